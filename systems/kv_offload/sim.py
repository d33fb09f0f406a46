"""Simulated TTC executor: the same plans as the real engine, with time charged from a hardware
profile (SIMULATED numbers).

Cost model (per decoder layer, per forward launch; ``b`` beams, ``s`` cached tokens):
- compute: roofline ``max(flops / (peak_flops * flops_efficiency), t_bytes) + launch_overhead_s`` with
  ``flops = 2 b P_layer + 4 b s (n_heads head_dim)`` and ``t_bytes = P_layer * dtype / bw(b) + b (s + 1)
  kv_layer_token / (mem_bw * mem_efficiency)`` (weights re-read once per group launch, at the rate a
  matmul of ``b`` rows reads them: ``hardware.mem_bw_by_rows`` where measured, else ``mem_bw``; KV
  read by attention); the LM head likewise, plus the sampling's passes over each beam's vocabulary
  row (``plan.SAMPLING_PASSES``);
- transfers: bytes / ``h2d_bw`` or ``d2h_bw`` (one copy engine per direction);
- overlap (a GPU profile; on a ``kind: cpu`` profile every copy is synchronous and adds to the
  compute, :func:`copies_overlap`): layer-wise prefetches the first offloaded layer while the
  resident layers compute and each next offloaded layer while a layer computes (``max(compute,
  load)`` per layer, a load being ``plan.layer_load_bytes``; the step's earlier tokens of the layer
  are a device copy added to its compute); its write-backs (layers leaving residency at the step's
  start, the step tail at its end) are waited for. LBS prefetches the next group's first beams into
  the free slots while a group computes; its write-backs run on the other copy engine and are hidden
  unless longer than compute;
- prune + expand: device-side copies of parents' KV into children's dense slots (in_gpu and the
  resident layers of layer-wise) at ``2 * bytes / (mem_bw * mem_efficiency)``; LBS shares host
  segments, so expansion moves nothing. Layer-wise's reorder of its offloaded layers in host memory
  is not charged (the profiles have no host-memory bandwidth);
- scores: synthetic, seeded per (seed, beam uid, step) so pruning is deterministic.
- energy: the serving family's fitted power model (:mod:`systems.common.gpu_model`, BEAM family) at
  the profile's default clock ``f`` (the clock the latency model's peak rates stand for; the LBS
  family does no DVFS). A kernel of time ``t_k = max(t_flops, t_bytes)`` draws
  ``P_busy(f, r)`` with ``r = t_flops / t_k`` its compute-bound share (prefill near 1, decode near 0;
  device copies ``r = 0``); launch gaps and I/O stalls (the GPU waits for PCIe) draw the
  idle/blocking power ``P_idle(f)``. Copies hidden under compute add nothing beyond the kernel's
  power (assumption: copy-engine power is not modelled). A profile without a ``power:`` model
  records energy as unavailable with the reason, never 0 (:class:`systems.kv_offload.protocol.EnergyWindow`).
"""

from __future__ import annotations

import time
from typing import Optional, Sequence, Tuple

import numpy as np

from harness.model_facts import dtype_bytes, layer_params
from systems.common.groups import copies_overlap, group_time
from systems.kv_offload.plan import SAMPLING_PASSES, KVGeometry, StepPlan, sampling_dtype
from systems.kv_offload.protocol import EnergyWindow, StepOutcome
from systems.kv_offload.tree import Beam, BeamTree, mix64_array


def synthetic_logprobs(seed: int, uids: Sequence[int], step: int, tokens: int) -> np.ndarray:
    """Seeded scores: the sum over ``tokens`` of per-token log-probs ~ N(-2, 1), i.e.
    ``-2 T + sqrt(T) z`` with ``z`` standard normal from a Box-Muller transform of
    ``mix64(seed, uid, step)`` and ``mix64(seed, uid, ~step)`` (order- and batch-independent)."""
    u = np.array([int(x) for x in uids], dtype=np.uint64)
    h1, h2 = mix64_array(seed, u, step), mix64_array(seed, u, ~step & ((1 << 64) - 1))
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    u2 = (h2 >> np.uint64(11)).astype(np.float64) / 2.0**53
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return -2.0 * tokens + np.sqrt(tokens) * z


class ClockPower:
    """Power (W per GPU) at one clock from the serving family's fitted model (``StageModel.busy_power``
    and ``idle_power``, systems/common/gpu_model.py). ``clock_mhz``: the profile's default clock."""

    def __init__(self, hw, model):
        from systems.common.gpu_model import StageModel

        self.stage = StageModel(model, hw, 1, 1)
        self.clock_mhz = float(hw.clock_default_mhz or hw.clock_max_mhz)
        self.idle_w = float(self.stage.idle_power(self.clock_mhz))  # P_idle(f): launch gaps, I/O stalls

    def busy_w(self, compute_frac):
        """P_busy(f, r) of kernels with compute-bound share ``r`` (scalar or array)."""
        return self.stage.busy_power(self.clock_mhz, compute_frac)


def clock_power(hw, model) -> Tuple[Optional[ClockPower], str]:
    """(the profile's power model at its default clock, "") or (None, why energy is unavailable)."""
    from systems.common.gpu_model import POWER_KEYS

    missing = [k for k in POWER_KEYS if k not in (hw.get("power") or {})]
    if missing or not (hw.get("clock_default_mhz") or hw.get("clock_max_mhz")):
        return None, (
            f"energy unavailable: hardware={hw.name} has no fitted power model (power: lacks "
            f"{missing or 'nothing'}; clock_default_mhz={hw.get('clock_default_mhz')})"
        )
    return ClockPower(hw, model), ""


class CostModel:
    """Roofline costs of one model on one hardware profile: seconds, and joules by ``power``
    (a :class:`ClockPower`; None = energy not charged, every joule 0)."""

    def __init__(self, hw, m, power: Optional[ClockPower] = None):
        self.hw, self.m = hw, m
        self.db = dtype_bytes(m.dtype)
        self.P = layer_params(m)
        self.geom = KVGeometry.from_model(m)
        self.peak = hw.peak_flops * hw.flops_efficiency
        self.bw = hw.mem_bw * hw.mem_efficiency
        # measured rates, achieved already: not discounted by mem_efficiency (harness.calibrate)
        table = sorted((int(r), float(v)) for r, v in (hw.get("mem_bw_by_rows") or {}).items())
        self._rows = np.array([r for r, _ in table], dtype=np.float64)
        self._s_per_byte = np.array([1.0 / v for _, v in table])
        self.sample_bytes = dtype_bytes(sampling_dtype(m.dtype))
        self.power = power

    def weight_bw(self, b: int) -> float:
        """Bytes/s at which a decode launch of ``b`` beams reads weights: ``hardware.mem_bw_by_rows``
        (measured per count of rows) interpolated linearly in seconds per byte between its rows (its
        first and last rows' rates outside them: beyond the table the roofline's compute term is the
        bound); ``mem_bw`` without a table."""
        if not len(self._rows):
            return self.bw
        return 1.0 / float(np.interp(b, self._rows, self._s_per_byte))

    def _charge(self, t_flops, t_bytes, launches):
        """(seconds, joules) of kernels taking ``max(t_flops, t_bytes)`` at ``P_busy(f, r)``,
        ``r = t_flops / max(...)``, plus ``launches`` launch gaps at ``P_idle(f)``."""
        t_k = np.maximum(t_flops, t_bytes)
        t_l = launches * self.hw.launch_overhead_s
        if self.power is None:
            return t_k + t_l, 0.0 * t_k
        e = self.power.busy_w(t_flops / np.maximum(t_k, 1e-30)) * t_k + self.power.idle_w * t_l
        return t_k + t_l, e

    def layer_decode(self, b, s):
        """One layer, one token for ``b`` beams at cached lengths ``s`` (array) -> (seconds, joules)."""
        s = np.asarray(s, dtype=np.float64)
        qd = self.m.num_heads * self.m.head_dim
        flops = 2.0 * b * self.P + 4.0 * b * s * qd
        t_bytes = self.P * self.db / self.weight_bw(b) + b * (s + 1) * self.geom.kv_layer_token / self.bw
        return self._charge(flops / self.peak, t_bytes, 1)

    def head(self, b):
        """Final norm + LM head + sampling for ``b`` beams (one token) -> (seconds, joules): the LM
        head's weights read at :meth:`weight_bw` (its roofline, one launch), then the sampling's own
        memory-bound kernels at ``mem_bw`` (no launch of their own: a layer's fixed cost covers the
        step's dispatch): the logits cast to the sampling dtype when the model's differs (read + write),
        and :data:`SAMPLING_PASSES` passes over each beam's vocabulary row in the sampling dtype."""
        hv = self.m.hidden_size * self.m.vocab_size
        t, e = self._charge(2.0 * b * hv / self.peak, hv * self.db / self.weight_bw(b), 1)
        row = b * self.m.vocab_size
        cast = row * (self.db + self.sample_bytes) if self.db != self.sample_bytes else 0
        ts, es = self._charge(0.0, (cast + SAMPLING_PASSES * row * self.sample_bytes) / self.bw, 0)
        return t + ts, e + es

    def prefill(self, n_tokens: int):
        """The prompt's forward -> (seconds, joules)."""
        qd = self.m.num_heads * self.m.head_dim
        flops = self.m.num_layers * (2.0 * n_tokens * self.P + 2.0 * n_tokens * n_tokens * qd)
        flops += 2.0 * self.m.hidden_size * self.m.vocab_size
        byts = self.m.num_layers * self.P * self.db
        return self._charge(flops / self.peak, byts / self.bw, self.m.num_layers)

    def h2d(self, nbytes) -> float:
        return nbytes / self.hw.h2d_bw

    def d2h(self, nbytes) -> float:
        return nbytes / self.hw.d2h_bw

    def d2d(self, nbytes):
        """A device copy (read + write, memory-bound: r = 0) -> (seconds, joules)."""
        return self._charge(0.0, 2.0 * np.asarray(nbytes, dtype=np.float64) / self.bw, 0)

    def stall_j(self, seconds: float) -> float:
        """Joules of waiting on PCIe for ``seconds``: ``P_idle(f)`` (0 without a power model)."""
        return self.power.idle_w * seconds if self.power is not None else 0.0


class SimExecutor:
    """Carries out StepPlans on a simulated GPU (a :class:`systems.kv_offload.protocol.Executor`)."""

    simulated = True
    clock = staticmethod(time.perf_counter)  # unused: the simulator charges, it does not measure

    def __init__(self, hw, model_cfg, seed: int):
        power, self.energy_reason = clock_power(hw, model_cfg)
        self.cost = CostModel(hw, model_cfg, power)
        self.geom = self.cost.geom
        self.seed = seed
        self.hw = hw
        self.overlap = copies_overlap(hw)
        self.energy_source = f"simulated power model at {power.clock_mhz:,.0f} MHz" if power is not None else None
        self._window = [0.0, 0.0]  # joules charged since the last step_energy(): all, I/O stall

    def warmup(self, prompt_tokens: Sequence[int], num_beams: int) -> float:
        """Nothing to warm up in a cost model."""
        return 0.0

    def _charge(self, joules, stall_s: float = 0.0) -> None:
        stall_j = self.cost.stall_j(stall_s)
        self._window[0] += float(joules) + stall_j
        self._window[1] += stall_j

    def prefill(self, tree: BeamTree, prompt_tokens: Sequence[int], offload: bool) -> StepOutcome:
        """Prefill the prompt (segment 0); written back to the host unless everything stays resident."""
        n = len(prompt_tokens)
        d2h = n * self.geom.kv_token if offload else 0
        t, e = self.cost.prefill(n)
        self._charge(e)
        return StepOutcome(
            np.zeros(0), compute_s=float(t), d2h_bytes=d2h, io_stall_s=0.0, peak_device_bytes=n * self.geom.kv_token
        )

    def execute_step(self, plan: StepPlan, tree: BeamTree, beams: Sequence[Beam]) -> StepOutcome:
        c, L = self.cost, self.geom.num_layers
        n, T = plan.num_beams, plan.tokens
        s = plan.start + np.arange(T)
        out = StepOutcome(synthetic_logprobs(self.seed, [b.uid for b in beams], plan.step, T))
        if plan.resident:
            (comp, e_comp), (head, e_head) = c.layer_decode(n, s), c.head(n)
            out.compute_s = float(np.sum(L * comp) + T * head)
            energy = np.sum(L * e_comp) + T * e_head
        elif plan.scheduler == "layerwise":
            Lr = plan.layers_resident  # [T]
            off = L - Lr
            (comp, e_comp), (head, e_head) = c.layer_decode(n, s), c.head(n)  # [T] one layer
            tail, e_tail = c.d2d(n * np.arange(T) * self.geom.kv_layer_token)  # the step tail
            comp_off = comp + tail
            load = c.h2d(plan.layer_load_bytes)  # [T] one offloaded layer
            t_res = Lr * comp
            if self.overlap:  # first offloaded layer prefetched during the resident layers, then pipelined
                t_off = np.where(
                    off > 0, np.maximum(t_res, load) - t_res + (off - 1) * np.maximum(comp_off, load) + comp_off, 0.0
                )
            else:  # each offloaded layer's load, then its compute
                t_off = off * (load + comp_off)
            total = t_res + t_off + head
            out.compute_s = float(np.sum(Lr * comp + off * comp_off) + T * head)
            out.io_stall_s = (
                max(0.0, float(np.sum(total)) - out.compute_s) + c.d2h(plan.evict_bytes) + c.d2h(plan.writeback_bytes)
            )
            energy = np.sum(Lr * e_comp + off * (e_comp + e_tail)) + T * e_head
        else:  # lbs groups
            t, comp_total, energy = 0.0, 0.0, 0.0
            carried = 0.0  # bytes of this group already prefetched by the previous one
            comp_of = {}  # (compute s, J) per group size (balanced groups: two sizes)
            for gp in plan.groups:
                b = len(gp.beams)
                load_s = c.h2d(gp.load_bytes - carried)
                if b not in comp_of:
                    (cb, eb), (hb, ehb) = c.layer_decode(b, s), c.head(b)
                    comp_of[b] = (float(np.sum(L * cb) + T * hb), float(np.sum(L * eb) + T * ehb))
                comp, e_comp = comp_of[b]
                pf_s = c.h2d(gp.prefetch_bytes)
                wb_s = c.d2h(gp.writeback_bytes)
                g_time = group_time(load_s, comp, pf_s, wb_s, self.overlap)
                out.group_rows.append(
                    {
                        "step": plan.step,
                        "beams": b,
                        "load_bytes": gp.load_bytes,
                        "prefetch_bytes": gp.prefetch_bytes,
                        "compute_s": comp,
                        "time_s": g_time,
                    }
                )
                t += g_time
                comp_total += comp
                energy += e_comp
                carried = gp.prefetch_bytes
            out.compute_s, out.io_stall_s = comp_total, max(0.0, t - comp_total)
        self._charge(energy, out.io_stall_s)
        out.h2d_bytes, out.d2h_bytes = plan.h2d_bytes, plan.d2h_bytes
        out.peak_device_bytes = plan.device_bytes
        return out

    def expand(self, plan: StepPlan, tree: BeamTree, old: Sequence[Beam], new: Sequence[Beam]) -> float:
        """Prune + expand cost (s): device copies of parents' KV into children's dense slots."""
        s = tree.prefix_tokens(new[0]) if new else 0
        n = len(new)
        if plan.resident:
            t, e = self.cost.d2d(n * s * self.geom.kv_token)
        elif plan.scheduler == "layerwise":
            Lr = int(plan.layers_resident[-1])
            t, e = self.cost.d2d(n * s * Lr * self.geom.kv_layer_token)
        else:
            return 0.0
        self._charge(e)
        return float(t)

    def step_energy(self) -> EnergyWindow:
        """Joules charged since the previous call (prefill, then each step with its prune + expand)."""
        joules, stall = self._window
        self._window = [0.0, 0.0]
        if self.energy_source is None:
            return EnergyWindow(None, None, self.energy_reason)
        return EnergyWindow(joules, stall)

    def close(self) -> None:
        pass
