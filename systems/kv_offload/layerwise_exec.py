"""Layer-wise offloading on the torch executor (LBS paper Eq.1-3; the baseline of HF transformers,
FlexGen, llama.cpp): see ``systems.kv_offload.torch_engine``'s module doc for the execution and
``systems.kv_offload.plan`` for the bytes.

Per run: ``L`` resident layers as dense device buffers ``[2, N, H, cap, D]`` (``cap = start + T``,
regrown each step), the other layers on the host as :class:`systems.kv_offload.kvstore.HostLayers`
(token-major, all beams). Per step: layers leaving residency are written back whole; per token,
each offloaded layer is loaded (its KV from before the step, one copy) into a staging buffer while
the previous layer computes; the step's tokens of offloaded layers stay on the device (the *tail*)
and go to the host in one copy per layer at the step's end. Host keys are ``("layer", l)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from systems.kv_offload.cache import GroupCache
from systems.kv_offload.kvstore import DeviceBuffer, HostLayers, PlanMismatch
from systems.kv_offload.plan import StepPlan
from systems.kv_offload.tree import Beam, BeamTree

if TYPE_CHECKING:
    from systems.kv_offload.torch_engine import TorchExecutor


def key(layer: int) -> Tuple[str, int]:
    """Host key of an offloaded layer (ordering of its write-backs before its loads)."""
    return ("layer", layer)


def token_major(t: torch.Tensor) -> torch.Tensor:
    """``[2, N, H, s, D]`` -> ``[s, 2, N, H, D]`` view (the host layout of :class:`HostLayers`)."""
    return t.permute(3, 0, 1, 2, 4)


class LayerwiseExec:
    """Layer-wise state of one run: resident device layers, host layers, and the step loop."""

    def __init__(self, ex: "TorchExecutor", num_beams: int):
        self.ex, self.N = ex, num_beams
        self.resident: List[DeviceBuffer] = []  # layer l < L: [2, N, H, cap, D]
        self.host = HostLayers(ex.max_len or 0, num_beams, ex.H, ex.D, ex.dtype, pin=ex.cuda)
        self.started = False

    # -- step ------------------------------------------------------------------------------------
    def step(self, plan: StepPlan, tree: BeamTree, beams: Sequence[Beam]):
        ex, st = self.ex, self.ex.store
        start, T, N = plan.start, plan.tokens, self.N
        if len(beams) != N:
            raise PlanMismatch(f"layer-wise: {len(beams)} live beams, the run has {N}")
        L = int(plan.layers_resident[0])
        if any(int(x) != L for x in plan.layers_resident):
            raise PlanMismatch(f"step {plan.step}: layer residency changes inside the step")
        self._need_host(start + T)
        if not self.started:
            self._first_step(L, start, T, beams)
        else:
            self._evict(L, start)
            self.resident = [ex.ensure_capacity(b, start + T, start, exact=True) for b in self.resident]
            for b in self.resident:  # charged as allocated: the whole step
                b.charge(N * (start + T) * ex.kv_layer_token)
        off = ex.L - L
        tail = (
            st.dev.alloc(
                (off, T, 2, N, ex.H, ex.D),
                ex.dtype,
                kind="staging",
                what=f"step {plan.step} tail of {off} offloaded layers",
            )
            if off
            else None
        )
        order = ex.slot_order(beams)
        sb = [beams[i] for i in order]  # beam at each batch slot
        prov = _LayerwiseKV(self, start, tail)
        toks, lps, last = self._decode(prov, sb, start, T)
        prov.end_token()
        if tail is not None:  # the step's tokens of offloaded layers, once
            with st.io("d2h"):
                for j, layer in enumerate(range(L, ex.L)):
                    st.d2h(self.host.layer(layer)[start : start + T], tail.tensor[j], key=key(layer))
                st.keep_alive(tail.tensor, direction="d2h")
            tail.free()
        inv = torch.as_tensor(np.argsort(order), device=ex.device)
        return toks[inv], lps[inv], last[inv]

    def _decode(self, prov: "_LayerwiseKV", sb: Sequence[Beam], start: int, T: int):
        ex = self.ex
        cache = GroupCache(prov, ex.L, start)
        return ex.decode(cache, [b.uid for b in sb], ex.parent_logp(sb), start, T, on_token=prov.begin_token)

    def _need_host(self, tokens: int) -> None:
        """Grow the host layers' capacity (only when the run did not give ``max_len``)."""
        cap = self.host.shape[0]
        if tokens <= cap:
            return
        self.ex.store.host_ready(key(layer) for layer in list(self.host.layers))
        old = self.host
        self.host = HostLayers(tokens, self.N, self.ex.H, self.ex.D, self.ex.dtype, pin=self.ex.cuda)
        for layer, t in old.layers.items():
            self.host.layer(layer)[:cap].copy_(t)

    def _first_step(self, L: int, start: int, T: int, beams: Sequence[Beam]) -> None:
        """Step 0: the prefill's KV (all layers, one beam) fills the resident layers of every beam;
        the other layers are written to the host for every beam."""
        ex, st, N = self.ex, self.ex.store, self.N
        prompt = ex.take_prompt()
        P = prompt.tensor.shape[-2]
        with st.io("d2h"):
            for layer in range(L, ex.L):
                src = token_major(prompt.tensor[layer]).expand(P, 2, N, ex.H, ex.D)
                st.d2h(self.host.layer(layer)[:P], src, key=key(layer))
            st.keep_alive(prompt.tensor, direction="d2h")
        for layer in range(L):
            b = st.dev.alloc((2, N, ex.H, start + T, ex.D), ex.dtype, what=f"layer-wise resident layer {layer}")
            st.d2d(b.tensor[:, :, :, :P], prompt.tensor[layer].expand(2, N, ex.H, P, ex.D))
            self.resident.append(b)
        prompt.free()
        ex.slot_of = {b.uid: i for i, b in enumerate(beams)}
        self.started = True

    def _evict(self, L: int, start: int) -> None:
        """Layers ``>= L`` leave residency: their KV (all beams, ``start`` tokens) goes to the host."""
        st = self.ex.store
        if L > len(self.resident):
            raise PlanMismatch(f"the plan grows layer residency {len(self.resident)} -> {L}")
        if L == len(self.resident):
            return
        with st.io("d2h"):
            for layer in range(L, len(self.resident)):
                t = self.resident[layer].tensor
                st.d2h(self.host.layer(layer)[:start], token_major(t[:, :, :, :start]), key=key(layer))
                st.keep_alive(t, direction="d2h")
        for b in self.resident[L:]:
            b.free()
        del self.resident[L:]

    # -- selection -------------------------------------------------------------------------------
    def reorder(self, moves: Sequence[Tuple[int, int]], S: int) -> None:
        """Copy each parent's KV (``S`` tokens) into its new child's slot: resident layers on the
        device, offloaded layers on the host (after their pending write-backs)."""
        st = self.ex.store
        for b in self.resident:
            for dst, src in moves:
                st.d2d(b.tensor[:, dst, :, :S], b.tensor[:, src, :, :S])
        for layer in sorted(self.host.layers):
            if layer < len(self.resident):
                continue
            with st.cpu_rewrite(key(layer)):
                h = self.host.layer(layer)
                for dst, src in moves:
                    h[:S, :, dst].copy_(h[:S, :, src])


class _LayerwiseKV:
    """KV provider of one layer-wise step (``systems.kv_offload.cache.KVProvider``)."""

    def __init__(self, lw: LayerwiseExec, start: int, tail: Optional[DeviceBuffer]):
        self.lw, self.ex, self.st = lw, lw.ex, lw.ex.store
        self.start, self.tail = start, tail
        self.L = len(lw.resident)
        self.k = 0
        self.inflight: Dict[int, DeviceBuffer] = {}

    def begin_token(self, k: int) -> None:
        """Token ``k`` starts: release the last token's staging, prefetch the first offloaded layer
        (it loads while the resident layers compute)."""
        self.end_token()
        self.k = k
        if self.L < self.ex.L:
            self._load(self.L)

    def end_token(self) -> None:
        for b in self.inflight.values():
            b.free()
        self.inflight.clear()

    def _load(self, layer: int) -> None:
        ex, st, s = self.ex, self.st, self.start
        buf = st.dev.alloc(
            (s + self.k + 1, 2, self.lw.N, ex.H, ex.D), ex.dtype, kind="staging", what=f"layer {layer} in flight"
        )
        with st.io("h2d"):
            st.h2d(buf.tensor[:s], self.lw.host.layer(layer)[:s], key=key(layer))
        self.inflight[layer] = buf

    def layer_kv(self, layer: int) -> torch.Tensor:
        if layer < self.L:
            return self.lw.resident[layer].tensor
        for j in [j for j in self.inflight if j < layer]:  # the previous offloaded layer is done
            self.inflight.pop(j).free()
        if layer not in self.inflight:
            self._load(layer)
        buf = self.inflight[layer].tensor
        self.st.wait_loads(buf)
        if self.k:  # the step's earlier tokens, kept on the device
            self.st.d2d(buf[self.start : self.start + self.k], self.tail.tensor[layer - self.L, : self.k])
        if layer + 1 < self.ex.L:
            self._load(layer + 1)  # prefetch the next layer
        return buf.permute(1, 2, 3, 0, 4)  # [2, N, H, s + 1, D] view

    def layer_done(self, layer: int, start: int, q: int) -> None:
        if layer < self.L:
            return
        pos = self.start + self.k
        self.st.d2d(self.tail.tensor[layer - self.L, self.k : self.k + q], self.inflight[layer].tensor[pos : pos + q])
