"""Types the serving family's driver, controllers and executors share (a leaf module: no torch, no
vLLM, nothing of ours imported).

The split follows the TTC family: the policy side (:mod:`systems.energy_serving.driver` and the
controllers) decides; an :class:`Executor` (the simulator, or vLLM) applies a :class:`Decision`,
runs iterations and reports each one as an :class:`Iteration`. Times are seconds since the start
of serving, energies joules, clocks MHz, lengths tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Protocol, Tuple


@dataclass
class EngineState:
    """What a controller sees. ``waiting``: FCFS prefills not finished, as (waited_s, remaining
    prompt tokens); ``num_decodes``: D requests in decode; current knobs."""

    now: float
    waiting: List[Tuple[float, int]]
    num_decodes: int
    chunk: int
    microbatches: int
    clock_mhz: float


@dataclass
class Decision:
    """Knob settings and what the model predicted for them (s, J; None where not predicted)."""

    chunk: int
    microbatches: int
    clock_mhz: float
    trigger: str = ""
    feasible: bool = True
    pred_ttft_s: Optional[float] = None
    pred_tbt_s: Optional[float] = None
    pred_energy_j: Optional[float] = None


@dataclass
class WindowStats:
    """Load seen over the last window: arrivals, their prompt tokens, the time-mean number of
    decodes, and the window's length (s)."""

    arrivals: int
    input_tokens: int
    mean_decodes: float
    duration_s: float


@dataclass(slots=True)
class Iteration:
    """One finished iteration (a microbatch that left the last pipeline stage), as an executor saw it.

    t_end: when its tokens appeared (s). latency_s: one stage's time for it (the quantity the
    controller's table L(n, f) predicts; on one device, the step time). energy_j: what it cost
    (busy energy of all its stages and GPUs, plus idle gaps its stages waited before it; None when
    not measured). scheduled: (request, new tokens, tokens already in its KV before them) per
    request in the batch. emitted: requests that got one output token (a prefill or recompute that
    completed, or a decode). finished: requests that completed. preempted: requests the executor
    evicted from the KV cache since its last report (they recompute their tokens later).
    budget: token budget in force (prefill chunk + decodes). clock_mhz: SM clock it ran at.
    cpu_s: on a CPU device, the engine thread's CPU time for it (its own cost; ``latency_s`` - cpu_s
    is time it waited for a core on a shared machine); None elsewhere. shape: its
    :func:`iteration_shape`, when the executor computed it already (else the driver does).
    n_decodes: the first n_decodes items of ``scheduled`` are decodes (an executor that lists them
    first says so; the driver then books prefill progress from the rest only).
    """

    t_end: float
    latency_s: float
    energy_j: Optional[float]
    scheduled: List[Tuple[int, int, int]]
    emitted: List[int]
    finished: List[int]
    preempted: List[int] = field(default_factory=list)
    budget: int = 0
    clock_mhz: float = 0.0
    cpu_s: Optional[float] = None
    shape: Optional[Tuple[int, float, float, int]] = None
    n_decodes: int = 0


def iteration_shape(scheduled) -> Tuple[int, float, float, int]:
    """(new tokens n, KV tokens read, attention pairs, sequences) of a batch of (request, tokens,
    context) items.

    A request's ``t`` new tokens after ``c`` cached ones read ``c + t`` KV tokens and form
    ``t c + t (t + 1) / 2`` causal query-key pairs (a decode: t = 1, c + 1 pairs); every request in
    the batch is one sequence (vLLM computes one row of logits per sequence). These are the inputs
    of an :class:`IterationCost`.
    """
    n = 0
    ctx = pairs = 0.0
    for _, t, c in scheduled:
        n += t
        ctx += c + t
        pairs += t * c + t * (t + 1) * 0.5
    return n, ctx, pairs, len(scheduled)


@dataclass
class ExecutorTotals:
    """What an executor reports when serving ends. energy_j: total (busy + idle) or None with
    ``energy_reason``; energy_bins: joules per 1-s bin (index = second); clock_log: (time s, SM
    clock MHz) when the clock in force changed (recorded-only clocks on a real device without
    actuation); preemptions: requests evicted from the KV cache."""

    energy_j: Optional[float]
    energy_reason: str = ""
    energy_bins: dict = field(default_factory=dict)
    clock_log: List[Tuple[float, float]] = field(default_factory=list)
    preemptions: int = 0


class Executor(Protocol):
    """A serving engine the driver runs: it applies decisions and reports iterations.

    ``now``: the executor's clock (s since serving started; simulated or wall time).
    """

    now: float

    def add(self, rid: int, input_len: int, output_len: int, now: float) -> None:
        """A request arrived (it joins the executor's FCFS waiting queue)."""

    def apply(self, decision: Decision, now: float) -> None:
        """Set chunk size, microbatches and SM clock (what a backend cannot apply it records)."""

    def advance(self, until: float) -> Optional[Iteration]:
        """Run until the next finished iteration (returned) or until ``until`` (None). A simulated
        executor never passes ``until``; a real one cannot stop inside a step, so ``now`` may."""

    def busy(self) -> bool:
        """Whether requests are queued or running."""

    def close(self, now: float) -> ExecutorTotals:
        """End serving at ``now`` (trailing idle energy charged) and return the totals."""


class IterationCost(Protocol):
    """Latency and energy of one stage iteration (the simulated executor's ground truth):
    :class:`systems.common.gpu_model.StageModel` or a measured CPU profile. ``has_energy``: it
    has a power model; ``follows_clock``: the clock changes its latency (False: a device whose
    clock is not set, where clock decisions are recorded only)."""

    has_energy: bool
    follows_clock: bool

    def step1(
        self, n: float, f: float, ctx_tokens: float = 0.0, attn_pairs: float = 0.0, seqs: int = 1
    ) -> Tuple[float, float]:
        """(latency s, energy J per GPU) of an iteration of ``n`` new tokens of ``seqs`` sequences
        at clock ``f`` (see :func:`iteration_shape`)."""

    def idle1(self, f: float) -> float:
        """Power (W per GPU) of a stage waiting at clock ``f``: a function of the clock alone (the
        simulator asks once per clock)."""
