"""Beam tree bookkeeping: incremental gc, prefix lengths, uids (systems/kv_offload/tree.py)."""

import random

import numpy as np
import pytest

from systems.kv_offload.tree import BeamTree, initial_beams, mix64, mix64_array, select_and_expand


@pytest.mark.parametrize("width", [1, 2, 4])
def test_tree_holds_exactly_the_segments_on_live_paths(width):
    """After every transition the tree holds the segments some live beam's path uses, no other, and
    each segment's child count is its children in the tree; a beam's prefix tokens are the sum of
    its prefix segments' lengths. (Mutations caught: the cascade stopping after one level; a parent's
    child count raised by one for several children; a child starting where its parent starts.)"""
    rnd = random.Random(width)
    tree = BeamTree(16)
    beams = initial_beams(tree, 16, 3)
    for step in range(30):
        length = rnd.choice([3, 5])
        for b in beams:
            b.cum_logprob += rnd.gauss(0, 1)
            tree.segments[b.leaf].length = length
        beams = select_and_expand(tree, beams, 16 // width, width)
        live = {s for b in beams for s in b.segments}
        assert set(tree.segments) == live, step
        for seg in tree.segments.values():
            assert seg.children == sum(1 for c in tree.segments.values() if c.parent == seg.id)
        for b in beams:
            assert tree.prefix_tokens(b) == sum(tree.segments[s].length for s in b.prefix)


def test_a_segment_is_extended_only_once_it_holds_tokens():
    tree = BeamTree(8)
    (b, *_) = initial_beams(tree, 2, 0)
    with pytest.raises(ValueError, match=f"segment {b.leaf} has no tokens yet"):
        select_and_expand(tree, [b], 1, 2)


def test_mix64_array_equals_the_scalar_hash():
    rnd = random.Random(0)
    a = [rnd.getrandbits(64) for _ in range(50)]
    got = mix64_array(np.array(a, dtype=np.uint64)[:, None], np.arange(1, 4, dtype=np.uint64), 2**64 - 5)
    assert got.tolist() == [[mix64(x, c, 2**64 - 5) for c in (1, 2, 3)] for x in a]
