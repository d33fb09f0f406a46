"""Iteration-level serving simulator: continuous batching, chunked prefill, pipeline parallelism.

The engine has ``p`` pipeline stages (each a TP group of ``g`` GPUs) and ``m`` microbatch slots (vLLM
virtual engines). A slot launches a microbatch when its previous one has left the last stage and
stage 0 is free; the microbatch then passes the stages in order (flow shop), each stage taking
``StageModel.step1(n, f)`` for its ``n`` tokens at the clock ``f`` in force at launch. A microbatch
holds its slot's decodes (one token each) plus up to ``chunk`` prefill tokens taken FCFS from
waiting requests (chunked prefill; consecutive chunks of one prompt may be in flight in different
microbatches at once, since each stage runs them in order -- the pipelining BEAM's Eq. 1 assumes).
A request's first token appears when its last chunk leaves the last stage; a decode token when its
microbatch does (a decode is in at most one microbatch at a time).

Energy: every stage iteration charges g x E(n, f); every gap a stage waits charges g x P_idle(f) x
gap (clock locked, engine idle or in a bubble). Clock changes take effect ``delay_s`` after the
decision (BEAM: asynchronous NVML call, 7-10 ms). Controllers are called at events: arrival,
finish, entering decode-only, and every ``period_s`` for window controllers.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from systems.serving.controllers import Controller, Decision, EngineState, WindowStats
from systems.serving.gpu_model import StageModel
from workloads.serving import Requests


@dataclass
class SimResult:
    """Per-request table, token gaps, decision log, 1-s timeline and totals (SI units)."""
    requests: pd.DataFrame
    gaps: np.ndarray
    decisions: pd.DataFrame
    timeline: pd.DataFrame
    energy_j: float
    makespan_s: float
    iterations: int
    notes: List[str] = field(default_factory=list)
    gap_times: Optional[np.ndarray] = None       # emission time (s) of each token gap
    stage_busy_s: float = 0.0                    # busy time of one stage (all stages run the same)


class ServingSimulator:
    """Run ``controller`` over ``requests`` on a pipeline of ``stage`` models.

    Args:
        stage: per-stage latency/power ground truth. controller: decides knobs at events.
        requests: the stream. p, g: stages and GPUs per stage. delay_s: clock actuation delay.
        max_num_seqs: cap on requests in prefill or decode. kv_capacity_tokens: KV tokens that fit
        per stage (admission waits beyond it). drain_s: after the last arrival, stop after this
        long; unfinished requests miss their SLOs. max_waiting_view: controllers see the oldest
        waiting requests one by one up to this many, the rest as one entry (the newest's wait,
        their tokens), which bounds decision time under overload.
    """

    def __init__(self, stage: StageModel, controller: Controller, requests: Requests, p: int, g: int,
                 delay_s: float = 0.0085, max_num_seqs: int = 256, kv_capacity_tokens: float = math.inf,
                 drain_s: float = 300.0, max_waiting_view: int = 64):
        self.st, self.ctl, self.p, self.g = stage, controller, int(p), int(g)
        self.delay_s, self.max_num_seqs, self.kv_cap = delay_s, int(max_num_seqs), kv_capacity_tokens
        self.max_waiting_view = max_waiting_view
        N = len(requests)
        self.arr = requests.arrival_s.astype(float)
        self.inp = requests.input_len.astype(np.int64)
        self.out = requests.output_len.astype(np.int64)
        self.N = N
        self.t_stop = (float(self.arr[-1]) if N else 0.0) + drain_s

    # -- helpers ------------------------------------------------------------------------------
    def _state(self, now: float) -> EngineState:
        v = self.max_waiting_view
        w = [(now - self.arr_l[r], self.inp_l[r] - self.pref[r]) for r in self.waiting[: v - 1]]
        if len(self.waiting) >= v:     # the rest as one entry: the newest's wait, all their tokens
            rest = self.waiting[v - 1:]
            w.append((now - self.arr_l[rest[-1]], sum(self.inp_l[r] - self.pref[r] for r in rest)))
        return EngineState(now, w, self.n_dec, self.chunk, self.m, self.clock_target)

    def _apply(self, d: Optional[Decision], now: float, trigger: str, rid: int, wall_ns: int) -> None:
        self.dec_rows.append((now, trigger, rid, wall_ns / 1e3, None if d is None else d.chunk,
                              None if d is None else d.microbatches, None if d is None else d.clock_mhz,
                              None if d is None else d.feasible, None if d is None else d.pred_ttft_s,
                              None if d is None else d.pred_tbt_s, None if d is None else d.pred_energy_j))
        if d is None:
            return
        self.chunk = int(d.chunk)
        if d.microbatches != self.m:
            self._set_m(int(d.microbatches), now)
        if d.clock_mhz != self.clock_target:
            self.clock_target = float(d.clock_mhz)
            self.pending.append((now + self.delay_s, float(d.clock_mhz)))
        self.knobs.append((now, self.chunk, self.m, self.clock_target))

    def _call(self, hook, now: float, trigger: str, rid: int = -1, *args) -> None:
        s = self._state(now)
        t0 = time.perf_counter_ns()
        d = hook(s, *args)
        self._apply(d, now, trigger, rid, time.perf_counter_ns() - t0)

    def _set_m(self, m: int, now: float) -> None:
        old = self.m
        self.m = m
        while len(self.slot_dec) < m:
            self.slot_ready.append(now)
            self.slot_busy.append(False)
            self.slot_dec.append([])
        for k in range(old, m):
            if not self.slot_busy[k]:
                self.slot_ready[k] = now
        # rebalance decodes that are not in flight over the active slots
        idle = [r for j in range(len(self.slot_dec)) for r in self.slot_dec[j] if not self.busy[r]]
        keep = [[r for r in self.slot_dec[j] if self.busy[r]] for j in range(len(self.slot_dec))]
        for j in range(len(self.slot_dec)):
            self.slot_dec[j] = keep[j]
        for r in idle:
            self._assign(r)

    def _assign(self, r: int) -> None:
        j = min(range(self.m), key=lambda k: len(self.slot_dec[k]))
        self.slot_dec[j].append(r)
        self.slot[r] = j

    def _clock_at(self, t: float) -> float:
        while self.pending and self.pending[0][0] <= t:
            self.clock = self.pending.pop(0)[1]
            self.clock_log.append((t, self.clock))
        return self.clock

    def _d_update(self, now: float) -> None:
        self.d_int += self.n_dec * (now - self.d_t)
        self.d_t = now

    # -- events ---------------------------------------------------------------------------------
    def _advance(self, t: float) -> None:
        """Process arrivals, completions and window ticks with time <= t, in time order."""
        while True:
            ta = self.arr_l[self.next_arr] if self.next_arr < self.N else math.inf
            tc = self.heap[0][0] if self.heap else math.inf
            tt = self.next_tick
            te = min(ta, tc, tt)
            if te > t:
                return
            if te == tt:
                self._d_update(te)
                win = WindowStats(self.win_arr, self.win_tok, self.d_int / max(te - self.win_t0, 1e-9),
                                  te - self.win_t0,
                                  float(np.percentile(self.win_lens, 90)) if self.win_lens else 0.0,
                                  float(max(self.win_sec.values())) if self.win_sec else 0.0)
                self.win_sec = defaultdict(int)
                self.win_arr = self.win_tok = 0
                self.win_lens = []
                self.d_int, self.win_t0 = 0.0, te
                self._call(self.ctl.on_tick, te, "tick", -1, win)
                self.next_tick = te + self.ctl.period_s
            elif te == ta:
                r = self.next_arr
                self.next_arr += 1
                self.waiting.append(r)
                self.win_arr += 1
                self.win_tok += self.inp_l[r]
                self.win_lens.append(self.inp_l[r])
                self.win_sec[int(te)] += self.inp_l[r]
                self._call(self.ctl.on_arrival, te, "arrival", r)
            else:
                _, _, j, decs, chunks = heapq.heappop(self.heap)
                self._complete(te, j, decs, chunks)
            for j in range(self.m):                       # idle slots may have work now
                if not self.slot_busy[j] and self.slot_ready[j] > te:
                    self.slot_ready[j] = te

    def _complete(self, now: float, j: int, decs: List[int], chunks: List[tuple]) -> None:
        self._d_update(now)
        self.slot_busy[j] = False
        finished = entered = 0
        bin_ = int(now)
        for r in decs:
            self.busy[r] = False
            self.gen[r] += 1
            gap = now - self.last[r]
            self.gaps.append(gap)
            self.gap_t.append(now)
            self.gap_sum[r] += gap
            self.gap_max[r] = max(self.gap_max[r], gap)
            self.last[r] = now
            self.tok_bin[bin_] += 1
            if self.gen[r] >= self.out_l[r]:
                self.fin[r] = now
                self.slot_dec[self.slot[r]].remove(r)
                self.n_dec -= 1
                self.n_run -= 1
                self.kv_used -= self.inp_l[r] + self.out_l[r]
                finished += 1
            elif self.slot[r] >= self.m:                  # its slot was retired by a smaller m
                self.slot_dec[self.slot[r]].remove(r)
                self._assign(r)
        for r, ntok, _ in chunks:
            self.pref[r] += ntok
            if self.pref[r] >= self.inp_l[r]:
                self.waiting.remove(r)
                self.first[r] = self.last[r] = now
                self.gen[r] = 1
                self.tok_bin[bin_] += 1
                if self.out_l[r] <= 1:
                    self.fin[r] = now
                    self.n_run -= 1
                    self.kv_used -= self.inp_l[r] + self.out_l[r]
                    finished += 1
                else:
                    self._assign(r)
                    self.n_dec += 1
                    entered += 1
        if finished:
            self._call(self.ctl.on_finish, now, "finish", -1)
        elif entered and not self.waiting:
            self._call(self.ctl.on_decode_only, now, "decode_only", -1)

    # -- main loop ------------------------------------------------------------------------------
    def run(self, progress=None) -> SimResult:
        N, p, g, st = self.N, self.p, self.g, self.st
        self.arr_l, self.inp_l, self.out_l = self.arr.tolist(), self.inp.tolist(), self.out.tolist()
        self.pref, self.sched, self.gen = [0] * N, [0] * N, [0] * N
        self.first, self.last, self.fin = [math.nan] * N, [math.nan] * N, [math.nan] * N
        self.gap_sum, self.gap_max = [0.0] * N, [0.0] * N
        self.busy, self.slot = [False] * N, [-1] * N
        self.started = [False] * N
        self.gaps: List[float] = []
        self.gap_t: List[float] = []
        self.waiting: List[int] = []
        self.heap: list = []
        self.seq = 0
        self.n_dec = self.n_run = 0
        self.kv_used = 0
        self.dec_rows: list = []
        self.knobs: list = []
        self.clock_log: list = []
        self.pending: list = []
        self.tok_bin: Dict[int, int] = defaultdict(int)
        self.e_bin: Dict[int, float] = defaultdict(float)
        self.d_int, self.d_t, self.win_t0 = 0.0, 0.0, 0.0
        self.win_arr = self.win_tok = 0
        self.win_lens: List[int] = []
        self.win_sec: Dict[int, int] = defaultdict(int)
        self.next_arr = 0
        self.next_tick = self.ctl.period_s if self.ctl.period_s else math.inf
        d0 = self.ctl.initial()
        self.chunk, self.m, self.clock = int(d0.chunk), int(d0.microbatches), float(d0.clock_mhz)
        self.clock_target = self.clock
        self.clock_log.append((0.0, self.clock))
        self.knobs.append((0.0, self.chunk, self.m, self.clock))
        self.slot_ready = [0.0] * self.m
        self.slot_busy = [False] * self.m
        self.slot_dec: List[List[int]] = [[] for _ in range(self.m)]
        stage_free = [0.0] * p
        energy = 0.0
        self.busy_s = 0.0
        iters = 0
        last_prog = 0
        while True:
            j = min(range(self.m), key=self.slot_ready.__getitem__)
            t = max(self.slot_ready[j], stage_free[0])
            if t > self.t_stop:
                break
            self._advance(t)
            if j >= self.m or self.slot_busy[j]:
                continue
            decs = [r for r in self.slot_dec[j] if not self.busy[r]]
            chunks, budget = [], self.chunk
            for r in self.waiting:
                if budget <= 0:
                    break
                if self.sched[r] >= self.inp_l[r]:          # all chunks in flight
                    continue
                if not self.started[r]:
                    if self.n_run >= self.max_num_seqs or self.kv_used + self.inp_l[r] + self.out_l[r] > self.kv_cap:
                        break                            # FCFS admission
                    self.started[r] = True
                    self.n_run += 1
                    self.kv_used += self.inp_l[r] + self.out_l[r]
                ntok = min(budget, self.inp_l[r] - self.sched[r])
                chunks.append((r, ntok, self.sched[r]))
                self.sched[r] += ntok
                budget -= ntok
            if not decs and not chunks:
                ta = self.arr_l[self.next_arr] if self.next_arr < N else math.inf
                tc = self.heap[0][0] if self.heap else math.inf
                nxt = min(ta, tc, self.next_tick if self.next_arr < N or self.heap else math.inf)
                if nxt == math.inf:
                    break
                self.slot_ready[j] = max(nxt, t)
                continue
            f = self._clock_at(t)
            n = len(decs)
            ctx = pairs = 0.0
            for r in decs:
                c = self.inp_l[r] + self.gen[r]
                ctx += c
                pairs += c
            for r, ntok, done in chunks:
                ctx += done + ntok
                pairs += ntok * (done + ntok / 2.0)
                n += ntok
            lat, e_gpu = st.step1(n, f, ctx, pairs)
            p_idle = st.idle1(f)
            prev = t
            for s in range(p):
                start = stage_free[s] if stage_free[s] > prev else prev
                gap = start - stage_free[s]
                if gap > 0:
                    e = g * p_idle * gap
                    energy += e
                    self.e_bin[int(stage_free[s])] += e
                end = start + lat
                stage_free[s] = end
                prev = end
                energy += g * e_gpu
                self.e_bin[int(start)] += g * e_gpu
            iters += 1
            self.busy_s += lat
            for r in decs:
                self.busy[r] = True
            self.slot_busy[j] = True
            self.slot_ready[j] = prev
            self.seq += 1
            heapq.heappush(self.heap, (prev, self.seq, j, decs, chunks))
            if progress is not None and int(t) > last_prog:
                progress.update(int(t) - last_prog)
                last_prog = int(t)
        t_end = max(stage_free)
        self._advance(t_end)
        t_end = max(t_end, max(self.slot_ready) if self.heap else 0.0)
        for s in range(p):                                   # trailing idle up to the end
            gap = t_end - stage_free[s]
            if gap > 0:
                e = g * st.idle1(self.clock) * gap
                energy += e
                self.e_bin[int(stage_free[s])] += e
        return self._result(energy, t_end, iters)

    def _result(self, energy: float, t_end: float, iters: int) -> SimResult:
        req = pd.DataFrame({
            "arrival_s": self.arr, "input_len": self.inp, "output_len": self.out,
            "first_token_s": self.first, "finish_s": self.fin, "generated": self.gen,
            "ttft_s": np.asarray(self.first) - self.arr,
            "tbt_mean_s": np.where(np.asarray(self.gen) > 1,
                                   np.asarray(self.gap_sum) / np.maximum(np.asarray(self.gen) - 1, 1), np.nan),
            "tbt_max_s": np.where(np.asarray(self.gen) > 1, self.gap_max, np.nan),
        })
        dec = pd.DataFrame(self.dec_rows, columns=["time_s", "trigger", "request", "decision_us", "chunk",
                                                   "microbatches", "clock_mhz", "feasible", "pred_ttft_s",
                                                   "pred_tbt_s", "pred_energy_j"])
        nb = int(math.ceil(t_end)) + 1
        tl = pd.DataFrame({"time_s": np.arange(nb, dtype=float)})
        tl["energy_j"] = [self.e_bin.get(i, 0.0) for i in range(nb)]
        tl["power_w"] = tl["energy_j"]                      # 1-s bins: J per s
        tl["tokens"] = [self.tok_bin.get(i, 0) for i in range(nb)]
        tl["arrivals"] = np.bincount(np.minimum(self.arr.astype(int), nb - 1), minlength=nb)[:nb]
        tl["input_tokens"] = np.bincount(np.minimum(self.arr.astype(int), nb - 1), weights=self.inp,
                                         minlength=nb)[:nb]
        # clock (time-weighted over each bin) and knobs (last value in the bin)
        ck = np.asarray(self.clock_log)
        edges = np.arange(nb + 1, dtype=float)
        f_bin = np.zeros(nb)
        times = np.append(ck[:, 0], max(t_end, ck[-1, 0]) + 1)
        for (a, fv), b in zip(ck, times[1:]):
            lo, hi = a, b
            i0, i1 = int(lo), min(int(math.ceil(hi)), nb)
            for i in range(i0, i1):
                ov = min(hi, edges[i + 1]) - max(lo, edges[i])
                if ov > 0:
                    f_bin[i] += fv * ov
        tl["clock_mhz"] = f_bin
        kn = pd.DataFrame(self.knobs, columns=["time_s", "chunk", "microbatches", "clock_target_mhz"])
        kn["bin"] = kn["time_s"].astype(int)
        last = kn.groupby("bin")[["chunk", "microbatches"]].last().reindex(range(nb)).ffill()
        tl["chunk"] = last["chunk"].to_numpy()
        tl["microbatches"] = last["microbatches"].to_numpy()
        res = SimResult(req, np.asarray(self.gaps), dec, tl, energy, t_end, iters)
        res.gap_times = np.asarray(self.gap_t)
        res.stage_busy_s = self.busy_s
        return res
