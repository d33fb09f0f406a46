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

from typing import Dict, List, Sequence, Tuple, Union

import numpy as np
from numpy.random.bit_generator import ISeedSequence

Entropy = Union[int, Sequence[int]]

_M32 = 0xFFFFFFFF
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875  # SeedSequence's pool hash
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED  # its output hash
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4


def _words(entropy: Entropy) -> List[int]:
    """The uint32 words SeedSequence assembles from ``entropy`` (each int little-endian, 0 -> [0])."""
    out: List[int] = []
    for v in (entropy,) if isinstance(entropy, int) else entropy:
        v = int(v)
        if v < 0:
            raise ValueError(f"seed entropy must be non-negative, got {v}")
        out.append(v & _M32)
        v >>= 32
        while v:
            out.append(v & _M32)
            v >>= 32
    return out


def _consts(init: int, mult: int, n: int) -> np.ndarray:
    """The first ``n + 1`` values of SeedSequence's hash constant (``init``, times ``mult`` each call),
    as a column of uint32."""
    out = [init]
    for _ in range(n):
        out.append(out[-1] * mult & _M32)
    return np.array(out, np.uint32)[:, None]


def _hashmix(v: np.ndarray, c_in: np.ndarray, c_out: np.ndarray) -> np.ndarray:
    """SeedSequence's ``hashmix`` of ``v`` with the constant before (``c_in``) and after (``c_out``)
    its update; each row of ``v`` with its own constants (uint32 arrays, broadcast)."""
    v = (v ^ c_in) * c_out
    return v ^ (v >> np.uint32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
    return r ^ (r >> np.uint32(16))


def state_words(entropy: np.ndarray) -> np.ndarray:
    """``SeedSequence(row).generate_state(4, np.uint64)`` of every row of ``entropy`` ((n, L) uint32
    words, as :func:`_words` gives them): an (n, 4) uint64 array. The pool's words are rows of a
    (4, n) array; the hashes one mixing step takes (its constants in sequence) are computed together."""
    n, length = entropy.shape
    extra = max(0, length - _POOL)
    a = _consts(_INIT_A, _MULT_A, _POOL + _POOL * (_POOL - 1) + extra * _POOL)
    words = np.zeros((_POOL, n), np.uint32)
    words[: min(length, _POOL)] = entropy[:, :_POOL].T
    pool = _hashmix(words, a[:_POOL], a[1 : _POOL + 1])
    k = _POOL  # constants used so far
    for src in range(_POOL):  # every other word mixed with src's hash, in order
        dst = [d for d in range(_POOL) if d != src]
        pool[dst] = _mix(pool[dst], _hashmix(pool[src], a[k : k + 3], a[k + 1 : k + 4]))
        k += 3
    for src in range(_POOL, length):
        pool = _mix(pool, _hashmix(entropy[:, src], a[k : k + _POOL], a[k + 1 : k + _POOL + 1]))
        k += _POOL
    b = _consts(_INIT_B, _MULT_B, 2 * _POOL)
    out = _hashmix(np.concatenate([pool, pool]), b[:-1], b[1:]).astype(np.uint64)  # words 0..7 of the state
    return (out[0::2] | (out[1::2] << np.uint64(32))).T.copy()


class _Given(ISeedSequence):
    """A seed sequence whose state is already computed (PCG64 asks for 4 uint64 words)."""

    def __init__(self, words: np.ndarray):
        self.words = words

    def generate_state(self, n_words, dtype=np.uint32):
        return self.words


def _word_groups(entropies: Sequence[Entropy]) -> List[Tuple[Sequence[int], np.ndarray]]:
    """The :func:`_words` of ``entropies`` grouped by their number: [(positions in ``entropies``,
    (len(positions), words) uint32 array)]. The two shapes the search uses are read by numpy at
    once, as two words each: ints below 2**64 (a copy's key) and pairs of ints below 2**32 (a
    request's ``[seed, 0|1]``). A key below 2**32 is one word, but a zero word after it changes
    nothing: SeedSequence pads its pool of 4 words with zeros (the number of words matters only
    past 4). Any other batch (or a negative entropy: its error) goes through :func:`_words`."""
    if all(type(e) is int for e in entropies):
        try:  # OverflowError: 2**64 and over (and, on numpy 2, a negative: numpy 1 wraps it, hence the min)
            v = np.array(entropies, np.uint64) if min(entropies, default=0) >= 0 else None
        except OverflowError:
            v = None
        if v is not None:
            words = np.stack([v & np.uint64(_M32), v >> np.uint64(32)], axis=1)  # little-endian
            return [(range(len(v)), words.astype(np.uint32))]
    elif all(type(e) in (list, tuple) and len(e) == 2 for e in entropies):
        a = np.array(entropies)  # int64 only if every value is an int that fits
        if a.dtype == np.int64 and ((a >= 0) & (a <= _M32)).all():
            return [(range(len(a)), a.astype(np.uint32))]
    rows = [_words(e) for e in entropies]
    by_len: Dict[int, List[int]] = {}
    for i, w in enumerate(rows):
        by_len.setdefault(len(w), []).append(i)
    return [(idx, np.array([rows[i] for i in idx], dtype=np.uint32)) for idx in by_len.values()]


def generators(entropies: Sequence[Entropy]) -> List[np.random.Generator]:
    """``[np.random.default_rng(e) for e in entropies]``, the same streams, built together."""
    out: List[np.random.Generator] = [None] * len(entropies)  # type: ignore[list-item]
    for idx, words in _word_groups(entropies):
        for i, w in zip(idx, state_words(words)):
            out[i] = np.random.Generator(np.random.PCG64(_Given(w)))
    return out
