"""One decode token through a transformers causal LM, layer by layer, without its generic forward.

The engine's decode step (one new token per beam against a cache of ``n`` tokens) spends most of
its host time in transformers' generic machinery around the arithmetic: masks it does not need for
one query, keyword plumbing, hooks and wrappers on every module call. :class:`LeanDecoder` runs the
same arithmetic with the model's own weights and functions (its RMSNorm and rotary embedding; the
same kernels its ``nn.Linear``, ``nn.LayerNorm`` and activation modules call, called directly:
``addmm`` on weight views transposed once, ``F.layer_norm``; attention as :func:`attend` computes
it), in the order the architecture's forward does, and writes each layer's K/V through the engine's cache
(``GroupCache``: its providers and ``layer_done`` hooks, so layer-wise prefetch and LBS groups work
unchanged). Supported: OPT (pre-norm, learned positions) and the LLaMA family (LLaMA, Qwen2: RMSNorm,
rotary positions, grouped-query attention, gated MLP). ``tests/kv_offload/test_decoder.py`` compares its logits
with transformers' own forward (float64) for each. Another architecture decodes through transformers
(:func:`lean_decoder` returns None; the engine says which in its record, ``decode_path``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F

LEAN_TYPES = ("opt", "llama", "qwen2")


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale) v`` for one query token: q ``[B, H, 1, D]``, keys/values
    ``[B, H_kv, n, D]`` (any strides; ``H`` a multiple of ``H_kv``: query head ``h`` reads K/V head
    ``h // (H / H_kv)``, as transformers' ``repeat_kv`` arranges them) -> ``[B, H * D]``. On CUDA,
    ``scaled_dot_product_attention`` (its fused kernels, ``enable_gqa`` instead of repeated K/V); on a
    CPU, two batched matmuls and a softmax with each K/V head's queries as rows (no repeated K/V): for
    a single query the CPU flash kernel costs 2.5x as much (64 beams, 4 heads, 48 tokens: 208 vs 84 us)."""
    B, H, _, D = q.shape
    if q.is_cuda:
        o = F.scaled_dot_product_attention(q, keys, values, scale=scale, enable_gqa=keys.shape[1] != H)
        return o.view(B, H * D)
    # batched matmuls on 3-D views (what torch.matmul folds the 4-D operands to, without its expand and
    # reshape operators): rows = (beam, K/V head), each row's queries = that K/V head's query heads
    Hkv, n = keys.shape[1], keys.shape[2]
    s = torch.bmm(q.reshape(B * Hkv, H // Hkv, D), keys.reshape(B * Hkv, n, D).transpose(1, 2))
    if scale != 1.0:
        s = s * scale
    return torch.bmm(torch.softmax(s, dim=-1), values.reshape(B * Hkv, n, D)).view(B, H * D)


def _fuse_qkv(attn):
    """One ``[q + k + v, hidden]`` weight (and bias) for the attention's three projections, one matmul
    per token instead of three; the modules' own parameters become views of it, so the model's
    memory and its transformers forward are unchanged. Returns (weight, bias or None, split sizes)."""
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    sizes = [p.weight.shape[0] for p in projs]
    weight = torch.cat([p.weight.detach() for p in projs])
    bias = torch.cat([p.bias.detach() for p in projs]) if projs[0].bias is not None else None
    for p, w in zip(projs, weight.split(sizes)):
        p.weight = torch.nn.Parameter(w, requires_grad=False)
    if bias is not None:
        for p, b in zip(projs, bias.split(sizes)):
            p.bias = torch.nn.Parameter(b, requires_grad=False)
    return weight, bias, sizes


def _affine(linear) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A ``nn.Linear``'s (transposed weight view, bias or None), for :func:`_dense`."""
    return linear.weight.t(), linear.bias


def _dense(x: torch.Tensor, weight_t: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for 2-D ``x`` ``[B, in]`` with ``weight_t = weight.t()``: the same
    kernel ``F.linear`` calls (``addmm``, or ``mm`` without a bias), without its transpose operator."""
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def _layer_norm(norm: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """A ``nn.LayerNorm``'s forward without the module call's dispatch."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _act(module) -> Callable:
    """An activation module's forward (ReLU, SiLU: ``torch.relu``, ``F.silu``), without the module call."""
    if isinstance(module, torch.nn.ReLU) and not module.inplace:
        return torch.relu
    return module.forward


DECODE_PATHS = ("auto", "lean", "piecewise", "transformers")


def decode_path_problem(
    path: str, lean: bool, cuda: bool, batch_invariant: bool, model: str
) -> Optional[Tuple[str, Any, str]]:
    """Why ``system.decode_path=path`` (with ``system.batch_invariant``) cannot run: ``(field, value,
    what is allowed)``, or None when it can. ``lean``: the model is one the lean arithmetic covers
    (:func:`lean_supported`); ``cuda``: the engine's device is a CUDA GPU; ``model``: its name for the
    message. The one rule for the runner's check before any work and the engine's constructor."""
    if path not in DECODE_PATHS:
        return "decode_path", path, " | ".join(DECODE_PATHS)
    if path in ("lean", "piecewise") and not lean:
        return (
            "decode_path",
            path,
            f"auto or transformers for {model}: the lean arithmetic covers {', '.join(LEAN_TYPES)} (pre-norm OPT)",
        )
    if batch_invariant and not (path == "piecewise" or (path == "auto" and lean and cuda)):
        return (
            "batch_invariant",
            True,
            "false unless decode_path=piecewise (or auto on a CUDA GPU): it pads the piecewise path's groups",
        )
    return None


def lean_supported(model_type: str, hf_config) -> bool:
    """Whether the lean arithmetic covers a model: its transformers ``model_type`` is one of
    :data:`LEAN_TYPES` (an OPT model pre-norm, ``do_layer_norm_before``)."""
    if model_type not in LEAN_TYPES:
        return False
    return model_type != "opt" or bool((hf_config or {}).get("do_layer_norm_before", True))


def lean_decoder(model) -> Optional["LeanDecoder"]:
    """A :class:`LeanDecoder` for ``model``, or None when its architecture is not one of
    :data:`LEAN_TYPES` (or an OPT configuration the lean path does not cover: post-norm)."""
    cfg = model.config
    if not lean_supported(cfg.model_type, {"do_layer_norm_before": getattr(cfg, "do_layer_norm_before", True)}):
        return None
    return LeanDecoder(model)


class LeanDecoder:
    """``decoder(ids, cache) -> logits [B, 1, V]`` for token ids ``[B]`` appended at position
    ``cache.get_seq_length()`` (every beam of a group has the same length).

    The arithmetic is written once, as the pieces between attentions that
    :class:`systems.kv_offload.piecewise.PiecewiseDecoder` captures as CUDA graphs:
    :meth:`embed` (token + position), :meth:`pre_attn` (layer ``l``'s norm, Q/K/V, rotary),
    :meth:`post_attn` (output projection, MLP, residuals), :meth:`head` (final norm, LM head);
    attention (:func:`attend`, on the cache's K/V) runs between them. Activations are ``[B, hidden]``
    (one token per beam: each projection is one ``addmm`` on 2-D input, no views)."""

    def __init__(self, model):
        self.model, self.kind = model, model.config.model_type
        self.base = model.model.decoder if self.kind == "opt" else model.model
        self.layers = list(self.base.layers)
        fused = [_fuse_qkv(layer.self_attn) for layer in self.layers]
        self.qkv = [(w.t(), b) for w, b, _ in fused]  # (transposed weight view, bias), for _dense
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.qkv_heads = [size // self.head_dim for size in fused[0][2]]  # (query, key, value) heads
        # OPT scales the query before attention (q * scaling), LLaMA scales the scores
        self.scale = 1.0 if self.kind == "opt" else attn.scaling
        self.lm_head_t = model.lm_head.weight.t()
        if self.kind == "opt":
            self.out = [_affine(layer.self_attn.out_proj) for layer in self.layers]
            self.mlp = [(_affine(layer.fc1), _affine(layer.fc2), _act(layer.activation_fn)) for layer in self.layers]
        else:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            self.rotate = apply_rotary_pos_emb
            self.out = [_affine(layer.self_attn.o_proj) for layer in self.layers]
            self.mlp = [
                (_affine(m.gate_proj), _affine(m.up_proj), _affine(m.down_proj), _act(m.act_fn))
                for m in (layer.mlp for layer in self.layers)
            ]

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, cache) -> torch.Tensor:
        return self.logits(ids, cache).unsqueeze(1)

    def logits(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """Logits ``[B, V]`` of the token after ``ids`` ``[B]`` (the engine's decode; no grad mode of
        its own: the engine's step runs under one)."""
        n = cache.get_seq_length()
        h, pos = self.embed(ids, n)
        for i in range(len(self.layers)):
            q, k, v = self.pre_attn(i, h, pos)
            keys, values = cache.layers[i].update(k, v)
            h = self.post_attn(i, h, self.attention(q, keys, values))
        return self.head(h)

    def embed(self, ids: torch.Tensor, n):
        """``(h [B, hidden], pos)``: the tokens' embedding at position ``n`` (an int, or a long tensor
        ``[1]`` for a captured graph); ``pos`` is what :meth:`pre_attn` needs of the position (LLaMA's
        rotary ``(cos, sin)``, nothing for OPT's learned positions, added here)."""
        base = self.base
        h = F.embedding(ids, base.embed_tokens.weight, base.embed_tokens.padding_idx)
        if self.kind == "opt":
            if base.project_in is not None:
                h = base.project_in(h)
            return h + base.embed_positions.weight[n + base.embed_positions.offset], None
        n = n.view(1, 1) if isinstance(n, torch.Tensor) else torch.tensor([[n]], device=h.device)
        return h, base.rotary_emb(h, n)  # ([1, 1, head_dim], [1, 1, head_dim])

    def pre_attn(self, i: int, h: torch.Tensor, pos):
        """Layer ``i``'s query, key, value ``[B, heads, 1, head_dim]`` (query scaled for OPT, rotated
        for LLaMA) from the residual stream ``h``."""
        layer, B, D = self.layers[i], h.shape[0], self.head_dim
        x = _layer_norm(layer.self_attn_layer_norm, h) if self.kind == "opt" else layer.input_layernorm.forward(h)
        q, k, v = _dense(x, *self.qkv[i]).view(B, -1, 1, D).split(self.qkv_heads, dim=1)
        if self.kind == "opt":
            return q * layer.self_attn.scaling, k, v
        q, k = self.rotate(q, k, *pos)
        return q, k, v

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``[B, heads * head_dim]``: :func:`attend` over the cache's K/V."""
        return attend(q, keys, values, self.scale)

    def post_attn(self, i: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The residual stream after layer ``i`` from its input ``h`` and attention output ``o``."""
        layer = self.layers[i]
        h = h + _dense(o, *self.out[i])
        if self.kind == "opt":
            fc1, fc2, act = self.mlp[i]
            return h + _dense(act(_dense(_layer_norm(layer.final_layer_norm, h), *fc1)), *fc2)
        gate, up, down, act = self.mlp[i]
        x = layer.post_attention_layernorm.forward(h)
        return h + _dense(act(_dense(x, *gate)) * _dense(x, *up), *down)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` from the last layer's residual stream."""
        base = self.base
        if self.kind == "opt":
            if base.final_layer_norm is not None:
                h = _layer_norm(base.final_layer_norm, h)
            if base.project_out is not None:
                h = base.project_out(h)
        else:
            h = base.norm.forward(h)
        return torch.mm(h, self.lm_head_t)
