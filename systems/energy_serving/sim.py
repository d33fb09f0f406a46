"""Iteration-level serving simulator, an executor: continuous batching, chunked prefill, pipeline
parallelism, a KV capacity, DVFS with an actuation delay. It applies decisions and reports
iterations; the driver (:mod:`systems.energy_serving.driver`) calls the controllers and does the accounting.

The engine has ``p`` pipeline stages (each a TP group of ``g`` GPUs) and ``m`` microbatch slots (vLLM
virtual engines). A slot launches a microbatch when its previous one has left the last stage and
stage 0 is free; the microbatch then passes the stages in order (flow shop), each stage taking
``cost.step1(n, f, ...)`` for its ``n`` tokens at the clock ``f`` in force at launch. A microbatch
holds its slot's decodes (one token each) plus up to ``chunk`` prefill tokens taken FCFS from
waiting requests (chunked prefill; consecutive chunks of one prompt may be in flight in different
microbatches at once, since each stage runs them in order -- the pipelining BEAM's Eq. 1 assumes).
A request's first token appears when its last chunk leaves the last stage; a decode token when its
microbatch does (a decode is in at most one microbatch at a time).

KV cache (vLLM's policy, token-granular): a request holds the KV of every token scheduled for it.
A waiting request is admitted when fewer than ``max_num_seqs`` requests run and its next chunk
fits; a chunk that does not fit waits (the queue stops there, FCFS). A decode token that does not
fit preempts the most recently admitted running request not in flight (vLLM's FCFS victim; it
may be the request itself): its KV is freed and it goes back to the queue's front to recompute
its prompt and output tokens.

Energy: every stage iteration charges g x E(n, f); every gap a stage waits charges g x P_idle(f) x
gap (clock locked, engine idle or in a bubble). Clock changes take effect ``delay_s`` after the
decision (BEAM: asynchronous NVML call, 7-10 ms).
"""

from __future__ import annotations

import heapq
import math
from typing import List, Optional

import numpy as np

from systems.energy_serving.driver import grown
from systems.energy_serving.protocol import Decision, ExecutorTotals, Iteration, IterationCost


class SimExecutor:
    """Simulated executor of ``p`` stages of ``g`` GPUs charged by ``cost`` (the ground truth).

    Args:
        cost: :class:`systems.energy_serving.protocol.IterationCost` (a StageModel, or a measured profile).
        p, g: stages and GPUs per stage. delay_s: clock actuation delay (s).
        max_num_seqs: cap on running requests. kv_capacity_tokens: KV tokens that fit per stage.
    """

    def __init__(
        self,
        cost: IterationCost,
        p: int,
        g: int,
        delay_s: float = 0.0085,
        max_num_seqs: int = 256,
        kv_capacity_tokens: float = math.inf,
    ):
        self.cost, self.p, self.g = cost, int(p), int(g)
        self.has_energy = bool(cost.has_energy)
        self.delay_s, self.max_num_seqs, self.kv_cap = float(delay_s), int(max_num_seqs), kv_capacity_tokens
        self.now = 0.0
        # per request (index = request id)
        self.inp: List[int] = []
        self.out: List[int] = []
        self.need: List[int] = []  # tokens to prefill: the prompt, or prompt + output after preemption
        self.sched: List[int] = []  # prefill tokens scheduled
        self.pref: List[int] = []  # prefill tokens finished
        self.gen: List[int] = []  # output tokens emitted
        self.gen_dec: List[int] = []  # gen when its prefill (or recompute) completed; KV held while decoding:
        # need + gen - gen_dec (the tokens of its decodes, none in flight)
        self.adm: List[int] = []  # admission order (preemption victim = the largest)
        self.slot: List[int] = []  # its decode slot (-1: not decoding)
        self.started: List[bool] = []
        self.waiting: List[int] = []  # FCFS, prefill not finished
        self.running: set = set()
        self.n_adm = self.kv_used = self.n_preempt = 0
        self._preempted: List[int] = []
        # engine
        self.chunk, self.m = 0, 0
        self.clock: Optional[float] = None
        self.clock_target = 0.0
        self.pending: List[tuple] = []
        self.clock_log: List[tuple] = []
        self.slot_ready: List[float] = []
        self.slot_busy: List[bool] = []
        self.parked = False  # an idle slot found nothing to run and waits for the next event
        self.slot_dec: List[List[int]] = []  # a slot's decodes: those in flight first, then those since
        self.slot_flying: List[List[int]] = []  # the decodes of a slot's microbatch in flight ([] when idle)
        self.stage_free = [0.0] * self.p
        self.heap: list = []
        self.seq = 0
        self.energy = 0.0
        self.e_bin = np.zeros(64)  # joules per 1-s bin (index = second): _charge, a buffer
        self.n_bins = 0  # grown when full, its first n_bins bins in use
        self.p_idle: dict = {}  # clock -> cost.idle1(clock), asked once per clock (_idle_power)

    # -- the executor protocol ----------------------------------------------------------------------
    def add(self, rid: int, input_len: int, output_len: int, now: float) -> None:
        if rid != len(self.inp):
            raise ValueError(f"request ids must arrive in order 0, 1, ...; got {rid} after {len(self.inp) - 1}")
        for lst, v in (
            (self.inp, input_len),
            (self.out, output_len),
            (self.need, input_len),
            (self.sched, 0),
            (self.pref, 0),
            (self.gen, 0),
            (self.gen_dec, 0),
            (self.adm, 0),
            (self.slot, -1),
            (self.started, False),
        ):
            lst.append(v)
        self.waiting.append(rid)
        self._wake(now)

    def apply(self, d: Decision, now: float) -> None:
        self.chunk = int(d.chunk)
        if d.microbatches != self.m:
            self._set_m(int(d.microbatches), now)
        f = float(d.clock_mhz)
        if self.clock is None:  # the initial clock is in force from the start
            self.clock = self.clock_target = f
            self.clock_log.append((now, f))
        elif f != self.clock_target:
            self.clock_target = f
            self.pending.append((now + self.delay_s, f))
        self._wake(now)

    def busy(self) -> bool:
        return bool(self.heap) or bool(self.waiting) or bool(self.running)

    def advance(self, until: float) -> Optional[Iteration]:
        """Launch microbatches and finish them, in time order, until the next finished one (returned)
        or ``until``. A launch at time t comes after every completion at t and before events at t
        from the driver (``until``). The next launch is the first active slot of the earliest ready
        time."""
        heap, ready, stage_free = self.heap, self.slot_ready, self.stage_free
        while True:
            tc = heap[0][0] if heap else math.inf
            j = 0  # the first active slot of the earliest ready time
            for k in range(1, self.m):
                if ready[k] < ready[j]:
                    j = k
            t_ready = ready[j]
            tl = t_ready if t_ready > stage_free[0] else stage_free[0]
            if tc <= tl:
                if tc >= until:
                    break
                return self._complete(heapq.heappop(heap))
            if tl >= until:
                break
            self._launch(j, tl)
        if until < math.inf:
            self.now = until
        return None

    def close(self, now: float) -> ExecutorTotals:
        """Charge each stage's trailing idle time up to the end of the last work (or ``now``)."""
        t_end = max(now, max(self.stage_free))
        p_idle = self._idle_power(self.clock)
        for s in range(self.p):
            gap = t_end - self.stage_free[s]
            if gap > 0:
                self.energy += self.g * p_idle * gap
                self._charge(self.stage_free[s], self.g * p_idle * gap)
        self.now = t_end
        has = self.has_energy
        return ExecutorTotals(
            self.energy if has else None,
            "" if has else "the measured profile has no power model (latency only)",
            dict(enumerate(np.asarray(self.e_bin)[: self.n_bins].tolist())) if has else {},
            list(self.clock_log),
            self.n_preempt,
        )

    # -- engine internals ---------------------------------------------------------------------------
    def _wake(self, now: float) -> None:
        """Idle slots may have work now (only a parked slot's ready time can lie after ``now``: an idle
        slot is otherwise ready since its last microbatch left, and _set_m readies new ones)."""
        if self.parked:
            busy, ready = self.slot_busy, self.slot_ready
            for j in range(self.m):
                if ready[j] > now and not busy[j]:
                    ready[j] = now
            self.parked = False

    def _charge(self, t: float, joules: float) -> None:
        """Add ``joules`` to the 1-s energy bin of time ``t`` (s)."""
        k = int(t)
        if k >= self.n_bins:  # a new second: the bins up to it start at 0.0
            if k >= len(self.e_bin):
                self.e_bin = grown(self.e_bin, k + 1)
            self.n_bins = k + 1
        self.e_bin[k] += joules

    def _idle_power(self, f: float) -> float:
        """P_idle at clock ``f`` (W per GPU): ``cost.idle1(f)``, a function of the clock alone, asked
        once per clock."""
        p = self.p_idle.get(f)
        if p is None:
            p = self.p_idle[f] = self.cost.idle1(f)
        return p

    def _clock_at(self, t: float) -> float:
        while self.pending and self.pending[0][0] <= t:
            self.clock = self.pending.pop(0)[1]
            self.clock_log.append((t, self.clock))
        return self.clock

    def _set_m(self, m: int, now: float) -> None:
        old = self.m
        self.m = m
        while len(self.slot_dec) < m:
            self.slot_ready.append(now)
            self.slot_busy.append(False)
            self.slot_dec.append([])
            self.slot_flying.append([])
        for k in range(old, m):
            if not self.slot_busy[k]:
                self.slot_ready[k] = now
        # rebalance decodes that are not in flight over the active slots
        dec, flying = self.slot_dec, self.slot_flying
        idle = [r for j in range(len(dec)) for r in dec[j] if r not in flying[j]]
        for j in range(len(dec)):
            dec[j] = [r for r in dec[j] if r in flying[j]]
        for r in idle:
            self._assign(r)

    def _assign(self, r: int) -> None:
        dec, j = self.slot_dec, 0  # the emptiest active slot (the first at a tie)
        for k in range(1, self.m):
            if len(dec[k]) < len(dec[j]):
                j = k
        dec[j].append(r)
        self.slot[r] = j

    def _release(self, r: int) -> None:
        """Free a request's KV and its decode slot."""
        if self.slot[r] >= 0:
            self.slot_dec[self.slot[r]].remove(r)
            self.slot[r] = -1
        self.kv_used -= self.need[r] + self.gen[r] - self.gen_dec[r]
        self.running.discard(r)

    def _preempt(self, r: int) -> None:
        self._release(r)
        self.started[r] = False
        self.need[r] = self.inp[r] + self.gen[r]
        self.sched[r] = self.pref[r] = 0
        self.waiting.insert(0, r)
        self._preempted.append(r)
        self.n_preempt += 1

    def _make_room(self, decs: List[int]) -> List[int]:
        """Preempt (vLLM's FCFS victim: the latest admitted, not in flight) until ``decs`` fit."""
        while decs and self.kv_used + len(decs) > self.kv_cap:
            slot, flying = self.slot, self.slot_flying
            victim = max(
                (r for r in self.running if slot[r] >= 0 and r not in flying[slot[r]]), key=self.adm.__getitem__
            )
            self._preempt(victim)
            if victim in decs:
                decs.remove(victim)
        return decs

    def _launch(self, j: int, t: float) -> None:
        """Form slot j's microbatch at time t and send it through the stages. Its shape
        (:func:`systems.energy_serving.protocol.iteration_shape`) is summed as it is formed, in integers: a
        decode after c cached tokens reads c + 1 KV tokens and forms c + 1 pairs.

        Slot j is idle, so none of its decodes is in flight (a decode joins a slot only when it is
        not in flight, and an in-flight one stays in the slot of its microbatch): all of them run."""
        decs = self.slot_dec[j][:]
        if decs and self.kv_used + len(decs) > self.kv_cap:
            decs = self._make_room(decs)
        inp, gen = self.inp, self.gen
        scheduled = []
        ctx = 0
        for r in decs:
            c = inp[r] + gen[r]
            scheduled.append((r, 1, c - 1))
            ctx += c
        n = n_dec = len(decs)
        pairs = ctx
        kv_used = self.kv_used + n_dec
        budget = self.chunk
        if self.waiting and budget > 0:
            kv_cap, sched, need, started, running = self.kv_cap, self.sched, self.need, self.started, self.running
            for r in self.waiting:
                if budget <= 0:
                    break
                c = sched[r]
                if c >= need[r]:  # all chunks in flight
                    continue
                ntok = min(budget, need[r] - c)
                if kv_used + ntok > kv_cap:
                    break  # does not fit: the queue waits (FCFS)
                if not started[r]:
                    if len(running) >= self.max_num_seqs:
                        break  # FCFS admission
                    started[r] = True
                    running.add(r)
                    self.n_adm += 1
                    self.adm[r] = self.n_adm
                scheduled.append((r, ntok, c))
                n += ntok
                ctx += c + ntok
                pairs += ntok * c + ntok * (ntok + 1) // 2
                sched[r] = c + ntok
                kv_used += ntok
                budget -= ntok
        self.kv_used = kv_used
        if not scheduled:
            self.slot_ready[j] = self.heap[0][0] if self.heap else math.inf
            self.parked = True
            return
        f = self._clock_at(t) if self.pending else self.clock
        seqs = len(scheduled)
        kv_read, attn = float(ctx), float(pairs)
        lat, e_gpu = self.cost.step1(n, f, kv_read, attn, seqs)
        g, stage_free = self.g, self.stage_free
        e_it, busy = 0.0, g * e_gpu
        p_idle = self._idle_power(f)  # P_idle(f): for the stages that waited
        prev = t
        for s in range(self.p):
            free = stage_free[s]
            if free < prev:  # the stage waited: idle energy
                idle = g * p_idle * (prev - free)
                self._charge(free, idle)
                e_it += idle
                free = prev
            self._charge(free, busy)
            e_it += busy
            stage_free[s] = prev = free + lat
        self.energy += e_it
        self.slot_busy[j] = True
        self.slot_flying[j] = decs
        self.slot_ready[j] = prev
        self.seq += 1
        heapq.heappush(
            self.heap, (prev, self.seq, j, decs, scheduled, lat, e_it, f, self.chunk + n_dec, (n, kv_read, attn, seqs))
        )

    def _complete(self, item) -> Iteration:
        """A microbatch left the last stage: its tokens appear."""
        t, _, j, decs, scheduled, lat, e_it, f, budget, shape = item
        self.now = t
        self.slot_busy[j] = False
        self.slot_flying[j] = []
        finished = []
        gen, out, m = self.gen, self.out, self.m
        for r in decs:
            g = gen[r] + 1
            gen[r] = g
            if g >= out[r]:
                self._release(r)
                finished.append(r)
        if j >= m:  # its slot was retired by a smaller m
            for r in decs:
                if self.slot[r] == j:
                    self.slot_dec[j].remove(r)
                    self._assign(r)
        n_dec = len(decs)
        emitted = decs  # the decodes' tokens, then completed prefills'
        if n_dec < len(scheduled):
            pref, need, waiting = self.pref, self.need, self.waiting
            for i in range(n_dec, len(scheduled)):
                r, ntok, _ = scheduled[i]
                pref[r] += ntok
                if pref[r] >= need[r]:  # prefill (or recompute) done: a token
                    waiting.remove(r)
                    gen[r] += 1
                    self.gen_dec[r] = gen[r]
                    emitted.append(r)
                    if gen[r] >= out[r]:
                        self._release(r)
                        finished.append(r)
                    else:
                        self._assign(r)
        pre, self._preempted = self._preempted, []
        self._wake(t)
        return Iteration(
            t, lat, e_it if self.has_energy else None, scheduled, emitted, finished, pre, budget, f, None, shape, n_dec
        )
