"""Grouping of beams for LBS (paper Algorithm 1 and "balanced grouping").

- ``group_capacity``: Alg.1 line 2, ``min(num_beams, floor(budget / bytes_per_beam))`` (the paper
  prints max; min is the only reading that makes sense).
- ``group_sizes``: balanced grouping keeps ``R = ceil(N / B)`` groups and spreads beams evenly
  (15 beams, capacity 7 -> [5, 5, 5], not [7, 7, 1]); unbalanced fills groups to capacity.
- ``greedy_beamset``: Alg.1's greedy BeamSet, literally: start a group from the first unassigned
  beam, repeatedly add the unassigned beam whose block set has the largest (token-weighted)
  intersection with the union of the group's blocks (ties: lowest index). O(N^2) set operations;
  the reference implementation.
- ``beamset_groups``: the same result in O(N log N). Block sets of beams are root-to-leaf paths of
  one tree, so the intersection with a group's union is the longest common prefix with its closest
  member; with beams indexed in depth-first (lexicographic path) order, greedy picks the next beam
  in that order every time, i.e. the groups are consecutive runs of the DFS order. Tested equal to
  ``greedy_beamset`` on random trees.
"""
from __future__ import annotations

import math
from typing import FrozenSet, List, Mapping, Sequence

import numpy as np


def group_capacity(num_beams: int, budget_bytes: int, bytes_per_beam: int) -> int:
    """Beams whose KV fits the device budget at once (Alg.1 line 2). May be 0 (nothing fits)."""
    if bytes_per_beam <= 0:
        return num_beams
    return max(0, min(num_beams, budget_bytes // bytes_per_beam))


def group_sizes(num_beams: int, capacity: int, balanced: bool = True) -> List[int]:
    """Sizes of the groups of one step.

    balanced: ``R = ceil(N / B)`` groups, sizes differ by at most one, larger first.
    Raises ValueError if capacity < 1.
    """
    if capacity < 1:
        raise ValueError(f"group capacity {capacity} < 1: one beam's KV does not fit the budget")
    r = math.ceil(num_beams / capacity)
    if not balanced:
        return [capacity] * (num_beams // capacity) + ([num_beams % capacity] if num_beams % capacity else [])
    base, extra = divmod(num_beams, r)
    return [base + (1 if i < extra else 0) for i in range(r)]


def greedy_beamset(block_sets: Sequence[FrozenSet[int]], weights: Mapping[int, int],
                   sizes: Sequence[int]) -> List[List[int]]:
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
    """Indices sorting beams' prefix paths ``[N, depth]`` lexicographically (depth-first order)."""
    if paths.shape[1] == 0:
        return np.arange(paths.shape[0])
    return np.lexsort(paths.T[::-1])


def beamset_groups(paths: np.ndarray, sizes: Sequence[int]) -> List[List[int]]:
    """Greedy BeamSet groups in O(N log N): consecutive runs of the DFS order (see module doc)."""
    order = dfs_order(paths)
    out, i = [], 0
    for s in sizes:
        out.append([int(x) for x in order[i:i + s]])
        i += s
    return out


def chunk_groups(num_beams: int, sizes: Sequence[int]) -> List[List[int]]:
    """Groups without locality awareness (inter-token only): consecutive beams in rating order."""
    out, i = [], 0
    for s in sizes:
        out.append(list(range(i, i + s)))
        i += s
    return out
