"""GPU latency / power model of one pipeline stage (a TP group): the simulator's ground truth.

One *stage iteration* runs ``n`` new tokens (prefill-chunk tokens + one token per decode) of
``layers / pp`` decoder layers on each of the ``tp`` GPUs of a stage at SM clock ``f`` (MHz).

Latency (seconds), a roofline with a clock-scaled compute part and a clock-insensitive memory part::

    t_sm(n, f)  = FLOPs(ceil(n / tile) * tile) / (peak_flops * flops_efficiency) * f_max / f
    t_mem(n, f) = (weight bytes + KV bytes read) / (mem_bw * mem_efficiency) * max(1, f_knee / f)
    t(n, f)     = max(t_sm, t_mem) + t_launch + t_comm          # t_comm: TP all-reduce + PP send

``f_knee`` models memory-bound kernels slowing down once the SM clock is too low to keep HBM busy
(an assumption, ``power.mem_knee_frac``). The tile quantisation makes latency step at tile
boundaries, which is what the profiler's tile-quantised sampling exploits (BEAM §2.5).

Power per GPU (watts), between idle and the power limit::

    P_act(f)    = a + b * (f / f_max) ** alpha          # fitted to Perseus A100 stage profiles
    P_busy(f,r) = P_idle + (P_act(f) - P_idle) * (beta + (1 - beta) * r)
    P_idle(f)   = idle_w + (blocking_w - idle_w) * f / f_max   # waiting in bubbles / on comm

``r`` is the compute-bound fraction of the kernel time (``t_sm / max(t_sm, t_mem)``); ``beta`` the
relative dynamic power of a memory-bound kernel, fitted to ML.ENERGY H100 power-vs-batch data
(:mod:`systems.energy_serving.power_fit`). Energy is power x time, so energy against ``f`` is U-shaped (the
energy valley, BEAM Fig. 2), and the valley moves with ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import numpy as np

# Parameters a hardware profile's ``power:`` dict must carry (see conf/hardware/a100-80gb.yaml).
POWER_KEYS = ("act_a_w", "act_b_w", "act_alpha", "mem_beta", "blocking_w", "mem_knee_frac", "limit_w", "tile_tokens")


def kv_bytes_per_rank(m, tp: int, pp: int = 1) -> float:
    """KV bytes per token on one rank of ``tp`` x ``pp`` (the simulator's stage model and the real
    vLLM engine's capacity both use it): vLLM splits the KV heads over the TP ranks, one head each
    (replicated) when there are fewer heads than ranks, and the layers over the pipeline stages (the
    largest stage's ceil(layers / pp) counted)."""
    from harness.model_facts import kv_bytes_per_token

    heads, layers = int(m.num_kv_heads), int(m.num_layers)
    return kv_bytes_per_token(m) / heads * max(1, heads // int(tp)) * (-(-layers // int(pp)) / layers)


@dataclass(frozen=True)
class PowerParams:
    """Fitted power-model parameters of one GPU (watts; fractions in [0, 1]; ``tile_tokens`` tokens)."""

    act_a_w: float
    act_b_w: float
    act_alpha: float
    mem_beta: float
    blocking_w: float
    mem_knee_frac: float
    limit_w: float
    tile_tokens: int

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PowerParams":
        """Raises KeyError naming the missing keys."""
        missing = [k for k in POWER_KEYS if k not in d]
        if missing:
            raise KeyError(f"hardware power model lacks {missing}; needs {list(POWER_KEYS)}")
        return cls(**{k: (int(d[k]) if k == "tile_tokens" else float(d[k])) for k in POWER_KEYS})


def p_active(f_mhz, f_max_mhz: float, pp: PowerParams):
    """Busy power of a fully compute-bound GPU at clock ``f`` (W): ``a + b (f/f_max)^alpha``."""
    return pp.act_a_w + pp.act_b_w * (np.asarray(f_mhz, dtype=float) / f_max_mhz) ** pp.act_alpha


class StageModel:
    """Latency and per-GPU power of one pipeline stage of ``model`` under (``tp``, ``pp``) on ``hw``.

    Args:
        model: model config (num_layers, hidden_size, num_heads, num_kv_heads, head_dim,
            intermediate_size, vocab_size, dtype, hf_model_type).
        hw: hardware config (peak_flops, mem_bw, efficiencies, interconnect_bw, launch_overhead_s,
            idle_w, clock_min/max_mhz, ``power`` dict with :data:`POWER_KEYS`).
        tp, pp: tensor- and pipeline-parallel degrees.
    """

    has_energy = True  # an IterationCost with a power model (systems.energy_serving.protocol)
    follows_clock = True  # latency and energy change with the SM clock

    def __init__(self, model, hw, tp: int, pp: int):
        self.tp, self.pp = int(tp), int(pp)
        self.f_max = float(hw.clock_max_mhz)
        self.f_min = float(hw.clock_min_mhz)
        self.power = PowerParams.from_dict(dict(hw.power))
        self.idle_w = float(hw.idle_w)
        from harness import model_facts as mf

        bpp = mf.dtype_bytes(model.dtype)
        h, hd = model.hidden_size, model.head_dim
        q = model.num_heads * hd
        self.layers = model.num_layers / self.pp
        # harness.model_facts, spread evenly over the stages and the TP group: all weights occupy
        # memory; the matmul weights (not the embedding lookups) are streamed and multiplied
        self.weight_bytes_gpu = mf.weight_bytes(model) / self.pp / self.tp
        self.weight_params_gpu = mf.forward_params(model) / self.pp / self.tp
        self.read_bytes_gpu = self.weight_params_gpu * bpp
        self.kv_bytes_token_gpu = kv_bytes_per_rank(model, self.tp, self.pp)  # K and V, this stage's rank
        self.attn_flops_pair_gpu = 4 * self.layers * q / self.tp  # QK^T + AV per (token, ctx)
        self.flops_rate = float(hw.peak_flops) * float(hw.flops_efficiency)
        self.bw = float(hw.mem_bw) * float(hw.mem_efficiency)
        self.t_launch = float(hw.launch_overhead_s) * self.layers
        self.act_bytes_token = h * bpp
        ic = float(hw.interconnect_bw) or 1e30
        self._ar_s_per_token = (
            2 * self.layers * 2 * (self.tp - 1) / self.tp * self.act_bytes_token / ic if self.tp > 1 else 0.0
        )
        self._ar_lat = 2 * self.layers * 8e-6 if self.tp > 1 else 0.0
        self._pp_s_per_token = self.act_bytes_token / ic if self.pp > 1 else 0.0
        self.f_knee = self.power.mem_knee_frac * self.f_max
        self._clock_terms: dict = {}  # clock -> step1's terms that depend on it alone

    # -- latency ----------------------------------------------------------------------------------
    def parts(self, n_tokens, f_mhz, ctx_tokens=0.0, attn_pairs=0.0):
        """Return (t_sm, t_mem, t_other) in seconds for a stage iteration (numpy-broadcastable).

        n_tokens: new tokens in the iteration; ctx_tokens: KV tokens read (sum of the context
        lengths of the sequences in the batch); attn_pairs: sum over new tokens of their context
        length (attention FLOPs).
        """
        n = np.asarray(n_tokens, dtype=float)
        f = np.asarray(f_mhz, dtype=float)
        tile = self.power.tile_tokens
        n_tile = np.ceil(n / tile) * tile
        flops = 2.0 * self.weight_params_gpu * n_tile + self.attn_flops_pair_gpu * np.asarray(attn_pairs, float)
        t_sm = flops / self.flops_rate * (self.f_max / f)
        t_mem = (
            (self.read_bytes_gpu + self.kv_bytes_token_gpu * np.asarray(ctx_tokens, float))
            / self.bw
            * np.maximum(1.0, self.f_knee / f)
        )
        t_other = self.t_launch + self._ar_lat + (self._ar_s_per_token + self._pp_s_per_token) * n
        return t_sm, t_mem, t_other

    def latency(self, n_tokens, f_mhz, ctx_tokens=0.0, attn_pairs=0.0):
        """Stage-iteration latency (s). See the module docstring."""
        t_sm, t_mem, t_other = self.parts(n_tokens, f_mhz, ctx_tokens, attn_pairs)
        return np.maximum(t_sm, t_mem) + t_other

    # -- power / energy ---------------------------------------------------------------------------
    def idle_power(self, f_mhz):
        """P_idle(f) (W per GPU): a GPU of an active engine waiting in a bubble or on communication."""
        f = np.asarray(f_mhz, dtype=float)
        return self.idle_w + (self.power.blocking_w - self.idle_w) * f / self.f_max

    def busy_power(self, f_mhz, compute_frac):
        """Kernel power (W per GPU) at clock f with compute-bound fraction r = compute_frac."""
        pa = p_active(f_mhz, self.f_max, self.power)
        r = np.clip(np.asarray(compute_frac, dtype=float), 0.0, 1.0)
        p = self.idle_w + (pa - self.idle_w) * (self.power.mem_beta + (1 - self.power.mem_beta) * r)
        return np.minimum(p, self.power.limit_w)

    def step(self, n_tokens, f_mhz, ctx_tokens=0.0, attn_pairs=0.0):
        """(latency s, energy J per GPU) of one stage iteration; energy = kernel + launch/comm time."""
        t_sm, t_mem, t_other = self.parts(n_tokens, f_mhz, ctx_tokens, attn_pairs)
        t_k = np.maximum(t_sm, t_mem)
        r = t_sm / np.maximum(t_k, 1e-30)
        e = self.busy_power(f_mhz, r) * t_k + self.idle_power(f_mhz) * t_other
        return t_k + t_other, e

    def step1(self, n: float, f: float, ctx_tokens: float = 0.0, attn_pairs: float = 0.0, seqs: int = 1):
        """Scalar :meth:`step` in plain floats (the simulator's hot path); same formula, its terms that
        depend on the clock alone computed once per clock. ``seqs`` (sequences in the batch) is not a
        term of this model: its matmuls count every token."""
        c = self._clock_terms.get(f) or self._terms(f)
        tile, rate, f_ratio, mem_slow, t_fixed, t_tok, dpa, beta, one_beta, limit, p_idle, w2, a, rb, kv, bw = c
        t_sm = (w2 * (-(-n // tile) * tile) + a * attn_pairs) / rate * f_ratio
        t_mem = (rb + kv * ctx_tokens) / bw * mem_slow
        t_other = t_fixed + t_tok * n
        t_k = t_sm if t_sm > t_mem else t_mem
        r = t_sm / t_k
        if r > 1.0:
            r = 1.0
        p = self.idle_w + dpa * (beta + one_beta * r)
        if p > limit:
            p = limit
        return t_k + t_other, p * t_k + p_idle * t_other

    def _terms(self, f: float) -> tuple:
        """The clock's terms of :meth:`step1`, each evaluated as the formula writes it: (tile, flops
        rate, f_max / f, memory slow-down, launch + all-reduce latency, per-token communication,
        P_active - P_idle, mem_beta, 1 - mem_beta, power limit, P_idle(f)), then the clock-free
        factors (2 x matmul params, attention FLOPs per pair, bytes read, KV bytes per token, memory
        bandwidth) so that step1 reads them all from locals."""
        pw = self.power
        pa = pw.act_a_w + pw.act_b_w * (f / self.f_max) ** pw.act_alpha
        c = (
            pw.tile_tokens,
            self.flops_rate,
            self.f_max / f,
            max(1.0, self.f_knee / f),
            self.t_launch + self._ar_lat,
            self._ar_s_per_token + self._pp_s_per_token,
            pa - self.idle_w,
            pw.mem_beta,
            1 - pw.mem_beta,
            pw.limit_w,
            self.idle1(f),
            2.0 * self.weight_params_gpu,
            self.attn_flops_pair_gpu,
            self.read_bytes_gpu,
            self.kv_bytes_token_gpu,
            self.bw,
        )
        self._clock_terms[f] = c
        return c

    def idle1(self, f: float) -> float:
        """Scalar :meth:`idle_power` (W per GPU)."""
        return self.idle_w + (self.power.blocking_w - self.idle_w) * f / self.f_max

    def clocks(self, step_mhz: int) -> np.ndarray:
        """The clock menu from f_min to f_max in ``step_mhz`` steps (MHz, ascending, f_max included)."""
        fs = np.arange(self.f_max, self.f_min - 1e-9, -float(step_mhz))[::-1]
        return fs

    def energy_valley(self, n_tokens: int, clocks: np.ndarray, ctx_tokens: float = 0.0) -> float:
        """The clock (MHz) of minimum energy per stage iteration for ``n_tokens`` (BEAM Fig. 2)."""
        _, e = self.step(n_tokens, clocks, ctx_tokens)
        return float(clocks[int(np.argmin(e))])


__all__ = ["StageModel", "PowerParams", "POWER_KEYS", "p_active"]
