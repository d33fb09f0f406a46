"""systems/verifier_search/seeding.py: generators built in bulk are numpy's ``default_rng`` streams, bit for bit."""

import random

import numpy as np
import pytest

from systems.verifier_search.seeding import generators


def test_bulk_generators_are_default_rngs():
    """Every entropy shape the search uses (a request's ``[seed, 0|1]``, a copy's 64-bit key) and the
    edge cases of SeedSequence's word assembly (0, 2**32 - 1, 2**32: one or two words, more words than
    its pool of 4, mixed lengths in one batch) give the generator ``default_rng`` gives: same state,
    same draws of every distribution the simulator takes (geometric, random, integers, normal).
    Mutations caught: the pool's cross-mix taking its destinations in reverse order (constants paired wrongly),
    the output words paired high-first, the zero word of 0 left out (0 -> no words)."""
    rnd = random.Random(7)
    ents = (
        [[rnd.randrange(2**31 - 1), rnd.randrange(2)] for _ in range(200)]
        + [rnd.randrange(2**64) for _ in range(200)]
        + [0, [0, 0], [0, 1], 2**32 - 1, 2**32, [2**32, 5], list(range(9)), 12345]
    )
    rnd.shuffle(ents)
    for e, g in zip(ents, generators(ents)):
        ref = np.random.default_rng(e)
        assert g.bit_generator.state == ref.bit_generator.state, e
        assert g.geometric(0.01) == ref.geometric(0.01) and g.random() == ref.random()
        assert g.integers(1000, 150000, size=7).tolist() == ref.integers(1000, 150000, size=7).tolist()
        assert g.normal(0.85, 0.1) == ref.normal(0.85, 0.1)


def test_negative_entropy_is_refused():
    """Also in a batch of ints, which numpy reads at once: numpy 1 wraps a negative into uint64
    instead of refusing it, hence the fast path's sign check (numpy 2 refuses by itself, so with
    numpy 2 this passes without the check too)."""
    with pytest.raises(ValueError, match="non-negative"):
        generators([[1, -2]])
    for batch in ([-1], [3, -(2**63)]):
        with pytest.raises(ValueError, match="non-negative"):
            generators(batch)


def test_batches_of_one_shape_are_default_rngs():
    """The fast paths of a batch whose entropies are all ints, or all pairs of ints, below their
    bounds (2**64; 2**32 per value), and the batches just past them (another path): same states as
    ``default_rng``, in the batch's order. Mutations caught: a key's words paired high-first, a
    pair's values swapped."""
    rnd = random.Random(11)
    ints = [rnd.randrange(2**64) for _ in range(50)] + [rnd.randrange(2**32) for _ in range(50)]
    ints += [0, 1, 2**32 - 1, 2**32, 2**64 - 1]
    rnd.shuffle(ints)
    pairs = [[rnd.randrange(2**31 - 1), rnd.randrange(2)] for _ in range(50)]
    pairs += [[0, 0], [2**32 - 1, 2**32 - 1], (7, 1), [2**31, 0]]
    for batch in (ints, pairs, ints + [2**64], pairs + [[2**32, 1]], pairs + [[2**63, 1]], [[1, 2], [3]], []):
        got = generators(batch)
        assert len(got) == len(batch)
        for e, g in zip(batch, got):
            assert g.bit_generator.state == np.random.default_rng(e).bit_generator.state, e
