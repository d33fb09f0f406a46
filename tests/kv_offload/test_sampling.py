"""The engine's sampling (systems/kv_offload/sampling.py): one batched draw per token, keyed by
(seed, beam uid, absolute position), never by batch slot."""

import numpy as np
import pytest
import torch

from systems.kv_offload.sampling import beam_keys, draw, sample, uniforms
from systems.kv_offload.tree import mix64


def test_each_beams_uniform_is_the_top_53_bits_of_mix64_of_seed_uid_position():
    """The device hash equals the scalar mix64 bit for bit (int64 arithmetic wrapping as uint64,
    logical shifts), for uids and positions across the 64-bit range. Mutations caught: an arithmetic
    shift left unmasked; the position folded before the uid; the golden-ratio constant dropped."""
    uids = [0, 1, 7, 2**31, 2**63 - 1, 2**63 + 5, 2**64 - 1]
    for seed in (0, 3, 2**40 + 1):
        keys = beam_keys(seed, uids, torch.device("cpu"))
        for pos in (0, 1, 255, 2**20):
            got = uniforms(keys, pos).tolist()
            assert got == [(mix64(seed, u, pos) >> 11) / 2**53 for u in uids]


def test_a_beams_token_depends_on_its_uid_and_position_not_its_slot():
    """Mutations caught: the uniform keyed by slot (row index) instead of uid; the position ignored."""
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(3, 500, dtype=torch.float64), -1)
    keys = beam_keys(4, [11, 22, 33], torch.device("cpu"))
    a = sample(logp, keys, 5)
    perm = [2, 0, 1]
    b = sample(logp[perm], keys[perm], 5)
    assert a[perm].tolist() == b.tolist()
    later = [sample(logp, keys, p).tolist() for p in range(6, 30)]
    assert any(x != a.tolist() for x in later)
    other_seed = beam_keys(5, [11, 22, 33], torch.device("cpu"))
    assert any(sample(logp, other_seed, p).tolist() != sample(logp, keys, p).tolist() for p in range(5, 30))


def test_tokens_follow_the_distribution_and_never_a_zero_probability_one():
    """Frequencies over 20,000 (uid, position) draws match the probabilities (within 1.5 percentage
    points), and a token of probability 0 is never drawn, also at a boundary of the cumulative
    probabilities or past a total that rounding left below the uniform. Mutations caught: searchsorted
    left-sided (u = 0 drew the zero-probability first token); the uniform not scaled by the row's
    total (u = 0.95 of a row summing to 0.9 drew the zero-probability last token)."""
    p = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0], dtype=torch.float64)
    n = 20_000
    logp = torch.log(p).expand(n, -1)
    keys = beam_keys(9, list(range(n)), torch.device("cpu"))
    tokens = torch.cat([sample(logp, keys, pos) for pos in (0,)])
    freq = np.bincount(tokens.numpy(), minlength=5) / n
    assert freq[1] == freq[4] == 0
    assert freq == pytest.approx(p.numpy(), abs=0.015)

    zero_first = torch.log(torch.tensor([[0.0, 0.5, 0.5]], dtype=torch.float64))
    assert draw(zero_first, torch.tensor([0.0], dtype=torch.float64)).tolist() == [1]
    short_total = torch.log(torch.tensor([[0.3, 0.3, 0.3, 0.0]], dtype=torch.float64))
    assert draw(short_total, torch.tensor([0.95], dtype=torch.float64)).tolist() == [2]


def test_a_steps_uniforms_at_once_equal_each_positions():
    """The engine draws a step's uniforms in one call (positions as a tensor): column k equals the
    uniform of position start + k. Mutation caught: the positions' fold broadcast the wrong way."""
    keys = beam_keys(7, [3, 99, 2**63 + 1], torch.device("cpu"))
    at_once = uniforms(keys, torch.arange(40, 48))
    assert at_once.shape == (3, 8)
    for k in range(8):
        assert torch.equal(at_once[:, k], uniforms(keys, 40 + k))
