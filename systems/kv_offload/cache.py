"""A transformers ``Cache`` that serves each layer's K/V from the TTC engine's dense device buffers.

transformers 5.x calls ``past_key_values.update(key_states, value_states, layer_idx)`` once per
decoder layer per forward, with ``key_states``/``value_states`` of shape
``[batch, num_kv_heads, q_len, head_dim]``, and uses the returned tensors (all cached tokens plus
the new ones, same layout) for attention. :class:`GroupCache` answers from a :class:`KVProvider`:
before layer ``l`` attends, ``provider.layer_kv(l)`` returns that layer's dense buffer
``[2, batch, num_kv_heads, capacity, head_dim]`` (any strides; the provider may load it from the host first and
prefetch layer ``l+1``: layer-wise offloading's per-layer hook); the new K/V are written in place at
``[length, length + q_len)`` and ``provider.layer_done(l, length, q_len)`` may then write them back
to the host. Nothing is concatenated or reallocated per token (``DynamicCache`` uses ``torch.cat``).

All sequences of a batch have the same length (true in step-wise beam search: every live path has
the same length), so no padding mask is needed: decode (``q_len = 1``) and prefill run with the
model's causal path. Works with OPT, LLaMA (GQA) and Qwen2 in transformers 5.19.
"""

from __future__ import annotations

from typing import Protocol, Tuple

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class KVProvider(Protocol):
    def layer_kv(self, layer_idx: int) -> torch.Tensor:
        """Layer ``layer_idx``'s resident buffer ``[2, batch, num_kv_heads, capacity, head_dim]``."""

    def layer_done(self, layer_idx: int, start: int, q_len: int) -> None:
        """Tokens ``[start, start + q_len)`` of the layer were just written."""


class DenseKV:
    """Simplest provider: one preallocated tensor ``[num_layers, 2, batch, num_kv_heads, capacity,
    head_dim]`` (all layers resident). Used for prefill, in-GPU runs and tests."""

    def __init__(self, kv: torch.Tensor):
        self.kv = kv
        self.layers = kv.unbind(0)  # per-layer views, made once (a decode step asks for each every token)
        self.split = [layer.unbind(0) for layer in self.layers]  # (keys, values) per layer, made once

    def layer_kv(self, layer_idx: int) -> torch.Tensor:
        return self.layers[layer_idx]

    def layer_kv_split(self, layer_idx: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_idx``'s (keys, values) views, ``[batch, num_kv_heads, capacity, head_dim]``
        each: the buffer is resident for the cache's life, so the views are made once."""
        return self.split[layer_idx]

    def layer_done(self, layer_idx: int, start: int, q_len: int) -> None:
        pass


class BufferLayer(CacheLayerMixin):
    """One layer of :class:`GroupCache`. Holds the provider itself (no reference back to the cache,
    so a cache and its layers are freed by reference counting the moment the engine drops them) and
    keeps no views of the buffer between calls (a freed buffer's memory is not held alive)."""

    is_sliding = False
    is_compileable = False
    supports_early_init = False

    def __init__(self, provider: KVProvider, layer_idx: int, length: int):
        super().__init__()
        self.provider, self.layer_idx, self.length = provider, layer_idx, length
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # buffers come from the provider
        pass

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        split = getattr(self.provider, "layer_kv_split", None)  # a resident buffer's views, made once
        keys, values = split(self.layer_idx) if split else self.provider.layer_kv(self.layer_idx).unbind(0)
        n, q = self.length, key_states.shape[-2]
        if n + q > keys.shape[-2]:
            raise RuntimeError(
                f"layer {self.layer_idx}: {n + q} tokens exceed the device buffer's capacity {keys.shape[-2]}"
            )
        keys.narrow(-2, n, q).copy_(key_states)
        values.narrow(-2, n, q).copy_(value_states)
        self.length = n + q
        self.provider.layer_done(self.layer_idx, n, q)
        return keys.narrow(-2, 0, n + q), values.narrow(-2, 0, n + q)

    def get_mask_sizes(self, query_length: int) -> Tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0


class GroupCache(Cache):
    """``Cache`` over a provider's buffers for one group of equal-length beams.

    Args:
        provider: a :class:`KVProvider` (buffers ``[2, G, num_kv_heads, capacity, head_dim]`` per layer).
        num_layers: decoder layers of the model.
        length: tokens already in the buffers (positions ``[0, length)``), the same for every beam.
    """

    def __init__(self, provider: KVProvider, num_layers: int, length: int = 0):
        super().__init__(layers=[BufferLayer(provider, i, length) for i in range(num_layers)])

    def set_length(self, length: int) -> None:
        for layer in self.layers:
            layer.length = length
