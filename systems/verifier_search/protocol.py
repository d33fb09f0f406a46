"""What the FastTTS search and its engines exchange, on both backends (vLLM and simulated).

A leaf module: plain dataclasses and ``typing.Protocol`` s, no vLLM, torch or harness imports, and
importing it sets no environment variable. Token lists are in the generator's token space.

- :class:`Generator`: ``extend(requests, policy) -> GenResult`` runs every :class:`GenRequest` to
  the end of its step, consulting the speculation policy (``systems.verifier_search.speculation``) for every
  speculative decision (FastTTS §4.1).
- :class:`Verifier`: ``verify(problem, items) -> VerifierOutput`` scores the steps of each path
  (one prefill pass per path, FastTTS §1.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence, Tuple

if TYPE_CHECKING:  # annotations only: no import at run time
    from systems.verifier_search.speculation import SpeculationPolicy


@dataclass
class GenRequest:
    """One generator call: extend ``uid`` from ``prompt_ids`` (prompt + path so far) by one step of
    at most ``max_tokens`` tokens, sampled with ``seed``. ``stop_at_delimiter`` False = last
    iteration / best-of-N (decode to the end token or the cap). ``potential``: speculative potential
    M_i (§4.1.1), larger = speculates longer under the cap. ``path``: the path's name in the search
    tree, problem-qualified (``"3/0.1.2"``; its parent is ``"3/0.1"``), whose prompt extends the
    parent's: the simulator hashes only the blocks past what it hashed for the parent (vLLM hashes
    blocks itself). ``path_steps``: steps the path holds before ``prompt_ids``' speculative tail,
    ``step_age``: tokens of the unfinished step at the end of ``prompt_ids`` (a speculative head
    start), both for the simulator's step-length model (``step_lengths``; a real engine ignores them)."""

    uid: str
    prompt_ids: List[int]
    max_tokens: int
    seed: int
    stop_at_delimiter: bool = True
    potential: int = 1
    path: str = ""
    path_steps: int = 0
    step_age: int = 0


@dataclass
class GenOutput:
    """Tokens produced for one request: the step (ending with the delimiter, the end token or at
    the cap) followed by speculative tokens. ``finish``: delimiter | eos | length. Token counts in
    tokens: ``step_len`` of the step proper (``tokens[step_len:]`` are speculative), ``prompt_tokens``
    of the request's prompt, ``cached_tokens`` of them served by the prefix cache."""

    tokens: List[int]
    finish: str
    step_len: int
    cached_tokens: int = 0
    prompt_tokens: int = 0


@dataclass
class GenResult:
    """One ``extend`` call: outputs by request uid, wall (vLLM) or charged (simulated) seconds,
    engine steps taken, tokens generated past a step boundary, and on a real engine the process
    CPU seconds of the call (``cpu_s``: with one torch thread, the call's time on an uncontended
    core; on a shared machine it is steadier than the wall time)."""

    outputs: Dict[str, GenOutput]
    time_s: float
    engine_steps: int = 0
    spec_tokens: int = 0
    cpu_s: Optional[float] = None


@dataclass
class VerifierOutput:
    """One ``verify`` call. ``values[i][k]``: the PRM score of step k of item i, or None when this
    call did not compute it (a step served by the prefix cache was scored by an earlier call).
    ``time_s`` seconds (``cpu_s``: process CPU seconds on a real engine, as in :class:`GenResult`);
    ``prompt_tokens`` verifier input tokens, ``cached_tokens`` of them served by the prefix cache."""

    values: List[List[Optional[float]]]
    time_s: float
    cached_tokens: int = 0
    prompt_tokens: int = 0
    cpu_s: Optional[float] = None


VerifyItem = Tuple[List[int], List[int]]  # (path tokens, exclusive end of each step)


class Generator(Protocol):
    def extend(self, requests: List[GenRequest], policy: "SpeculationPolicy") -> GenResult:
        """Run the requests (list order = admission order) to the end of their steps."""


class Verifier(Protocol):
    def verify(
        self, problem: int, items: Sequence[VerifyItem], paths: Optional[Sequence[str]] = None
    ) -> VerifierOutput:
        """Score every step of every item of problem ``problem``; ``paths``: each item's path name
        (as ``GenRequest.path``), a hint for reusing the parent's work."""
