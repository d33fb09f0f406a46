"""Simulated TTC executor: the same plans as the real engine, with time charged from a hardware
profile (SIMULATED numbers).

Cost model (per decoder layer, per forward launch; ``b`` beams, ``s`` cached tokens):
- compute: roofline ``max(flops / (peak_flops * flops_efficiency), bytes / (mem_bw * mem_efficiency))
  + launch_overhead_s`` with ``flops = 2 b P_layer + 4 b s (n_heads head_dim)`` and
  ``bytes = P_layer * dtype + b (s + 1) kv_layer_token`` (weights re-read once per group launch;
  KV read by attention);
- transfers: bytes / ``h2d_bw`` or ``d2h_bw`` (one copy engine per direction);
- overlap: layer-wise prefetches the first offloaded layer while the resident layers compute and
  each next offloaded layer while a layer computes (``max(compute, load)`` per layer, a load being
  ``plan.layer_load_bytes``; the step's earlier tokens of the layer are a device copy added to its
  compute); its write-backs (layers leaving residency at the step's start, the step tail at its end)
  are waited for. LBS prefetches the next group's first beams into the free slots while a group
  computes; its write-backs run on the other copy engine and are hidden unless longer than compute;
- prune + expand: device-side copies of parents' KV into children's dense slots (in_gpu and the
  resident layers of layer-wise) at ``2 * bytes / (mem_bw * mem_efficiency)``; LBS shares host
  segments, so expansion moves nothing. Layer-wise's reorder of its offloaded layers in host memory
  is not charged (the profiles have no host-memory bandwidth);
- scores: synthetic, seeded per (seed, beam uid, step) so pruning is deterministic.
- energy: coarse, ``idle_w * t + (tdp_w - idle_w) * t_compute`` (no power model is fitted for
  this family; labelled simulated like everything here).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from harness.model_facts import dtype_bytes, layer_params
from systems.ttc.plan import KVGeometry, StepPlan
from systems.ttc.protocol import StepOutcome
from systems.ttc.tree import Beam, BeamTree, mix64_array


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


def group_time(load_s: float, compute_s: float, prefetch_s: float, writeback_s: float) -> float:
    """Seconds of one LBS group (LBS paper Alg.1 with prefetch): its load not prefetched by the group
    before (``load_s``) is waited for, then it computes while the next group's first beams are
    prefetched (``prefetch_s``, one copy engine) and its new tokens are written back (``writeback_s``,
    the other): either copy shows only where it outlasts the compute."""
    return load_s + compute_s + max(0.0, prefetch_s - compute_s) + max(0.0, writeback_s - compute_s)


class CostModel:
    """Roofline costs of one model on one hardware profile (seconds)."""

    def __init__(self, hw, m):
        self.hw, self.m = hw, m
        self.db = dtype_bytes(m.dtype)
        self.P = layer_params(m)
        self.geom = KVGeometry.from_model(m)
        self.peak = hw.peak_flops * hw.flops_efficiency
        self.bw = hw.mem_bw * hw.mem_efficiency

    def layer_decode(self, b, s) -> np.ndarray:
        """One layer, one token for ``b`` beams at cached lengths ``s`` (array) -> seconds."""
        s = np.asarray(s, dtype=np.float64)
        qd = self.m.num_heads * self.m.head_dim
        flops = 2.0 * b * self.P + 4.0 * b * s * qd
        byts = self.P * self.db + b * (s + 1) * self.geom.kv_layer_token
        return np.maximum(flops / self.peak, byts / self.bw) + self.hw.launch_overhead_s

    def head(self, b) -> float:
        """Final norm + LM head for ``b`` beams (one token)."""
        hv = self.m.hidden_size * self.m.vocab_size
        return max(2.0 * b * hv / self.peak, hv * self.db / self.bw) + self.hw.launch_overhead_s

    def prefill(self, n_tokens: int) -> float:
        qd = self.m.num_heads * self.m.head_dim
        flops = self.m.num_layers * (2.0 * n_tokens * self.P + 2.0 * n_tokens * n_tokens * qd)
        flops += 2.0 * self.m.hidden_size * self.m.vocab_size
        byts = self.m.num_layers * self.P * self.db
        return max(flops / self.peak, byts / self.bw) + self.m.num_layers * self.hw.launch_overhead_s

    def h2d(self, nbytes) -> float:
        return nbytes / self.hw.h2d_bw

    def d2h(self, nbytes) -> float:
        return nbytes / self.hw.d2h_bw

    def d2d(self, nbytes) -> float:
        return 2.0 * nbytes / self.bw


class SimExecutor:
    """Carries out StepPlans on a simulated GPU (a :class:`systems.ttc.protocol.Executor`)."""

    simulated = True
    clock = staticmethod(time.perf_counter)      # unused: the simulator charges, it does not measure

    def __init__(self, hw, model_cfg, seed: int):
        self.cost = CostModel(hw, model_cfg)
        self.geom = self.cost.geom
        self.seed = seed
        self.hw = hw

    def warmup(self, prompt_tokens: Sequence[int], num_beams: int) -> float:
        """Nothing to warm up in a cost model."""
        return 0.0

    def prefill(self, tree: BeamTree, prompt_tokens: Sequence[int], offload: bool) -> StepOutcome:
        """Prefill the prompt (segment 0); written back to the host unless everything stays resident."""
        n = len(prompt_tokens)
        d2h = n * self.geom.kv_token if offload else 0
        return StepOutcome(np.zeros(0), compute_s=self.cost.prefill(n), d2h_bytes=d2h,
                           io_stall_s=0.0, peak_device_bytes=n * self.geom.kv_token)

    def execute_step(self, plan: StepPlan, tree: BeamTree, beams: Sequence[Beam]) -> StepOutcome:
        c, L = self.cost, self.geom.num_layers
        n, T = plan.num_beams, plan.tokens
        s = plan.start + np.arange(T)
        out = StepOutcome(synthetic_logprobs(self.seed, [b.uid for b in beams], plan.step, T))
        if plan.resident:
            out.compute_s = float(np.sum(L * c.layer_decode(n, s)) + T * c.head(n))
        elif plan.scheduler == "layerwise":
            Lr = plan.layers_resident                                 # [T]
            off = L - Lr
            comp = c.layer_decode(n, s)                               # [T] one layer
            comp_off = comp + c.d2d(n * np.arange(T) * self.geom.kv_layer_token)   # + the step tail
            load = c.h2d(plan.layer_load_bytes)                       # [T] one offloaded layer
            t_res = Lr * comp
            # first offloaded layer prefetched during the resident layers, then pipelined
            t_off = np.where(off > 0, np.maximum(t_res, load) - t_res + (off - 1) * np.maximum(comp_off, load)
                             + comp_off, 0.0)
            total = t_res + t_off + c.head(n)
            out.compute_s = float(np.sum(Lr * comp + off * comp_off) + T * c.head(n))
            out.io_stall_s = (max(0.0, float(np.sum(total)) - out.compute_s)
                              + c.d2h(plan.evict_bytes) + c.d2h(plan.writeback_bytes))
        else:  # lbs groups
            t, comp_total = 0.0, 0.0
            carried = 0.0          # bytes of this group already prefetched by the previous one
            comp_of = {}           # compute seconds per group size (balanced groups: two sizes)
            for gp in plan.groups:
                b = len(gp.beams)
                load_s = c.h2d(gp.load_bytes - carried)
                if b not in comp_of:
                    comp_of[b] = float(np.sum(L * c.layer_decode(b, s)) + T * c.head(b))
                comp = comp_of[b]
                pf_s = c.h2d(gp.prefetch_bytes)
                wb_s = c.d2h(gp.writeback_bytes)
                g_time = group_time(load_s, comp, pf_s, wb_s)
                out.group_rows.append({"step": plan.step, "beams": b, "load_bytes": gp.load_bytes,
                                       "prefetch_bytes": gp.prefetch_bytes, "compute_s": comp,
                                       "time_s": g_time})
                t += g_time
                comp_total += comp
                carried = gp.prefetch_bytes
            out.compute_s, out.io_stall_s = comp_total, max(0.0, t - comp_total)
        out.h2d_bytes, out.d2h_bytes = plan.h2d_bytes, plan.d2h_bytes
        out.peak_device_bytes = plan.device_bytes
        return out

    def expand(self, plan: StepPlan, tree: BeamTree, old: Sequence[Beam], new: Sequence[Beam]) -> float:
        """Prune + expand cost (s): device copies of parents' KV into children's dense slots."""
        s = tree.prefix_tokens(new[0]) if new else 0
        n = len(new)
        if plan.resident:
            return self.cost.d2d(n * s * self.geom.kv_token)
        if plan.scheduler == "layerwise":
            Lr = int(plan.layers_resident[-1])
            return self.cost.d2d(n * s * Lr * self.geom.kv_layer_token)
        return 0.0

    def energy_j(self, total_s: float, compute_s: float) -> float:
        return self.hw.idle_w * total_s + (self.hw.tdp_w - self.hw.idle_w) * compute_s

    def close(self) -> None:
        pass
