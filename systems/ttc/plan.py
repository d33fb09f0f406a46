"""Per-step plans of the TTC schedulers (plain Python + numpy; no torch).

A scheduler looks at the live beams and the KV budget and returns a :class:`StepPlan`: which
beams run together and in which order, what each group loads host->device, what is written back,
what is prefetched. Executors (``torch_engine`` real, ``sim`` simulated) carry a plan out and
report what happened; the bytes they count must equal the plan's, exactly.

Byte accounting (``kv_token`` = KV bytes of one token of one beam over all layers,
``kv_layer_token`` = one layer's share; LBS paper Table 1 symbols in brackets):

- ``in_gpu``: everything resident; no transfers. Does not fit -> the run is recorded as OOM.
- ``layerwise`` [Eq.1-3]: every token, ``L(s)`` whole layers stay resident; each other layer's
  KV of all beams (``N * s * kv_layer_token``, s = tokens already cached) is loaded before it
  computes, and the new token's KV of those layers is written back. ``L(s)`` follows Eq.1 but
  reserves room for the token being appended (``s + 1``), so the enforced budget is never
  exceeded; when ``L`` shrinks, the evicted layer's KV (``N * s * kv_layer_token``) is written back.
- ``lbs`` [Eq.4-5 + Alg.1]: per step, capacity ``B = floor(budget / ((s + T) * kv_token))`` beams
  (their dense buffers hold the step's new tokens too); groups of the step load their beams'
  prefix KV once per step (with ``inter_beam``: each shared segment once per group), decode T
  tokens, and write the T new tokens back (host copy authoritative). When all beams fit for the
  whole request, LBS keeps everything resident and moves nothing, like in_gpu.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np

from harness.model_facts import dtype_bytes
from systems.ttc.beamset import beamset_groups, chunk_groups, group_capacity, group_sizes
from systems.ttc.tree import Beam, BeamTree, path_matrix



@dataclass(frozen=True)
class KVGeometry:
    """KV shape of a model. ``kv_layer_token`` = 2 * n_kv_heads * head_dim * bytes (the paper's KV)."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @classmethod
    def from_model(cls, model_cfg) -> "KVGeometry":
        return cls(model_cfg.num_layers, model_cfg.num_kv_heads, model_cfg.head_dim,
                   dtype_bytes(model_cfg.dtype))

    @property
    def kv_layer_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_token(self) -> int:
        return self.num_layers * self.kv_layer_token


@dataclass
class GroupPlan:
    """One group of an LBS step. ``beams`` index the step's live beams (rating order)."""
    beams: List[int]
    load_blocks: List[int]            # segment ids loaded host->device; repeats = per-beam loads
    load_bytes: int                   # host->device bytes, all layers
    writeback_bytes: int              # device->host bytes (the step's new tokens)
    prefetch_beams: int = 0           # beams of the next group loaded into free slots meanwhile
    prefetch_bytes: int = 0           # their share of the next group's load_bytes
    device_bytes: int = 0             # peak device KV bytes while this group runs


@dataclass
class StepPlan:
    step: int
    start: int                        # s: tokens cached per beam at the step's start
    tokens: int                       # T: tokens decoded this step
    scheduler: str
    num_beams: int
    capacity: int = 0                 # LBS group capacity B (beams)
    groups: List[GroupPlan] = field(default_factory=list)
    resident: bool = False            # everything stays on the device (in_gpu, or LBS when it fits)
    layers_resident: Optional[np.ndarray] = None   # layerwise: L per token t of the step
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    device_bytes: int = 0             # peak device KV bytes during the step

    @property
    def num_groups(self) -> int:
        return len(self.groups) if self.groups else 1


def layers_resident(geom: KVGeometry, num_beams: int, budget: int, s: np.ndarray) -> np.ndarray:
    """Eq.1 with room for the appended token: ``min(N_layer, floor(budget / (N * (s+1) * KV)))``."""
    per_layer = num_beams * (np.asarray(s, dtype=np.int64) + 1) * geom.kv_layer_token
    return np.minimum(geom.num_layers, budget // per_layer).astype(np.int64)


class Scheduler:
    """Builds the plan of each step. ``budget`` in bytes (None = unlimited, in_gpu on a real GPU)."""

    def __init__(self, kind: str, geom: KVGeometry, budget: Optional[int], *, inter_beam: bool = True,
                 prefetch: bool = True, prompt_len: int, gen_len: int):
        self.kind, self.geom, self.budget = kind, geom, budget
        self.inter_beam, self.prefetch = inter_beam, prefetch
        self.prompt_len, self.gen_len = prompt_len, gen_len
        self._prev_L: Optional[int] = None

    # -- whole-request checks ------------------------------------------------------------------
    def full_kv_bytes(self, num_beams: int) -> int:
        return num_beams * (self.prompt_len + self.gen_len) * self.geom.kv_token

    def fits_whole_request(self, num_beams: int) -> bool:
        return self.budget is None or self.full_kv_bytes(num_beams) <= self.budget

    # -- per step --------------------------------------------------------------------------------
    def plan(self, step: int, tree: BeamTree, beams: Sequence[Beam], tokens: int) -> StepPlan:
        n = len(beams)
        start = tree.prefix_tokens(beams[0])
        p = StepPlan(step=step, start=start, tokens=tokens, scheduler=self.kind, num_beams=n)
        if self.kind == "in_gpu" or (self.kind == "lbs" and self.fits_whole_request(n)):
            p.resident, p.capacity = True, n
            p.device_bytes = n * (start + tokens) * self.geom.kv_token
            return p
        if self.kind == "layerwise":
            return self._plan_layerwise(p, n, start, tokens)
        if self.kind == "lbs":
            return self._plan_lbs(p, tree, beams, start, tokens)
        raise ValueError(f"scheduler={self.kind!r}: no plan (allowed: in_gpu, layerwise, lbs)")

    def _plan_layerwise(self, p: StepPlan, n: int, start: int, tokens: int) -> StepPlan:
        g = self.geom
        s = start + np.arange(tokens, dtype=np.int64)
        L = layers_resident(g, n, self.budget, s)
        off = g.num_layers - L
        p.layers_resident = L
        p.h2d_bytes = int(np.sum(off * n * s * g.kv_layer_token))
        d2h = int(np.sum(off * n * g.kv_layer_token))
        prev = np.concatenate([[self._prev_L if self._prev_L is not None else L[0]], L[:-1]])
        evicted = np.maximum(prev - L, 0)
        d2h += int(np.sum(evicted * n * s * g.kv_layer_token))
        p.d2h_bytes = d2h
        self._prev_L = int(L[-1])
        # resident layers at their final length + one offloaded layer in flight (+ the prefetched next)
        in_flight = np.where(off > 0, np.minimum(off, 2), 0)
        p.device_bytes = int(np.max((L + in_flight) * n * (s + 1) * g.kv_layer_token))
        return p

    def _plan_lbs(self, p: StepPlan, tree: BeamTree, beams: Sequence[Beam], start: int,
                  tokens: int) -> StepPlan:
        g, n = self.geom, len(beams)
        per_beam = (start + tokens) * g.kv_token
        cap = group_capacity(n, self.budget, per_beam)
        if cap < 1:
            from harness.errors import RunOOM
            raise RunOOM(f"step {p.step}: one beam's KV ({per_beam} B at {start + tokens} tokens) "
                         f"exceeds the KV budget ({self.budget} B)")
        sizes = group_sizes(n, cap, balanced=self.prefetch)
        paths = path_matrix(tree, beams)
        idx = beamset_groups(paths, sizes) if self.inter_beam else chunk_groups(n, sizes)
        seg_len = {sid: tree.segments[sid].length for sid in np.unique(paths)}
        groups = []
        for members in idx:
            blocks = ([int(x) for x in np.unique(paths[members])] if self.inter_beam
                      else [int(x) for x in paths[members].ravel()])
            load = sum(seg_len[b] for b in blocks) * g.kv_token
            groups.append(GroupPlan(beams=members, load_blocks=blocks, load_bytes=load,
                                    writeback_bytes=len(members) * tokens * g.kv_token))
        for i, gp in enumerate(groups):
            gp.device_bytes = len(gp.beams) * per_beam
            if self.prefetch and i + 1 < len(groups):
                nxt = groups[i + 1]
                k = min(cap - len(gp.beams), len(nxt.beams))
                gp.prefetch_beams = k
                # the share of the next group's load that belongs to its first k beams
                first = nxt.beams[:k]
                blocks = (np.unique(paths[first]) if self.inter_beam else paths[first].ravel()) if k else []
                gp.prefetch_bytes = sum(seg_len[int(b)] for b in blocks) * g.kv_token
                gp.device_bytes += k * start * g.kv_token
        p.capacity, p.groups = cap, groups
        p.h2d_bytes = sum(gp.load_bytes for gp in groups)
        p.d2h_bytes = sum(gp.writeback_bytes for gp in groups)
        p.device_bytes = max(gp.device_bytes for gp in groups)
        return p
