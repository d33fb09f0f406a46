"""Seeded numpy generators built in bulk: :func:`generators` returns, for each entropy, the generator
``np.random.default_rng(entropy)`` returns (the same PCG64 stream, bit for bit), built together.

numpy seeds a PCG64 with ``SeedSequence(entropy).generate_state(4, np.uint64)``. :func:`state_words`
computes those words for a batch of entropies with SeedSequence's own hash (numpy's
``random/bit_generator.pyx``: ``hashmix``, ``mix``, a pool of 4 words, ``generate_state``),
vectorised over the batch, and each PCG64 gets its words through an ``ISeedSequence`` that returns
them. Issue 18: a simulated FastTTS main command builds ~44,000 generators (two per generator
request, one per speculative copy); a SeedSequence per generator was half of each one's cost.
Only non-negative integer entropies (an int or a sequence of ints), the only ones the search uses.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Union

import numpy as np
from numpy.random.bit_generator import ISeedSequence

Entropy = Union[int, Sequence[int]]

_M32 = 0xFFFFFFFF
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875          # SeedSequence's pool hash
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED          # its output hash
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4


def _words(entropy: Entropy) -> List[int]:
    """The uint32 words SeedSequence assembles from ``entropy`` (each int little-endian, 0 -> [0])."""
    out: List[int] = []
    for v in ((entropy,) if isinstance(entropy, int) else entropy):
        v = int(v)
        if v < 0:
            raise ValueError(f"seed entropy must be non-negative, got {v}")
        out.append(v & _M32)
        v >>= 32
        while v:
            out.append(v & _M32)
            v >>= 32
    return out


class _Hash:
    """SeedSequence's ``hashmix`` over uint32 arrays, its multiplier advancing with each call."""

    def __init__(self, init: int, mult: int):
        self.const, self.mult = init, mult

    def __call__(self, v: np.ndarray) -> np.ndarray:
        v = v ^ np.uint32(self.const)
        self.const = self.const * self.mult & _M32
        v = v * np.uint32(self.const)
        return v ^ (v >> np.uint32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
    return r ^ (r >> np.uint32(16))


def state_words(entropy: np.ndarray) -> np.ndarray:
    """``SeedSequence(row).generate_state(4, np.uint64)`` of every row of ``entropy`` ((n, L) uint32
    words, as :func:`_words` gives them): an (n, 4) uint64 array."""
    n, length = entropy.shape
    hashmix = _Hash(_INIT_A, _MULT_A)
    zero = np.zeros(n, np.uint32)
    pool = [hashmix(entropy[:, i] if i < length else zero) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = _mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL, length):
        for dst in range(_POOL):
            pool[dst] = _mix(pool[dst], hashmix(entropy[:, src]))
    out = _Hash(_INIT_B, _MULT_B)
    w = [out(pool[i % _POOL]).astype(np.uint64) for i in range(2 * _POOL)]
    return np.stack([w[2 * i] | (w[2 * i + 1] << np.uint64(32)) for i in range(_POOL)], axis=1)


class _Given(ISeedSequence):
    """A seed sequence whose state is already computed (PCG64 asks for 4 uint64 words)."""

    def __init__(self, words: np.ndarray):
        self.words = words

    def generate_state(self, n_words, dtype=np.uint32):
        return self.words


def generators(entropies: Sequence[Entropy]) -> List[np.random.Generator]:
    """``[np.random.default_rng(e) for e in entropies]``, the same streams, built together."""
    rows = [_words(e) for e in entropies]
    by_len: Dict[int, List[int]] = {}
    for i, w in enumerate(rows):
        by_len.setdefault(len(w), []).append(i)
    out: List[np.random.Generator] = [None] * len(rows)            # type: ignore[list-item]
    for idx in by_len.values():
        words = state_words(np.array([rows[i] for i in idx], dtype=np.uint32))
        for i, w in zip(idx, words):
            out[i] = np.random.Generator(np.random.PCG64(_Given(w)))
    return out
