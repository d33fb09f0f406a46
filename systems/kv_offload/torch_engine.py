"""The real LBS-family executor on torch: carries out the plans of ``systems.kv_offload.plan`` on a
transformers model through the tiered KV store (LBS paper Sec. 3-4, Alg. 1). It satisfies
:class:`systems.kv_offload.protocol.Executor`, as ``systems.kv_offload.sim.SimExecutor`` does, so the
runner swaps them. Per scheduler: in_gpu keeps every beam's KV resident; layerwise keeps
``plan.layers_resident`` layers and streams the others from the host, one contiguous copy per layer,
prefetching the next; lbs runs group by group, loading each group's segments (and prefetching the
next group's first beams). Sampling (:mod:`systems.kv_offload.sampling`) is one batched computation
keyed by (seed, beam uid, absolute position), never by batch slot. Bytes are counted at every copy, never copied from the plan. How
each call, each scheduler, timing and peak memory work: docs/kv_offload.md, "The torch engine".
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from harness.meters import time_basis
from systems.kv_offload.cache import DenseKV, GroupCache
from systems.kv_offload.decoder import DECODE_PATHS, decode_path_problem, lean_decoder
from systems.kv_offload.kvstore import DeviceBuffer, KVBudgetExceeded, PlanMismatch, TieredKVStore
from systems.kv_offload.layerwise_exec import LayerwiseExec
from systems.kv_offload.model import shared_model
from systems.kv_offload.piecewise import PiecewiseDecoder
from systems.kv_offload.plan import StepPlan, sampling_dtype
from systems.kv_offload.protocol import EnergyWindow, StepOutcome
from systems.kv_offload.sampling import beam_keys, draw, draw_margin, uniforms
from systems.kv_offload.tree import Beam, BeamTree

ROOT = -1  # key of the prompt's next-token distribution (parent of step-0 beams)


def resolve_device(device: str) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def log_probs(logits: torch.Tensor, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` in ``dtype`` (the sampling distribution,
    :func:`systems.kv_offload.sampling.sample`; its value at a token is the token's log-probability)."""
    x = logits.to(dtype)
    return torch.log_softmax(x if temperature == 1.0 else x / temperature, dim=-1)


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
        model: a prebuilt ``(model, KVGeometry)``; default :func:`systems.kv_offload.model.shared_model`
            (one build per process, shared by every run that uses the same model).
        streams: a ``systems.kv_offload.streams`` object (``record=True`` keeps the log of stream
            operations for ordering checks); default: CUDA streams on CUDA, the CPU stand-in.
        decode_path: ``auto`` (piecewise CUDA graphs on CUDA, lean eager on a CPU, transformers for an
            architecture the lean arithmetic does not cover), ``lean``, ``piecewise`` (eager on a CPU)
            or ``transformers`` (``systems.kv_offload.decoder``, ``systems.kv_offload.piecewise``).
        max_beams: the largest group a decode brings (the run's beams): the piecewise path's sizes.
        batch_invariant: piecewise path: every group padded to ``max_beams`` (one shape for every
            group of every scheduler; ``systems.kv_offload.piecewise``).
    Raises ValueError for a decode path the model cannot take (before any work).
    """

    simulated = False

    def __init__(
        self,
        model_cfg,
        device: str = "cpu",
        budget_bytes: Optional[int] = None,
        seed: int = 0,
        scheduler: str = "lbs",
        record_tree: bool = False,
        *,
        dtype: Optional[str] = None,
        temperature: float = 1.0,
        max_len: Optional[int] = None,
        model=None,
        streams=None,
        decode_path: str = "auto",
        max_beams: Optional[int] = None,
        batch_invariant: bool = False,
    ):
        if temperature <= 0:
            raise ValueError(f"temperature={temperature!r} must be > 0")
        self.device = resolve_device(device)
        self.model, self.geom = model if model is not None else shared_model(model_cfg, self.device, seed, dtype)
        g = self.geom
        self.L, self.H, self.D = g.num_layers, g.num_kv_heads, g.head_dim
        self.dtype = next(self.model.parameters()).dtype
        self.kv_layer_token = g.kv_layer_token
        self.kv_token = g.kv_token
        self.store = TieredKVStore(
            self.L, self.H, self.D, self.dtype, self.device, budget_bytes, staging_budget=0, streams=streams
        )
        self.clock, self.time_basis = time_basis(self.device)
        self.budget = budget_bytes
        self.seed, self.temperature, self.scheduler = seed, float(temperature), scheduler
        self.max_len = max_len
        self.record_tree = record_tree
        self.sample_dtype = getattr(torch, sampling_dtype(str(self.dtype).removeprefix("torch.")))  # the sim's too
        self.lean, self.piecewise = self._decoders(decode_path, max_beams, batch_invariant)
        self.next_logp: Dict[int, torch.Tensor] = {}  # uid -> [V] log-probs of its next token
        self.forced: Optional[Dict[int, List[int]]] = None  # teacher forcing: uid -> this step's tokens
        self._flips: List[Tuple[Sequence[int], torch.Tensor, torch.Tensor]] = []
        self.slot_of: Dict[int, int] = {}  # resident runs: uid -> batch slot
        self.prompt_kv: Optional[DeviceBuffer] = None  # prefill KV kept for fan-out
        self.res: Optional[DeviceBuffer] = None  # resident: [L, 2, N, H, cap, D]
        self.lw: Optional[LayerwiseExec] = None
        self._energy, self.energy_reason = None, ("energy unavailable: CPU device (NVML meters NVIDIA GPUs only)")
        if self.device.type == "cuda":
            from harness.meters import EnergyMeter

            meter = EnergyMeter([self.device.index or 0])
            self._energy, self.energy_reason = (meter, "") if meter.available else (None, meter.reason)
        self.energy_source = "measured by NVML, one window per step" if self._energy else None

    def _decoders(self, path: str, max_beams: Optional[int], batch_invariant: bool):
        """(lean, piecewise) decoders for ``path``; sets ``decode_path``, the record's words for it."""
        lean = lean_decoder(self.model) if path in DECODE_PATHS and path != "transformers" else None
        problem = decode_path_problem(path, lean is not None, self.cuda, batch_invariant, self.model.config.model_type)
        if problem:
            raise ValueError(f"{problem[0]}={problem[1]!r} is not allowed: {problem[2]}")
        if lean is None:
            self.decode_path = "transformers forward"
            return None, None
        if path == "lean" or (path == "auto" and not self.cuda):
            self.decode_path = "lean (systems/kv_offload/decoder.py)"
            return lean, None
        if max_beams is None:
            raise ValueError("the piecewise decode path needs max_beams (the largest group) to size its graphs")
        pw = PiecewiseDecoder(
            lean,
            max_beams,
            lambda logits: self._logp(logits),
            graphs=self.cuda,
            pad_to=max_beams if batch_invariant else None,
        )
        how = "CUDA graphs" if self.cuda else "eager"
        sizes = f"every group padded to {max_beams}" if batch_invariant else f"sizes {pw.sizes}"
        self.decode_path = f"piecewise (systems/kv_offload/piecewise.py: {how}, {sizes})"
        return lean, pw

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _logp(self, logits: torch.Tensor) -> torch.Tensor:
        return log_probs(logits, self.temperature, self.sample_dtype)

    @torch.inference_mode()
    def decode(
        self, cache: GroupCache, uids: Sequence[int], logp: torch.Tensor, start: int, T: int, on_token=None
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode ``T`` tokens for a group whose KV (``start`` tokens) is in ``cache``.

        logp: ``[G, V]`` next-token log-probs of each beam's parent. ``on_token(k)`` runs before
        token k's forward. Returns tokens ``[G, T]`` (long), their log-probs ``[G, T]`` and the
        next-token log-probs after the last ``[G, V]``. Teacher forcing (``self.forced`` set by
        :meth:`force`): the tokens are the forced ones, and each beam's own draws that differ from
        them are counted with their margin (``StepOutcome.token_flips``). Runs in inference mode (less
        host work per operator than no-grad mode); what it returns are inference tensors (read them;
        clone one to update it in place outside inference mode)."""
        G = len(uids)
        keys = beam_keys(self.seed, uids, self.device)  # sampling keyed by (seed, uid, position), not slot
        # the step's draws [G, T], cast once to the sampling dtype (draw's own cast is then a no-op),
        # one column per token
        u = uniforms(keys, torch.arange(start, start + T, device=self.device)).to(self.sample_dtype).unbind(1)
        toks, lps = [], []  # per token: [G] tokens, [G, 1] their log-probs (stacked once at the end)
        forced = None
        if self.forced is not None:
            forced = torch.tensor([self.forced[int(x)] for x in uids], dtype=torch.long, device=self.device)
            flips = torch.zeros(G, dtype=torch.long, device=self.device)
            margin = torch.zeros(G, dtype=self.sample_dtype, device=self.device)
        for k in range(T):
            if on_token is not None:
                on_token(k)
            y = draw(logp, u[k])
            if forced is not None:
                flips += y != forced[:, k]
                margin = torch.maximum(margin, draw_margin(logp, u[k], forced[:, k]))
                y = forced[:, k]
            toks.append(y)
            lps.append(logp.gather(1, y[:, None]))
            logp = self.next_token_logp(y, cache)
        if not toks:
            raise ValueError(f"decode of T={T} tokens: at least 1")
        toks, lps = torch.stack(toks, dim=1), torch.cat(lps, dim=1)
        if forced is not None:
            self._flips.append((uids, flips, margin))
        # the piecewise path's log-probs are a static buffer the next decode overwrites
        return toks, lps, logp.clone() if self.piecewise is not None else logp

    def force(self, tokens: Optional[Dict[int, List[int]]]) -> None:
        """Teacher forcing for the next :meth:`execute_step`: beam uid -> its tokens of the step (a
        recorded run's; ``systems.kv_offload.divergence``); None samples again."""
        self.forced = tokens

    def next_token_logp(self, y: torch.Tensor, cache: GroupCache) -> torch.Tensor:
        """Log-probs ``[G, V]`` of the token after ``y`` ``[G]``, whose K/V ``cache`` gains."""
        if self.piecewise is not None:
            return self.piecewise(y, cache)
        if self.lean is not None:
            return self._logp(self.lean.logits(y, cache))
        return self._logp(self.model(input_ids=y[:, None], past_key_values=cache, use_cache=True).logits[:, -1])

    # ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def warmup(self, prompt_tokens: Sequence[int], num_beams: int, tokens: int = 2) -> float:
        """Run the model outside the store and the measurement: the prompt's prefill, then ``tokens``
        decode tokens at ``num_beams`` beams over a short context (lazy initialisation, allocator
        growth, kernel selection for the run's batch size). Returns its wall seconds."""
        t0 = self.clock()
        P = min(len(prompt_tokens), 16)
        kv = torch.empty((self.L, 2, num_beams, self.H, P + tokens, self.D), dtype=self.dtype, device=self.device)
        ids = torch.tensor([list(prompt_tokens)[:P]] * num_beams, dtype=torch.long, device=self.device)
        cache = GroupCache(DenseKV(kv), self.L, 0)
        logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        logp = self._logp(logits[:, -1])
        for _ in range(tokens):  # the path decode takes
            logp = self.next_token_logp(logp.argmax(-1), cache)
        if self.piecewise is not None:  # capture every size a group of the run can take, now
            self.piecewise.warm(self.piecewise.sizes)
        del cache, kv, logits, logp
        self.sync()
        return self.clock() - t0

    @torch.no_grad()
    def prefill(self, tree: BeamTree, prompt_tokens: Sequence[int], offload: bool) -> StepOutcome:
        """Prefill the prompt (segment 0). ``offload``: write its KV to the host (d2h counted) and
        release the device copy; else it stays on the device for the first step to fan out."""
        st = self.store
        if self._energy is not None:
            self._energy.begin_window("step")
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = self.clock()
        P = len(prompt_tokens)
        st.dev.reset_peak()
        h2d0, d2h0 = st.bytes.h2d, st.bytes.d2h
        buf = st.dev.alloc((self.L, 2, 1, self.H, P, self.D), self.dtype, what="prefill KV")
        ids = torch.tensor([list(prompt_tokens)], dtype=torch.long, device=self.device)
        cache = GroupCache(DenseKV(buf.tensor), self.L, 0)
        logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        self.next_logp[ROOT] = self._logp(logits[0, -1])
        del cache, logits
        if offload:
            with st.io("d2h"):
                st.d2h(st.host.ensure(0, P), buf.tensor[:, :, 0], key=0)
                st.keep_alive(buf.tensor, direction="d2h")
        else:
            self.prompt_kv = buf
        st.wait_writebacks()
        stall = st.take_io_stall()
        out = StepOutcome(
            np.zeros(0),
            compute_s=self.clock() - t0 - stall,
            io_stall_s=stall,
            h2d_bytes=st.bytes.h2d - h2d0,
            d2h_bytes=st.bytes.d2h - d2h0,
            peak_device_bytes=st.dev.peak_total,
            peak_physical_bytes=st.dev.peak_physical,
        )
        if offload:
            buf.free()
        return out

    @torch.no_grad()
    def execute_step(self, plan: StepPlan, tree: BeamTree, beams: Sequence[Beam]) -> StepOutcome:
        """Decode one step of the search for every live beam as ``plan`` says (see module doc)."""
        st = self.store
        t0 = self.clock()
        st.dev.reset_peak()
        st.dev.staging_budget = plan.staging_bytes
        h2d0, d2h0 = st.bytes.h2d, st.bytes.d2h
        rows: List[dict] = []
        if plan.resident:
            res = self._step_resident(plan, beams)
        elif plan.scheduler == "layerwise":
            if self.lw is None:
                self.lw = LayerwiseExec(self, len(beams))
            res = self.lw.step(plan, tree, beams)
        elif plan.scheduler == "lbs":
            res = self._step_lbs(plan, tree, beams, rows)
        else:
            raise PlanMismatch(f"scheduler={plan.scheduler!r}: the torch executor runs in_gpu, layerwise, lbs")
        toks, lps, last = res  # per beam (beams order), on device
        st.wait_writebacks()
        stall = st.take_io_stall()  # synchronises: the step's end
        for r in rows:  # copy-engine time of each group's load
            r["load_s"] = st.span_seconds(r.pop("load_span"))
        for b, lp in zip(beams, last):
            self.next_logp[b.uid] = lp
        lps_cpu = lps.double().cpu().numpy()
        tokens = toks.cpu().tolist()
        wall = self.clock() - t0
        return StepOutcome(
            lps_cpu.sum(axis=1),
            tokens=tokens,
            token_flips=self._take_flips(beams),
            compute_s=wall - stall,
            io_stall_s=stall,
            h2d_bytes=st.bytes.h2d - h2d0,
            d2h_bytes=st.bytes.d2h - d2h0,
            peak_device_bytes=st.dev.peak_total,
            peak_physical_bytes=st.dev.peak_physical,
            group_rows=rows,
        )

    def _take_flips(self, beams: Sequence[Beam]) -> Optional[List[tuple]]:
        """Per beam (``beams`` order), (flipped draws, largest margin) of the step's forced decodes."""
        if self.forced is None:
            return None
        got = {}
        for uids, flips, margin in self._flips:
            for u, f, m in zip(uids, flips.tolist(), margin.tolist()):
                got[int(u)] = (int(f), float(m))
        self._flips = []
        return [got[b.uid] for b in beams]

    def parent_logp(self, beams: Sequence[Beam]) -> torch.Tensor:
        return torch.stack([self.next_logp[ROOT if b.parent_uid is None else b.parent_uid] for b in beams])

    @staticmethod
    def _prefix_path(tree: BeamTree, b: Beam) -> List[Tuple[int, int]]:
        return [(s, tree.segments[s].length) for s in b.prefix]

    # -- resident (in_gpu, LBS when everything fits) ---------------------------------------------
    def ensure_capacity(self, buf: DeviceBuffer, need: int, filled: int, exact: bool = False) -> DeviceBuffer:
        """Grow a resident buffer's token capacity (dim -2) to ``need``, copying ``filled`` tokens
        device-side. ``exact``: to ``need`` (layer-wise: physical memory stays within the plan);
        else to ``max_len`` or double (the whole-request budget check covers ``max_len``)."""
        cap = buf.tensor.shape[-2]
        if cap >= need:
            return buf
        new_cap = need if exact else max(need, min(2 * cap, self.max_len or 2 * cap))
        shape = list(buf.tensor.shape)
        shape[-2] = new_cap
        new = self.store.dev.alloc(shape, self.dtype, kind=buf.kind, charge=0, what=buf.what)
        self.store.d2d(new.tensor[..., :filled, :], buf.tensor[..., :filled, :])
        charged = buf.charged
        buf.free()
        new.charge(charged)
        return new

    def slot_order(self, beams: Sequence[Beam]) -> List[int]:
        """Indices of ``beams`` in batch-slot order; raises PlanMismatch unless slots cover them."""
        order = sorted(range(len(beams)), key=lambda i: self.slot_of[beams[i].uid])
        if [self.slot_of[beams[i].uid] for i in order] != list(range(len(beams))):
            raise PlanMismatch("resident slots do not cover the live beams")
        return order

    def take_prompt(self) -> DeviceBuffer:
        """The prefill's KV, moved to the staging allowance (the plan counts it as a step-0 transient)."""
        if self.prompt_kv is None:
            raise PlanMismatch(
                "a step that starts from the prefill's KV on the device, but the prefill "
                "wrote it to the host (offload=True)"
            )
        buf, self.prompt_kv = self.prompt_kv, None
        self.store.dev.rekind(buf, "staging")
        return buf

    def _step_resident(self, plan: StepPlan, beams: Sequence[Beam]):
        from harness.errors import RunOOM

        st, N = self.store, len(beams)
        start, T = plan.start, plan.tokens
        need = start + T
        try:
            if self.res is None:
                prompt = self.take_prompt()
                cap = max(need, self.max_len or need)
                self.res = st.dev.alloc(
                    (self.L, 2, N, self.H, cap, self.D), self.dtype, charge=0, what="resident KV (all beams)"
                )
                P = prompt.tensor.shape[-2]
                # fan the prompt out to every beam's dense slot: one broadcast copy (N slots' bytes)
                st.d2d(self.res.tensor[:, :, :, :, :P], prompt.tensor[:, :, :1].expand(-1, -1, N, -1, -1, -1))
                self.res.charge(N * need * self.kv_token)
                prompt.free()
                self.slot_of = {b.uid: i for i, b in enumerate(beams)}
            else:
                self.res = self.ensure_capacity(self.res, need, start)
                self.res.charge(N * need * self.kv_token)
        except KVBudgetExceeded as e:
            raise RunOOM(f"{self.scheduler}: all beams' KV does not fit the device budget: {e}") from None
        order = self.slot_order(beams)
        uids = [beams[i].uid for i in order]
        cache = GroupCache(DenseKV(self.res.tensor), self.L, start)
        toks, lps, last = self.decode(cache, uids, self.parent_logp([beams[i] for i in order]), start, T)
        inv = torch.as_tensor(np.argsort(order), device=self.device)
        return toks[inv], lps[inv], last[inv]

    # -- LBS: group by group -----------------------------------------------------------------------
    def _step_lbs(self, plan: StepPlan, tree: BeamTree, beams: Sequence[Beam], rows: List[dict]):
        st = self.store
        start, T, N = plan.start, plan.tokens, len(beams)
        paths = [self._prefix_path(tree, b) for b in beams]
        for b in beams:
            st.host.ensure(b.leaf, T)
        toks = torch.empty(N, T, dtype=torch.long, device=self.device)
        lps = torch.empty(N, T, dtype=self.sample_dtype, device=self.device)
        last = [None] * N
        covered = sorted(i for gp in plan.groups for i in gp.beams)
        if covered != list(range(N)):
            raise PlanMismatch(f"step {plan.step}: the plan's groups do not cover the {N} live beams once each")
        pre: Optional[Tuple[DeviceBuffer, Counter, dict]] = None  # prefetched part of this group
        for gi, gp in enumerate(plan.groups):
            G = len(gp.beams)
            h0 = st.bytes.h2d
            buf = st.dev.alloc(
                (self.L, 2, G, self.H, start + T, self.D), self.dtype, what=f"step {plan.step} group {gi} ({G} beams)"
            )
            if pre is not None:
                sbuf, credits, sources = pre
                k = sbuf.tensor.shape[2]
                st.d2d(buf.tensor[:, :, :k, :, :start], sbuf.tensor)  # compute stream, after wait_loads
                sbuf.free()
                sources = {sid: (buf.tensor, slot, pos) for sid, (_, slot, pos) in sources.items()}
            else:
                k, credits, sources = 0, Counter(gp.load_blocks), {}
            fan: list = []
            with st.io("h2d"):
                with st.copy_span("h2d") as span:  # the host->device copies alone (load_s)
                    st.load_paths(
                        buf.tensor, range(k, G), [paths[i] for i in gp.beams[k:]], credits, sources, fan_out=fan
                    )
                st.fan_out(fan)  # shared prefixes to the other beams, device-side
            if any(v != 0 for v in credits.values()):
                raise PlanMismatch(
                    f"step {plan.step} group {gi}: the plan loads blocks no beam needs: "
                    f"{ {s: c for s, c in credits.items() if c} }"
                )
            st.wait_loads(buf.tensor)
            loaded = st.bytes.h2d - h0
            # prefetch the next group's first beams into the free slots (before this group computes)
            pre, prefetched = None, 0
            if gp.prefetch_beams and gi + 1 < len(plan.groups):
                nxt = plan.groups[gi + 1]
                kp = gp.prefetch_beams
                sbuf = st.dev.alloc(
                    (self.L, 2, kp, self.H, start, self.D),
                    self.dtype,
                    what=f"step {plan.step} prefetch of group {gi + 1} ({kp} beams)",
                )
                ncredits, nsources = Counter(nxt.load_blocks), {}
                h1 = st.bytes.h2d
                with st.io("h2d"):
                    st.load_paths(sbuf.tensor, range(kp), [paths[i] for i in nxt.beams[:kp]], ncredits, nsources)
                pre = (sbuf, ncredits, nsources)
                prefetched = st.bytes.h2d - h1
            t0 = self.clock()
            gt, gl, glast = self._decode_group(buf, [beams[i] for i in gp.beams], start, T)
            comp_wall = self.clock() - t0
            if pre is not None:
                st.wait_loads(pre[0].tensor)
            with st.io("d2h"):
                st.write_back(buf.tensor, range(G), [beams[i].leaf for i in gp.beams], start, T)
                st.keep_alive(buf.tensor, direction="d2h")
            idx = torch.as_tensor(gp.beams, device=self.device)
            toks[idx], lps[idx] = gt, gl
            for j, i in enumerate(gp.beams):
                last[i] = glast[j]
            buf.free()  # no other reference is left: the memory is released here
            rows.append(
                {
                    "step": plan.step,
                    "group": gi,
                    "beams": G,
                    "load_bytes": loaded,
                    "plan_load_bytes": gp.load_bytes,
                    "prefetch_bytes": prefetched,
                    "plan_prefetch_bytes": gp.prefetch_bytes,
                    "compute_wall_s": comp_wall if not st.cuda else None,
                    "load_span": span,
                    "load_span_bytes": loaded,
                }
            )
        if pre is not None:
            raise PlanMismatch(f"step {plan.step}: the last group prefetches beyond the step")
        return toks, lps, torch.stack(last)

    def _decode_group(self, buf: DeviceBuffer, beams: Sequence[Beam], start: int, T: int):
        """One group's ``T`` tokens; the group's cache lives only inside this call."""
        cache = GroupCache(DenseKV(buf.tensor), self.L, start)
        return self.decode(cache, [b.uid for b in beams], self.parent_logp(beams), start, T)

    # ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def expand(self, plan: StepPlan, tree: BeamTree, old: Sequence[Beam], new: Sequence[Beam]) -> float:
        """Prune + expand on the engine's side (see module doc). Returns wall seconds."""
        t0 = self.clock()
        st = self.store
        st.host.keep_only(tree.segments.keys())
        parents = {b.parent_uid for b in new}
        for u in [u for u in self.next_logp if u not in parents]:
            del self.next_logp[u]
        if (self.res is not None or self.lw is not None) and new:
            S = tree.prefix_tokens(new[0])
            moves, slot_of = self._child_slots(old, new, parents)
            if self.res is not None:
                for dst, src in moves:  # copy the parent's KV into the child's slot
                    st.d2d(self.res.tensor[:, :, dst, :, :S], self.res.tensor[:, :, src, :, :S])
            if self.lw is not None:
                self.lw.reorder(moves, S)
            self.slot_of = slot_of
        self.sync()
        return self.clock() - t0

    def _child_slots(self, old: Sequence[Beam], new: Sequence[Beam], parents):
        """Batch slots of the next step's beams: a parent's first child keeps its slot, the others
        take slots of beams that died. Returns ([(child slot, parent slot)] to copy, uid -> slot)."""
        free = sorted(self.slot_of[b.uid] for b in old if b.uid not in parents)
        slot_of, seen, moves = {}, set(), []
        for b in new:
            ps = self.slot_of[b.parent_uid]
            if b.parent_uid not in seen:
                seen.add(b.parent_uid)
                slot_of[b.uid] = ps
                continue
            s = free.pop(0)
            moves.append((s, ps))
            slot_of[b.uid] = s
        return moves, slot_of

    def step_energy(self) -> EnergyWindow:
        """Measured GPU energy (J) of the window since the previous call; opens the next window."""
        if self._energy is None:
            return EnergyWindow(None, None, self.energy_reason)
        m = self._energy.end_window("step", sync=self.sync)
        self._energy.begin_window("step")
        return EnergyWindow(m.energy_j, None, m.reason)

    def memory_peaks(self) -> Dict[str, Optional[int]]:
        """Peak device memory of the run: ``peak_device_physical_bytes`` (the store's live KV
        tensors) and, on CUDA, ``cuda_max_memory_allocated_bytes`` (everything torch allocated)."""
        return {
            "cuda_max_memory_allocated_bytes": int(torch.cuda.max_memory_allocated(self.device)) if self.cuda else None
        }

    def close(self) -> None:
        if self._energy is not None:
            self._energy._open.pop("step", None)  # the window after the last step measures nothing
        for b in list(self.store.dev.live):
            b.free()
        self.res, self.lw, self.prompt_kv = None, None, None
