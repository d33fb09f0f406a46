"""Real TTC executor on torch: carries out the plans of ``systems.ttc.plan`` on a transformers model
through the tiered KV store (LBS paper Sec. 3-4, Alg.1; DESIGN.md "The TTC engine").

Same interface as :class:`systems.ttc.sim.SimExecutor`, so ``systems.ttc.runner`` swaps them:

- ``prefill(tree, prompt_tokens, offload) -> StepOutcome``: one forward over the prompt (batch 1);
  its KV is segment 0. ``offload``: written back to the host (counted d2h); otherwise it stays on
  the device only (everything-resident runs).
- ``execute_step(plan, tree, beams) -> StepOutcome``: decode ``plan.tokens`` tokens for every live
  beam as the plan says (see below); returns per beam (in ``beams`` order) the sampled tokens and the
  sum of their log-probabilities (``logprob_delta``; cumulative log-probability is the score), the
  bytes moved each way (counted at every copy, never copied from the plan), compute and I/O-stall
  seconds, and the peak device KV bytes.
- ``expand(plan, tree, old, new) -> float``: after selection/expansion, frees dead host segments and
  (in_gpu, resident layers of layer-wise) copies each kept parent's KV into its extra children's
  dense slots on the device; returns its wall seconds.
- ``close()``, ``energy_j(total_s, compute_s)`` (None where energy cannot be read).

Execution per scheduler:

- **in_gpu** (and LBS when everything fits, ``plan.resident``): all beams' KV resident in one
  dense buffer; no transfers. A budget overrun raises :class:`harness.run.RunOOM`.
- **layerwise** [Eq.1-3]: all beams token by token. Before each token, layers ``>= L(t)``
  (``plan.layers_resident``) are evicted (their KV written back); in the forward, layer ``l``'s
  ``Cache.update`` loads it from the host if it is not resident (all beams' paths), prefetches
  layer ``l+1``, and writes the new token's K/V back. The two layers in flight are charged to a
  staging allowance of two layers (the plan's ``device_bytes`` counts them above the KV budget).
- **lbs** [Eq.4-5, Alg.1]: group by group. Each group's dense buffer (``start + T`` tokens per beam)
  is filled from the host as ``GroupPlan.load_blocks`` says (a segment listed once is loaded once
  and fanned out on the device; listed once per beam, loaded per beam); with prefetch, the next
  group's first ``prefetch_beams`` beams are loaded into the free slots before this group computes
  (on CUDA on a copy stream, overlapping compute); the group decodes ``T`` tokens with its KV
  resident; its new KV is written back to the beams' leaf segments (host authoritative).

Sampling is Gumbel-max on ``log_softmax(logits / temperature)`` with noise drawn from a generator
seeded by ``mix64(seed, beam uid, absolute position)``, never by batch slot, so grouping and order
cannot change the search (tested). The first token of a step is drawn from the parent's last
next-token distribution (the prompt's for step 0).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from systems.ttc.cache import DenseKV, GroupCache
from systems.ttc.kvstore import DeviceBuffer, KVBudgetExceeded, PlanMismatch, TieredKVStore
from systems.ttc.model import build_model
from systems.ttc.plan import StepPlan
from systems.ttc.sim import StepOutcome
from systems.ttc.tree import Beam, BeamTree, mix64

ROOT = -1          # key of the prompt's next-token distribution (parent of step-0 beams)
_MASK63 = (1 << 63) - 1


def resolve_device(device: str) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def gumbel_noise(gen: torch.Generator, seed: int, uids: Sequence[int], pos: int, vocab: int,
                 dtype: torch.dtype) -> torch.Tensor:
    """Gumbel(0, 1) noise ``[len(uids), vocab]`` on ``gen``'s device. Row i is drawn from ``gen``
    re-seeded with ``mix64(seed, uids[i], pos)``: it depends on the beam and the absolute position
    of the token being sampled, never on the batch slot (so grouping cannot change the search)."""
    out = torch.empty(len(uids), vocab, dtype=dtype, device=gen.device)
    for i, u in enumerate(uids):
        gen.manual_seed(mix64(seed, u, pos) & _MASK63)
        out[i].uniform_(generator=gen)
    tiny = torch.finfo(dtype).tiny
    return -torch.log(-torch.log(out.clamp_(min=tiny)))


def log_probs(logits: torch.Tensor, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` in ``dtype`` (the sampling distribution; Gumbel-max on
    it samples a token, and its value at the token is the token's log-probability)."""
    return torch.log_softmax(logits.to(dtype) / temperature, dim=-1)


class TorchExecutor:
    """The real engine. See the module doc for the interface and the execution of each scheduler.

    Args:
        model_cfg: ``harness.config.ModelConfig`` (``conf/model/*.yaml``).
        device: ``cpu``, ``cuda`` or ``auto``.
        budget_bytes: device KV budget in bytes (None = unlimited).
        seed: model init seed and sampling-noise seed.
        scheduler: ``in_gpu | layerwise | lbs`` (decides where the prefill's KV goes).
        dtype: override of ``model_cfg.dtype`` (tests use float64).
        temperature: sampling temperature (> 0).
        max_len: prompt + generated tokens, to size resident buffers once (else they grow).
        model: a prebuilt ``(model, KVGeometry)`` from :func:`systems.ttc.model.build_model`.
    """

    simulated = False

    def __init__(self, model_cfg, device: str = "cpu", budget_bytes: Optional[int] = None, seed: int = 0,
                 scheduler: str = "lbs", record_tree: bool = False, *, dtype: Optional[str] = None,
                 temperature: float = 1.0, max_len: Optional[int] = None, model=None):
        if temperature <= 0:
            raise ValueError(f"temperature={temperature!r} must be > 0")
        self.device = resolve_device(device)
        self.model, self.geom = model if model is not None else build_model(model_cfg, self.device, seed, dtype)
        g = self.geom
        self.L, self.H, self.D = g.num_layers, g.num_kv_heads, g.head_dim
        self.dtype = next(self.model.parameters()).dtype
        self.kv_layer_token = g.kv_layer_token
        self.kv_token = g.kv_token
        self.store = TieredKVStore(self.L, self.H, self.D, self.dtype, self.device, budget_bytes, staging_budget=0)
        self.budget = budget_bytes
        self.seed, self.temperature, self.scheduler = seed, float(temperature), scheduler
        self.max_len = max_len
        self.record_tree = record_tree
        self.sample_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self._gen = torch.Generator(device=self.device)
        self.next_logp: Dict[int, torch.Tensor] = {}      # uid -> [V] log-probs of its next token
        self.slot_of: Dict[int, int] = {}                   # resident runs: uid -> batch slot
        self.prompt_kv: Optional[DeviceBuffer] = None       # prefill KV kept for fan-out
        self.res: Optional[DeviceBuffer] = None             # resident: [L, 2, N, H, cap, D]
        self.lw_bufs: Optional[List[DeviceBuffer]] = None   # layer-wise resident layers: [2, N, H, cap, D]
        self._energy = None
        if self.device.type == "cuda":
            from harness.meters import EnergyMeter
            self._energy = EnergyMeter([self.device.index or 0])
        self._energy_j = None

    # ----------------------------------------------------------------------------------------------
    # sampling (keyed by seed, beam uid, absolute position)
    def noise(self, uids: Sequence[int], pos: int, vocab: int) -> torch.Tensor:
        """Gumbel noise ``[len(uids), vocab]``; row i depends only on (seed, uids[i], pos)."""
        return gumbel_noise(self._gen, self.seed, uids, pos, vocab, self.sample_dtype)

    def _logp(self, logits: torch.Tensor) -> torch.Tensor:
        return log_probs(logits, self.temperature, self.sample_dtype)

    def _decode(self, cache: GroupCache, uids: Sequence[int], logp: torch.Tensor, start: int, T: int,
                on_token=None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode ``T`` tokens for a group whose KV (``start`` tokens) is in ``cache``.

        logp: ``[G, V]`` next-token log-probs of each beam's parent. Returns tokens ``[G, T]``
        (long), their log-probs ``[G, T]`` and the next-token log-probs after the last ``[G, V]``."""
        G = len(uids)
        toks = torch.empty(G, T, dtype=torch.long, device=self.device)
        lps = torch.empty(G, T, dtype=self.sample_dtype, device=self.device)
        for k in range(T):
            if on_token is not None:
                on_token(k)
            y = (logp + self.noise(uids, start + k, logp.shape[-1])).argmax(-1)
            toks[:, k] = y
            lps[:, k] = logp.gather(1, y[:, None])[:, 0]
            out = self.model(input_ids=y[:, None], past_key_values=cache, use_cache=True)
            logp = self._logp(out.logits[:, -1])
        return toks, lps, logp

    # ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, tree: BeamTree, prompt_tokens: Sequence[int], offload: bool) -> StepOutcome:
        """Prefill the prompt (segment 0). ``offload``: write its KV to the host (d2h counted)."""
        st = self.store
        if self._energy is not None and self._energy.available:
            self._energy.begin_window("run")
        P = len(prompt_tokens)
        st.dev.reset_peak()
        h2d0, d2h0 = st.bytes.h2d, st.bytes.d2h
        buf = st.dev.alloc((self.L, 2, 1, self.H, P, self.D), self.dtype, what="prefill KV")
        ids = torch.tensor([list(prompt_tokens)], dtype=torch.long, device=self.device)
        with st.compute():
            out = self.model(input_ids=ids, past_key_values=GroupCache(DenseKV(buf.tensor), self.L, 0),
                             use_cache=True, logits_to_keep=1)
            self.next_logp[ROOT] = self._logp(out.logits[0, -1])
        if offload:
            host = st.host.ensure(0, P)
            with st.io("d2h"):
                st.d2h(host, buf.tensor[:, :, 0])
                st.keep_alive(buf.tensor, "d2h")
        keep = (not offload) or self.scheduler == "layerwise"
        if keep:
            self.prompt_kv = buf
        t = st.take_times()
        peak = st.dev.peak_total
        if not keep:
            buf.free()
        return StepOutcome(np.zeros(0), compute_s=t["compute"], io_stall_s=t["io_stall"],
                           h2d_bytes=st.bytes.h2d - h2d0, d2h_bytes=st.bytes.d2h - d2h0,
                           peak_device_bytes=peak)

    @torch.no_grad()
    def execute_step(self, plan: StepPlan, tree: BeamTree, beams: Sequence[Beam]) -> StepOutcome:
        """Decode one step of the search for every live beam as ``plan`` says (see module doc)."""
        st = self.store
        st.dev.reset_peak()
        h2d0, d2h0 = st.bytes.h2d, st.bytes.d2h
        rows: List[dict] = []
        if plan.resident:
            res = self._step_resident(plan, beams)
        elif plan.scheduler == "layerwise":
            res = self._step_layerwise(plan, tree, beams)
        elif plan.scheduler == "lbs":
            res = self._step_lbs(plan, tree, beams, rows)
        else:
            raise PlanMismatch(f"scheduler={plan.scheduler!r}: the torch executor runs in_gpu, layerwise, lbs")
        toks, lps, last = res                     # per beam (beams order), on device
        t = st.take_times()
        for r in rows:                            # copy-engine time of each group's load (synchronised above)
            r["load_s"] = st.span_seconds(r.pop("load_span"))
        for b, lp in zip(beams, last):
            self.next_logp[b.uid] = lp
        lps_cpu = lps.double().cpu().numpy()
        return StepOutcome(lps_cpu.sum(axis=1), tokens=toks.cpu().tolist(), compute_s=t["compute"],
                           io_stall_s=t["io_stall"], h2d_bytes=st.bytes.h2d - h2d0,
                           d2h_bytes=st.bytes.d2h - d2h0, peak_device_bytes=st.dev.peak_total,
                           group_rows=rows)

    def _parent_logp(self, beams: Sequence[Beam]) -> torch.Tensor:
        return torch.stack([self.next_logp[ROOT if b.parent_uid is None else b.parent_uid] for b in beams])

    @staticmethod
    def _prefix_path(tree: BeamTree, b: Beam) -> List[Tuple[int, int]]:
        return [(s, tree.segments[s].length) for s in b.prefix]

    # -- resident (in_gpu, LBS when everything fits) ---------------------------------------------
    def _ensure_capacity(self, buf: DeviceBuffer, need: int, filled: int, seq_dim: int = -2) -> DeviceBuffer:
        """Grow a resident buffer's token capacity to ``need`` (copies ``filled`` tokens, device-side).
        Physical capacity beyond the charged KV is slack (``max_len`` avoids regrowth)."""
        cap = buf.tensor.shape[seq_dim]
        if cap >= need:
            return buf
        new_cap = max(need, min(2 * cap, self.max_len or 2 * cap))
        shape = list(buf.tensor.shape)
        shape[seq_dim] = new_cap
        new = self.store.dev.alloc(shape, self.dtype, kind=buf.kind, charge=0, what=buf.what)
        self.store.d2d(new.tensor[..., :filled, :], buf.tensor[..., :filled, :])
        charged = buf.charged
        buf.free()
        new.charge(charged)
        return new

    def _init_slots(self, beams: Sequence[Beam]) -> None:
        self.slot_of = {b.uid: i for i, b in enumerate(beams)}

    def _step_resident(self, plan: StepPlan, beams: Sequence[Beam]):
        from harness.errors import RunOOM
        st, N = self.store, len(beams)
        start, T = plan.start, plan.tokens
        need = start + T
        try:
            if self.res is None:
                if self.prompt_kv is None:
                    raise PlanMismatch("resident step without the prefill's KV on the device "
                                       "(prefill ran with offload=True)")
                cap = max(need, self.max_len or need)
                # charged once the prefill's copy is freed (the plans do not count that transient)
                self.res = st.dev.alloc((self.L, 2, N, self.H, cap, self.D), self.dtype, charge=0,
                                        what="resident KV (all beams)")
                P = self.prompt_kv.tensor.shape[-2]
                for i in range(N):      # fan the prompt out to every beam's dense slot
                    st.d2d(self.res.tensor[:, :, i, :, :P], self.prompt_kv.tensor[:, :, 0])
                self.prompt_kv.free()
                self.prompt_kv = None
                self._init_slots(beams)
            else:
                self.res = self._ensure_capacity(self.res, need, start)
            self.res.charge(N * need * self.kv_token)
        except KVBudgetExceeded as e:
            raise RunOOM(f"{self.scheduler}: all beams' KV does not fit the device budget: {e}") from None
        order = sorted(range(N), key=lambda i: self.slot_of[beams[i].uid])   # batch = slot order
        if [self.slot_of[beams[i].uid] for i in order] != list(range(N)):
            raise PlanMismatch("resident slots do not cover the live beams")
        uids = [beams[i].uid for i in order]
        cache = GroupCache(DenseKV(self.res.tensor), self.L, start)
        with st.compute():
            toks, lps, last = self._decode(cache, uids, self._parent_logp([beams[i] for i in order]), start, T)
        inv = torch.as_tensor(np.argsort(order), device=self.device)
        return toks[inv], lps[inv], last[inv]

    # -- LBS: group by group -----------------------------------------------------------------------
    def _step_lbs(self, plan: StepPlan, tree: BeamTree, beams: Sequence[Beam], rows: List[dict]):
        st = self.store
        start, T, N = plan.start, plan.tokens, len(beams)
        if self.prompt_kv is not None:      # the prefill's device copy is not used by LBS groups
            self.prompt_kv.free()
            self.prompt_kv = None
        paths = [self._prefix_path(tree, b) for b in beams]
        for b in beams:
            st.host.ensure(b.leaf, T)
        toks = torch.empty(N, T, dtype=torch.long, device=self.device)
        lps = torch.empty(N, T, dtype=self.sample_dtype, device=self.device)
        last = [None] * N
        covered = sorted(i for gp in plan.groups for i in gp.beams)
        if covered != list(range(N)):
            raise PlanMismatch(f"step {plan.step}: the plan's groups do not cover the {N} live beams once each")
        pre: Optional[Tuple[DeviceBuffer, Counter, dict]] = None     # prefetched part of this group
        for gi, gp in enumerate(plan.groups):
            G = len(gp.beams)
            h0 = st.bytes.h2d
            buf = st.dev.alloc((self.L, 2, G, self.H, start + T, self.D), self.dtype,
                               what=f"step {plan.step} group {gi} ({G} beams)")
            if pre is not None:
                sbuf, credits, sources = pre
                k = sbuf.tensor.shape[2]
                with st.io("h2d"):
                    st.d2d(buf.tensor[:, :, :k, :, :start], sbuf.tensor)
                    st.keep_alive(sbuf.tensor, "h2d")
                sbuf.free()
                sources = {sid: (buf.tensor, slot, pos) for sid, (_, slot, pos) in sources.items()}
            else:
                k, credits, sources = 0, Counter(gp.load_blocks), {}
            with st.io("h2d"), st.copy_span("h2d") as span:
                st.load_paths(buf.tensor, slice(None), range(k, G), [paths[i] for i in gp.beams[k:]],
                              credits, sources)
            if any(v != 0 for v in credits.values()):
                raise PlanMismatch(f"step {plan.step} group {gi}: the plan loads blocks no beam needs: "
                                   f"{ {s: c for s, c in credits.items() if c} }")
            st.wait_loads(buf.tensor)
            loaded = st.bytes.h2d - h0
            span_bytes = loaded
            # prefetch the next group's first beams into the free slots (before this group computes)
            pre = None
            if gp.prefetch_beams and gi + 1 < len(plan.groups):
                nxt = plan.groups[gi + 1]
                kp = gp.prefetch_beams
                sbuf = st.dev.alloc((self.L, 2, kp, self.H, start, self.D), self.dtype,
                                    what=f"step {plan.step} prefetch of group {gi + 1} ({kp} beams)")
                ncredits, nsources = Counter(nxt.load_blocks), {}
                h1 = st.bytes.h2d
                with st.io("h2d"):
                    st.load_paths(sbuf.tensor, slice(None), range(kp), [paths[i] for i in nxt.beams[:kp]],
                                  ncredits, nsources)
                pre = (sbuf, ncredits, nsources)
                prefetched = st.bytes.h2d - h1
            else:
                prefetched = 0
            uids = [beams[i].uid for i in gp.beams]
            cache = GroupCache(DenseKV(buf.tensor), self.L, start)
            t0 = time.perf_counter()
            with st.compute():
                gt, gl, glast = self._decode(cache, uids, self._parent_logp([beams[i] for i in gp.beams]), start, T)
            comp_wall = time.perf_counter() - t0
            if pre is not None:
                st.wait_loads(pre[0].tensor)
            with st.io("d2h"):
                st.write_back(buf.tensor, slice(None), range(G), [beams[i].leaf for i in gp.beams], start, T)
                st.keep_alive(buf.tensor, "d2h")
            idx = torch.as_tensor(gp.beams, device=self.device)
            toks[idx], lps[idx] = gt, gl
            for j, i in enumerate(gp.beams):
                last[i] = glast[j]
            buf.free()
            rows.append({"step": plan.step, "group": gi, "beams": G, "load_bytes": loaded,
                         "plan_load_bytes": gp.load_bytes, "prefetch_bytes": prefetched,
                         "plan_prefetch_bytes": gp.prefetch_bytes,
                         "compute_wall_s": comp_wall if not st.cuda else None,
                         "load_span": span, "load_span_bytes": span_bytes})
        if pre is not None:
            raise PlanMismatch(f"step {plan.step}: the last group prefetches beyond the step")
        return toks, lps, torch.stack(last)

    # -- layer-wise offloading ---------------------------------------------------------------------
    def _step_layerwise(self, plan: StepPlan, tree: BeamTree, beams: Sequence[Beam]):
        st = self.store
        start, T, N = plan.start, plan.tokens, len(beams)
        Ls = [int(x) for x in plan.layers_resident]
        for b in beams:
            st.host.ensure(b.leaf, T)
        # two layers in flight (the one computing and the prefetched next), as the plan counts
        st.dev.staging_budget = 2 * N * (start + T) * self.kv_layer_token
        if self.lw_bufs is None:           # first step: resident layers take the prompt from prefill
            if self.prompt_kv is None:
                raise PlanMismatch("layer-wise step 0 without the prefill's KV on the device")
            self.lw_bufs = []
            P = self.prompt_kv.tensor.shape[-2]
            cap = max(start + T, self.max_len or 0)
            for l in range(Ls[0]):
                b = st.dev.alloc((2, N, self.H, cap, self.D), self.dtype, charge=0,
                                 what=f"layer-wise resident layer {l}")
                for i in range(N):
                    st.d2d(b.tensor[:, i, :, :P], self.prompt_kv.tensor[l, :, 0])
                self.lw_bufs.append(b)
            self.prompt_kv.free()
            self.prompt_kv = None
            for b in self.lw_bufs:     # charged once the prefill's copy is freed
                b.charge(N * (start + 1) * self.kv_layer_token)
            self._init_slots(beams)
        else:
            self.lw_bufs = [self._ensure_capacity(b, start + T, start) for b in self.lw_bufs]
        order = sorted(range(N), key=lambda i: self.slot_of[beams[i].uid])
        if [self.slot_of[beams[i].uid] for i in order] != list(range(N)):
            raise PlanMismatch("layer-wise slots do not cover the live beams")
        sb = [beams[i] for i in order]                       # beam at each batch slot
        prefix = [self._prefix_path(tree, b) for b in sb]
        leaves = [b.leaf for b in sb]
        prov = _LayerwiseKV(self, N, prefix, leaves, start)

        def on_token(k: int) -> None:
            s = start + k
            Lt = Ls[k]
            if Lt > len(self.lw_bufs):
                raise PlanMismatch(f"step {plan.step} token {k}: the plan grows layer residency "
                                   f"{len(self.lw_bufs)} -> {Lt}")
            while len(self.lw_bufs) > Lt:                    # evict: write the layer's KV back
                l = len(self.lw_bufs) - 1
                buf = self.lw_bufs.pop()
                with st.io("d2h"):
                    for slot in range(N):
                        pos = 0
                        for sid, n in prefix[slot] + [(leaves[slot], k)]:
                            if n:
                                st.d2h(st.host.get(sid)[l][..., :n, :], buf.tensor[:, slot, :, pos:pos + n])
                            pos += n
                    st.keep_alive(buf.tensor, "d2h")
                buf.free()
            for buf in self.lw_bufs:
                buf.charge(N * (s + 1) * self.kv_layer_token)
            prov.begin_token(k)

        cache = GroupCache(prov, self.L, start)
        with st.compute():
            toks, lps, last = self._decode(cache, [b.uid for b in sb], self._parent_logp(sb), start, T,
                                           on_token=lambda k: (prov.end_token(), on_token(k)))
            prov.end_token()
        inv = torch.as_tensor(np.argsort(order), device=self.device)
        return toks[inv], lps[inv], last[inv]

    # ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def expand(self, plan: StepPlan, tree: BeamTree, old: Sequence[Beam], new: Sequence[Beam]) -> float:
        """Prune + expand on the engine's side (see module doc). Returns wall seconds."""
        t0 = time.perf_counter()
        st = self.store
        st.host.keep_only(tree.segments.keys())
        parents = {b.parent_uid for b in new}
        for u in [u for u in self.next_logp if u not in parents]:
            del self.next_logp[u]
        bufs = ([self.res] if self.res is not None else []) + list(self.lw_bufs or [])
        if bufs and new:
            S = tree.prefix_tokens(new[0])
            kept = {b.uid for b in old if b.uid in parents}
            free = sorted(self.slot_of[b.uid] for b in old if b.uid not in kept)
            slot_of, seen = {}, set()
            for b in new:
                ps = self.slot_of[b.parent_uid]
                if b.parent_uid not in seen:          # first child keeps the parent's slot
                    seen.add(b.parent_uid)
                    slot_of[b.uid] = ps
                    continue
                s = free.pop(0)
                for buf in bufs:                      # copy the parent's KV into the child's slot
                    st.d2d(buf.tensor[..., s, :, :S, :], buf.tensor[..., ps, :, :S, :])
                slot_of[b.uid] = s
            self.slot_of = slot_of
        if st.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def energy_j(self, total_s: float, compute_s: float) -> Optional[float]:
        """Measured GPU energy of the run window (J), or None where it cannot be read."""
        return self._energy_j

    def close(self) -> None:
        if self._energy is not None and self._energy.available and "run" in self._energy._open:
            m = self._energy.end_window("run", sync=lambda: torch.cuda.synchronize(self.device))
            self._energy_j = m.energy_j
        for b in list(self.store.dev.live):
            b.free()
        self.res, self.lw_bufs, self.prompt_kv = None, None, None


class _LayerwiseKV:
    """Provider for layer-wise offloading: resident layers from ``lw_bufs``; the others loaded per
    token (all beams' paths, ``s`` tokens) into a staging buffer of ``s + 1`` tokens just before the
    layer attends, with the next offloaded layer prefetched; the new token written back after."""

    def __init__(self, ex: TorchExecutor, N: int, prefix, leaves, start: int):
        self.ex, self.N, self.prefix, self.leaves, self.start = ex, N, prefix, leaves, start
        self.k = 0
        self.inflight: Dict[int, DeviceBuffer] = {}

    def begin_token(self, k: int) -> None:
        self.k = k

    def end_token(self) -> None:
        for b in self.inflight.values():
            b.free()
        self.inflight.clear()

    def _load(self, l: int) -> None:
        st, s = self.ex.store, self.start + self.k
        buf = st.dev.alloc((2, self.N, self.ex.H, s + 1, self.ex.D), self.ex.dtype, kind="staging",
                           what=f"layer {l} in flight")
        paths = [p + [(leaf, self.k)] for p, leaf in zip(self.prefix, self.leaves)]
        with st.io("h2d"):
            st.load_paths(buf.tensor, l, range(self.N), paths, credits=None)
        self.inflight[l] = buf

    def layer_kv(self, l: int) -> torch.Tensor:
        ex, st = self.ex, self.ex.store
        if l < len(ex.lw_bufs):
            return ex.lw_bufs[l].tensor
        for j in [j for j in self.inflight if j < l]:     # the previous offloaded layer is done
            self.inflight.pop(j).free()
        if l not in self.inflight:
            self._load(l)
        st.wait_loads(self.inflight[l].tensor)
        if l + 1 < ex.L and l + 1 not in self.inflight:
            self._load(l + 1)                              # prefetch the next layer
        return self.inflight[l].tensor

    def layer_done(self, l: int, start: int, q: int) -> None:
        ex, st = self.ex, self.ex.store
        if l < len(ex.lw_bufs):
            return
        buf = self.inflight[l].tensor
        with st.io("d2h"):
            st.write_back(buf, l, range(self.N), self.leaves, start, q, host_pos=self.k)
            st.keep_alive(buf, "d2h")
