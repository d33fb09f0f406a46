"""Types the TTC family's runner and executors share (leaf module: numpy only).

The runner (``systems.kv_offload.runner``) builds a :class:`systems.kv_offload.plan.StepPlan` per step and hands it
to an :class:`Executor`: ``sim.SimExecutor`` (simulated) or ``torch_engine.TorchExecutor`` (real).
Executors carry plans out and report a :class:`StepOutcome`; they decide nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, List, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from systems.kv_offload.plan import StepPlan
    from systems.kv_offload.tree import Beam, BeamTree


@dataclass
class StepOutcome:
    """What executing one step (or the prefill) produced. Seconds are measured (real) or charged (sim).

    compute_s + io_stall_s is the step's end-to-end time: on the real engine, the wall time between
    the step's start and its final synchronisation, split by the measured I/O stall."""

    logprob_delta: np.ndarray  # [N] sum of log-probs of this step's tokens
    tokens: Optional[List[List[int]]] = None  # [N][T] sampled tokens (real engine)
    compute_s: float = 0.0
    io_stall_s: float = 0.0
    other_s: float = 0.0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    peak_device_bytes: int = 0  # charged (KV + staging), comparable with the plan's
    peak_physical_bytes: int = 0  # bytes of live device KV tensors (real engine)
    group_rows: List[dict] = field(default_factory=list)
    # teacher-forced real runs: per beam, (tokens whose own draw differs from the forced one, the
    # largest distance in probability of such a draw from the forced token's interval); else None
    token_flips: Optional[List[tuple]] = None


@dataclass
class EnergyWindow:
    """GPU energy of one window of a run (J): the prefill, or one step with its planning and prune +
    expand. ``energy_j`` None = not measured (``reason`` says why; never recorded as 0).
    ``io_stall_j``: the part drawn while waiting on PCIe (simulator only; None on a real GPU, whose
    NVML counter does not split a window)."""

    energy_j: Optional[float]
    io_stall_j: Optional[float] = None
    reason: str = ""


@runtime_checkable
class Executor(Protocol):
    """Carries out the plans of one run (LBS paper Alg.1 execution); see ``torch_engine``'s module doc."""

    simulated: bool
    clock: Callable[[], float]  # the time basis of measured seconds (real executors)
    energy_source: Optional[str]  # how energy is obtained (simulated model / NVML), None = not at all

    def warmup(self, prompt_tokens: Sequence[int], num_beams: int) -> float:
        """Run the model once outside the measurement (lazy initialisation, kernel selection);
        returns its wall seconds (0 where there is nothing to warm up)."""

    def prefill(self, tree: "BeamTree", prompt_tokens: Sequence[int], offload: bool) -> StepOutcome:
        """Prefill the prompt (segment 0); ``offload``: write its KV to the host."""

    def execute_step(self, plan: "StepPlan", tree: "BeamTree", beams: Sequence["Beam"]) -> StepOutcome:
        """Decode one step for every live beam as ``plan`` says."""

    def expand(self, plan: "StepPlan", tree: "BeamTree", old: Sequence["Beam"], new: Sequence["Beam"]) -> float:
        """Prune + expand on the executor's side; returns its seconds."""

    def step_energy(self) -> EnergyWindow:
        """Close the energy window opened by the previous call (the first opens at the prefill's
        start) and open the next at once (on NVML two counter reads apart), so their sum is the run's energy."""

    def close(self) -> None:
        """Release device memory; finish measurement windows."""
