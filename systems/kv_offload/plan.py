"""Per-step plans of the TTC schedulers (plain Python + numpy; no torch).

A scheduler looks at the live beams and the KV budget and returns a :class:`StepPlan`: which
beams run together and in which order, what each group loads host->device, what is written back,
what is prefetched. Executors (``torch_engine`` real, ``sim`` simulated) carry a plan out and
report what happened; the bytes they count must equal the plan's, exactly.

Byte accounting (``kv_token`` = KV bytes of one token of one beam over all layers,
``kv_layer_token`` = one layer's share; LBS paper Table 1 symbols in brackets):

- ``in_gpu``: everything resident; no transfers. Does not fit -> the run is recorded as OOM.
- ``layerwise`` [Eq.1-3]: all beams token by token. ``L`` whole layers stay resident for the
  step: Eq.1 evaluated at the step's last token, ``L = min(N_layer, floor(budget / (N * (start + T)
  * kv_layer_token)))`` (room for every token the step appends, so the resident layers are
  allocated once per step and never exceed the budget; with ``T = 1`` this is Eq.1 per token with
  the appended token reserved). Per token, each offloaded layer's KV of all beams from before the
  step (``N * start * kv_layer_token``) is loaded host->device; the step's earlier tokens of that
  layer are kept on the device (the step *tail*) and written back once, at the step's end
  (``N * T * kv_layer_token`` per offloaded layer). Layers leaving residency at a step's start are
  written back whole (``N * start * kv_layer_token`` each; at step 0 the prefill holds every layer).
  Host->device bytes are therefore Eq.3's minus the tokens of the current step: equal to Eq.3 at
  ``step=1``.
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
from systems.common.groups import consecutive_groups, group_capacity, group_sizes, prefetch_count
from systems.kv_offload.beamset import PrefixOrder, union_tokens
from systems.kv_offload.tree import Beam, BeamTree

# The engine's sampling, per beam and token, over its [V] row of the vocabulary (torch_engine.log_probs,
# sampling.draw): log-softmax (read for the max, read for the sum of exponentials, read + write), the
# exponentials (read + write) and their cumulative sum (read + write): 8 passes, in the sampling dtype.
SAMPLING_PASSES = 8


def sampling_dtype(model_dtype: str) -> str:
    """The engine's sampling dtype for a model's: float64 for a float64 model, else float32 (a
    float16/bfloat16 model's log-probabilities are summed over a search in float32)."""
    return "float64" if model_dtype == "float64" else "float32"


@dataclass(frozen=True)
class KVGeometry:
    """KV shape of a model. ``kv_layer_token`` = 2 * n_kv_heads * head_dim * bytes (the paper's KV)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @classmethod
    def from_model(cls, model_cfg) -> "KVGeometry":
        return cls(model_cfg.num_layers, model_cfg.num_kv_heads, model_cfg.head_dim, dtype_bytes(model_cfg.dtype))

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
    load_blocks: Optional[List[int]]  # segment ids loaded host->device, repeats = per-beam loads;
    # None when the scheduler lists none (list_blocks=False)
    load_bytes: int  # host->device bytes, all layers
    writeback_bytes: int  # device->host bytes (the step's new tokens)
    prefetch_beams: int = 0  # beams of the next group loaded into free slots meanwhile
    prefetch_bytes: int = 0  # their share of the next group's load_bytes
    device_bytes: int = 0  # peak device KV bytes while this group runs


@dataclass
class StepPlan:
    step: int
    start: int  # s: tokens cached per beam at the step's start
    tokens: int  # T: tokens decoded this step
    scheduler: str
    num_beams: int
    capacity: int = 0  # LBS group capacity B (beams)
    groups: List[GroupPlan] = field(default_factory=list)
    resident: bool = False  # everything stays on the device (in_gpu, or LBS when it fits)
    layers_resident: Optional[np.ndarray] = None  # layerwise: L per token t of the step
    layer_load_bytes: Optional[np.ndarray] = None  # layerwise: host->device bytes of one offloaded layer, per token
    evict_bytes: int = 0  # layerwise: device->host bytes of layers leaving residency (step start)
    writeback_bytes: int = 0  # layerwise: device->host bytes of the step tail (step end)
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    device_bytes: int = 0  # peak device bytes charged during the step (KV + staging)
    staging_bytes: int = 0  # staging allowance beyond the KV budget: layer-wise's layers in
    # flight and step tail; the prefill's copy of the prompt at step 0

    @property
    def num_groups(self) -> int:
        return len(self.groups) if self.groups else 1


def layers_resident(geom: KVGeometry, num_beams: int, budget: int, s):
    """Eq.1 with room for the appended token: ``min(N_layer, floor(budget / (N * (s+1) * KV)))``
    (``s``: tokens cached before the token; scalar or array). May be 0: every layer streamed."""
    per_layer = num_beams * (np.asarray(s, dtype=np.int64) + 1) * geom.kv_layer_token
    return np.minimum(geom.num_layers, budget // per_layer).astype(np.int64)


class Scheduler:
    """Builds the plan of each step; one subclass per scheduler (:data:`SCHEDULERS`, made by
    :func:`make_scheduler`). ``budget`` in bytes (None = unlimited, in_gpu on a real GPU).

    ``list_blocks``: LBS groups name the segments they load (``GroupPlan.load_blocks``), for an
    executor that copies blocks; the simulator needs only their bytes (False: the plan of a step
    then costs O(beams), not O(blocks)). The bytes are the same either way."""

    kind = ""  # the scheduler's name: system.scheduler, and each StepPlan's ``scheduler``

    def __init__(
        self,
        geom: KVGeometry,
        budget: Optional[int],
        *,
        inter_beam: bool = True,
        prefetch: bool = True,
        prompt_len: int,
        gen_len: int,
        list_blocks: bool = True,
    ):
        self.geom, self.budget = geom, budget
        self.inter_beam, self.prefetch = inter_beam, prefetch
        self.prompt_len, self.gen_len = prompt_len, gen_len
        self.list_blocks = list_blocks
        self._prev_L: Optional[int] = None
        self._order = PrefixOrder()  # LBS inter-beam: DFS order of the beams, step to step

    # -- whole-request checks ------------------------------------------------------------------
    def full_kv_bytes(self, num_beams: int) -> int:
        return num_beams * (self.prompt_len + self.gen_len) * self.geom.kv_token

    def fits_whole_request(self, num_beams: int) -> bool:
        return self.budget is None or self.full_kv_bytes(num_beams) <= self.budget

    def host_kv_bytes(self, num_beams: int, beam_size: int, step: int) -> int:
        """Peak KV bytes the host holds during the request (0 when nothing is offloaded): the
        offloaded KV must fit the host's memory (``hardware.host_memory_bytes``, systems/kv_offload/runner.py).

        - ``lbs`` (request over the budget): the host copy is authoritative and holds the tree's live
          segments: the prompt once; at step ``i`` the ``N`` live beams' new segments (``T_i``
          tokens) and their ancestors, at most ``beam_size`` per depth (the kept parents and
          theirs; dead segments are freed between steps). Peak over the steps of
          ``(P + beam_size * i * step + N * T_i) * kv_token``: a bound reached when no two kept beams
          share a parent (prefix sharing only lowers it); <= ``full_kv_bytes``.
        - ``layerwise``: every offloaded layer holds all beams' dense KV at full length (the real
          engine sizes them once): ``(N_layer - L) * N * (P + G) * kv_layer_token``, ``L`` the
          layers still resident at the last token (residency only shrinks).
        - ``in_gpu``, or LBS when the request fits: 0.
        O(1) in the number of beams: called before any per-beam state exists."""
        return 0

    def prefill_offload(self, num_beams: int) -> bool:
        """Whether the prefill writes the prompt's KV to the host: LBS groups load it from there when
        the request does not fit; layer-wise and resident runs start from the device copy."""
        return False

    # -- per step --------------------------------------------------------------------------------
    def plan(self, step: int, tree: BeamTree, beams: Sequence[Beam], tokens: int) -> StepPlan:
        """The plan of step ``step``: ``tokens`` new tokens for every beam of ``beams``."""
        start = tree.prefix_tokens(beams[0])
        p = StepPlan(step=step, start=start, tokens=tokens, scheduler=self.kind, num_beams=len(beams))
        return self._plan(p, tree, beams)

    def _plan(self, p: StepPlan, tree: BeamTree, beams: Sequence[Beam]) -> StepPlan:
        """Everything resident: every beam's KV in one dense device buffer."""
        n = p.num_beams
        p.resident, p.capacity = True, n
        p.staging_bytes = self._prompt_transient(p.step)
        p.device_bytes = n * (p.start + p.tokens) * self.geom.kv_token + p.staging_bytes
        return p

    def _prompt_transient(self, step: int) -> int:
        """Step 0 of a plan that keeps the prefill's KV on the device (layer-wise, resident): the
        prompt's copy (one beam, all layers) is alive while the beams' buffers are filled from it."""
        return self.prompt_len * self.geom.kv_token if step == 0 else 0


class InGpuScheduler(Scheduler):
    """``in_gpu``: every beam's KV resident for the whole request (an oom when it does not fit)."""

    kind = "in_gpu"


class LayerwiseScheduler(Scheduler):
    """``layerwise`` (LBS paper Eq.1-3): token by token, the first ``L`` layers resident, the others
    streamed from the host one layer at a time, the next layer prefetched."""

    kind = "layerwise"

    def host_kv_bytes(self, num_beams: int, beam_size: int, step: int) -> int:
        P, G, g = self.prompt_len, self.gen_len, self.geom
        L = min(g.num_layers, self.budget // (num_beams * (P + G) * g.kv_layer_token))  # Eq.1 at P+G-1, in ints
        return (g.num_layers - L) * num_beams * (P + G) * g.kv_layer_token

    def _plan(self, p: StepPlan, tree: BeamTree, beams: Sequence[Beam]) -> StepPlan:
        n, start, tokens = p.num_beams, p.start, p.tokens
        g, kvl = self.geom, self.geom.kv_layer_token
        L = int(layers_resident(g, n, self.budget, start + tokens - 1))
        off = g.num_layers - L
        prev = g.num_layers if self._prev_L is None else self._prev_L
        if L > prev:
            raise ValueError(f"step {p.step}: layer residency grows {prev} -> {L} (it only shrinks as sequences grow)")
        self._prev_L = L
        p.layers_resident = np.full(tokens, L, dtype=np.int64)
        p.layer_load_bytes = np.full(tokens, n * start * kvl, dtype=np.int64)
        p.h2d_bytes = off * tokens * n * start * kvl
        p.evict_bytes = (prev - L) * n * start * kvl
        p.writeback_bytes = off * n * tokens * kvl
        p.d2h_bytes = p.evict_bytes + p.writeback_bytes
        resident = L * n * (start + tokens) * kvl  # allocated for the whole step
        in_flight = min(off, 2) * n * (start + tokens) * kvl  # the layer computing + the next (last token)
        tail = off * n * tokens * kvl
        charged = max(in_flight + tail, self._prompt_transient(p.step))
        p.device_bytes = resident + charged
        # physical only: a resident layer's previous buffer while it is copied into this step's
        regrow = n * start * kvl if (L and p.step) else 0
        p.staging_bytes = max(charged, regrow)
        return p


class LbsScheduler(Scheduler):
    """``lbs`` (LBS paper Alg.1, Eq.4-5): group by group, each group's KV loaded from the host (its
    shared segments once with ``inter_beam``), the next group's first beams prefetched; everything
    resident when the whole request fits the budget."""

    kind = "lbs"

    def host_kv_bytes(self, num_beams: int, beam_size: int, step: int) -> int:
        P, G, g = self.prompt_len, self.gen_len, self.geom
        if self.fits_whole_request(num_beams):
            return 0
        k = -(-G // step)  # steps
        last = max((i * beam_size * step + num_beams * min(step, G - i * step) for i in {max(k - 2, 0), k - 1}))
        return (P + last) * g.kv_token

    def prefill_offload(self, num_beams: int) -> bool:
        return not self.fits_whole_request(num_beams)

    def _plan(self, p: StepPlan, tree: BeamTree, beams: Sequence[Beam]) -> StepPlan:
        if self.fits_whole_request(p.num_beams):
            return super()._plan(p, tree, beams)
        start, tokens = p.start, p.tokens
        n, kv = len(beams), self.geom.kv_token
        per_beam = (start + tokens) * kv
        cap = group_capacity(n, self.budget, per_beam)
        if cap < 1:
            from harness.errors import RunOOM

            raise RunOOM(
                f"step {p.step}: one beam's KV ({per_beam} B at {start + tokens} tokens) "
                f"exceeds the KV budget ({self.budget} B)"
            )
        sizes = group_sizes(n, cap, balanced=self.prefetch)
        if self.inter_beam:  # each shared segment once per group
            order, shared = self._order.update(tree, beams, start)
            tokens_of = union_tokens(start, shared)
        else:  # every beam its whole prefix, in rating order
            order, shared = np.arange(n), np.zeros(n, dtype=np.int64)
            tokens_of = lambda a, b: (b - a) * start  # noqa: E731
        bounds = np.cumsum([0] + sizes).tolist()  # group i: DFS positions bounds[i]..bounds[i+1]-1
        groups = []
        for a, b, members in zip(bounds, bounds[1:], consecutive_groups(order, sizes)):
            blocks = self._load_blocks(tree, beams, members, shared[a:b]) if self.list_blocks else None
            groups.append(
                GroupPlan(
                    beams=members,
                    load_blocks=blocks,
                    load_bytes=tokens_of(a, b) * kv,
                    writeback_bytes=len(members) * tokens * kv,
                    device_bytes=len(members) * per_beam,
                )
            )
        for i, gp in enumerate(groups):
            if self.prefetch and i + 1 < len(groups):
                # the next group's first k beams, loaded into this group's free slots meanwhile
                k = prefetch_count(cap, len(gp.beams), len(groups[i + 1].beams))
                a = bounds[i + 1]
                gp.prefetch_beams = k
                gp.prefetch_bytes = tokens_of(a, a + k) * kv
                gp.device_bytes += k * start * kv
        p.capacity, p.groups = cap, groups
        p.h2d_bytes = sum(gp.load_bytes for gp in groups)
        p.d2h_bytes = sum(gp.writeback_bytes for gp in groups)
        p.device_bytes = max(gp.device_bytes for gp in groups)
        return p

    def _load_blocks(self, tree: BeamTree, beams: Sequence[Beam], members: List[int], shared) -> List[int]:
        """Segment ids a group loads, for executors that copy blocks (the real engine): per beam, root
        -> leaf, the prefix segments from the first token it does not share with the group's previous
        beam (inter-beam: each shared segment once; else ``shared`` is 0: every beam its whole prefix)."""
        out: List[int] = []
        for j, i in enumerate(members):
            skip = int(shared[j]) if j else 0
            own, node = [], beams[i].path.up
            while node is not None and tree.segments[node.leaf].start >= skip:
                own.append(node.leaf)
                node = node.up
            out.extend(reversed(own))
        return out


SCHEDULERS = {s.kind: s for s in (InGpuScheduler, LayerwiseScheduler, LbsScheduler)}


def make_scheduler(kind: str, geom: KVGeometry, budget: Optional[int], **kw) -> Scheduler:
    """The scheduler named ``kind`` (:data:`SCHEDULERS`; keyword arguments: :class:`Scheduler`'s).
    Raises ValueError for another name."""
    if kind not in SCHEDULERS:
        raise ValueError(f"scheduler={kind!r}: no plan (allowed: {', '.join(SCHEDULERS)})")
    return SCHEDULERS[kind](geom, budget, **kw)
