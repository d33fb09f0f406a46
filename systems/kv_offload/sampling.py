"""Sampling of the LBS-family engine: one batched computation on the device, keyed by (seed, beam uid,
absolute position), never by batch slot, with no Python loop over beams.

A token is drawn by inverse transform: ``u`` uniform in [0, 1) per beam, the token is the first whose
cumulative probability exceeds ``u`` times the row's total (a zero-probability token is never drawn).
``u`` is the top 53 bits of ``mix64(seed, uid, position)`` (:func:`systems.kv_offload.tree.mix64`,
splitmix64's finaliser folded over the values), computed on the device from each beam's key
(``mix64``'s state after ``seed`` and ``uid``, made once per group, :func:`beam_keys`) and the position:
the hash in int64 arithmetic, which wraps as uint64's does, with logical shifts masked from arithmetic
ones (``tests/kv_offload/test_sampling.py`` checks it equals the scalar ``mix64`` bit for bit).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from systems.kv_offload.tree import mix64_array

_GOLDEN = 0x9E3779B97F4A7C15


def _signed(x: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    return x - (1 << 64) if x >= 1 << 63 else x


_C_GOLDEN, _C1, _C2 = _signed(_GOLDEN), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _fold(h: torch.Tensor, v) -> torch.Tensor:
    """One value folded into mix64's state ``h`` (int64 tensors holding uint64 bits)."""
    h = (h ^ v) + _C_GOLDEN
    z = (h ^ _shr(h, 30)) * _C1
    z = (z ^ _shr(z, 27)) * _C2
    return z ^ _shr(z, 31)


def beam_keys(seed: int, uids: Sequence[int], device: torch.device) -> torch.Tensor:
    """``[len(uids)]`` int64 on ``device``: mix64's state after folding ``seed`` and each uid."""
    keys = mix64_array(seed, np.array([int(u) for u in uids], dtype=np.uint64))
    return torch.from_numpy(keys.view(np.int64)).to(device)


def uniforms(keys: torch.Tensor, position) -> torch.Tensor:
    """Float64 in [0, 1): the top 53 bits of ``mix64(seed, uid, position)``: ``[N]`` for one position
    (an int), ``[N, T]`` for ``T`` positions (an int64 tensor: a step's tokens at once)."""
    if isinstance(position, torch.Tensor):
        h = _fold(keys[:, None], position[None, :])
    else:
        h = _fold(keys, _signed(position & ((1 << 64) - 1)))
    return _shr(h, 11).to(torch.float64) * (1.0 / (1 << 53))


def draw(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Tokens ``[N]`` (long) by inverse transform: row ``i`` of ``exp(logp)`` (``[N, V]``, normalised by
    its own total, which float rounding leaves near 1) at ``u[i]`` in [0, 1). A zero-probability token
    is never drawn."""
    cdf = torch.cumsum(torch.exp(logp), dim=-1)
    x = u.to(cdf.dtype)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, x, right=True)[:, 0].clamp_(max=logp.shape[-1] - 1)


def sample(logp: torch.Tensor, keys: torch.Tensor, position: int) -> torch.Tensor:
    """Tokens ``[N]`` drawn from ``exp(logp)``, beam ``i``'s by its uniform for ``position``
    (:func:`uniforms` of its key, :func:`beam_keys`)."""
    return draw(logp, uniforms(keys, position))


def draw_margin(logp: torch.Tensor, u: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """``[N]``: how far, in probability, ``u``'s point of row ``i``'s CDF lies outside the interval of
    token ``forced[i]`` (0 when :func:`draw` would draw ``forced[i]`` from this ``logp``): the change of
    arithmetic that flipped a teacher-forced token (``systems.kv_offload.divergence``)."""
    cdf = torch.cumsum(torch.exp(logp), dim=-1)
    total = cdf[:, -1]
    x = u.to(cdf.dtype) * total
    hi = cdf.gather(1, forced[:, None])[:, 0]
    lo = torch.where(forced > 0, cdf.gather(1, (forced - 1).clamp(min=0)[:, None])[:, 0], torch.zeros_like(hi))
    return (torch.clamp(lo - x, min=0) + torch.clamp(x - hi, min=0)) / total
