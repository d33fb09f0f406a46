"""Search paths (beams), per-request seeds, the step-length model and synthetic scores.

Token lists are in the generator's token space. A beam's generated ``tokens`` hold whole steps
only; ``step_ends[k]`` is the exclusive end of step k in ``tokens``; ``spec`` holds speculative
tokens produced past the last step boundary by speculative beam extension (FastTTS §4.1).
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Sequence


def _encoded(parts) -> bytes:
    """The bytes :func:`stable_hash` hashes: each part's repr followed by a unit separator (0x1f)."""
    return ("\x1f".join(map(repr, parts)) + "\x1f").encode() if parts else b""


def stable_hash(*parts) -> int:
    """64-bit blake2b hash of the parts' reprs, each followed by a unit separator (0x1f); stable across
    processes (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(_encoded(parts), digest_size=8).digest(), "little")


def stable_hashes(parts: tuple, lasts: Sequence) -> List[int]:
    """``[stable_hash(*parts, x) for x in lasts]``, the shared leading parts hashed once (a copy of
    the hash state per item: half the cost of one ``stable_hash`` each)."""
    h = hashlib.blake2b(_encoded(parts), digest_size=8)
    out = []
    for x in lasts:
        c = h.copy()
        c.update(_encoded((x,)))
        out.append(int.from_bytes(c.digest(), "little"))
    return out


def request_seed(seed: int, problem: int, iteration: int, uid: str) -> int:
    """Per-request sampling seed keyed by the beam's identity, never by its batch slot, so that
    sampling does not depend on how beams are ordered or batched (needed for P == baseline)."""
    return stable_hash("req", seed, problem, iteration, uid) % (2**31 - 1)


def request_seeds(seed: int, problem: int, iteration: int, uids: Sequence[str]) -> List[int]:
    """:func:`request_seed` of each of ``uids``."""
    return [h % (2**31 - 1) for h in stable_hashes(("req", seed, problem, iteration), uids)]


@dataclass
class Beam:
    """One reasoning path. ``uid`` names the path in the search tree ("3.0.2": child 2 of child 0
    of path 3), so it is the same whatever order the scheduler runs beams in."""

    uid: str
    tokens: List[int] = field(default_factory=list)
    step_ends: List[int] = field(default_factory=list)
    spec: List[int] = field(default_factory=list)
    scores: List[float] = field(default_factory=list)  # per-step verifier scores (step k -> scores[k])
    done: bool = False
    finish: str = ""  # eos | length | max_len | empty | budget
    completion_time_s: Optional[float] = None
    completed_iteration: Optional[int] = None

    def copy_as(self, uid: str, spec: Optional[List[int]] = None) -> "Beam":
        return Beam(
            uid, list(self.tokens), list(self.step_ends), list(self.spec if spec is None else spec), list(self.scores)
        )

    @property
    def num_steps(self) -> int:
        return len(self.step_ends)

    def content_key(self, upto_step: Optional[int] = None) -> int:
        """Hash of the committed tokens up to the end of step ``upto_step`` (default: all)."""
        end = self.step_ends[upto_step] if upto_step is not None else len(self.tokens)
        return stable_hash(tuple(self.tokens[:end]))


def aggregate(scores: Sequence[float], strategy: str) -> float:
    """Aggregate per-step PRM scores: last (search-and-learn default), min, prod, mean."""
    if not scores:
        return 0.0
    if strategy == "last":
        return float(scores[-1])
    if strategy == "min":
        return float(min(scores))
    if strategy == "prod":
        return float(math.prod(scores))
    if strategy == "mean":
        return float(sum(scores) / len(scores))
    raise ValueError(f"unknown aggregation {strategy!r}")


def synthetic_prm_score(seed: int, problem: int, tokens: Sequence[int]) -> float:
    """A content-keyed stand-in PRM score in [0, 1) for the step ending at the last of ``tokens``
    (the path's generated tokens up to and including that step, generator token space): a hash of
    (seed, problem, tokens). Like a causal PRM it depends only on the tokens up to the step, so
    tokens after it (speculative ones) cannot change it; unlike a random-weight PRM (every score
    ~0.5: ties) scores are distinct, so a score attached to the wrong path changes the selection."""
    return synthetic_prm_values(seed, problem, tokens, [len(tokens)], [True])[0]


def _prm_hasher(seed: int, problem: int):
    h = hashlib.blake2b(digest_size=8)
    h.update(f"prm|{seed}|{problem}|".encode())
    return h


def _read_scores(h, tokens: Sequence[int], at: int, wanted: Sequence[int]) -> dict:
    """Feed ``h`` (holding tokens[:at]) the 64-bit ids of tokens[at:wanted[-1]], reading the score at
    each end in ``wanted``; returns {end: score}, ``h`` left at the last end."""
    start, got = at, {}
    data = struct.pack(f"={wanted[-1] - start}q", *tokens[start : wanted[-1]])  # native int64s, as array("q")
    for e in wanted:
        h.update(data[8 * (at - start) : 8 * (e - start)])
        at = e
        got[e] = _score(h)  # digest() leaves h as it is
    return got


def _score(h) -> float:
    return (int.from_bytes(h.digest(), "little") % (1 << 53)) / float(1 << 53)


def synthetic_prm_values(
    seed: int, problem: int, tokens: Sequence[int], step_ends: Sequence[int], computed: Sequence[bool]
) -> List[Optional[float]]:
    """The verifier's values for one item scored by the synthetic PRM: step k's
    :func:`synthetic_prm_score` where the engine computed its position (``computed[k]``), else None
    (a position served by the prefix cache was scored by an earlier call). One hash runs along the
    path (blake2b of the 64-bit token ids after a ``prm|seed|problem|`` prefix), read at each step."""
    wanted = [e for e, c in zip(step_ends, computed) if c]
    if not wanted:
        return [None] * len(step_ends)
    got = _read_scores(_prm_hasher(seed, problem), tokens, 0, wanted)
    return [got[e] if c else None for e, c in zip(step_ends, computed)]


def step_probabilities(step_tokens_mean: float, steps_per_answer_mean: float) -> tuple[float, float]:
    """Per-token probabilities (delimiter, end token) of the random-weight step model: a step ends at
    either with probability 1/``step_tokens_mean`` per token (geometric step length, mean
    ``step_tokens_mean`` tokens) and 1/``steps_per_answer_mean`` of those ends are the end token
    (geometric number of steps per path, mean ``steps_per_answer_mean``). Both means > 1 (checked by
    ``runner.validate``)."""
    p_boundary = 1.0 / step_tokens_mean
    p_end = p_boundary / steps_per_answer_mean
    return p_boundary - p_end, p_end


def step_logit_biases(
    vocab_size: int, temperature: float, step_tokens_mean: float, steps_per_answer_mean: float
) -> tuple[float, float]:
    """Logit biases (delimiter, end token) giving the per-token probabilities of
    :func:`step_probabilities` under flat logits (random weights). vLLM adds the bias before dividing
    by the temperature, so the bias is ``T * ln w`` with ``w`` the wanted weight relative to one
    ordinary token. Returns (bias_delimiter, bias_end) in logit units."""
    p_d, p_e = step_probabilities(step_tokens_mean, steps_per_answer_mean)
    rest = 1.0 - p_d - p_e
    others = vocab_size - 2
    w_d, w_e = p_d * others / rest, p_e * others / rest
    t = max(temperature, 1e-5)
    return t * math.log(w_d), t * math.log(w_e)
