"""Speculative beam extension (S), FastTTS §4.1 / Alg. 1: every speculative rule, in one place.

Plain Python (no vLLM, no torch). Both generators (``vllm_engine.VllmGenerator`` on vLLM,
``sim.SimGenerator`` simulated) consult :class:`SpeculationPolicy` and only execute what it decides;
the search (``search.py``) uses :func:`speculative_potential` and :func:`copy_keeps`.

Per request of one ``extend`` call (one iteration's generator stage):

- A request may produce up to :meth:`SpeculationPolicy.max_tokens` tokens (with S: twice its step
  cap, so a finished step can keep decoding).
- When a standard request ends its step (:meth:`SpeculationPolicy.at_step_end`): it *speculates*
  (keeps decoding past the "\\n\\n") only if S is on, the step ended at the delimiter, and no request
  waits for admission (Phase 2: every path of the iteration is running); otherwise it *stops*, as
  a stop string would (Phase 1, continuous beam batching).
- After every engine step (:meth:`SpeculationPolicy.to_abort`): all speculative requests are
  aborted when the last standard request has ended its step (speculation adds no tail latency),
  when a request waits (a new or preempted request: back to Phase 1), or when the engine is under
  memory pressure (preemption kills speculation, §4.1.2); beyond ``max_beams`` speculative requests
  (the AE's cap of 256), those of lowest potential M_i are aborted first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

from systems.verifier_search.protocol import GenRequest
from systems.verifier_search.seeding import generators

STOP = "stop"
SPECULATE = "speculate"


@dataclass(frozen=True)
class SpeculationPolicy:
    """The decisions of speculative beam extension for one ``extend`` call (see module docstring).

    ``enabled``: S is on for this call (off in the last iteration, where steps decode to the end
    token). ``max_beams``: at most this many speculative requests at once."""

    enabled: bool = False
    max_beams: int = 256

    def may_speculate(self, r: GenRequest) -> bool:
        """Whether ``r`` can ever speculate in this call (else the engine may stop it at its first
        delimiter by itself, as a stop token)."""
        return self.enabled and r.stop_at_delimiter

    def max_tokens(self, r: GenRequest) -> int:
        """Tokens the engine may produce for ``r``: its step cap, doubled when it may speculate so
        that the step can be followed by speculative tokens."""
        return 2 * r.max_tokens if self.may_speculate(r) else r.max_tokens

    def at_step_end(self, r: GenRequest, finish: str, waiting: int) -> str:
        """``r`` ended its step with ``finish`` (delimiter | eos | length) while ``waiting``
        requests wait for admission. Returns SPECULATE (keep decoding) or STOP (end the request)."""
        if self.may_speculate(r) and finish == "delimiter" and waiting == 0:
            return SPECULATE
        return STOP

    def to_abort(self, standard: int, speculative: Dict[str, int], waiting: int, pressure: bool) -> List[str]:
        """Speculative requests to abort after an engine step.

        Args: ``standard`` requests still producing their step; ``speculative`` uid -> potential
            M_i of the requests decoding speculatively; ``waiting`` requests waiting for admission
            (new or preempted); ``pressure`` the engine ran out of KV blocks (memory pressure).
        Returns: uids to abort (sorted; by potential, then uid, under the cap)."""
        if not speculative:
            return []
        if standard == 0 or waiting > 0 or pressure:
            return sorted(speculative)
        extra = len(speculative) - self.max_beams
        if extra <= 0:
            return []
        return sorted(speculative, key=lambda u: (speculative[u], u))[:extra]


def speculative_potential(scores: Sequence[float], bins: int) -> List[int]:
    """Score-bin potential M_i = B - j + 1 for a score in bin C_j (C_1 highest) of B equal-count
    bins over the given scores (FastTTS §4.1.1). Returns ints in [1, B]."""
    m = len(scores)
    if m == 0:
        return []
    order = sorted(range(m), key=lambda i: -scores[i])
    pot = [1] * m
    for rank, i in enumerate(order):
        j = min(bins, rank * bins // m + 1)
        pot[i] = bins - j + 1
    return pot


def truncate_keep(length: int, r: float) -> int:
    """Speculative tokens a duplicate keeps: round(r * length), at least 1 kept and 1 dropped
    (FastTTS AE ``truncate_sentence_by_tokens``); 0 for a single token."""
    if length <= 1:
        return 0
    return int(min(length - 1, max(1, round(r * length))))


def copy_keeps(lengths: Sequence[int], r_mean: float, r_std: float, keys: Sequence[int]) -> List[int]:
    """Speculative tokens kept by copies (not the original) of surviving paths, one per (``lengths[i]``
    speculative tokens, ``keys[i]``): a fraction r ~ N(r_mean, r_std) clipped to [0, 1] (FastTTS §1.4:
    R = 0.85, sigma = 0.1), drawn from a generator seeded with the key (the copy's identity;
    ``seeding.generators``, built together), then :func:`truncate_keep`."""
    return [
        truncate_keep(n, min(1.0, max(0.0, float(g.normal(r_mean, r_std))))) for n, g in zip(lengths, generators(keys))
    ]
