"""Grouping of beams for LBS (paper Algorithm 1 and "balanced grouping"); the group sizes and
capacity, and the rule that turns an order into groups, are in :mod:`systems.common.groups`.

- ``greedy_beamset``: Alg.1's greedy BeamSet, literally: start a group from the first unassigned
  beam, repeatedly add the unassigned beam whose block set has the largest (token-weighted)
  intersection with the union of the group's blocks (ties: lowest index). O(N^2) set operations;
  the reference implementation.
- ``consecutive_groups(dfs order, sizes)`` (systems.common.groups): the same result in O(N log N). Block sets of beams are
  root-to-leaf paths of one tree, so the intersection with a group's union is the longest common
  prefix with its closest member; with beams indexed in depth-first (lexicographic path) order,
  greedy picks the next beam in that order every time, i.e. the groups are consecutive runs of the
  DFS order. Tested equal to ``greedy_beamset`` on random trees.
- ``PrefixOrder``: that DFS order, and the prefix tokens each beam shares with the one before it,
  kept from step to step in O(N log N) per step whatever the tree's depth (``reference_order``
  computes both from the paths, O(N * depth)). A group's load is then ``union_tokens``: its first
  beam's prefix plus what each next beam does not share with the one before it.
"""

from __future__ import annotations

from typing import Callable, Dict, FrozenSet, List, Mapping, Sequence, Tuple

import numpy as np

from systems.kv_offload.tree import path_matrix


def greedy_beamset(
    block_sets: Sequence[FrozenSet[int]], weights: Mapping[int, int], sizes: Sequence[int]
) -> List[List[int]]:
    """Alg.1 greedy BeamSet (reference). ``block_sets[i]``: block ids of beam i; ``weights``:
    tokens per block; ``sizes``: group sizes in order. Returns beam indices per group."""
    unassigned = list(range(len(block_sets)))
    groups: List[List[int]] = []
    for size in sizes:
        g = [unassigned.pop(0)]
        union = set(block_sets[g[0]])
        while len(g) < size and unassigned:
            best, best_w = 0, -1
            for k, b in enumerate(unassigned):
                w = sum(weights[x] for x in block_sets[b] & union)
                if w > best_w:
                    best, best_w = k, w
            b = unassigned.pop(best)
            g.append(b)
            union |= block_sets[b]
        groups.append(g)
    return groups


def dfs_order(paths: np.ndarray) -> np.ndarray:
    """Indices sorting beams' prefix paths ``[N, depth]`` lexicographically (depth-first order; equal
    paths keep their index order)."""
    if paths.shape[1] == 0:
        return np.arange(paths.shape[0])
    return np.lexsort(paths.T[::-1])


def union_tokens(start: int, shared: np.ndarray) -> Callable[[int, int], int]:
    """``tokens(a, b)``: tokens in the union of the prefixes of the beams at DFS positions ``a..b-1``
    (each shared segment once), from ``shared[j]``, the prefix tokens beam ``j`` shares with beam
    ``j - 1`` (:class:`PrefixOrder`): ``start + sum(start - shared[a+1:b])``; 0 when ``b <= a``."""
    cum = np.concatenate(([0], np.cumsum(start - shared))).tolist()
    return lambda a, b: start + cum[b] - cum[a + 1] if b > a else 0


class PrefixOrder:
    """The live beams in DFS order of their prefixes, and the prefix tokens each shares with the one
    before it in that order, kept from step to step by a scheduler (O(N log N) numpy work per step
    for N beams, whatever the tree's depth).

    The beams of a step extend the leaves of the beams of the call before (their parents). A child's
    prefix is its parent's whole path, so children sort as their parents' paths do: by the parent's
    prefix class (equal prefixes), then the parent's leaf id (DFS order of the paths), siblings in
    list order (the reference's stable ties). Two adjacent children share their whole prefix when
    they have one parent, their parents' prefix when the parents are siblings, else what their
    parents' prefix classes share: the minimum over the classes between them (the common prefix of
    two sorted paths is the minimum of the adjacent common prefixes between them). Beams whose
    parents are not the previous call's beams (a first call, another tree, a re-plan) are ordered
    from their paths by :func:`reference_order`, tested equal.
    """

    def __init__(self):
        self._tree = None
        self._cls: Dict[int, int] = {}  # leaf of a previous beam -> its prefix class
        self._cls_shared = np.zeros(1, dtype=np.int64)  # per class: tokens shared with the class before
        self._start = 0  # prefix tokens of the previous beams

    def update(self, tree, beams: Sequence, start: int) -> Tuple[np.ndarray, np.ndarray]:
        """``(order, shared)`` of this step's ``beams`` (prefixes of ``start`` tokens): ``order``
        [N] indices in DFS order, ``shared`` [N] tokens that ``beams[order[j]]`` shares with
        ``beams[order[j-1]]`` (``shared[0] = 0``). Remembers them for the next step."""
        if tree is not self._tree:  # a new tree: the prompt (segment 0) is the only "parent"
            self._tree, self._cls, self._cls_shared = tree, {0: 0}, np.zeros(1, dtype=np.int64)
        parents = [b.path.up.leaf for b in beams]
        cls = list(map(self._cls.get, parents))
        if None in cls:
            order, shared = reference_order(tree, beams)
        else:
            order, shared = self._advance(np.array(cls, dtype=np.int64), np.array(parents, dtype=np.int64), start)
        new_cls = shared[1:] < start  # a class (distinct prefix) begins where less is shared
        self._cls = dict(
            zip([beams[i].path.leaf for i in order.tolist()], np.concatenate(([0], np.cumsum(new_cls))).tolist())
        )
        self._cls_shared = np.concatenate(([0], shared[1:][new_cls]))
        self._start = start
        return order, shared

    def _advance(self, cls: np.ndarray, parent: np.ndarray, start: int) -> Tuple[np.ndarray, np.ndarray]:
        n = len(cls)
        order = np.lexsort((np.arange(n), parent, cls))
        c, p = cls[order], parent[order]
        same_parent, same_cls = p[1:] == p[:-1], c[1:] == c[:-1]
        shared = np.zeros(n, dtype=np.int64)
        shared[1:] = np.where(same_parent, start, self._start)
        apart = np.flatnonzero(~same_cls)  # adjacent children of parents in different classes
        if apart.size:
            bounds = np.empty(2 * apart.size, dtype=np.int64)
            bounds[0::2], bounds[1::2] = c[apart] + 1, c[apart + 1] + 1
            mins = np.minimum.reduceat(np.append(self._cls_shared, 0), bounds)[0::2]
            shared[apart + 1] = mins
        return order, shared


def reference_order(tree, beams: Sequence) -> Tuple[np.ndarray, np.ndarray]:
    """:meth:`PrefixOrder.update`'s result computed from the beams' paths (O(N * depth))."""
    paths = path_matrix(tree, beams)
    order = dfs_order(paths)
    p = paths[order]
    shared = np.zeros(len(beams), dtype=np.int64)
    if len(beams) > 1:
        differ = p[1:] != p[:-1]
        first = differ.argmax(axis=1)  # depth of the first segment the two do not share
        starts = np.array(
            [tree.segments[int(s)].start for s in p[1:][np.arange(len(first)), first]], dtype=np.int64
        ).reshape(-1)
        shared[1:] = np.where(differ.any(axis=1), starts, tree.prefix_tokens(beams[0]))
    return order, shared
