"""The serving driver: the one place that calls controllers and accounts requests (no torch, no vLLM).

It owns the events (arrivals, window ticks, finished iterations) and turns them into controller
hooks (``on_arrival``, ``on_finish``, ``on_decode_only``, ``on_tick``), builds the
:class:`EngineState` and :class:`WindowStats` a controller sees, logs every decision (with its
wall-clock decision time), hands decisions to the executor, and does the per-request TTFT / TBT /
SLO accounting from the executor's :class:`Iteration` reports. The simulator and the vLLM engine
are executors (:class:`systems.energy_serving.protocol.Executor`); neither calls a controller.

Rules, one meaning on every backend:

* Events at the same time: window tick, then arrivals, then the executor's work at that time.
* A controller sees the oldest waiting prefills one by one up to ``max_waiting_view`` and the rest
  as one entry (the newest's wait, their tokens), which bounds decision time under overload.
* Window statistics: arrivals and prompt tokens of the window, and the time-mean number of decodes.
* TTFT = first token - arrival; TBT = gap between consecutive tokens of a request (a recomputed
  request's next token counts as a gap); a request's token after the run stopped does not exist.
* After a finished iteration: ``on_finish`` if a request finished, else ``on_decode_only`` if a
  request entered decode and no prefill waits.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from itertools import chain
from typing import Callable, Dict, List, Optional

import numpy as np

from systems.energy_serving.protocol import EngineState, Executor, Iteration, WindowStats, iteration_shape

DECISION_COLUMNS = [
    "time_s",
    "trigger",
    "request",
    "decision_us",
    "chunk",
    "microbatches",
    "clock_mhz",
    "feasible",
    "pred_ttft_s",
    "pred_tbt_s",
    "pred_energy_j",
]
ITERATION_COLUMNS = [
    "time_s",
    "latency_s",
    "cpu_s",
    "tokens",
    "ctx_tokens",
    "attn_pairs",
    "seqs",
    "prefill_tokens",
    "decodes",
    "budget",
    "clock_mhz",
    "energy_j",
]
INT_ITERATION_COLUMNS = ("tokens", "seqs", "prefill_tokens", "decodes", "budget")
Columns = Dict[str, np.ndarray]  # a table: column name -> 1-D array, all of one length
LOG_ROWS = 4096  # a log's first buffer (rows); doubled when full (grown)


@dataclass
class ServeResult:
    """What serving produced (SI units). Tables are :data:`Columns` (name -> numpy array; written as
    parquet by the harness, no pandas needed): requests: one row per request; decisions: the
    decision log; iterations: one row per finished iteration; timeline: 1-s bins (energy, power,
    tokens, arrivals, clock, knobs). gaps / gap_times: every token gap (s) and when it was emitted;
    energy_j: None when not measured (``energy_reason`` says why)."""

    requests: Columns
    gaps: np.ndarray
    gap_times: np.ndarray
    decisions: Columns
    iterations: Columns
    timeline: Columns
    energy_j: Optional[float]
    energy_reason: str
    makespan_s: float
    preemptions: int


class Driver:
    """Run ``controller`` over ``requests`` on an executor.

    Args:
        controller: a :class:`systems.energy_serving.controllers.Controller`.
        requests: :class:`workloads.serving.Requests` (arrival s, input/output tokens).
        t_stop: stop serving at this time (s); requests unfinished then miss their SLOs.
        max_waiting_view: waiting prefills a controller sees one by one (see module docstring).
    """

    def __init__(self, controller, requests, t_stop: float = math.inf, max_waiting_view: int = 64):
        self.ctl = controller
        self.arr = requests.arrival_s.astype(float)
        self.inp = requests.input_len.astype(np.int64)
        self.out = requests.output_len.astype(np.int64)
        self.N = len(requests)
        self.t_stop = float(t_stop)
        self.max_waiting_view = int(max_waiting_view)

    # -- what a controller sees -------------------------------------------------------------------
    def state(self, now: float) -> EngineState:
        v, w, arr, need, pref = self.max_waiting_view, self.waiting, self.arr_l, self.need, self.pref
        seen = [(now - arr[r], need[r] - pref[r]) for r in w[: v - 1]]
        if len(w) >= v:  # the rest as one entry: the newest's wait, all their tokens
            rest = w[v - 1 :]
            seen.append((now - arr[rest[-1]], sum(need[r] - pref[r] for r in rest)))
        return EngineState(now, seen, self.n_dec, self.chunk, self.m, self.clock)

    def _call(self, hook, now: float, trigger: str, rid: int = -1, win: Optional[WindowStats] = None) -> None:
        s = self.state(now)
        t0 = time.perf_counter_ns()
        d = hook(s) if win is None else hook(s, win)
        us = (time.perf_counter_ns() - t0) / 1e3
        if d is None:
            self.dec_rows.append((now, trigger, rid, us, None, None, None, None, None, None, None))
            return
        self.dec_rows.append(
            (
                now,
                trigger,
                rid,
                us,
                d.chunk,
                d.microbatches,
                d.clock_mhz,
                d.feasible,
                d.pred_ttft_s,
                d.pred_tbt_s,
                d.pred_energy_j,
            )
        )
        self.chunk, self.m, self.clock = int(d.chunk), int(d.microbatches), float(d.clock_mhz)
        self.knobs.append((now, self.chunk, self.m, self.clock))
        self.ex.apply(d, now)

    # -- events -----------------------------------------------------------------------------------
    def _decodes_until(self, now: float) -> None:
        if now > self.d_t:
            self.d_int += self.n_dec * (now - self.d_t)
            self.d_t = now

    def _tick(self, t: float) -> None:
        self._decodes_until(t)
        span = t - self.win_t0
        win = WindowStats(self.win_arr, self.win_tok, self.d_int / max(span, 1e-9), span)
        self.win_arr = self.win_tok = 0
        self.d_int, self.win_t0 = 0.0, t
        self._call(self.ctl.on_tick, t, "tick", -1, win)

    def _arrival(self, now: float) -> None:
        r = self.next_arr
        self.next_arr += 1
        n = self.inp_l[r]
        self.ex.add(r, n, self.out_l[r], now)
        self.waiting.append(r)
        self.in_wait[r] = True
        self.win_arr += 1
        self.win_tok += n
        self._call(self.ctl.on_arrival, now, "arrival", r)

    def _account(self, it: Iteration) -> None:
        """Book one finished iteration: prefill progress, requests entering decode, finishes, and the
        tokens emitted (logged here; their TTFT and token gaps are computed once, in :meth:`_tokens`)."""
        t = it.t_end
        if t > self.d_t:
            self.d_int += self.n_dec * (t - self.d_t)
            self.d_t = t
        in_wait, pref = self.in_wait, self.pref
        for r in it.preempted:  # evicted: back to the queue's front, recomputing all its tokens
            if not in_wait[r]:
                self.n_dec -= 1
                in_wait[r] = True
                self.waiting.insert(0, r)
            self.need[r] = self.inp_l[r] + self.gen[r]
            pref[r] = 0
        pf, sch = 0, it.scheduled
        for i in range(it.n_decodes, len(sch)):
            r, ntok, _ = sch[i]
            if in_wait[r]:
                pref[r] += ntok
                pf += ntok
        emitted = it.emitted
        k, e = self.n_it, self.n_em  # this iteration's row in the logs, its first token's
        if k == len(self.em_n):
            self.em_n, self.it_log = grown(self.em_n, k + 1), grown(self.it_log, k + 1)
        if e + len(emitted) > len(self.em_req):
            self.em_req = grown(self.em_req, e + len(emitted))
        self.em_n[k] = len(emitted)
        entered, gen, em_req = 0, self.gen, self.em_req
        for r in emitted:
            em_req[e] = r
            e += 1
            gen[r] += 1
            if in_wait[r]:  # its prefill (or recompute) completed with this token
                in_wait[r] = False
                self.waiting.remove(r)
                entered += 1
        self.n_dec += entered
        if it.finished:
            for r in it.finished:
                self.fin[r] = t
            self.n_dec -= len(it.finished)
        self.n_em = e
        n, ctx, pairs, seqs = it.shape or iteration_shape(sch)
        cpu, en = it.cpu_s, it.energy_j
        row = self.it_log[k]  # ITERATION_COLUMNS, in order (not measured: NaN)
        row[0], row[1], row[2] = t, it.latency_s, (math.nan if cpu is None else cpu)  # time_s, latency_s, cpu_s
        row[3], row[4], row[5], row[6] = n, ctx, pairs, seqs  # tokens, ctx_tokens, attn_pairs, seqs
        row[7], row[8], row[9] = pf, n - pf, it.budget  # prefill_tokens, decodes, budget
        row[10], row[11] = it.clock_mhz, (math.nan if en is None else en)  # clock_mhz, energy_j
        self.n_it = k + 1
        if it.finished:
            self._call(self.ctl.on_finish, t, "finish")
        elif entered and not self.waiting:
            self._call(self.ctl.on_decode_only, t, "decode_only")

    # -- main loop ----------------------------------------------------------------------------------
    def run(self, ex: Executor, progress: Optional[Callable[[float], None]] = None) -> ServeResult:
        """Serve every request on ``ex`` (or until ``t_stop``) and return what happened.
        ``progress``: called with the serving time (s) when an iteration reaches a new whole second."""
        N = self.N
        self.ex = ex
        self.arr_l, self.inp_l, self.out_l = self.arr.tolist(), self.inp.tolist(), self.out.tolist()
        self.need, self.pref = list(self.inp_l), [0] * N
        self.fin = [math.nan] * N
        self.gen = [0] * N  # tokens emitted per request
        # the logs, in numpy buffers doubled when full (grown); rows in use: n_it iterations, n_em tokens.
        # The token log: requests that emitted a token, in order, and how many per iteration (when: the
        # iteration's time_s)
        self.em_req = np.empty(LOG_ROWS, np.int64)
        self.em_n = np.empty(LOG_ROWS, np.int64)
        self.n_it = self.n_em = 0
        self.in_wait = [False] * N
        self.waiting: List[int] = []
        self.dec_rows: list = []
        self.it_log = np.empty((LOG_ROWS, len(ITERATION_COLUMNS)))  # a row of ITERATION_COLUMNS per iteration
        # (not measured: NaN)
        self.knobs: list = []
        self.n_dec = self.next_arr = 0
        self.d_int = self.d_t = self.win_t0 = 0.0
        self.win_arr = self.win_tok = 0
        d0 = self.ctl.initial()
        self.chunk, self.m, self.clock = int(d0.chunk), int(d0.microbatches), float(d0.clock_mhz)
        self.knobs.append((0.0, self.chunk, self.m, self.clock))
        ex.apply(d0, 0.0)
        period = self.ctl.period_s
        next_tick = period if period else math.inf
        arr = self.arr_l
        next_second = 1.0  # progress: called when serving reaches each next whole second
        t_stop = self.t_stop
        until = min(arr[0] if N else math.inf, next_tick, t_stop)  # the next arrival, tick or stop
        while self.next_arr < N or ex.busy():
            it = ex.advance(until)
            if it is not None:
                self._account(it)
                if progress is not None and it.t_end >= next_second:
                    progress(it.t_end)
                    next_second = math.floor(it.t_end) + 1.0
                continue
            now = ex.now
            if now >= t_stop or until == math.inf:  # stopped, or stuck with nothing to wait for
                break
            while True:  # events due by now, in time order (ticks first at a tie)
                ta = arr[self.next_arr] if self.next_arr < N else math.inf
                if next_tick <= now and next_tick <= ta:
                    self._tick(next_tick)
                    next_tick += period
                elif ta <= now:
                    self._arrival(now)
                else:
                    break
            until = min(ta, next_tick, t_stop)
        totals = ex.close(ex.now)
        return self._result(totals, ex.now)

    # -- result tables ------------------------------------------------------------------------------
    def _id_type(self) -> np.dtype:
        """The smallest unsigned integer type that holds a request id."""
        return np.min_scalar_type(max(self.N - 1, 0))

    def _iteration_times(self) -> np.ndarray:
        """When each iteration ended (s): the iteration log's time_s."""
        return np.asarray(self.it_log)[: self.n_it, 0]

    def _tokens(self):
        """From the token log: (tokens per request, first-token time, sum and max of each request's
        token gaps (s), every gap in emission order, when each gap ended).

        A request's gaps are the differences of its successive token times (a recomputed request's
        next token too); each request's gaps are summed one after another in time order, as a
        running sum during serving would."""
        N = self.N
        # ids in the smallest unsigned type that holds them: numpy sorts 8/16-bit keys by radix, stably
        req = np.asarray(self.em_req)[: self.n_em].astype(self._id_type())
        t = np.repeat(self._iteration_times(), np.asarray(self.em_n)[: self.n_it])
        gen = np.asarray(self.gen)
        order = np.argsort(req, kind="stable")  # by request, in time order within one
        rs, ts = req[order], t[order]
        first_of = np.ones(len(rs), bool)
        first_of[1:] = rs[1:] != rs[:-1]
        first = np.full(N, math.nan)
        first[rs[first_of]] = ts[first_of]
        is_gap = ~first_of
        gap_sorted = np.empty(len(rs))
        gap_sorted[1:] = ts[1:] - ts[:-1]
        at = np.zeros(len(rs), bool)  # in emission order: which tokens end a gap
        at[order[is_gap]] = True
        gap_log = np.empty(len(rs))
        gap_log[order] = gap_sorted
        gaps, gap_times = gap_log[at], t[at]
        gap_sum, gap_max = np.zeros(N), np.zeros(N)
        g = gap_sorted[is_gap]
        if len(g):
            owner = rs[is_gap]
            starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
            who = owner[starts]
            gap_max[who] = np.maximum.reduceat(g, starts)
            # bincount adds each weight to its bin in array order, one after another from 0.0 (not
            # pairwise, as np.add.reduceat may): each request's gaps summed in time order
            gap_sum = np.bincount(owner, weights=g, minlength=N)
        return gen, first, gap_sum, gap_max, gaps, gap_times

    def _result(self, totals, t_end: float) -> ServeResult:
        gen, first, gap_sum, gap_max, gaps, gap_times = self._tokens()
        req = {
            "arrival_s": self.arr,
            "input_len": self.inp,
            "output_len": self.out,
            "first_token_s": first,
            "finish_s": np.asarray(self.fin, dtype=float),
            "generated": gen,
            "ttft_s": first - self.arr,
            "tbt_mean_s": np.where(gen > 1, gap_sum / np.maximum(gen - 1, 1), np.nan),
            "tbt_max_s": np.where(gen > 1, gap_max, np.nan),
        }
        dec = {
            c: column(list(v))
            for c, v in zip(DECISION_COLUMNS, zip(*self.dec_rows) if self.dec_rows else [()] * len(DECISION_COLUMNS))
        }
        a = np.asarray(self.it_log)[: self.n_it]
        its = {
            c: a[:, i].astype(np.int64) if c in INT_ITERATION_COLUMNS else a[:, i].copy()
            for i, c in enumerate(ITERATION_COLUMNS)
        }
        tl = self._timeline(totals, t_end)
        return ServeResult(
            req, gaps, gap_times, dec, its, tl, totals.energy_j, totals.energy_reason, t_end, totals.preemptions
        )

    def _timeline(self, totals, t_end: float) -> Columns:
        """1-s bins: energy (J) and power (W) of the executor (None when not measured), tokens emitted,
        arrivals and their prompt tokens, the clock in force (time-weighted) and the knobs (the last
        value set in the bin, else the bin before's)."""
        nb = int(math.ceil(t_end)) + 1
        tl = {"time_s": np.arange(nb, dtype=float)}
        if totals.energy_j is not None:
            tl["energy_j"] = np.array([totals.energy_bins.get(i, 0.0) for i in range(nb)], dtype=float)
        else:
            tl["energy_j"] = np.full(nb, np.nan)
        tl["power_w"] = tl["energy_j"]  # 1-s bins: J per s
        em_bin = self._iteration_times().astype(np.int64)  # int(t): the second it is in
        n_tok = np.asarray(self.em_n)[: self.n_it]
        tl["tokens"] = np.bincount(em_bin, weights=n_tok, minlength=nb)[:nb].astype(np.int64)
        a = np.minimum(self.arr.astype(int), nb - 1)
        tl["arrivals"] = np.bincount(a, minlength=nb)[:nb]
        tl["input_tokens"] = np.bincount(a, weights=self.inp, minlength=nb)[:nb]
        ck = [(float(t), float(f)) for t, f in totals.clock_log or [(0.0, self.clock)]]
        ends = [t for t, _ in ck[1:]] + [max(t_end, ck[-1][0]) + 1]
        f_bin = [0.0] * nb
        for (lo, fv), hi in zip(ck, ends):
            for i in range(int(lo), min(int(math.ceil(hi)), nb)):
                ov = min(hi, i + 1.0) - max(lo, float(i))
                if ov > 0:
                    f_bin[i] += fv * ov
        tl["clock_mhz"] = np.array(f_bin)
        kn = np.fromiter(chain.from_iterable(self.knobs), float, 4 * len(self.knobs)).reshape(
            -1, 4
        )  # time, chunk, m, f
        bins = kn[:, 0].astype(int)
        last = np.full(nb, -1)  # the bin's last knob setting, else -1
        inside = bins < nb
        np.maximum.at(last, bins[inside], np.flatnonzero(inside))
        have = last >= 0
        last = last[np.maximum.accumulate(np.where(have, np.arange(nb), 0))]  # else the bin before's
        for i, c in ((1, "chunk"), (2, "microbatches")):
            v = np.where(last >= 0, kn[last, i], np.nan)
            tl[c] = v.astype(np.int64) if have.all() else v
        return tl


def grown(buf, rows: int) -> np.ndarray:
    """A full buffer (a log's here, the simulator's energy bins) copied into one of at least ``rows``
    rows (twice as many, or more); the rows added are zeros."""
    old = np.asarray(buf)
    new = np.zeros((max(2 * len(old), rows), *old.shape[1:]), old.dtype)
    new[: len(old)] = old
    return new


def column(values: list) -> np.ndarray:
    """A table column from Python values, typed as pandas types a column of rows: numbers with
    None -> float64 with NaN; else numpy's type (int64, float64, bool, str), or object (all None,
    bools with None)."""
    arr = np.asarray(values) if values else np.array([], dtype=object)
    if arr.dtype != object:
        return arr
    kinds = set(map(type, values))
    if (
        type(None) in kinds
        and len(kinds) > 1
        and all(issubclass(k, numbers.Real) and not issubclass(k, (bool, np.bool_)) for k in kinds - {type(None)})
    ):
        return np.array(values, dtype=float)  # None -> NaN
    return arr
