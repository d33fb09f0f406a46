"""One decode token through a transformers causal LM, layer by layer, without its generic forward.

The engine's decode step (one new token per beam against a cache of ``n`` tokens) spends most of
its host time in transformers' generic machinery around the arithmetic: masks it does not need for
one query, keyword plumbing, hooks and wrappers on every module call. :class:`LeanDecoder` runs the
same arithmetic with the model's own weights and functions (its layer norms and MLP modules, its
rotary embedding, ``scaled_dot_product_attention`` as transformers' sdpa path calls it), in the
order the architecture's forward does, and writes each layer's K/V through the engine's cache
(``GroupCache``: its providers and ``layer_done`` hooks, so layer-wise prefetch and LBS groups work
unchanged). Supported: OPT (pre-norm, learned positions) and the LLaMA family (LLaMA, Qwen2: RMSNorm,
rotary positions, grouped-query attention). ``tests/kv_offload/test_decoder.py`` compares its logits
with transformers' own forward (float64) for each. Another architecture decodes through transformers
(:func:`lean_decoder` returns None; the engine says which in its record, ``decode_path``).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

LEAN_TYPES = ("opt", "llama", "qwen2")


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


def lean_decoder(model) -> Optional["LeanDecoder"]:
    """A :class:`LeanDecoder` for ``model``, or None when its architecture is not one of
    :data:`LEAN_TYPES` (or an OPT configuration the lean path does not cover: post-norm)."""
    kind = model.config.model_type
    if kind not in LEAN_TYPES or (kind == "opt" and not model.config.do_layer_norm_before):
        return None
    return LeanDecoder(model)


class LeanDecoder:
    """``decoder(ids, cache) -> logits [B, 1, V]`` for token ids ``[B]`` appended at position
    ``cache.get_seq_length()`` (every beam of a group has the same length)."""

    def __init__(self, model):
        self.model, self.kind = model, model.config.model_type
        self.base = model.model.decoder if self.kind == "opt" else model.model
        self.qkv = [_fuse_qkv(layer.self_attn) for layer in self.base.layers]

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, cache) -> torch.Tensor:
        n = cache.get_seq_length()
        h = self._opt(ids, cache, n) if self.kind == "opt" else self._llama(ids, cache, n)
        return self.model.lm_head(h).unsqueeze(1)

    # activations are [B, hidden] (one token per beam): F.linear on 2-D input is one matmul, no views
    def _opt(self, ids: torch.Tensor, cache, n: int) -> torch.Tensor:
        dec = self.base
        h = dec.embed_tokens(ids)
        if dec.project_in is not None:
            h = dec.project_in(h)
        h = h + dec.embed_positions.weight[n + dec.embed_positions.offset]
        B = ids.shape[0]
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            r = h
            x = layer.self_attn_layer_norm(h)
            w, b, sizes = self.qkv[i]
            q, k, v = F.linear(x, w, b).split(sizes, dim=-1)
            q = (q * attn.scaling).view(B, -1, 1, attn.head_dim)
            keys, values = cache.layers[i].update(k.view(B, -1, 1, attn.head_dim), v.view(B, -1, 1, attn.head_dim))
            o = F.scaled_dot_product_attention(q, keys, values, scale=1.0).view(B, -1)
            h = r + F.linear(o, attn.out_proj.weight, attn.out_proj.bias)
            x = layer.final_layer_norm(h)
            x = F.linear(
                layer.activation_fn(F.linear(x, layer.fc1.weight, layer.fc1.bias)), layer.fc2.weight, layer.fc2.bias
            )
            h = h + x
        if dec.final_layer_norm is not None:
            h = dec.final_layer_norm(h)
        if dec.project_out is not None:
            h = dec.project_out(h)
        return h

    def _llama(self, ids: torch.Tensor, cache, n: int) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

        base = self.base
        h = base.embed_tokens(ids)
        cos, sin = base.rotary_emb(h, torch.tensor([[n]], device=h.device))  # [1, 1, head_dim]
        B = ids.shape[0]
        for i, layer in enumerate(base.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            w, b, sizes = self.qkv[i]
            q, k, v = (t.view(B, -1, 1, attn.head_dim) for t in F.linear(x, w, b).split(sizes, dim=-1))
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys, values = cache.layers[i].update(k, v)
            groups = attn.num_key_value_groups
            if groups > 1:
                keys, values = repeat_kv(keys, groups), repeat_kv(values, groups)
            o = F.scaled_dot_product_attention(q, keys, values, scale=attn.scaling).view(B, -1)
            h = h + F.linear(o, attn.o_proj.weight, attn.o_proj.bias)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return base.norm(h)
