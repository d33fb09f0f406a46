"""The simulator's token streams (systems/verifier_search/sim.py TokenStream): the tokens of a request's seed,
however the stream is read."""

import numpy as np
import pytest

from systems.verifier_search.protocol import GenRequest
from systems.verifier_search.sim import StepModel, TokenSource


def reference(model: StepModel, seed: int, n: int):
    """The stream as defined: chunk lengths and end flags from ``default_rng([seed, 0])``, each
    chunk's body drawn on its own from ``default_rng([seed, 1])`` (the code before bulk draws)."""
    rng_len, rng_body = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    out = []
    while len(out) < n:
        k, eos = model.chunk(rng_len)
        out += model.body(rng_body, k - 1) + [model.eos_id if eos else model.delimiter_id]
    return out[:n]


@pytest.mark.parametrize("vocab", [151936, 2500])  # 2500: a small vocabulary (boundaries kept out)
def test_stream_reads_the_seeds_tokens_in_any_increments(vocab):
    """Read in small and large increments, after ``boundary`` drew chunks ahead, prepared in bulk or
    built alone: always the reference's tokens. Mutations caught: a chunk's body sliced one token
    short (``k = end - len - 2``), one body token drawn per boundary token too (the draw's size not
    less the chunks' count), a stream handed out twice by ``TokenSource.stream`` (``get``, not ``pop``)."""
    model = StepModel(p_delim=0.03, p_eos=0.01, delimiter_id=271, eos_id=vocab - 1, vocab_size=vocab)
    src = TokenSource(model)
    reqs = [GenRequest(f"r{i}", [1, 2], 64, seed) for i, seed in enumerate((0, 5, 2**31 - 2, 77))]
    src.prepare(reqs[:3])
    for r, steps in zip(reqs, ([1, 1, 5, 40, 300, 2000], [2000], [0, 7, 7, 8, 1500], [3, 900])):
        s = src.stream(r)
        s.boundary(0, 500, eos_only=True)  # chunks drawn ahead of the tokens read
        for n in steps:
            assert s.read(n) == reference(model, r.seed, n)
    assert src.ready == {}


def test_token_map_passes_the_steps_through_for_the_same_tokenizer():
    """Same tokenizer, step tag = delimiter (Skywork): the verifier input is the prompt and the tokens
    up to the last step end (tokens after it are not scored), a step's score at its last token; the
    prompt is not modified. Mutations caught: the tokens after the last end kept; the positions
    counted from the tokens' start instead of the prompt's."""
    from systems.verifier_search.vllm_engine import TokenMap

    tm = TokenMap("qwen", "qwen", 100, 7, 7)
    prompt = [1, 2]
    assert tm.build(prompt, [3, 7, 4, 5, 7, 9], [2, 5]) == ([1, 2, 3, 7, 4, 5, 7], [3, 6])
    assert tm.build(prompt, [3, 7], [2]) == ([1, 2, 3, 7], [3]) and prompt == [1, 2]
    assert tm.build(prompt, [], []) == ([1, 2], [])


@pytest.mark.parametrize("seed", [0, 3, 41])
def test_lazy_speculation_end_is_the_streams_boundary(seed):
    """A speculation's end found lazily (``sim._Seq.speculate`` / ``resolve``, one boundary at a time)
    is the eager ``TokenStream.boundary`` from the step's end to the end token or the cap, and every
    tentative end before it is a strictly rising lower bound (so the end heap's top is exact once
    resolved). Mutations caught: ``resolve`` not moving past the boundary it looked at (``scan``
    not incremented: no progress), the scan starting at the step's own delimiter (``bisect_left``),
    the speculation stopping at a delimiter (``eos_only=False``)."""
    from systems.verifier_search.sim import _Seq

    model = StepModel(p_delim=0.05, p_eos=0.005, delimiter_id=271, eos_id=151643, vocab_size=151936)
    r = GenRequest("r", [1, 2], 64, seed)
    for cap in (30, 400, 5000):
        lazy, eager = TokenSource(model).stream(r), TokenSource(model).stream(r)
        step_len, _ = lazy.boundary(0, 64, eos_only=False)
        eager.boundary(0, 64, eos_only=False)
        s = _Seq(r, lazy, step_len, "delimiter", [], 0, 0, admitted=7)
        s.speculate(cap)
        bounds = [s.end]
        while s.tentative and len(bounds) < 10_000:
            s.resolve()
            bounds.append(s.end)
        end, _ = eager.boundary(step_len, cap, eos_only=True)
        assert not s.tentative and s.end == 7 + end
        tentative = bounds[:-1]
        assert all(a < b for a, b in zip(tentative, tentative[1:])) and all(b <= s.end for b in tentative)
        assert all(b > 7 + step_len for b in tentative)


def test_starts_with_compares_the_first_n_tokens_of_base_then_tail():
    """sim.starts_with, shared by the simulated engines' block hashes and the synthetic PRM:
    tokens[:n] against (base + tail)[:n]. Mutations caught: the tail's
    part compared from its position in ``tokens`` (``tail[p:n]``); ``n == p`` taken as all of
    ``tokens``; the tail ignored."""
    from systems.verifier_search.sim import starts_with

    base, tail = [1, 2, 3], [4, 5]
    assert starts_with([1, 2, 3, 4, 5, 6], 5, base, tail)
    assert starts_with([1, 2, 3, 4], 4, base, tail)
    assert not starts_with([1, 2, 3, 4, 9], 5, base, tail)
    assert not starts_with([1, 2, 3, 9, 5], 4, base, tail)
    assert starts_with([1, 2, 3, 9], 3, base, tail)  # n inside base: what follows does not count
    assert starts_with([1, 2], 2, base)
    assert not starts_with([1, 7, 3], 3, base)
    assert not starts_with([1, 2, 3], 3, [1, 2, 4], [])
    big = [10**6 + i for i in range(40)]  # ints that are objects of their own
    copies = [int(str(t)) for t in big]  # equal values, other objects
    assert starts_with(copies, 40, big[:30], big[30:]) and starts_with(copies, 25, big)
    assert not starts_with(copies[:39] + [0], 40, big[:30], big[30:])
