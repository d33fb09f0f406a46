"""Roofline cost model and asymmetric KV allocation (FastTTS §4.3, "M").

Units: bytes, seconds, FLOP, tokens. Shapes come from ``ModelConfig``-like objects (num_layers,
hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size, vocab_size, dtype) and the
hardware profile (peak_flops, mem_bw, flops_efficiency, mem_efficiency, launch_overhead_s), or,
for a profile measured by ``systems.verifier_search.calibrate``, its per-stage fits (``measured.tts``).

The allocation minimises (FastTTS §4.3, Eq. 1)

    T_tot = ceil(N/B_pre) * T_roof^pre(B_pre, S) + ceil(N/B_dec) * S_dec * T_roof^dec(B_dec, S_cache)
    s.t.    B_pre * KVBytes(1, S) + B_dec * KVBytes(1, S_ctx) <= M

with T_roof = max(FLOPs / P, Bytes / BW) and KVBytes(1, S) = 2 * L * H_kv * d_head * S * bytes.
The FLOP/byte terms are not given by the paper; ours are the standard instantiation written in
in this module. T_tot is separable (f(B_pre) + g(B_dec)) and the constraint is a
budget, so the exact optimum is min over B_pre of f(B_pre) + min_{b <= D(B_pre)} g(b): a prefix
minimum over g, vectorised (no convexity assumed). Ties go to the larger decode batch, then to
the smaller prefill batch.

M plans from a profiled table (:class:`StageTable`, :func:`profile_table`): each T_roof above is
multiplied by the interpolated ratio profiled / roofline of a profiling pass with error (issue 38,
item 10: M must not plan with the simulator's own cost model); without a table, the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a model (see module docstring for units)."""

    num_params: float  # parameters multiplied per token (harness.model_facts.forward_params)
    num_layers: int
    hidden_size: int
    kv_bytes_per_token: float  # 2 * L * H_kv * d_head * bytes
    weight_bytes: float  # every weight (memory held)
    vocab_size: int
    head_params: float = 0.0  # of num_params: the vocabulary projection, applied per sampled position
    dtype_bytes: int = 2

    @staticmethod
    def of(m) -> "ModelShape":
        from harness import model_facts as mf

        # FLOPs count the matmul weights (embedding lookups are free); memory holds every weight
        return ModelShape(
            float(mf.forward_params(m)),
            int(m.num_layers),
            int(m.hidden_size),
            float(mf.kv_bytes_per_token(m)),
            float(mf.weight_bytes(m)),
            int(m.vocab_size),
            float(mf.lm_head_params(m)),
            mf.dtype_bytes(m.dtype),
        )

    @property
    def body_params(self) -> float:
        """Parameters multiplied at every position (all but the vocabulary projection)."""
        return self.num_params - self.head_params

    @property
    def read_bytes(self) -> float:
        """Weight bytes a forward pass streams: the multiplied weights, not the embedding table
        (only its looked-up rows are read) unless it doubles as the LM head."""
        return self.num_params * self.dtype_bytes


@dataclass(frozen=True)
class Roofline:
    """Achievable compute P (FLOP/s) and bandwidth BW (B/s) of a device, a fixed cost per layer
    per forward (s), a fixed cost per engine step (s; scheduler and host work) and per sampled
    sequence (s; the sampler), the last two measured on a CPU. ``additive``: compute and memory
    time add up (measured on a CPU, whose single thread does not overlap them) instead of the
    roofline's max (a GPU)."""

    flops: float
    bw: float
    launch_per_layer_s: float = 0.0
    step_s: float = 0.0
    additive: bool = False
    seq_s: float = 0.0  # per sampled sequence per step (host-side sampling, measured on CPU)

    @staticmethod
    def of(hw, stage: str = "decode") -> "Roofline":
        """The roofline of a hardware profile for one stage: ``decode`` (generator steps) or
        ``prefill`` (verifier passes). A profile measured by ``systems.verifier_search.calibrate`` holds a fit
        per stage under ``measured.tts.<stage>`` (flops, bw, step_s, seq_s, form max | sum), used
        as it is; otherwise the datasheet peaks x efficiencies and the per-layer launch cost."""
        fit = ((hw.get("measured") or {}).get("tts") or {}).get(stage)
        if fit:
            return Roofline(
                float(fit["flops"]),
                float(fit["bw"]),
                0.0,
                float(fit["step_s"]),
                fit["form"] == "sum",
                float(fit["seq_s"]),
            )
        return Roofline(
            float(hw.peak_flops) * float(hw.flops_efficiency),
            float(hw.mem_bw) * float(hw.mem_efficiency),
            float(hw.launch_overhead_s),
        )

    def busy_s(self, flops, byts):
        """Seconds of compute and memory traffic: max(FLOPs/P, Bytes/BW), or their sum when
        ``additive`` (numpy-broadcastable)."""
        a, b = flops / self.flops, byts / self.bw
        if self.additive:
            return a + b
        return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)

    def fixed_s(self, m: "ModelShape") -> float:
        """Fixed seconds of one forward of model ``m``: per-layer launches + the per-step cost."""
        return m.num_layers * self.launch_per_layer_s + self.step_s


def t_prefill(m: ModelShape, hw: Roofline, batch, seq_len):
    """Roofline time (s) of one verifier prefill pass of ``batch`` sequences of ``seq_len`` new
    tokens (numpy-broadcastable). FLOPs = 2*body params*B*S + 2*L*d*B*S^2 (causal attention; a
    PRM's head runs at every position, no vocabulary projection); Bytes = weights read + B*S*KV/token."""
    B, S = batch, seq_len
    flops = 2 * m.body_params * B * S + 2 * m.num_layers * m.hidden_size * B * S * S
    byts = m.read_bytes + B * S * m.kv_bytes_per_token
    return hw.busy_s(flops, byts) + hw.fixed_s(m)


def t_decode(m: ModelShape, hw: Roofline, batch, ctx_len):
    """Roofline time (s) of one decode step for ``batch`` sequences with ``ctx_len`` cached tokens
    each. FLOPs = 2*params*B + 4*L*d*B*ctx; Bytes = weights read + B*ctx*KV/token; + B sampled sequences."""
    B, C = batch, ctx_len
    flops = 2 * m.num_params * B + 4 * m.num_layers * m.hidden_size * B * C
    byts = m.read_bytes + B * C * m.kv_bytes_per_token
    return hw.busy_s(flops, byts) + hw.fixed_s(m) + hw.seq_s * B


@dataclass(frozen=True)
class Allocation:
    """Result of the search: batches, KV bytes per engine, predicted T_tot (s), whether the
    offload extension (§4.3.2) was chosen."""

    b_pre: int
    b_dec: int
    gen_kv_bytes: int
    ver_kv_bytes: int
    t_tot_s: float
    offload: bool = False


class MemoryTooSmall(ValueError):
    """The KV budget cannot hold one verifier and one generator sequence."""


def _f_pre(
    ver: ModelShape, hw: Roofline, n: int, b_pre: np.ndarray, s: float, table: Optional["StageTable"] = None
) -> np.ndarray:
    """ceil(N/B_pre) * T^pre(B_pre, S): :func:`t_prefill` with the scalars folded (fast path), read
    through the profiled ``table`` when one is given (:meth:`StageTable.ratio`)."""
    a = 2 * ver.body_params * s + 2 * ver.num_layers * ver.hidden_size * s * s
    t = hw.busy_s(b_pre * a, b_pre * s * ver.kv_bytes_per_token + ver.read_bytes) + hw.fixed_s(ver)
    if table is not None:
        t = t * table.ratio("prefill", b_pre, s)
    return np.ceil(n / b_pre) * t


def _g_dec(
    gen: ModelShape,
    hw: Roofline,
    n: int,
    b_dec: np.ndarray,
    s_dec: float,
    s_cache: float,
    table: Optional["StageTable"] = None,
) -> np.ndarray:
    """ceil(N/B_dec) * S_dec * T^dec(B_dec, S_cache): :func:`t_decode` folded (fast path), read
    through the profiled ``table`` when one is given (:meth:`StageTable.ratio`)."""
    a = 2 * gen.num_params + 4 * gen.num_layers * gen.hidden_size * s_cache
    t = (
        hw.busy_s(b_dec * a, b_dec * s_cache * gen.kv_bytes_per_token + gen.read_bytes)
        + hw.fixed_s(gen)
        + hw.seq_s * b_dec
    )
    if table is not None:
        t = t * table.ratio("decode", b_dec, s_cache)
    return np.ceil(n / b_dec) * (s_dec * t)


def table_grid(max_batch: int, max_len: int) -> tuple:
    """The (batch sizes, context lengths) a profiling pass measures: powers of two from 1 up to the
    first one >= ``max_batch`` (sequences), and from 16 up to the first one >= ``max_len`` (tokens),
    each with the bound itself. Shapes (I,), (J,), ascending, float."""

    def pow2(lo: int, hi: int) -> np.ndarray:
        k = lo
        pts = {int(hi)}
        while True:
            pts.add(k)
            if k >= hi:
                break
            k *= 2
        return np.array(sorted(pts), float)

    return pow2(1, max(1, int(max_batch))), pow2(16, max(16, int(max_len)))


@dataclass(frozen=True)
class StageTable:
    """A profiled table of one pass of each stage: T^pre(B, S) (verifier prefill of B sequences of
    S tokens) and T^dec(B, C) (generator decode step of B sequences with C cached tokens), seconds,
    measured at ``batches`` x ``contexts`` (shapes (I,), (J,); ``pre``, ``dec``: (I, J)).

    Between and beyond the grid the table is read through the roofline's shape (the planner's own
    model, FastTTS §4.3): the planned time of a pass is T_roof(B, S) * rho(B, S), rho the ratio
    profiled / roofline at the grid points, interpolated bilinearly in (log2 B, log2 S) and held at
    the grid's edges. At a grid point the plan uses the profiled time; with an exact profile (rho
    = 1 everywhere) the plan is the roofline's, bit for bit. Built by :func:`profile_table`."""

    batches: np.ndarray
    contexts: np.ndarray
    pre: np.ndarray
    dec: np.ndarray
    pre_ratio: np.ndarray
    dec_ratio: np.ndarray

    def ratio(self, stage: str, batch, ctx: float) -> np.ndarray:
        """rho(B, S) of ``stage`` (``prefill`` | ``decode``) for batches ``batch`` (array) at one
        context ``ctx`` (tokens): bilinear in (log2 B, log2 S), held at the edges; shape of ``batch``."""
        r = self.pre_ratio if stage == "prefill" else self.dec_ratio
        lb, ls = np.log2(self.batches), np.log2(self.contexts)
        # along the context: the column pair around ctx (a + (b - a) * t: exact where a == b)
        x = float(np.clip(np.log2(max(float(ctx), 1.0)), ls[0], ls[-1]))
        j = int(min(np.searchsorted(ls, x, side="right") - 1, len(ls) - 2)) if len(ls) > 1 else 0
        if len(ls) > 1:
            t = (x - ls[j]) / (ls[j + 1] - ls[j])
            col = r[:, j] + (r[:, j + 1] - r[:, j]) * t
        else:
            col = r[:, 0]
        # along the batch
        y = np.clip(np.log2(np.maximum(np.asarray(batch, float), 1.0)), lb[0], lb[-1])
        if len(lb) == 1:
            return np.broadcast_to(col[0], y.shape).astype(float)
        i = np.minimum(np.searchsorted(lb, y, side="right") - 1, len(lb) - 2)
        u = (y - lb[i]) / (lb[i + 1] - lb[i])
        return col[i] + (col[i + 1] - col[i]) * u


def profile_table(
    gen: ModelShape,
    ver: ModelShape,
    dec_hw: Roofline,
    pre_hw: Roofline,
    max_batch: int,
    max_len: int,
    error=None,
    rng: Optional[np.random.Generator] = None,
) -> StageTable:
    """The profiling pass M plans from: each stage's pass timed at :func:`table_grid` (``max_batch``
    sequences, ``max_len`` tokens) as :func:`t_prefill` / :func:`t_decode` charge it on ``pre_hw`` /
    ``dec_hw``, seen through ``error`` (a :class:`systems.common.profile_error.ProfileError`,
    BEAM's profiling error: bias and seeded Gaussian noise per measurement; None = exact), prefill
    table first, row by row. Returns a :class:`StageTable`."""
    b, c = table_grid(max_batch, max_len)
    B, C = b[:, None], c[None, :]
    pre_true = np.asarray(t_prefill(ver, pre_hw, B, C), float) * np.ones((len(b), len(c)))
    dec_true = np.asarray(t_decode(gen, dec_hw, B, C), float) * np.ones((len(b), len(c)))
    if error is None:
        pre, dec = pre_true, dec_true
    else:
        rng = rng if rng is not None else np.random.default_rng(0)
        pre, dec = error.apply(pre_true, rng), error.apply(dec_true, rng)
    return StageTable(b, c, pre, dec, pre / pre_true, dec / dec_true)


def search_allocation(
    gen: ModelShape,
    ver: ModelShape,
    hw: Roofline,
    budget_bytes: float,
    n: int,
    s_ver: float,
    s_ctx: float,
    s_dec: float,
    offload: bool = False,
    offload_bw: Optional[float] = None,
    pre_hw: Optional[Roofline] = None,
    table: Optional[StageTable] = None,
) -> Allocation:
    """Roofline-guided KV allocation (FastTTS §4.3.1; offload §4.3.2).

    Args:
        gen, ver: generator / verifier shapes. hw: roofline of generator decode (and of verifier
        prefill unless ``pre_hw`` is given). budget_bytes: M, KV bytes for both.
        n: number of beams N. s_ver: verifier input length S (tokens). s_ctx: generator sequence
        length held in KV while decoding (tokens). s_dec: decode horizon S_dec (tokens per step).
        offload: also consider giving each stage the whole budget while the inactive model's KV
        sits in host memory; the swap of both KV sets is charged at ``offload_bw`` (B/s).
        table: a profiled :class:`StageTable` the stage times are read from (None: the roofline).
    Returns: the Allocation minimising T_tot (ties: larger B_dec, then smaller B_pre).
    Raises: MemoryTooSmall when not even B_pre = B_dec = 1 fits.
    """
    k_pre = ver.kv_bytes_per_token * s_ver
    k_dec = gen.kv_bytes_per_token * s_ctx
    if k_pre + k_dec > budget_bytes:
        raise MemoryTooSmall(
            f"KV budget {budget_bytes / 2**20:.1f} MiB < one verifier sequence "
            f"({k_pre / 2**20:.1f} MiB) + one generator sequence ({k_dec / 2**20:.1f} MiB)"
        )
    s_cache = s_ctx - s_dec / 2.0
    pre_hw = pre_hw or hw
    pre_max = int(min(n, (budget_bytes - k_dec) // k_pre))
    dec_max = int(min(n, (budget_bytes - k_pre) // k_dec))
    b_pre = np.arange(1.0, pre_max + 1)
    b_dec = np.arange(1.0, dec_max + 1)
    f = _f_pre(ver, pre_hw, n, b_pre, s_ver, table)
    g = _g_dec(gen, hw, n, b_dec, s_dec, s_cache, table)
    G = np.minimum.accumulate(g)  # best g over b <= d
    Gb = np.maximum.accumulate(np.where(g <= G, b_dec, 0.0))  # largest b attaining it
    d = np.minimum(dec_max, ((budget_bytes - b_pre * k_pre) // k_dec).astype(np.int64)) - 1
    tot = f + G[d]  # d >= 0 for every b_pre <= pre_max
    bd = Gb[d]
    cand = np.flatnonzero(tot == tot.min())
    i = int(cand[np.argmax(bd[cand])]) if len(cand) > 1 else int(cand[0])  # larger B_dec, then smaller B_pre
    bp, bdd = i + 1, int(bd[i])
    best = Allocation(bp, bdd, int(budget_bytes - bp * k_pre), int(bp * k_pre), float(tot[i]))
    if offload:
        bp_o = min(n, int(budget_bytes // k_pre))
        b_all = np.arange(1, min(n, int(budget_bytes // k_dec)) + 1, dtype=float)
        g_all = _g_dec(gen, hw, n, b_all, s_dec, s_cache, table)
        bd_o = int(b_all[np.lexsort((-b_all, g_all))[0]])
        swap = 2.0 * budget_bytes / (offload_bw or hw.bw)
        t_off = float(
            _f_pre(ver, pre_hw, n, np.array([bp_o], float), s_ver, table)[0]
            + _g_dec(gen, hw, n, np.array([bd_o], float), s_dec, s_cache, table)[0]
            + swap
        )
        if t_off < best.t_tot_s:
            return Allocation(bp_o, bd_o, int(budget_bytes), int(budget_bytes), t_off, True)
    return best


def brute_force_allocation(
    gen: ModelShape,
    ver: ModelShape,
    hw: Roofline,
    budget_bytes: float,
    n: int,
    s_ver: float,
    s_ctx: float,
    s_dec: float,
    pre_hw: Optional[Roofline] = None,
    table: Optional[StageTable] = None,
) -> Allocation:
    """Reference: every feasible (B_pre, B_dec) pair in [1, n]^2; same objective and tie rule.
    O(n^2); for tests."""
    k_pre = ver.kv_bytes_per_token * s_ver
    k_dec = gen.kv_bytes_per_token * s_ctx
    s_cache = s_ctx - s_dec / 2.0
    best = None
    for bp in range(1, n + 1):
        for bd in range(1, n + 1):
            if bp * k_pre + bd * k_dec > budget_bytes:
                continue
            t = float(
                _f_pre(ver, pre_hw or hw, n, np.array([bp], float), s_ver, table)[0]
                + _g_dec(gen, hw, n, np.array([bd], float), s_dec, s_cache, table)[0]
            )
            key = (t, -bd, bp)
            if best is None or key < best[0]:
                best = (key, bp, bd)
    if best is None:
        raise MemoryTooSmall("nothing fits")
    (t, _, _), bp, bd = best
    return Allocation(bp, bd, int(budget_bytes - bp * k_pre), int(bp * k_pre), t)
