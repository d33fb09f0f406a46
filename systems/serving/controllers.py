"""Serving controllers: vanilla, Window-DVFS and BEAM (S1 + S2). Plain Python + numpy.

A controller sees an :class:`EngineState` at events and returns a :class:`Decision` (chunk size,
microbatch count m, SM clock) or None to keep the current one. The same objects drive the
simulator and the real vLLM engine.

Composition of the per-shard table into pipeline predictions (BEAM §2.3, our reading of Eq. 1/2;
p stages, each a TP group of g GPUs, m in-flight microbatches, l = L(n, f), e = E(n, f) per GPU)::

  Eq.1  TTFT(c, f)   = t_queue + (k + p - 1) * l,       k = ceil(tokens up to and incl. the request / c)
        TBT(c, f)    = max(m, p) * l,                   l = L(c + d, f), d = ceil(D / m)
        E(c, f)      = g * (k * p * e + P_idle(f) * p * (p - 1) * l)
  Eq.2  TBT(m, f)    = max(m, p) * l,                   l = L(b, f), b = ceil(D / m)
        E_round(m,f) = g * (p * m * e + P_idle(f) * p * (max(m, p) - m) * l);  per token / D
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from systems.serving.profiler import LatencyEnergyTable


@dataclass
class EngineState:
    """What a controller sees. ``waiting``: FCFS prefills not finished, as (waited_s, remaining
    prompt tokens); ``num_decodes``: D requests in decode; current knobs."""
    now: float
    waiting: List[Tuple[float, int]]
    num_decodes: int
    chunk: int
    microbatches: int
    clock_mhz: float


@dataclass
class Decision:
    """Knob settings and what the model predicted for them (s, J; None where not predicted)."""
    chunk: int
    microbatches: int
    clock_mhz: float
    trigger: str = ""
    feasible: bool = True
    pred_ttft_s: Optional[float] = None
    pred_tbt_s: Optional[float] = None
    pred_energy_j: Optional[float] = None


@dataclass
class WindowStats:
    """Load seen over the last window: arrivals, their prompt tokens (sum and 90th percentile),
    time-mean decodes, window length (s), and the largest prompt-token count of any 1-s slice."""
    arrivals: int
    input_tokens: int
    mean_decodes: float
    duration_s: float
    input_p90: float = 0.0
    peak_tokens_per_s: float = 0.0


# -- Eq. 1 and Eq. 2 ---------------------------------------------------------------------------
def eq1_prefill(l, e, p_idle, k, p: int, g: int, m: int, t_queue=0.0):
    """BEAM Eq. 1 (our reading): (TTFT s, TBT of ongoing decodes s, prefill energy J).

    l, e: per-stage latency (s) and per-GPU energy (J) of one iteration of c + d tokens at f;
    p_idle: P_idle(f) (W per GPU); k: number of chunks; p stages of g GPUs; m microbatches.
    Arrays broadcast.
    """
    l = np.asarray(l, float)
    ttft = t_queue + (np.asarray(k) + p - 1) * l
    tbt = max(m, p) * l
    energy = g * (np.asarray(k) * p * np.asarray(e, float) + np.asarray(p_idle, float) * p * (p - 1) * l)
    return ttft, tbt, energy


def eq2_decode(l, e, p_idle, D: int, m, p: int, g: int):
    """BEAM Eq. 2 (our reading): (TBT s, energy per round J, energy per token J).

    l, e: per-stage latency and per-GPU energy of a microbatch of b = ceil(D/m) tokens at f.
    """
    l = np.asarray(l, float)
    m = np.asarray(m)
    mp = np.maximum(m, p)
    tbt = mp * l
    e_round = g * (p * m * np.asarray(e, float) + np.asarray(p_idle, float) * p * (mp - m) * l)
    return tbt, e_round, e_round / max(D, 1)


# -- S1 and S2 ----------------------------------------------------------------------------------
class TableSearch:
    """Exact minimum search over clocks on one table row, fast enough for event-driven use.

    Latency rows are non-increasing in the clock (the profiler enforces it), so the feasible clocks
    of a latency bound are a suffix found by bisection; the minimum of an objective
    ``w_e * E[n] + w_l * P_idle * L[n]`` over every suffix is cached per (n, w_e, w_l). The result
    equals a brute-force scan (tests compare them).
    """

    def __init__(self, table: LatencyEnergyTable, clock_idx: Optional[np.ndarray] = None):
        ci = np.arange(len(table.clocks)) if clock_idx is None else np.asarray(clock_idx)
        self.L, self.E = table.L[:, ci], table.E[:, ci]
        self.idle, self.clocks = table.idle_w[ci], table.clocks[ci]
        self.F = len(ci)
        self._neg: dict = {}
        self._best: dict = {}

    def first_ok(self, n: int, bound: float) -> int:
        """Index of the lowest clock with L[n] <= bound (F if none)."""
        row = self._neg.get(n)
        if row is None:
            row = self._neg[n] = (-self.L[n]).tolist()
        return bisect_left(row, -bound)

    def best_from(self, n: int, w_e: float, w_l: float, j: int) -> Tuple[int, float]:
        """(index, value) of the minimum of w_e*E[n] + w_l*idle*L[n] over clocks j..F-1."""
        key = (n, w_e, w_l)
        c = self._best.get(key)
        if c is None:
            obj = (w_e * self.E[n] + w_l * self.idle * self.L[n]).tolist()
            idx, val = [0] * self.F, [0.0] * self.F
            bi, bv = self.F - 1, obj[-1]
            for i in range(self.F - 1, -1, -1):
                if obj[i] <= bv:
                    bi, bv = i, obj[i]
                idx[i], val[i] = bi, bv
            if len(self._best) > 200_000:
                self._best.clear()
            c = self._best[key] = (idx, val)
        return c[0][j], c[1][j]


def s1_search(search: TableSearch, waiting: Sequence[Tuple[float, int]], D: int, m: int,
              p: int, g: int, chunks: Sequence[int], slo_ttft: float, slo_tbt: float) -> Decision:
    """Alg. 1: minimum Eq.1 energy over chunk x clock subject to every waiting request's TTFT SLO
    and the ongoing decodes' TBT SLO (``waiting``: FCFS (waited s, remaining tokens), the newest
    last). Requests that already waited past the TTFT SLO are not constraints (they have missed).
    Ties go to the earlier chunk candidate and the lower clock. Infeasible everywhere -> largest
    chunk at max clock, ``feasible=False``.
    """
    d = -(-D // m) if D > 0 else 0
    mp = max(m, p)
    cum, tot, cons = 0, 0, []
    for wt, tok in waiting:
        cum += tok
        if wt < slo_ttft:
            cons.append((slo_ttft - wt, cum))
    tot = cum
    t0 = waiting[-1][0] if waiting else 0.0
    best = None
    for c in chunks:
        n = c + d
        lim = slo_tbt / mp if D > 0 else math.inf
        for slack, cu in cons:
            b = slack / (-(-cu // c) + p - 1)
            if b < lim:
                lim = b
        j0 = search.first_ok(n, lim)
        if j0 >= search.F:
            continue
        k = -(-tot // c)
        j, v = search.best_from(n, float(k), float(p - 1), j0)
        if best is None or v < best[0]:
            best = (v, c, j, k)
    if best is None:
        c = max(chunks)
        n, k, j = c + d, -(-tot // c), search.F - 1
        l = float(search.L[n, j])
        e = g * p * (k * float(search.E[n, j]) + (p - 1) * float(search.idle[j]) * l)
        return Decision(int(c), m, float(search.clocks[j]), "s1", False, t0 + (k + p - 1) * l, mp * l, e)
    v, c, j, k = best
    l = float(search.L[c + d, j])
    return Decision(int(c), m, float(search.clocks[j]), "s1", True, t0 + (k + p - 1) * l, mp * l, g * p * v)


def s2_search(search: TableSearch, D: int, p: int, g: int, microbatches: Sequence[int],
              slo_tbt: float, chunk: int) -> Decision:
    """Alg. 2: minimum Eq.2 energy per token over microbatches x clock subject to TBT <= SLO.
    m is limited to <= D. Ties go to the earlier m and the lower clock. Infeasible -> the candidate
    with the lowest TBT at max clock."""
    Dp = max(D, 1)
    ms = [mm for mm in microbatches if mm <= Dp] or [min(microbatches)]
    best = None
    for m in ms:
        b = -(-Dp // m)
        mp = max(m, p)
        j0 = search.first_ok(b, slo_tbt / mp)
        if j0 >= search.F:
            continue
        j, v = search.best_from(b, float(m), float(mp - m), j0)
        if best is None or v < best[0]:
            best = (v, m, j, b)
    if best is None:
        jl = search.F - 1
        m = min(ms, key=lambda mm: max(mm, p) * float(search.L[-(-Dp // mm), jl]))
        b, mp = -(-Dp // m), max(m, p)
        l, e = float(search.L[b, jl]), float(search.E[b, jl])
        return Decision(chunk, m, float(search.clocks[jl]), "s2", False, None, mp * l,
                        g * p / Dp * (m * e + float(search.idle[jl]) * (mp - m) * l))
    v, m, j, b = best
    return Decision(chunk, m, float(search.clocks[j]), "s2", True, None, max(m, p) * float(search.L[b, j]),
                    g * p / Dp * v)


# -- controllers ---------------------------------------------------------------------------------
@dataclass
class Controller:
    """Base: fixed knobs (vanilla vLLM: max clock, default chunk, m = p). Event hooks return None."""
    table: LatencyEnergyTable
    p: int
    g: int
    slo_ttft: float
    slo_tbt: float
    default_chunk: int
    name: str = "vanilla"
    period_s: Optional[float] = None
    fixed_clock_mhz: Optional[float] = None      # start clock (default: max)

    def initial(self) -> Decision:
        f = self.fixed_clock_mhz if self.fixed_clock_mhz is not None else float(self.table.clocks[-1])
        return Decision(self.default_chunk, self.p, float(f), "init")

    def on_arrival(self, st: EngineState) -> Optional[Decision]:
        return None

    def on_finish(self, st: EngineState) -> Optional[Decision]:
        return None

    def on_decode_only(self, st: EngineState) -> Optional[Decision]:
        return None

    def on_tick(self, st: EngineState, win: WindowStats) -> Optional[Decision]:
        return None


@dataclass
class WindowDVFS(Controller):
    """Window-DVFS (DynamoLLM's DVFS part, BEAM §2.6): every ``period_s`` pick the lowest clock
    predicted to meet both SLOs at the previous window's load; chunk and m never change.

    With ``load_profile`` (the simulated backend builds one offline, like DynamoLLM's profiles):
    see :meth:`profiled_choice`. Without one (real engine), the analytic prediction below.

    Prediction at each clock f (our reconstruction of "expected to meet the SLOs at that load"):
    the steady round time R of m microbatches when prefill tokens arrive at the window's rate (the
    larger of its mean and its busiest 1-s slice, plus the prompt tokens still queued at its end
    per window second) and D decodes are spread over the slots solves R = m * L(D/m + q, f) with q = rate * R / m
    prefill tokens per microbatch (fixed-point iteration); q > chunk means overload. Then
    TBT = max(R, p * L(D/m + q)) and TTFT of a p90-long prompt X = R / m + (ceil(X / c) + p - 1) *
    L(min(c, X + q) + D/m). The clock is the lowest feasible one, raised to the energy valley of the
    typical microbatch (D/m + q tokens) if below it. No feasible clock -> max clock.
    """
    name: str = "window_dvfs"
    period_s: Optional[float] = 5.0
    load_profile: Optional[dict] = None

    def profiled_choice(self, win: WindowStats, backlog_tokens: float) -> Optional[Decision]:
        """With an offline load profile (``loads`` prompt tokens/s ascending, ``clocks`` MHz
        ascending, ``ttft_p90``/``tbt_p90`` [load, clock] in s, as DynamoLLM profiles): the lowest
        clock whose profiled P90 TTFT and P90 TBT meet the SLOs at the first profiled load >= the
        window's (prompt tokens + backlog) / window length. None without a profile."""
        pr = self.load_profile
        if not pr:
            return None
        load = (win.input_tokens + backlog_tokens) / max(win.duration_s, 1e-9)
        i = int(np.searchsorted(pr["loads"], load, side="left"))
        if i >= len(pr["loads"]):
            return Decision(self.default_chunk, self.p, float(self.table.clocks[-1]), "window", False)
        ok = (pr["ttft_p90"][i] <= self.slo_ttft) & (pr["tbt_p90"][i] <= self.slo_tbt)
        if not ok.any():
            return Decision(self.default_chunk, self.p, float(self.table.clocks[-1]), "window", False)
        j = int(np.argmax(ok))
        return Decision(self.default_chunk, self.p, float(pr["clocks"][j]), "window", True,
                        float(pr["ttft_p90"][i][j]), float(pr["tbt_p90"][i][j]))

    def predict(self, win: WindowStats, m: int, backlog_tokens: float = 0.0):
        """(TTFT s, TBT s, feasible-load mask) over clocks, and the valley clock index."""
        T = self.table
        rate_tok = (max(win.input_tokens / max(win.duration_s, 1e-9), win.peak_tokens_per_s)
                    + backlog_tokens / max(win.duration_s, 1e-9))
        d = win.mean_decodes / m
        c = self.default_chunk
        n_max = T.n_max

        def lat(n):
            n = np.clip(n, 1, n_max)
            lo = np.floor(n).astype(np.int64)
            return T.L[lo, np.arange(len(T.clocks))]
        R = m * lat(np.full(len(T.clocks), max(d, 1.0)))
        for _ in range(40):
            q = rate_tok * R / m
            R = m * lat(d + np.minimum(q, c) + 1e-9)
        q = rate_tok * R / m
        stable = q <= c
        tbt = np.maximum(R, self.p * lat(d + np.minimum(q, c)))
        X = win.input_p90
        k = max(1, math.ceil(X / c)) if X > 0 else 1
        ttft = R / m + (k + self.p - 1) * lat(np.minimum(c, X + q) + d)
        n_typ = int(np.clip(round(d + float(np.median(np.minimum(q, c)))), 1, n_max))
        return ttft, tbt, stable, int(np.argmin(T.E[n_typ]))

    def on_tick(self, st: EngineState, win: WindowStats) -> Optional[Decision]:
        backlog = float(sum(t for _, t in st.waiting))
        if self.load_profile:
            return self.profiled_choice(win, backlog)
        ttft, tbt, stable, j_valley = self.predict(win, st.microbatches, backlog)
        ok = stable & (tbt <= self.slo_tbt) & ((ttft <= self.slo_ttft) | (win.arrivals == 0))
        if not ok.any():
            return Decision(st.chunk, st.microbatches, float(self.table.clocks[-1]), "window", False)
        # lowest feasible clock, but not below the energy valley of the typical microbatch (clocks
        # below it cost more time and more energy: Pareto-dominated)
        j = max(int(np.argmax(ok)), j_valley)
        return Decision(st.chunk, st.microbatches, float(self.table.clocks[j]), "window", True,
                        float(ttft[j]) if win.arrivals else None, float(tbt[j]))


@dataclass
class Beam(Controller):
    """BEAM (event-driven): S1 (Alg. 1) on prefill arrival and on a finish while prefills wait;
    S2 (Alg. 2) on entering/updating a decode-only state. S1 restores m = p (a chunked prefill is
    pipelined over all stages); S2's m holds only while the engine is decode-only. Ablations: ``search_chunk=False`` keeps
    the default chunk (DVFS only / +S2), ``search_microbatch=False`` keeps m = p."""
    name: str = "beam"
    chunks: Sequence[int] = (128, 256, 512, 1024, 2048)
    microbatches: Sequence[int] = ()
    search_chunk: bool = True
    search_microbatch: bool = True
    clock_idx: Optional[np.ndarray] = None
    decisions: int = 0

    def __post_init__(self):
        if not self.microbatches:
            self.microbatches = tuple(range(1, 2 * self.p + 1))
        self.set_clocks(self.clock_idx)

    def set_clocks(self, clock_idx: Optional[np.ndarray]) -> None:
        """Restrict the clock candidates (indices into table.clocks; None = all)."""
        self.clock_idx = clock_idx
        self.search = TableSearch(self.table, clock_idx)

    def _s1(self, st: EngineState) -> Decision:
        chunks = self.chunks if self.search_chunk else (self.default_chunk,)
        # prefill needs the full pipeline (Eq.1's (k + p - 1) l assumes chunks pipelined): m = p
        return s1_search(self.search, st.waiting, st.num_decodes, self.p, self.p, self.g,
                         chunks, self.slo_ttft, self.slo_tbt)

    def _s2(self, st: EngineState) -> Decision:
        ms = self.microbatches if self.search_microbatch else (self.p,)
        return s2_search(self.search, st.num_decodes, self.p, self.g, ms, self.slo_tbt, st.chunk)

    def on_arrival(self, st):
        return self._s1(st) if st.waiting else self._s2(st)

    def on_finish(self, st):
        return self._s1(st) if st.waiting else self._s2(st)

    def on_decode_only(self, st):
        return self._s2(st)


def make_controller(kind: str, table: LatencyEnergyTable, p: int, g: int, slo_ttft: float,
                    slo_tbt: float, default_chunk: int, chunks: Sequence[int] = (),
                    microbatches: Sequence[int] = (), search_chunk: bool = True,
                    search_microbatch: bool = True, window_s: float = 5.0) -> Controller:
    """Build a controller by name: vanilla | window_dvfs | beam. Raises ValueError otherwise."""
    common = dict(table=table, p=p, g=g, slo_ttft=slo_ttft, slo_tbt=slo_tbt, default_chunk=default_chunk)
    if kind == "vanilla":
        return Controller(**common)
    if kind == "window_dvfs":
        return WindowDVFS(**common, period_s=window_s)
    if kind == "beam":
        return Beam(**common, chunks=tuple(chunks) or (default_chunk,), microbatches=tuple(microbatches),
                    search_chunk=search_chunk, search_microbatch=search_microbatch)
    raise ValueError(f"controller {kind!r}: use vanilla, window_dvfs or beam")
