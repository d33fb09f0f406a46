"""Serving controllers: vanilla, Window-DVFS and BEAM (S1 + S2). Plain Python + numpy.

A controller sees an :class:`EngineState` at events and returns a :class:`Decision` (chunk size,
microbatch count m, SM clock) or None to keep the current one. The driver
(:mod:`systems.energy_serving.driver`) calls it, on the simulator and on vLLM alike; the table it plans
with comes from a profiling pass over the backend it runs on (:mod:`systems.energy_serving.profiler`).

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
from typing import Optional, Sequence, Tuple

import numpy as np

from systems.energy_serving.profiler import LatencyEnergyTable
from systems.energy_serving.protocol import Decision, EngineState, WindowStats


# -- Eq. 1 and Eq. 2 ---------------------------------------------------------------------------
def eq1_prefill(lat, e, p_idle, k, p: int, g: int, m: int, t_queue=0.0):
    """BEAM Eq. 1 (our reading): (TTFT s, TBT of ongoing decodes s, prefill energy J).

    l, e: per-stage latency (s) and per-GPU energy (J) of one iteration of c + d tokens at f;
    p_idle: P_idle(f) (W per GPU); k: number of chunks; p stages of g GPUs; m microbatches.
    Arrays broadcast.
    """
    lat = np.asarray(lat, float)
    ttft = t_queue + (np.asarray(k) + p - 1) * lat
    tbt = max(m, p) * lat
    energy = g * (np.asarray(k) * p * np.asarray(e, float) + np.asarray(p_idle, float) * p * (p - 1) * lat)
    return ttft, tbt, energy


def eq2_decode(lat, e, p_idle, D: int, m, p: int, g: int):
    """BEAM Eq. 2 (our reading): (TBT s, energy per round J, energy per token J).

    l, e: per-stage latency and per-GPU energy of a microbatch of b = ceil(D/m) tokens at f.
    """
    lat = np.asarray(lat, float)
    m = np.asarray(m)
    mp = np.maximum(m, p)
    tbt = mp * lat
    e_round = g * (p * m * np.asarray(e, float) + np.asarray(p_idle, float) * p * (mp - m) * lat)
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


def s1_search(
    search: TableSearch,
    waiting: Sequence[Tuple[float, int]],
    D: int,
    m: int,
    p: int,
    g: int,
    chunks: Sequence[int],
    slo_ttft: float,
    slo_tbt: float,
) -> Decision:
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
        lat = float(search.L[n, j])
        e = g * p * (k * float(search.E[n, j]) + (p - 1) * float(search.idle[j]) * lat)
        return Decision(int(c), m, float(search.clocks[j]), "s1", False, t0 + (k + p - 1) * lat, mp * lat, e)
    v, c, j, k = best
    lat = float(search.L[c + d, j])
    return Decision(int(c), m, float(search.clocks[j]), "s1", True, t0 + (k + p - 1) * lat, mp * lat, g * p * v)


def s2_search(
    search: TableSearch, D: int, p: int, g: int, microbatches: Sequence[int], slo_tbt: float, chunk: int
) -> Decision:
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
        lat, e = float(search.L[b, jl]), float(search.E[b, jl])
        return Decision(
            chunk,
            m,
            float(search.clocks[jl]),
            "s2",
            False,
            None,
            mp * lat,
            g * p / Dp * (m * e + float(search.idle[jl]) * (mp - m) * lat),
        )
    v, m, j, b = best
    return Decision(
        chunk, m, float(search.clocks[j]), "s2", True, None, max(m, p) * float(search.L[b, j]), g * p / Dp * v
    )


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
    fixed_clock_mhz: Optional[float] = None  # start clock (default: max)

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
    expected to meet both SLOs at the previous window's load; chunk and m never change.

    "Expected" comes from an offline load profile, as DynamoLLM's: ``load_profile`` (built by
    :func:`systems.energy_serving.runner.window_profile` from the controller's own table, on every backend)
    holds ``loads`` (prompt tokens/s, ascending), ``clocks`` (MHz, ascending) and the P90 TTFT and
    P90 TBT (s) measured at each [load, clock]. The window's load is its prompt tokens plus those
    still queued at its end, per second of window; the clock is the lowest one whose profiled P90s
    meet both SLOs at the first profiled load >= it. Above the profiled loads, or when no clock
    meets them: max clock, ``feasible=False``.
    """

    name: str = "window_dvfs"
    period_s: Optional[float] = 5.0
    load_profile: Optional[dict] = None

    def on_tick(self, st: EngineState, win: WindowStats) -> Optional[Decision]:
        pr = self.load_profile
        if not pr:
            raise RuntimeError(
                "Window-DVFS has no load profile (systems.energy_serving.runner.window_profile builds it)"
            )
        load = (win.input_tokens + sum(t for _, t in st.waiting)) / max(win.duration_s, 1e-9)
        i = int(np.searchsorted(pr["loads"], load, side="left"))
        if i >= len(pr["loads"]):
            return Decision(self.default_chunk, self.p, float(self.table.clocks[-1]), "window", False)
        ok = (pr["ttft_p90"][i] <= self.slo_ttft) & (pr["tbt_p90"][i] <= self.slo_tbt)
        if not ok.any():
            return Decision(self.default_chunk, self.p, float(self.table.clocks[-1]), "window", False)
        j = int(np.argmax(ok))
        return Decision(
            self.default_chunk,
            self.p,
            float(pr["clocks"][j]),
            "window",
            True,
            float(pr["ttft_p90"][i][j]),
            float(pr["tbt_p90"][i][j]),
        )


@dataclass
class Beam(Controller):
    """BEAM (event-driven): S1 (Alg. 1) on prefill arrival and on a finish while prefills wait;
    S2 (Alg. 2) on entering/updating a decode-only state. S1 restores m = p (a chunked prefill is
    pipelined over all stages); S2's m holds only while the engine is decode-only. Ablations:
    ``search_chunk=False`` keeps the default chunk (DVFS only / +S2), ``search_microbatch=False`` keeps m = p."""

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
        self._s2_memo: dict = {}  # S2 is a function of its arguments and the table: (D, chunk, ...) -> Decision

    def _s1(self, st: EngineState) -> Decision:
        chunks = self.chunks if self.search_chunk else (self.default_chunk,)
        # prefill needs the full pipeline (Eq.1's (k + p - 1) l assumes chunks pipelined): m = p
        return s1_search(
            self.search, st.waiting, st.num_decodes, self.p, self.p, self.g, chunks, self.slo_ttft, self.slo_tbt
        )

    def _s2(self, st: EngineState) -> Decision:
        ms = self.microbatches if self.search_microbatch else (self.p,)
        key = (st.num_decodes, st.chunk, tuple(ms), self.p, self.g, self.slo_tbt)
        d = self._s2_memo.get(key)
        if d is None:
            d = self._s2_memo[key] = s2_search(self.search, st.num_decodes, self.p, self.g, ms, self.slo_tbt, st.chunk)
        return d

    def on_arrival(self, st):
        return self._s1(st) if st.waiting else self._s2(st)

    def on_finish(self, st):
        return self._s1(st) if st.waiting else self._s2(st)

    def on_decode_only(self, st):
        return self._s2(st)


def _vanilla(common: dict, **_) -> Controller:
    return Controller(**common)


def _window_dvfs(common: dict, window_s: float, **_) -> Controller:
    return WindowDVFS(**common, period_s=window_s)


def _beam(common: dict, chunks, microbatches, search_chunk: bool, search_microbatch: bool, **_) -> Controller:
    return Beam(
        **common,
        chunks=tuple(chunks) or (common["default_chunk"],),
        microbatches=tuple(microbatches),
        search_chunk=search_chunk,
        search_microbatch=search_microbatch,
    )


# ``system.controller`` -> how it is built (config.CONTROLLERS lists these names for validation)
CONTROLLERS = {"vanilla": _vanilla, "window_dvfs": _window_dvfs, "beam": _beam}


def make_controller(
    kind: str,
    table: LatencyEnergyTable,
    p: int,
    g: int,
    slo_ttft: float,
    slo_tbt: float,
    default_chunk: int,
    chunks: Sequence[int] = (),
    microbatches: Sequence[int] = (),
    search_chunk: bool = True,
    search_microbatch: bool = True,
    window_s: float = 5.0,
) -> Controller:
    """Build the controller named ``kind`` (:data:`CONTROLLERS`). Raises ValueError for another name."""
    if kind not in CONTROLLERS:
        raise ValueError(f"controller {kind!r}: use {', '.join(CONTROLLERS)}")
    common = dict(table=table, p=p, g=g, slo_ttft=slo_ttft, slo_tbt=slo_tbt, default_chunk=default_chunk)
    return CONTROLLERS[kind](
        common,
        chunks=chunks,
        microbatches=microbatches,
        search_chunk=search_chunk,
        search_microbatch=search_microbatch,
        window_s=window_s,
    )
