"""Config schemas of the TTC family (LBS paper): the ``ttc_beam`` workload and the TTC systems."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING


@dataclass
class TTCBeamWorkload:
    """Step-wise beam search (LBS paper Sec. 2): ``beams`` = beam size x beam width live paths.

    Lengths in tokens. ``step`` tokens per search step (32/64/128 in the paper).
    """

    name: str = "ttc_beam"
    kind: str = "ttc_beam"
    prompt_len: int = 128
    gen_len: int = 1920
    beam_width: int = 2
    beams: int = 16
    step: int = 32
    scorer: str = "logprob"  # logprob (cumulative log-probability) | synthetic
    temperature: float = 1.0


@dataclass
class TTCSystem:
    """One TTC system variant. ``scheduler`` picks the execution order; the flags give LBS ablations.

    inter_beam: share prefix KV blocks when loading a group (greedy BeamSet, Alg.1).
    prefetch:   balanced grouping + prefetch of the next group into free slots.
    """

    name: str = MISSING
    family: str = "kv_offload"
    scheduler: str = MISSING  # in_gpu | layerwise | lbs | hf_offload
    inter_beam: bool = True
    prefetch: bool = True
    kv_budget: Any = None  # bytes or "7GiB"; None = hardware profile / live free memory
    record_tree: bool = False  # real engine: save the beam tree (parents kept per step)
    replay_tree: Any = None  # path of a recorded beam tree to replay (its kept beams)
    teacher_force: bool = False  # torch + replay_tree: decode the recorded tokens (systems/kv_offload/divergence.py)
    warmup: bool = True  # real engine: warm-up run before the measurement (excluded, recorded)
    decode_path: str = "auto"  # real engine: auto | lean | piecewise | transformers (docs/kv_offload.md)
    batch_invariant: bool = False  # real engine, piecewise path: every group padded to the run's beams
    deadline: Any = None  # Unix seconds: stop between steps after it (status timeout)


def register(cs) -> None:
    cs.store(group="workload", name="_ttc_beam_schema", node=TTCBeamWorkload)
    cs.store(group="system", name="_kv_offload_system_schema", node=TTCSystem)
