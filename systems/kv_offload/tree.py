"""Beam tree of segments and the step-wise beam search around it (LBS paper Sec. 2, docs/design.md).

The prompt is segment 0. At every step each live path (beam) writes one new segment of ``step``
tokens. A beam is a root-to-leaf path of segments; beams that share a prefix share its segments,
which are the KV blocks of Algorithm 1. All live beams always have the same length.

Search per step: **expansion** (each of the ``beam_size`` kept beams spawns ``beam_width``
children, ``beams = beam_size * beam_width`` live paths), **rating** (cumulative log-probability),
**selection** (keep the top ``beam_size``; ties broken by uid so the result never depends on
execution order). This module is plain Python: no torch, shared by real and simulated engines.

Cost: a step's bookkeeping is O(beams), whatever the tree's depth. A beam holds its path as a link
to its parent's (shared, never copied); ``BeamTree.gc`` counts each segment's children and drops a
segment when its last child is dropped, so it visits only the segments that die.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def mix64(*values: int) -> int:
    """Deterministic 64-bit hash (splitmix64 finaliser folded over ``values``).

    Used for beam uids and for keying sampling noise by (seed, beam uid, position)."""
    h = _GOLDEN
    for v in values:
        h = (h ^ (int(v) & _MASK64)) & _MASK64
        h = (h + _GOLDEN) & _MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h


def mix64_array(*values) -> np.ndarray:
    """``mix64(*values)`` elementwise, vectorised (uint64); each value an int or an array of uint64,
    broadcast together. Equal to the scalar form."""

    def fold(h, v):
        h = h ^ v
        h = h + np.uint64(_GOLDEN)
        z = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    vals = [
        np.asarray(v, dtype=np.uint64) if isinstance(v, np.ndarray) else np.uint64(int(v) & _MASK64) for v in values
    ]
    with np.errstate(over="ignore"):
        h = np.full(np.broadcast_shapes(*(np.shape(v) for v in vals)), _GOLDEN, dtype=np.uint64)
        for v in vals:
            h = fold(h, v)
        return h


@dataclass(slots=True)
class Segment:
    """KV block: ``length`` consecutive tokens starting at absolute position ``start``. Its length
    is final before it gets children (they start where it ends)."""

    id: int
    parent: Optional[int]
    start: int
    length: int
    depth: int  # 0 for the prompt
    children: int = 0  # child segments in the tree (BeamTree.gc)


class Path:
    """A beam's root-to-leaf segment ids as a linked list, leaf first: ``Path(leaf, parent's path)``.
    Children share their parent's path object, so a step never copies paths."""

    __slots__ = ("leaf", "up")

    def __init__(self, leaf: int, up: Optional["Path"]):
        self.leaf, self.up = leaf, up

    def ids(self) -> Tuple[int, ...]:
        """Segment ids root -> leaf (O(depth))."""
        out, p = [], self
        while p is not None:
            out.append(p.leaf)
            p = p.up
        return tuple(reversed(out))


@dataclass(eq=False, slots=True)
class Beam:
    """A live path. ``path.leaf`` is the segment written this step; ``path.up`` its prefix."""

    uid: int
    path: Path
    cum_logprob: float = 0.0
    tokens: List[int] = field(default_factory=list)
    parent_uid: Optional[int] = None

    @property
    def leaf(self) -> int:
        return self.path.leaf

    @property
    def parent_segment(self) -> int:
        """The last segment of the prefix (the segment the leaf extends)."""
        return self.path.up.leaf

    @property
    def segments(self) -> Tuple[int, ...]:
        """Segment ids root -> leaf."""
        return self.path.ids()

    @property
    def prefix(self) -> Tuple[int, ...]:
        """Segments whose KV exists at the start of the step (all but the leaf)."""
        return self.path.up.ids()


class BeamTree:
    """All segments still referenced by a live beam; ``gc`` drops the rest."""

    def __init__(self, prompt_len: int):
        if prompt_len <= 0:
            raise ValueError(f"prompt_len={prompt_len} must be > 0")
        self.segments: Dict[int, Segment] = {0: Segment(0, None, 0, prompt_len, 0)}
        self._childless: Set[int] = {0}
        self._next_id = 1

    def new_segments(self, parent: int, count: int) -> range:
        """``count`` children of ``parent``, each starting where it ends; returns their ids. Raises
        ValueError if ``parent`` holds no tokens yet (its length must be set before it is extended)."""
        p = self.segments[parent]
        if p.length <= 0:
            raise ValueError(f"segment {parent} has no tokens yet: set its length before extending it")
        ids = range(self._next_id, self._next_id + count)
        self._next_id += count
        start, depth = p.start + p.length, p.depth + 1
        for sid in ids:
            self.segments[sid] = Segment(sid, parent, start, 0, depth)
        p.children += count
        self._childless.discard(parent)
        self._childless.update(ids)
        return ids

    def length(self, beam: Beam) -> int:
        """Tokens in the beam's KV (prompt + generated so far)."""
        leaf = self.segments[beam.leaf]
        return leaf.start + leaf.length

    def prefix_tokens(self, beam: Beam) -> int:
        """Tokens of the beam's prefix (all segments but the leaf)."""
        return self.segments[beam.leaf].start

    def gc(self, beams: Sequence[Beam]) -> List[int]:
        """Drop segments no live beam references; returns the dropped ids (the host can free them).

        A segment is referenced when it lies on a beam's path, i.e. it is a live leaf or has a child;
        a childless segment that is no live leaf is dropped, and so, in turn, its parent when that
        was its last child."""
        live = {b.path.leaf for b in beams}
        dead = []
        for sid in self._childless - live:
            while True:
                seg = self.segments.pop(sid)
                self._childless.discard(sid)
                dead.append(sid)
                if seg.parent is None:
                    break
                parent = self.segments[seg.parent]
                parent.children -= 1
                if parent.children or parent.id in live:
                    if not parent.children:
                        self._childless.add(parent.id)
                    break
                sid = parent.id
        return dead


def initial_beams(tree: BeamTree, beams: int, seed: int) -> List[Beam]:
    """Step 0: ``beams`` children of the prompt (they share segment 0)."""
    root = Path(0, None)
    uids = mix64_array(seed, 0, np.arange(beams, dtype=np.uint64)).tolist()
    return [Beam(uid=u, path=Path(sid, root)) for u, sid in zip(uids, tree.new_segments(0, beams))]


def rank_key(cum_logprob: float, uid: int) -> tuple:
    """Selection's order: higher cumulative log-probability first, ties to the smaller uid."""
    return (-cum_logprob, uid)


def select(beams: Sequence[Beam], beam_size: int) -> List[Beam]:
    """Selection: the top ``beam_size`` by :func:`rank_key`."""
    return sorted(beams, key=lambda b: rank_key(b.cum_logprob, b.uid))[:beam_size]


def expand(tree: BeamTree, kept: Sequence[Beam], beam_width: int) -> List[Beam]:
    """Expansion: each kept beam spawns ``beam_width`` children sharing its segments; child ``c``
    (0-based) of parent ``p`` has uid ``mix64(p.uid, c + 1)``."""
    parents = np.array([p.uid for p in kept], dtype=np.uint64)
    uids = mix64_array(parents[:, None], np.arange(1, beam_width + 1, dtype=np.uint64)).tolist()
    out = []
    for parent, child_uids in zip(kept, uids):
        path, score, tokens, puid = parent.path, parent.cum_logprob, parent.tokens, parent.uid
        for uid, sid in zip(child_uids, tree.new_segments(path.leaf, beam_width)):
            out.append(Beam(uid, Path(sid, path), score, list(tokens), puid))
    return out


def select_and_expand(
    tree: BeamTree, beams: Sequence[Beam], beam_size: int, beam_width: int, keep_uids: Optional[Sequence[int]] = None
) -> List[Beam]:
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
