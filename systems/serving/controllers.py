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
from dataclasses import dataclass, field
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
    """Load seen over the last window: arrivals, their prompt tokens, time-mean decodes, length (s)."""
    arrivals: int
    input_tokens: int
    mean_decodes: float
    duration_s: float


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
def s1_search(table: LatencyEnergyTable, waiting: Sequence[Tuple[float, int]], D: int, m: int,
              p: int, g: int, chunks: Sequence[int], slo_ttft: float, slo_tbt: float,
              clock_idx: Optional[np.ndarray] = None) -> Decision:
    """Alg. 1: minimum Eq.1 energy over chunk x clock subject to every waiting request's TTFT SLO
    and the ongoing decodes' TBT SLO. Requests that already waited past the TTFT SLO are not
    constraints (they have missed). Infeasible everywhere -> largest chunk at max clock,
    ``feasible=False``.
    """
    C = np.asarray(chunks, dtype=np.int64)
    ci = np.arange(len(table.clocks)) if clock_idx is None else np.asarray(clock_idx)
    d = -(-D // m) if D > 0 else 0
    L, E = table.rows(C + d)
    L, E = L[:, ci], E[:, ci]
    idle = table.idle_w[ci]
    w = np.array([x[0] for x in waiting], float)
    cum = np.cumsum([x[1] for x in waiting]).astype(float)
    live = w < slo_ttft
    total = cum[-1] if len(cum) else 0.0
    k_all = np.ceil(total / C)
    ttft, tbt, energy = eq1_prefill(L, E, idle, k_all[:, None], p, g, m)
    if live.any():
        k = np.ceil(cum[live][:, None] / C[None, :])                 # (I, K)
        bound = np.min((slo_ttft - w[live])[:, None] / (k + p - 1), axis=0)   # max l per chunk
        ok = L <= bound[:, None]
    else:
        ok = np.ones_like(L, bool)
    t_new = (w[-1] if len(w) else 0.0) + ttft          # TTFT of the newest waiting request
    if D > 0:
        ok &= tbt <= slo_tbt
    if not ok.any():
        j = len(table.clocks) - 1
        kk = int(np.argmax(C))
        Lf, Ef = table.rows(np.array([C[kk] + d]))
        t, b, en = eq1_prefill(Lf[0, j], Ef[0, j], table.idle_w[j], k_all[kk], p, g, m)
        t0 = w[-1] if len(w) else 0.0
        return Decision(int(C[kk]), m, float(table.clocks[j]), "s1", False, float(t0 + t), float(b), float(en))
    en = np.where(ok, energy, np.inf)
    a, b = np.unravel_index(int(np.argmin(en)), en.shape)
    return Decision(int(C[a]), m, float(table.clocks[ci[b]]), "s1", True, float(t_new[a, b]),
                    float(tbt[a, b]), float(energy[a, b]))


def s2_search(table: LatencyEnergyTable, D: int, p: int, g: int, microbatches: Sequence[int],
              slo_tbt: float, chunk: int, clock_idx: Optional[np.ndarray] = None) -> Decision:
    """Alg. 2: minimum Eq.2 energy per token over microbatches x clock subject to TBT <= SLO.
    m is limited to <= D. Infeasible -> the candidate with the lowest TBT at max clock."""
    M = np.asarray([mm for mm in microbatches if mm <= max(D, 1)] or [min(microbatches)], dtype=np.int64)
    ci = np.arange(len(table.clocks)) if clock_idx is None else np.asarray(clock_idx)
    b = -(-max(D, 1) // M)
    L, E = table.rows(b)
    L, E = L[:, ci], E[:, ci]
    tbt, e_round, e_tok = eq2_decode(L, E, table.idle_w[ci], D, M[:, None], p, g)
    ok = tbt <= slo_tbt
    if not ok.any():
        a = int(np.argmin(tbt[:, -1]))
        return Decision(chunk, int(M[a]), float(table.clocks[ci[-1]]), "s2", False, None,
                        float(tbt[a, -1]), float(e_tok[a, -1]))
    en = np.where(ok, e_tok, np.inf)
    a, j = np.unravel_index(int(np.argmin(en)), en.shape)
    return Decision(chunk, int(M[a]), float(table.clocks[ci[j]]), "s2", True, None, float(tbt[a, j]),
                    float(e_tok[a, j]))


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

    def initial(self) -> Decision:
        return Decision(self.default_chunk, self.p, float(self.table.clocks[-1]), "init")

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

    Prediction at clock f (our reconstruction): one request of mean prompt X in k = ceil(X/c)
    chunks, prefill utilisation rho = lambda * k * L(c + d, f) (lambda = arrivals/s),
    TTFT = (k + p - 1) * l + rho / (1 - rho) * k * l / 2 (M/D/1 wait), mean
    TBT = max(m, p) * (rho * L(c + d, f) + (1 - rho) * L(d, f)). Needs rho < 1. No feasible clock
    -> max clock.
    """
    name: str = "window_dvfs"
    period_s: Optional[float] = 5.0

    def predict(self, win: WindowStats, m: int):
        """Arrays over clocks: (TTFT s, mean TBT s, rho)."""
        lam = win.arrivals / max(win.duration_s, 1e-9)
        X = win.input_tokens / win.arrivals if win.arrivals else 0.0
        D = win.mean_decodes
        d = int(math.ceil(D / m)) if D > 0 else 0
        c = self.default_chunk
        k = max(1, math.ceil(X / c)) if X > 0 else 0
        l_c, _ = self.table.rows(np.array([min(c, max(int(X), 1)) + d]))
        l_d, _ = self.table.rows(np.array([max(d, 1)]))
        l_c, l_d = l_c[0], l_d[0]
        rho = lam * k * l_c
        with np.errstate(divide="ignore", invalid="ignore"):
            ttft = (k + self.p - 1) * l_c + np.where(rho < 1, rho / (1 - rho), np.inf) * k * l_c / 2
        tbt = max(m, self.p) * (np.minimum(rho, 1) * l_c + (1 - np.minimum(rho, 1)) * l_d)
        return ttft, tbt, rho

    def on_tick(self, st: EngineState, win: WindowStats) -> Optional[Decision]:
        ttft, tbt, rho = self.predict(win, st.microbatches)
        ok = (rho < 1) & (tbt <= self.slo_tbt) & ((ttft <= self.slo_ttft) | (win.arrivals == 0))
        if not ok.any():
            return Decision(st.chunk, st.microbatches, float(self.table.clocks[-1]), "window", False)
        j = int(np.argmax(ok))                        # lowest feasible clock
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

    def _s1(self, st: EngineState) -> Decision:
        chunks = self.chunks if self.search_chunk else (self.default_chunk,)
        # prefill needs the full pipeline (Eq.1's (k + p - 1) l assumes chunks pipelined): m = p
        return s1_search(self.table, st.waiting, st.num_decodes, self.p, self.p, self.g,
                         chunks, self.slo_ttft, self.slo_tbt, self.clock_idx)

    def _s2(self, st: EngineState) -> Decision:
        ms = self.microbatches if self.search_microbatch else (self.p,)
        return s2_search(self.table, st.num_decodes, self.p, self.g, ms, self.slo_tbt, st.chunk,
                         self.clock_idx)

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
