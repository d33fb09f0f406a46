"""Greedy BeamSet (Alg.1) and balanced grouping on hand-built and random trees."""
import random
import time

import numpy as np
import pytest

from systems.ttc.beamset import beamset_groups, dfs_order, greedy_beamset, group_capacity, group_sizes
from systems.ttc.tree import BeamTree, initial_beams, path_matrix, select_and_expand


def test_balanced_sizes_15_beams_capacity_7():
    assert group_sizes(15, 7, balanced=True) == [5, 5, 5]
    assert group_sizes(15, 7, balanced=False) == [7, 7, 1]
    assert group_sizes(16, 7, balanced=True) == [6, 5, 5]
    assert group_sizes(64, 64) == [64]
    with pytest.raises(ValueError, match="does not fit"):
        group_sizes(4, 0)


def test_capacity_is_min_of_beams_and_budget():
    assert group_capacity(64, 7 * 2**30, 541 * 2**20) == 13
    assert group_capacity(8, 100 * 2**30, 2**20) == 8
    assert group_capacity(8, 10, 2**20) == 0


def _three_subtrees():
    """15 beams: prompt 0 -> three branches a, b, c (segments 1, 2, 3), five leaves each (4..18).
    Indices interleaved so grouping by index order would mix branches."""
    blocks, weights = [], {0: 128, 1: 32, 2: 32, 3: 32}
    for i in range(15):
        branch = 1 + i % 3
        leaf = 4 + i
        blocks.append(frozenset({0, branch, leaf}))
        weights[leaf] = 32
    return blocks, weights


def test_greedy_groups_prefix_sharing_beams_together():
    blocks, weights = _three_subtrees()
    groups = greedy_beamset(blocks, weights, group_sizes(15, 7))
    assert [len(g) for g in groups] == [5, 5, 5]
    for g in groups:
        branches = {next(iter(blocks[b] - {0} & {1, 2, 3})) for b in g}
        assert len(branches) == 1, groups
    assert groups[0] == [0, 3, 6, 9, 12]


def _random_tree(n_beams, width, steps, seed):
    rnd = random.Random(seed)
    tree = BeamTree(16)
    beams = initial_beams(tree, n_beams, seed)
    for _ in range(steps):
        for b in beams:
            b.cum_logprob += rnd.gauss(0, 1)
            tree.segments[b.leaf].length = 8
        beams = select_and_expand(tree, beams, n_beams // width, width)
    return tree, beams


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n,cap", [(16, 5), (32, 7), (64, 13)])
def test_fast_beamset_equals_greedy_reference(seed, n, cap):
    tree, beams = _random_tree(n, 2, 4, seed)
    paths = path_matrix(tree, beams)
    order = dfs_order(paths)
    beams = [beams[i] for i in order]            # index beams in DFS order (Alg.1: "any" start beam)
    paths = path_matrix(tree, beams)
    sizes = group_sizes(n, cap)
    blocks = [frozenset(int(x) for x in row) for row in paths]
    weights = {sid: seg.length for sid, seg in tree.segments.items()}
    assert beamset_groups(paths, sizes) == greedy_beamset(blocks, weights, sizes)


@pytest.mark.parametrize("n", [64, 256])
def test_benchmark_beamset(benchmark, n):
    tree, beams = _random_tree(n, 2, 30, 1)
    paths = path_matrix(tree, beams)
    sizes = group_sizes(n, max(1, n // 5))
    groups = benchmark(beamset_groups, paths, sizes)
    assert sorted(x for g in groups for x in g) == list(range(n))
