"""Beam tree of segments and the step-wise beam search around it (LBS paper Sec. 2, DESIGN.md).

The prompt is segment 0. At every step each live path (beam) writes one new segment of ``step``
tokens. A beam is a root-to-leaf path of segments; beams that share a prefix share its segments,
which are the KV blocks of Algorithm 1. All live beams always have the same length.

Search per step: **expansion** (each of the ``beam_size`` kept beams spawns ``beam_width``
children, ``beams = beam_size * beam_width`` live paths), **rating** (cumulative log-probability),
**selection** (keep the top ``beam_size``; ties broken by uid so the result never depends on
execution order). This module is plain Python: no torch, shared by real and simulated engines.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

_MASK64 = (1 << 64) - 1


def mix64(*values: int) -> int:
    """Deterministic 64-bit hash (splitmix64 finaliser folded over ``values``).

    Used for beam uids and for keying sampling noise by (seed, beam uid, position)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h


def mix64_array(seed: int, uids: np.ndarray, step: int) -> np.ndarray:
    """``mix64(seed, uid, step)`` for an array of uids (uint64), vectorised; equal to the scalar form."""
    def fold(h, v):
        h = h ^ v
        h = h + np.uint64(0x9E3779B97F4A7C15)
        z = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
    u = np.asarray(uids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = np.full(u.shape, 0x9E3779B97F4A7C15, dtype=np.uint64)
        h = fold(h, np.uint64(int(seed) & _MASK64))
        h = fold(h, u)
        return fold(h, np.uint64(int(step) & _MASK64))


@dataclass
class Segment:
    """KV block: ``length`` consecutive tokens starting at absolute position ``start``."""
    id: int
    parent: Optional[int]
    start: int
    length: int
    depth: int                       # 0 for the prompt


@dataclass
class Beam:
    """A live path. ``segments`` runs root -> leaf; the leaf is the segment written this step."""
    uid: int
    segments: Tuple[int, ...]
    cum_logprob: float = 0.0
    tokens: List[int] = field(default_factory=list)
    parent_uid: Optional[int] = None

    @property
    def leaf(self) -> int:
        return self.segments[-1]

    @property
    def prefix(self) -> Tuple[int, ...]:
        """Segments whose KV exists at the start of the step (all but the leaf)."""
        return self.segments[:-1]


class BeamTree:
    """All segments still referenced by a live beam; ``gc`` drops the rest."""

    def __init__(self, prompt_len: int):
        if prompt_len <= 0:
            raise ValueError(f"prompt_len={prompt_len} must be > 0")
        self.segments: Dict[int, Segment] = {0: Segment(0, None, 0, prompt_len, 0)}
        self._next_id = 1

    def new_segment(self, parent: int) -> int:
        p = self.segments[parent]
        sid = self._next_id
        self._next_id += 1
        self.segments[sid] = Segment(sid, parent, p.start + p.length, 0, p.depth + 1)
        return sid

    def length(self, beam: Beam) -> int:
        """Tokens in the beam's KV (prompt + generated so far)."""
        return sum(self.segments[s].length for s in beam.segments)

    def prefix_tokens(self, beam: Beam) -> int:
        return sum(self.segments[s].length for s in beam.prefix)

    def gc(self, beams: Sequence[Beam]) -> List[int]:
        """Drop segments no live beam references; returns the dropped ids (the host can free them)."""
        live = {s for b in beams for s in b.segments}
        dead = [s for s in self.segments if s not in live]
        for s in dead:
            del self.segments[s]
        return dead


def initial_beams(tree: BeamTree, beams: int, seed: int) -> List[Beam]:
    """Step 0: ``beams`` children of the prompt (they share segment 0)."""
    return [Beam(uid=mix64(seed, 0, i), segments=(0, tree.new_segment(0))) for i in range(beams)]


def select(beams: Sequence[Beam], beam_size: int) -> List[Beam]:
    """Selection: the top ``beam_size`` by cumulative log-probability (ties: smaller uid first)."""
    return sorted(beams, key=lambda b: (-b.cum_logprob, b.uid))[:beam_size]


def expand(tree: BeamTree, kept: Sequence[Beam], beam_width: int) -> List[Beam]:
    """Expansion: each kept beam spawns ``beam_width`` children sharing its segments."""
    out = []
    for parent in kept:
        for c in range(beam_width):
            out.append(Beam(uid=mix64(parent.uid, c + 1), segments=parent.segments + (tree.new_segment(parent.leaf),),
                            cum_logprob=parent.cum_logprob, tokens=list(parent.tokens), parent_uid=parent.uid))
    return out


def select_and_expand(tree: BeamTree, beams: Sequence[Beam], beam_size: int, beam_width: int,
                      keep_uids: Optional[Sequence[int]] = None) -> List[Beam]:
    """One search transition between steps; returns the next step's live beams and GCs the tree.

    ``keep_uids`` replays a recorded tree: keep exactly those beams instead of rating them."""
    if keep_uids is not None:
        by_uid = {b.uid: b for b in beams}
        missing = [u for u in keep_uids if u not in by_uid]
        if missing:
            raise ValueError(f"replayed tree keeps beams {missing[:3]} that are not live")
        kept = [by_uid[u] for u in keep_uids]
    else:
        kept = select(beams, beam_size)
    nxt = expand(tree, kept, beam_width)
    tree.gc(nxt)
    return nxt


def path_matrix(tree: BeamTree, beams: Sequence[Beam]) -> np.ndarray:
    """Segment ids of each beam's prefix as an int64 matrix [num_beams, depth] (equal depths)."""
    return np.array([b.prefix for b in beams], dtype=np.int64).reshape(len(beams), -1)
