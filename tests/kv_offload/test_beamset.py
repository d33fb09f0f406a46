"""Greedy BeamSet (Alg.1) and balanced grouping on hand-built and random trees."""

import random

import pytest

from systems.common.groups import consecutive_groups, group_capacity, group_sizes
from systems.kv_offload.beamset import PrefixOrder, dfs_order, greedy_beamset, reference_order
from systems.kv_offload.tree import BeamTree, initial_beams, path_matrix, select_and_expand


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
    beams = [beams[i] for i in order]  # index beams in DFS order (Alg.1: "any" start beam)
    paths = path_matrix(tree, beams)
    sizes = group_sizes(n, cap)
    blocks = [frozenset(int(x) for x in row) for row in paths]
    weights = {sid: seg.length for sid, seg in tree.segments.items()}
    assert consecutive_groups(dfs_order(paths), sizes) == greedy_beamset(blocks, weights, sizes)


@pytest.mark.parametrize("n", [64, 256])
def test_benchmark_beamset(benchmark, n):
    tree, beams = _random_tree(n, 2, 30, 1)
    paths = path_matrix(tree, beams)
    sizes = group_sizes(n, max(1, n // 5))
    groups = benchmark(lambda: consecutive_groups(dfs_order(paths), sizes))
    assert sorted(x for g in groups for x in g) == list(range(n))


def _live_steps(n, width, steps, seed):
    """Yields (tree, beams) per step of a random search: step lengths 1..8 tokens, scores with ties,
    the live list shuffled every step (the order rules must not depend on list order)."""
    rnd = random.Random(seed)
    tree = BeamTree(16)
    beams = initial_beams(tree, n, seed)
    for i in range(steps):
        rnd.shuffle(beams)
        yield tree, beams
        if i + 1 == steps:
            return
        length = rnd.randint(1, 8)
        for b in beams:
            b.cum_logprob += round(rnd.gauss(0, 1))  # ties: selection falls back to uids
            tree.segments[b.leaf].length = length
        beams = select_and_expand(tree, beams, n // width, width)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n,width", [(16, 2), (24, 4), (64, 2)])
def test_prefix_order_kept_step_to_step_equals_the_reference(seed, n, width):
    """PrefixOrder's incremental order and shared tokens equal reference_order's (from the paths) at
    every step, and a second call for the same beams (a re-plan) or another tree falls back to it.
    (Mutations caught: siblings' classes sharing the new prefix instead of the old one; the range
    minimum over classes replaced by the shared tokens of the first class boundary; children sorted
    by list index instead of their parent's leaf; a new tree not resetting the state.)"""
    po = PrefixOrder()
    for step, (tree, beams) in enumerate(_live_steps(n, width, 12, seed)):
        start = tree.prefix_tokens(beams[0])
        ref = reference_order(tree, beams)
        for _ in range(1 + (step == 5)):
            order, shared = po.update(tree, beams, start)
            assert order.tolist() == ref[0].tolist() and shared.tolist() == ref[1].tolist(), step
    for tree, beams in _live_steps(n, width, 13, seed + 100):
        pass  # another search; its step 12's parents have the ids of the first one's last leaves
    ref = reference_order(tree, beams)
    order, shared = po.update(tree, beams, tree.prefix_tokens(beams[0]))
    assert order.tolist() == ref[0].tolist() and shared.tolist() == ref[1].tolist()


@pytest.mark.parametrize("inter_beam", [True, False])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    "n,width,cap,prefetch", [(32, 2, 10, [2, 2, 2, 0]), (40, 4, 13, [3, 3, 3, 0]), (30, 2, 8, [0, 0, 1, 0])]
)
def test_lbs_group_loads_are_the_union_of_their_beams_blocks(seed, inter_beam, n, width, cap, prefetch):
    """Each group's load (and each prefetch) is the token-weighted union of its beams' prefix blocks
    (inter-beam; else every beam's whole prefix), as Alg.1 defines it; the listed blocks are that
    set (as a multiset without inter-beam), and a plan without lists has the same groups and bytes.
    (Mutations caught: union_tokens summing shared[a:b] instead of shared[a+1:b]; a prefetch counted
    from the next group's last beams; _load_blocks skipping nothing for a group's later beams; the free
    slots counted as capacity minus the next group's size, not this group's, which only unequal
    groups (30 beams, capacity 8: sizes 8, 8, 7, 7) show.)"""
    from collections import Counter

    from systems.kv_offload.plan import KVGeometry, make_scheduler

    geom = KVGeometry(num_layers=2, num_kv_heads=1, head_dim=4, dtype_bytes=2)
    for step, (tree, beams) in enumerate(_live_steps(n, width, 8, seed)):
        start = tree.prefix_tokens(beams[0])
        budget = cap * (start + 4) * geom.kv_token + 7
        plans = [
            make_scheduler(
                "lbs", geom, budget, inter_beam=inter_beam, prompt_len=16, gen_len=10**4, list_blocks=lb
            ).plan(step, tree, beams, 4)
            for lb in (True, False)
        ]
        listed, bare = plans
        assert [g.beams for g in listed.groups] == [g.beams for g in bare.groups]
        for i, (g, h) in enumerate(zip(listed.groups, bare.groups)):
            blocks = [s for k in g.beams for s in beams[k].prefix]
            want = Counter(set(blocks) if inter_beam else blocks)
            assert Counter(g.load_blocks) == want and h.load_blocks is None
            weight = sum(tree.segments[s].length for s in want.elements()) * geom.kv_token
            assert g.load_bytes == h.load_bytes == weight
            if g.prefetch_beams:
                first = [s for k in listed.groups[i + 1].beams[: g.prefetch_beams] for s in beams[k].prefix]
                tokens = sum(tree.segments[s].length for s in (set(first) if inter_beam else first))
                assert g.prefetch_bytes == h.prefetch_bytes == tokens * geom.kv_token
        assert [g.prefetch_beams for g in listed.groups] == prefetch
