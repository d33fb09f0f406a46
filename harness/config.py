"""Structured-config schemas for the shared config groups, and validation helpers.

Every YAML option of a group extends its schema through its defaults list
(``defaults: [_hardware_schema, _self_]``), so Hydra type-checks it at composition. Family-specific
groups (workload kinds, system knobs) are registered by ``systems/<family>/config.py`` modules,
each exposing ``register(cs: ConfigStore)``; ``register_configs()`` calls them all.

Semantic checks that types cannot express (beams divisible by beam width, a KV budget large enough
for one beam, ...) raise :class:`ConfigError` from the family's ``validate(cfg)`` before any work
starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from harness.errors import ConfigError, bad  # noqa: F401  (re-exported for older imports)


@dataclass
class HardwareConfig:
    """A device profile. Per-device numbers; every number's source is in ``sources``.

    Units: bytes, bytes/s, FLOP/s, seconds, watts, MHz.
    """

    name: str = MISSING
    kind: str = "gpu"  # gpu | cpu
    description: str = ""
    num_gpus: int = 1
    memory_bytes: int = MISSING  # device memory per GPU (bytes)
    peak_flops: float = MISSING  # dense fp16/bf16 tensor FLOP/s per GPU
    mem_bw: float = MISSING  # device memory bandwidth (B/s)
    # weight bytes/s of a decode matmul by its rows (beams of one launch), measured by harness.calibrate
    # (achieved rates: mem_efficiency does not discount them); empty = mem_bw at every batch (the LBS
    # family's cost model, systems/kv_offload/sim.py); on the command line: hardware.mem_bw_by_rows.4=1e10
    # (a row the profile has) or +hardware.mem_bw_by_rows.4=1e10 (a new one)
    mem_bw_by_rows: Dict[Any, float] = field(default_factory=dict)  # rows: an int, or its digits as text
    h2d_bw: float = MISSING  # effective host->device copy bandwidth, pinned (B/s)
    d2h_bw: float = MISSING  # effective device->host copy bandwidth, pinned (B/s)
    launch_overhead_s: float = 0.0  # fixed cost per decoder layer per forward launch (s)
    flops_efficiency: float = 0.6  # achieved / peak for large GEMMs
    mem_efficiency: float = 0.8  # achieved / peak for streaming reads
    interconnect_bw: float = 0.0  # GPU<->GPU (NVLink) B/s, for TP/PP
    tdp_w: float = 0.0
    idle_w: float = 0.0
    clock_min_mhz: int = 0
    clock_max_mhz: int = 0
    clock_default_mhz: int = 0
    clock_step_mhz: int = 15
    kv_reserve_bytes: Optional[int] = None  # device memory for neither weights nor KV; null = 10 % (model_facts)
    host_memory_bytes: Optional[int] = (
        None  # host RAM that holds offloaded KV (TTC family); null = unknown, not checked
    )
    power: Dict[str, Any] = field(default_factory=dict)  # power-model parameters (serving family)
    measured: Dict[str, Any] = field(default_factory=dict)  # calibrated values, with their date
    datasheet: Dict[str, Any] = field(default_factory=dict)  # vendor values a measured profile replaced
    sources: Dict[str, str] = field(default_factory=dict)  # field -> spec sheet / measurement


@dataclass
class ModelConfig:
    """Architecture of a decoder-only LM: the exact shapes of the named model.

    ``hf_model_type`` is the transformers ``model_type`` that builds it (random weights from this
    config unless ``weights`` is a local checkpoint directory). ``hf_config`` carries extra
    constructor fields of that transformers config class.
    """

    name: str = MISSING
    paper_name: str = ""  # how the paper calls it
    hf_model_type: str = MISSING  # opt | llama | qwen2 | mistral | ...
    maps_to: str = ""  # why this transformers class stands for the paper's model
    num_layers: int = MISSING
    hidden_size: int = MISSING
    num_heads: int = MISSING
    num_kv_heads: int = MISSING
    head_dim: int = MISSING
    intermediate_size: int = MISSING
    vocab_size: int = MISSING
    max_position: int = 2048
    dtype: str = "float16"  # float16 | bfloat16 | float32 | float64
    weights: str = "random"  # random | /path/to/local/checkpoint
    num_params: Optional[int] = None  # parameter count; None = derived from the shapes
    hf_config: Dict[str, Any] = field(default_factory=dict)


@dataclass
class VerifierConfig(ModelConfig):
    """A verifier / reward model (same shapes as a model); ``name: none`` means no verifier."""

    name: str = "none"
    hf_model_type: str = ""
    num_layers: int = 0
    hidden_size: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    step_tag_id: Optional[int] = None  # token id of the PRM step tag
    # How a step's score is read (tts family, systems/verifier_search/checkpoint.py):
    #   head: a PRM with a 2-label head (Qwen2ForProcessRewardModel, Skywork-style): P(label 1) at
    #         the "\n\n" step tag.
    #   lm:   a causal LM (*ForCausalLM, Math-Shepherd-style): P(good) of the 2-way softmax over its
    #         logits for [good_token_id, bad_token_id] at each ``step_tag`` token (" ки" = 12902,
    #         "+" = 648, "-" = 387 for math-shepherd-mistral-7b-prm).
    prm_kind: str = "head"  # head | lm
    step_tag: str = "\n\n"  # text of the step tag (lm: inserted after every step)
    good_token_id: Optional[int] = None  # lm: the "+" token
    bad_token_id: Optional[int] = None  # lm: the "-" token
    # The verifier's input as the FastTTS artifact built it (systems/verifier_search/artifact.py):
    # none | response_left (the response keeps its last input_limit - |prompt| - 1 tokens) | right
    # (the input keeps its first input_limit tokens); system_prompt: the generator's system prompt +
    # "\n" + question + "\n" as the prompt (Math-Shepherd in the artifact) instead of the question.
    input_truncation: str = "none"
    input_limit: Optional[int] = None
    system_prompt: bool = False


@dataclass
class BackendConfig:
    """Which engine executes the system: ``auto`` = the real engine on a CUDA GPU, else ``sim``."""

    name: str = "auto"  # auto | torch | vllm | sim
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 1  # torch threads of a real-engine run; 0 = torch's default (harness/machine.py)


@dataclass
class TrackingConfig:
    """Experiment tracking. Local files stay the source of truth."""

    name: str = "wandb"  # wandb | none
    mode: str = "offline"  # offline | online | disabled
    project: str = "ttc-sched-bench"
    entity: Optional[str] = None
    # How jobs of a multirun reach W&B. runs: each job its own W&B run. table: each job one row
    # (config + summary) of the sweep's W&B run, next to the sweep's figures. auto: table for
    # simulated jobs (W&B start-up costs more CPU than a simulated job), runs for real-engine jobs.
    sweep_jobs: str = "auto"  # auto | runs | table


class AttrDict(dict):
    """A resolved config as plain dicts with attribute access (fast in hot loops, unlike DictConfig)."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def plain(cfg) -> AttrDict:
    """Resolve a DictConfig into nested :class:`AttrDict` s."""

    def conv(x):
        if isinstance(x, dict):
            return AttrDict({k: conv(v) for k, v in x.items()})
        if isinstance(x, list):
            return [conv(v) for v in x]
        return x

    return conv(OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg)


BACKENDS = ("auto", "torch", "vllm", "sim")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float16", "bfloat16", "float32", "float64")


def register_configs() -> None:
    """Register every schema with Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(group="hardware", name="_hardware_schema", node=HardwareConfig)
    cs.store(group="model", name="_model_schema", node=ModelConfig)
    cs.store(group="verifier", name="_verifier_schema", node=VerifierConfig)
    cs.store(group="backend", name="_backend_schema", node=BackendConfig)
    cs.store(group="tracking", name="_tracking_schema", node=TrackingConfig)
    from harness.family import families

    for family in families().values():
        family.register_configs(cs)


def _first(*values):
    """Resolver ``${first:a,b,...}``: the first value that is not null (top-level shortcuts)."""
    for v in values:
        if v is not None and v != "None":
            return v
    return None


def _parallel_jobs(backend_name: str) -> int:
    """Resolver ``${parallel_jobs:${backend.name}}``: sweep jobs in parallel (all cores) only when
    every job is simulated; real engines run one job at a time so measurements do not interfere."""
    if backend_name == "sim":
        return -1
    if backend_name == "auto":
        from harness.backend import cuda_available

        return 1 if cuda_available() else -1
    return 1


def _repo_path(*parts: str) -> str:
    """Resolver ``${repo_path:results}``: a path inside the repository, absolute, so ``results_dir``'s
    default is the repository's ``results/`` from any current directory (as harness.reproduce's)."""
    from pathlib import Path

    return str(Path(__file__).resolve().parent.parent.joinpath(*parts))


def _env_or(name: str, default: str) -> str:
    """Resolver ``${env_or:NAME,default}``: the environment variable ``NAME``, or ``default`` when it
    is unset or empty (``oc.env`` returns an exported empty value as is: ``TTC_RESULTS_DIR=`` put
    every record under ``/``; an empty variable almost always means "unset")."""
    return os.environ.get(name) or default


def default_results_dir():
    """$TTC_RESULTS_DIR (unless unset or empty), else the repository's ``results/``: run.py's
    ``results_dir`` default (conf/config.yaml), for the tools that find records without a config."""
    from pathlib import Path

    return Path(_env_or("TTC_RESULTS_DIR", _repo_path("results")))


def results_dir_of(overrides: List[str]):
    """The results folder a tool's run.py jobs write to: the value of a ``results_dir=`` among
    ``overrides`` (a relative one inside the repository, where the tools run run.py), else
    :func:`default_results_dir`."""
    from pathlib import Path

    given = next((str(a).split("=", 1)[1] for a in overrides if str(a).startswith("results_dir=")), None)
    if not given:
        return default_results_dir()
    p = Path(given)
    return p if p.is_absolute() else Path(_repo_path()) / p


JOB_FOLDER_MAX_BYTES = 200  # a file name may have 255 bytes; the rest is for temp-file prefixes and suffixes


def job_folder_name(dirname: str) -> str:
    """A sweep job's folder name (``hydra.sweep.subdir``) from its override dirname (``beams=4,system=lbs``):
    each character that would make it a path or an unreadable name (``/``, a backslash, ``%`` itself,
    a control character) percent-encoded (``workload.path=/data/x.jsonl`` ->
    ``workload.path=%2Fdata%2Fx.jsonl``: it made folders outside the sweep's), and a name over
    :data:`JOB_FOLDER_MAX_BYTES` bytes cut, with a hash of the whole name after it, so that distinct
    jobs keep distinct folders (300 bytes of values ended in "File name too long"). Names made of
    other characters (every sweep so far) stay as they were."""
    import hashlib

    out = "".join(f"%{ord(c):02X}" if c in "/\\%" or not c.isprintable() else c for c in dirname)
    if len(out.encode()) > JOB_FOLDER_MAX_BYTES:
        digest = hashlib.sha256(dirname.encode()).hexdigest()[:16]
        head = out.encode()[: JOB_FOLDER_MAX_BYTES - len(digest) - 1].decode(errors="ignore")
        out = f"{head}~{digest}"
    return out


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("env_or"):
        OmegaConf.register_new_resolver("env_or", _env_or)
    if not OmegaConf.has_resolver("pid"):
        # ${pid:}: the id of the process that composed the config (run and sweep folders); cached, as
        # Hydra's ${now:}, so a sweep's jobs (their configs copy the cache, loky workers included) keep it
        OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True)
    if not OmegaConf.has_resolver("repo_path"):
        OmegaConf.register_new_resolver("repo_path", _repo_path)
    if not OmegaConf.has_resolver("first"):
        OmegaConf.register_new_resolver("first", _first)
    if not OmegaConf.has_resolver("job_folder"):
        OmegaConf.register_new_resolver("job_folder", job_folder_name)
    if not OmegaConf.has_resolver("parallel_jobs"):
        OmegaConf.register_new_resolver("parallel_jobs", _parallel_jobs)


SWEEP_JOBS = ("auto", "runs", "table")
MAX_REPEATS = 1000  # repeats=100000 was accepted: 14 h of a simulated main command, its tables all in memory
TRACKING_NAMES = ("wandb", "none")
TRACKING_MODES = ("offline", "online", "disabled")

# The range each numeric field of a hardware profile or a model must be in (a finite number always;
# null only where the schema allows it). ">= 0" where 0 means none or not modelled.
RANGES = {
    "> 0": lambda x: x > 0,
    ">= 0": lambda x: x >= 0,
    "in (0, 1]": lambda x: 0 < x <= 1,
    "in [0, 1]": lambda x: 0 <= x <= 1,
    "in (0, 1)": lambda x: 0 < x < 1,
}
HARDWARE_NUMBERS = {  # field: (what it is, range, what 0 or null means)
    "num_gpus": ("a GPU count", "> 0", ""),
    "memory_bytes": ("a device memory size in bytes", "> 0", ""),
    "peak_flops": ("a compute rate in FLOP/s", "> 0", ""),
    "mem_bw": ("a bandwidth in bytes/s", "> 0", ""),
    "h2d_bw": ("a bandwidth in bytes/s", "> 0", ""),
    "d2h_bw": ("a bandwidth in bytes/s", "> 0", ""),
    "launch_overhead_s": ("a time in seconds", ">= 0", ""),
    "flops_efficiency": ("a fraction of peak_flops", "in (0, 1]", ""),
    "mem_efficiency": ("a fraction of mem_bw", "in (0, 1]", ""),
    "interconnect_bw": ("a bandwidth in bytes/s", ">= 0", "0 = no GPU-to-GPU link"),
    "tdp_w": ("a power in watts", ">= 0", "0 = not measured"),
    "idle_w": ("a power in watts", ">= 0", "0 = not measured"),
    "clock_min_mhz": ("a clock in MHz", ">= 0", "0 = no clock range"),
    "clock_max_mhz": ("a clock in MHz", ">= 0", "0 = no clock range"),
    "clock_default_mhz": ("a clock in MHz", ">= 0", "0 = no clock range"),
    "clock_step_mhz": ("a clock step in MHz", "> 0", ""),
    "kv_reserve_bytes": ("a size in bytes", ">= 0", "null = 10 % of memory_bytes"),
    "host_memory_bytes": ("a host memory size in bytes", "> 0", "null = unknown, not checked"),
}
# Physically plausible values (field: lowest, highest, why): a value outside is a typo or a unit slip
# (1e-300 FLOP/s ran as "ok" with an infinite latency; 1e308 s of launch overhead likewise), not a
# device. Wide on purpose: from a slow CPU core to 10-100x today's largest accelerator. A field whose
# 0 means "not set" (HARDWARE_NUMBERS' ">= 0" fields) is bounded only when set.
PLAUSIBLE = {
    "num_gpus": (1, 1024, "GPUs of one node or NVLink domain (the largest today: 72-576)"),
    "memory_bytes": (2**20, 2**44, "1 MiB to 16 TiB of device memory (the largest GPU today: 288 GB)"),
    "peak_flops": (1e8, 1e17, "0.1 GFLOP/s to 100 PFLOP/s (an H200: 0.99 PFLOP/s dense fp16)"),
    "mem_bw": (1e8, 1e14, "0.1 GB/s to 100 TB/s (an H200: 4.8 TB/s)"),
    "h2d_bw": (1e6, 1e13, "1 MB/s to 10 TB/s (PCIe 5 x16: 64 GB/s; NVLink-C2C: 900 GB/s)"),
    "d2h_bw": (1e6, 1e13, "1 MB/s to 10 TB/s (PCIe 5 x16: 64 GB/s; NVLink-C2C: 900 GB/s)"),
    "interconnect_bw": (1e6, 1e14, "1 MB/s to 100 TB/s (NVLink 5: 1.8 TB/s per GPU)"),
    "launch_overhead_s": (1e-9, 1.0, "1 ns to 1 s per decoder-layer launch (measured: 30-500 us)"),
    "tdp_w": (1.0, 1e4, "1 W to 10 kW (a B200: 1 kW)"),
    "idle_w": (0.1, 1e4, "0.1 W to 10 kW"),
    "clock_min_mhz": (1, 10_000, "1 MHz to 10 GHz"),
    "clock_max_mhz": (1, 10_000, "1 MHz to 10 GHz"),
    "clock_default_mhz": (1, 10_000, "1 MHz to 10 GHz"),
    "clock_step_mhz": (1, 10_000, "1 MHz to 10 GHz"),
    "host_memory_bytes": (2**20, 2**50, "1 MiB to 1 PiB of host memory"),
}
POWER_NUMBERS = {  # hardware.power: the serving power model (systems/common/gpu_model.py)
    "act_a_w": ("a power in watts", ">= 0", ""),
    "act_b_w": ("a power in watts", ">= 0", ""),
    "act_alpha": ("an exponent", "> 0", ""),
    "mem_beta": ("a fraction of the active power", "in [0, 1]", ""),
    "blocking_w": ("a power in watts", ">= 0", ""),
    "mem_knee_frac": ("a fraction of clock_max_mhz", "in [0, 1]", ""),
    "limit_w": ("a power in watts", "> 0", ""),
    "tile_tokens": ("a token count", "> 0", ""),
}
MODEL_NUMBERS = {  # the shapes' own rule (counts, heads) is harness.model_facts.check_model_shapes
    "num_params": ("a parameter count", ">= 0", "null or 0 = derived from the shapes"),
}


def check_number(field_name: str, value: Any, what: str, rng: str = "> 0", note: str = "") -> None:
    """ConfigError unless ``value`` is a finite number in ``rng`` (a key of :data:`RANGES`), naming
    the field and what is allowed: "hardware.h2d_bw=-5.0 is not allowed: a bandwidth in bytes/s > 0"."""
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        x = math.nan
    if isinstance(value, bool) or not (math.isfinite(x) and RANGES[rng](x)):
        finite = "" if math.isfinite(x) else " and finite"
        raise bad(field_name, value, f"{what} {rng}{finite}" + (f" ({note})" if note else ""))


# The most iterations a loop that advances by a configured amount may run (a clock ticking by a
# period, a sampler stepping by a tile): each is a Python-level event (a controller call, a sample, a
# timeline bin) of ~1-100 us, so 10 million are seconds to minutes; more looks like a hang (a
# Window-DVFS period of 1e-20 s against 900 s of serving was ~1e23 ticks; 1e-300 s never advanced).
MAX_STEPS = 10_000_000


def check_steps(
    field_name: str, step: Any, horizon: float, horizon_text: str, what: str, unit: str, limit: int = MAX_STEPS
) -> None:
    """ConfigError, naming ``field_name``, unless a loop that advances by ``step`` from 0 up to
    ``horizon`` (both in ``unit``) ends within ``limit`` iterations (:data:`MAX_STEPS`): the step
    advances the clock at the horizon (``horizon + step > horizon`` in floating point; else ``t +
    step == t`` there and the loop never ends) and ``step >= horizon / limit``. ``horizon_text`` says
    where the horizon comes from and ``what`` what the step is, for the message. ``step`` is already
    known to be a finite number > 0 (:func:`check_number`)."""
    dt, end = float(step), float(horizon)
    least = end / limit
    allowed = f"{what} of at least {least:g} {unit}"
    if not end + dt > end:
        raise bad(
            field_name,
            step,
            f"{allowed}: it does not advance the clock at {horizon_text} = {end:g} {unit} "
            f"({end:g} + {dt:g} == {end:g} in floating point: the loop would never end)",
        )
    if dt < least:
        raise bad(
            field_name,
            step,
            f"{allowed}: {horizon_text} = {end:g} {unit} in steps of {dt:g} {unit} is {end / dt:.3g} "
            f"iterations, more than the limit of {limit:,} (a loop that long looks hung)",
        )


def check_numbers(group: str, node, limits: Dict[str, tuple]) -> None:
    """:func:`check_number` for each field of ``limits`` set in ``node`` (null: a schema default)."""
    for key, (what, rng, note) in limits.items():
        value = node.get(key)
        if value is not None:
            check_number(f"{group}.{key}", value, what, rng, note)


def check_hardware(hw) -> None:
    """A hardware profile's numbers (:data:`HARDWARE_NUMBERS`, ``power``: :data:`POWER_NUMBERS`), each
    within its physically plausible range (:data:`PLAUSIBLE`), and their order: the clocks set (> 0) as min <= default <= max, idle power at most the TDP (when
    both are set). Raises ConfigError naming the field."""
    check_numbers("hardware", hw, HARDWARE_NUMBERS)
    for key, (low, high, why) in PLAUSIBLE.items():
        v = hw.get(key)
        unset = v is None or (v == 0 and HARDWARE_NUMBERS[key][1] == ">= 0")
        if not unset and not low <= v <= high:
            raise bad(f"hardware.{key}", v, f"{HARDWARE_NUMBERS[key][0]} from {low:g} to {high:g} ({why})")
    if hw.get("power"):
        check_numbers("hardware.power", hw.power, POWER_NUMBERS)
    low, high, why = PLAUSIBLE["mem_bw"]
    seen = set()
    for rows, v in (hw.get("mem_bw_by_rows") or {}).items():  # keys: ints, or their digits as text
        if isinstance(rows, bool) or not str(rows).isdigit() or int(rows) < 1:
            raise bad("hardware.mem_bw_by_rows", rows, "a count of rows (an integer >= 1) as each key")
        if int(rows) in seen:
            raise bad("hardware.mem_bw_by_rows", rows, f"each count of rows once (row {int(rows)} is given twice)")
        seen.add(int(rows))
        check_number(f"hardware.mem_bw_by_rows.{rows}", v, f"a bandwidth in bytes/s from {low:g} to {high:g}", "> 0")
        if not low <= v <= high:
            raise bad(f"hardware.mem_bw_by_rows.{rows}", v, f"a bandwidth in bytes/s from {low:g} to {high:g} ({why})")
    clocks = [(k, hw.get(k)) for k in ("clock_min_mhz", "clock_default_mhz", "clock_max_mhz") if hw.get(k)]
    for (k1, f1), (k2, f2) in zip(clocks, clocks[1:]):
        if f1 > f2:
            raise bad(
                f"hardware.{k1}",
                f1,
                f"a clock at most hardware.{k2}={f2} MHz (clock_min_mhz <= clock_default_mhz <= clock_max_mhz)",
            )
    if hw.get("tdp_w") and hw.get("idle_w") and hw.idle_w > hw.tdp_w:
        raise bad("hardware.idle_w", hw.idle_w, f"a power at most hardware.tdp_w={hw.tdp_w} W")


def check_model(group: str, m) -> None:
    """A model's shapes (:func:`harness.model_facts.check_model_shapes`: counts, attention heads, what
    its architecture requires) and its other numbers (:data:`MODEL_NUMBERS`), ``group`` being the
    config key (``model``, ``verifier``). Raises ConfigError."""
    from harness.model_facts import check_model_shapes

    check_model_shapes(m, group)
    check_numbers(group, m, MODEL_NUMBERS)


# Top-level shortcuts (conf/config.yaml) other than kv_budget (check_kv_budget): each feeds its group's
# field through ``${first:${key},default}``; a set value is checked here even where nothing reads it.
SHORTCUTS = {
    "beams": "a beam count",
    "step": "a token count",
    "gen_len": "a token count",
    "prompt_len": "a token count",
    "n": "a path count",
    "tp": "a GPU count",
    "pp": "a GPU count",
}


def check_shortcuts(cfg, keys: List[str]) -> None:
    """The top-level shortcuts ``keys`` (set ones that no setting reads, :func:`unused_shortcuts`:
    the families check the ones they read, naming the field they set): counts positive integers
    (:data:`SHORTCUTS`), ``rate`` a finite request rate > 0 (req/s), so that ``rate=inf`` with a
    trace workload is refused like with a Poisson one. Raises ConfigError."""
    for key in keys:
        v = cfg.get(key)
        if key == "rate":
            check_number("rate", v, "a request rate in req/s", "> 0")
        elif key in SHORTCUTS and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise bad(key, v, f"{SHORTCUTS[key]}: an integer > 0")


def unused_shortcuts(cfg) -> List[str]:
    """The top-level shortcuts set (not null) that no setting of this config reads (no
    ``${key}`` in its unresolved values): e.g. ``rate`` with a trace workload (servegen replays
    its own arrival times). For a warning: a sweep may set one for jobs of several workloads."""
    keys = [k for k in (*SHORTCUTS, "rate", "kv_budget") if cfg.get(k) is not None]
    if not keys:
        return []
    text = repr(OmegaConf.to_container(cfg, resolve=False))
    return [k for k in keys if "${" + k + "}" not in text]


def shortcut_overridden_by(key: str, overrides: Optional[List[str]]) -> Optional[str]:
    """For a shortcut that no setting reads (:func:`unused_shortcuts`), the command-line override of
    a group field of the same name that replaced its ``${key}`` (``system.kv_budget=1GiB`` beside
    ``kv_budget=2GiB``), as given; None when there is none (the shortcut is simply not read here)."""
    from harness.cli import CONFIG_GROUPS

    for o in overrides or ():
        name = o.split("=", 1)[0].lstrip("+~")
        if "=" in o and name.count(".") == 1 and name.split(".")[1] == key and name.split(".")[0] in CONFIG_GROUPS:
            return o.lstrip("+")
    return None


def check_kv_budget(cfg) -> None:
    """``kv_budget`` (bytes of KV cache per device, harness/model_facts.py), when set: a size, and
    at most the device's memory (its default, memory - weights - reserve, always is).
    ``system.cpu_kv_budget`` (the default on a real CPU engine), where a system has one: a size, also
    in a run that does not use it (it was parsed only on a real CPU run, so a typo passed elsewhere)."""
    from harness.model_facts import configured_kv_budget
    from harness.units import size_setting

    if cfg.system.get("cpu_kv_budget") is not None:
        size_setting(cfg.system.cpu_kv_budget, "system.cpu_kv_budget")
    val, hw = cfg.system.get("kv_budget"), cfg.hardware
    size = configured_kv_budget(cfg.system)
    if size is not None and size > hw.memory_bytes:
        raise bad(
            "kv_budget",
            val,
            f"a KV cache size per device of at most the device's memory, "
            f"hardware.memory_bytes={hw.memory_bytes} B ({hw.memory_bytes / 2**30:.2f} GiB "
            f"on {hw.name})",
        )


def check_folder(key: str, value: Any, allowed: str) -> None:
    """Raise ConfigError for an empty (or null) folder setting ``key``: a path built on it lands at the
    file system root (``${results_dir}/runs/...`` = ``/runs/...``) or in the current folder (``hydra.run.dir=``).
    ``allowed``: what to pass instead, for the message."""
    if value is None or not str(value).strip():
        raise bad(key, value, allowed)


def check_results_dir(value: Any) -> None:
    """:func:`check_folder` for ``results_dir`` (its ``runs/``, ``sweeps/`` and ``cache/``)."""
    check_folder(
        "results_dir",
        value,
        "a folder (records, sweeps and caches go under it; "
        "leave results_dir out for $TTC_RESULTS_DIR, else <repo>/results)",
    )


NAME_MAX_BYTES = 100


def check_names(cfg) -> None:
    """``system.name``, ``model.name``, ``hardware.name``, ``workload.name`` and ``verifier.name`` become
    parts of folder names (a run's ``<time>-<system>-<model>``, a sweep job's folder): each must be one
    path segment of printable characters (no NUL, tab or newline), not empty, not ``.`` or ``..``, at most
    :data:`NAME_MAX_BYTES` bytes; ``sweep_name``, when
    set, at most as long (a 300-byte one ended in an OSError traceback). Raises ConfigError."""
    for group in ("system", "model", "hardware", "workload", "verifier"):
        node = cfg.get(group)
        if node is None or "name" not in node:
            continue
        name = node.get("name")
        text = str(name) if name is not None else ""
        if (
            not text
            or text in (".", "..")
            or "/" in text
            or "\\" in text
            or not text.isprintable()  # NUL, a tab or a newline in a folder name breaks every shell listing
            or len(text.encode()) > NAME_MAX_BYTES
        ):
            raise bad(
                f"{group}.name",
                name,
                f"a name of 1-{NAME_MAX_BYTES} bytes of printable characters without '/' or a backslash, not '.' "
                f"or '..' (it names folders)",
            )
    sweep = cfg.get("sweep_name")  # its '/' and '..' are the sweep-folder check's (harness.folders)
    if sweep is not None and len(str(sweep).encode()) > NAME_MAX_BYTES:
        raise bad("sweep_name", sweep, f"a name of at most {NAME_MAX_BYTES} bytes (it names the sweep's folder)")


def validate_common(cfg) -> None:
    """Checks shared by every family. Raises ConfigError."""
    check_results_dir(cfg.get("results_dir", "results"))
    check_names(cfg)
    if cfg.backend.name not in BACKENDS:
        raise bad("backend", cfg.backend.name, f"one of {', '.join(BACKENDS)}")
    if cfg.backend.device not in DEVICES:
        raise bad("backend.device", cfg.backend.device, f"one of {', '.join(DEVICES)}")
    if cfg.model.dtype not in DTYPES:
        raise bad("model.dtype", cfg.model.dtype, f"one of {', '.join(DTYPES)}")
    if cfg.hardware.kind not in ("gpu", "cpu"):
        raise bad("hardware.kind", cfg.hardware.kind, "gpu or cpu")
    check_hardware(cfg.hardware)
    check_model("model", cfg.model)
    if cfg.get("verifier") is not None and cfg.verifier.get("name", "none") != "none":
        check_model("verifier", cfg.verifier)
    check_kv_budget(cfg)
    seed = cfg.get("seed", 0)
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise bad("seed", seed, "an integer >= 0 (repeats use seeds seed..seed+repeats-1)")
    repeats = cfg.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not 1 <= repeats <= MAX_REPEATS:
        raise bad(
            "repeats",
            repeats,
            f"an integer in 1..{MAX_REPEATS} (repeats of the job, seeds seed..seed+repeats-1; every repeat's "
            f"tables stay in memory until the record is written, and 30 give a 95 % interval whose t quantile "
            f"is within 5 % of the normal one)",
        )
    threads = cfg.backend.get("threads", 1)
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
        raise bad("backend.threads", threads, "an integer >= 0 (0 = torch's default thread count)")
    for key in ("progress", "resume", "verbose"):
        if not isinstance(cfg.get(key, False), bool):
            raise bad(key, cfg.get(key), "true or false")
    isolate = cfg.get("isolate", "auto")
    if not (isinstance(isolate, bool) or isolate == "auto"):
        raise bad("isolate", isolate, "auto, true or false")
    tracking = cfg.get("tracking")
    if tracking is not None:
        if tracking.get("sweep_jobs", "auto") not in SWEEP_JOBS:
            raise bad("tracking.sweep_jobs", tracking.sweep_jobs, f"one of {', '.join(SWEEP_JOBS)}")
        if tracking.get("name") not in TRACKING_NAMES:
            raise bad("tracking.name", tracking.get("name"), f"one of {', '.join(TRACKING_NAMES)}")
        if tracking.get("mode") not in TRACKING_MODES:
            raise bad("tracking.mode", tracking.get("mode"), f"one of {', '.join(TRACKING_MODES)}")
