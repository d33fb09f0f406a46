"""FastTTS family runner: ``validate(cfg)``, ``validate_backend(cfg, backend)``, ``run(cfg, ctx)``.

Backends: ``vllm`` = two in-process vLLM engines (measured); ``sim`` = the same search code with
the simulated engines of ``sim.py`` charged from ``cfg.hardware`` (simulated). KV budget M
(bytes, both engines): ``system.kv_budget`` / top-level ``kv_budget``; else, simulated, the
hardware memory x ``memory_fraction`` minus both models' weights and a 5 % activation reserve;
real on CPU, ``system.cpu_kv_budget``. The baseline splits M as the FastTTS artifact's fixed
``gpu_memory_utilization`` pairs where the model pair is one of the paper's, else by
``gen_memory_share``; with M (``system.memory``) the roofline search of ``memory.py`` decides.
Local checkpoints (``weights=/dir``, checked by ``checkpoint.py``) bring real tokenizers; with
real generator weights on vLLM every run is graded for Top-1 / Pass@N (``accuracy.py``).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from harness.errors import ConfigError, bad
from harness.errors import RunOOM
from harness.run import RunResult
from harness.units import parse_size
from systems.tts.beams import step_logit_biases
from systems.tts.checkpoint import DELIMITER, is_local
from systems.tts.config import AGGREGATIONS, PRM_KINDS, SCORE_SOURCES, SEARCHES
from systems.tts.memory import (Allocation, MemoryTooSmall, ModelShape, Roofline, search_allocation)

ROOT = Path(__file__).resolve().parent.parent.parent
ACTIVATION_RESERVE = 0.05
# FastTTS AE fixed gpu_memory_utilization (generator, verifier) per pair: baseline / FastTTS (§4.4)
AE_SPLITS = {("qwen2.5-math-1.5b", "skywork-prm-1.5b"): (0.20, 0.20),
             ("qwen2.5-math-1.5b", "math-shepherd-7b"): (0.19, 0.71),
             ("qwen2.5-math-7b", "skywork-prm-1.5b"): (0.68, 0.22)}


def _real_cpu(cfg, backend=None) -> bool:
    if backend is not None:
        return not backend.simulated and backend.device == "cpu"
    return cfg.backend.name == "vllm" and cfg.backend.device != "cuda"


def step_model(cfg, real_cpu: bool):
    """(step_tokens_mean, max_step_tokens) in force: the CPU values on a real CPU engine with random
    generator weights (real weights decide their own step lengths, capped at ``max_step_tokens``)."""
    w = cfg.workload
    if real_cpu and not is_local(cfg.model.weights):
        return float(w.cpu_step_tokens_mean), int(w.cpu_max_step_tokens)
    return float(w.step_tokens_mean), int(w.max_step_tokens)


def _shapes(cfg):
    return ModelShape.of(cfg.model), ModelShape.of(cfg.verifier)


def _roofline(cfg, real_cpu: bool) -> Roofline:
    if real_cpu:      # the roofline of the machine actually running (placeholder numbers in cpu.yaml)
        return Roofline.of(OmegaConf.load(ROOT / "conf" / "hardware" / "cpu.yaml"))
    return Roofline.of(cfg.hardware)


def kv_budget(cfg, real_cpu: bool) -> int:
    """Total KV bytes M for both engines (see module docstring). Raises ConfigError if <= 0."""
    s = cfg.system
    try:
        if s.kv_budget not in (None, "None"):
            m = parse_size(s.kv_budget, "kv_budget")
        elif real_cpu:
            m = parse_size(s.cpu_kv_budget, "system.cpu_kv_budget")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if s.kv_budget in (None, "None") and not real_cpu:
        gen, ver = _shapes(cfg)
        usable = float(cfg.hardware.memory_bytes) * float(s.memory_fraction) * (1 - ACTIVATION_RESERVE)
        m = int(usable - gen.weight_bytes - ver.weight_bytes)
    if m <= 0 and s.kv_budget in (None, "None") and not real_cpu:     # the models do not fit: recorded oom
        raise RunOOM(f"memory_fraction={s.memory_fraction} of {cfg.hardware.name} leaves {m / 2**30:.2f} GiB "
                     f"for KV after the weights of {cfg.model.name} + {cfg.verifier.name}")
    if m <= 0:
        raise ConfigError(f"KV memory too small: kv_budget={m} bytes")
    return int(m)


def one_sequence_kv(cfg, shape: ModelShape) -> int:
    """KV bytes of one ``max_model_len`` sequence plus two blocks (vLLM's start-up check)."""
    return int(shape.kv_bytes_per_token * (cfg.workload.max_model_len + 2 * cfg.system.block_size))


def plan_memory(cfg, real_cpu: bool, n: int, s_ver: float, s_ctx: float, s_dec: float) -> Allocation:
    """KV bytes and batch caps of both engines for the current state.

    Baseline: fixed split, vLLM's default ``max_num_seqs``. M: roofline search (§4.3).
    Raises ConfigError when the KV memory cannot hold one sequence per engine."""
    s = cfg.system
    gen, ver = _shapes(cfg)
    M = kv_budget(cfg, real_cpu)
    if s.memory:
        try:
            a = search_allocation(gen, ver, _roofline(cfg, real_cpu), M, n, s_ver, s_ctx, s_dec,
                                  offload=bool(s.offload) and not real_cpu,
                                  offload_bw=float(cfg.hardware.h2d_bw))
        except MemoryTooSmall as e:
            raise ConfigError(f"KV memory too small for the chosen batch: {e}") from None
        # an engine must hold one max_model_len sequence (vLLM refuses to start otherwise): the
        # engine short of it takes it from the other one's share
        floor_v = one_sequence_kv(cfg, ver)
        floor_g = one_sequence_kv(cfg, gen)
        if not a.offload and a.ver_kv_bytes < floor_v:
            a = Allocation(a.b_pre, a.b_dec, a.gen_kv_bytes - (floor_v - a.ver_kv_bytes), floor_v, a.t_tot_s)
        if not a.offload and a.gen_kv_bytes < floor_g:
            a = Allocation(a.b_pre, a.b_dec, floor_g, a.ver_kv_bytes - (floor_g - a.gen_kv_bytes), a.t_tot_s)
        return a
    pair = AE_SPLITS.get((cfg.model.name, cfg.verifier.name))
    if pair and s.kv_budget in (None, "None") and not real_cpu:
        mem = float(cfg.hardware.memory_bytes) * (1 - ACTIVATION_RESERVE)
        g = int(pair[0] * mem - gen.weight_bytes)
        v = int(pair[1] * mem - ver.weight_bytes)
    else:
        g = int(M * float(s.gen_memory_share))
        v = M - g
    return Allocation(int(s.max_num_seqs), int(s.max_num_seqs), g, v, float("nan"))


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
    if w.agg_strategy not in AGGREGATIONS:
        raise bad("workload.agg_strategy", w.agg_strategy, f"one of {', '.join(AGGREGATIONS)}")
    if s.score_source not in SCORE_SOURCES:
        raise bad("system.score_source", s.score_source, f"one of {', '.join(SCORE_SOURCES)}")
    if w.beam_width < 1 or w.n < 1 or w.n % w.beam_width:
        raise bad("n", w.n, f"a positive multiple of the beam width ({w.beam_width})")
    if w.num_iterations < 1:
        raise bad("workload.num_iterations", w.num_iterations, ">= 1")
    if w.num_problems is not None and w.num_problems < 1:
        raise bad("workload.num_problems", w.num_problems, ">= 1 or null (all)")
    if not 0.0 <= s.spec_truncation_ratio <= 1.0:
        raise bad("system.spec_truncation_ratio", s.spec_truncation_ratio, "in [0, 1]")
    if v.name == "none" or not v.vocab_size:
        raise bad("verifier", v.name, "a process reward model (skywork-prm-1.5b, math-shepherd-7b, tiny-prm)")
    if v.prm_kind not in PRM_KINDS:
        raise bad("verifier.prm_kind", v.prm_kind, f"one of {', '.join(PRM_KINDS)}")
    if v.prm_kind == "head" and v.step_tag != DELIMITER:
        raise bad("verifier.step_tag", v.step_tag, 'the "\\n\\n" step delimiter for prm_kind=head (Skywork-style '
                  'PRMs score each step at its "\\n\\n"); another tag needs prm_kind=lm')
    # local checkpoints: directory, config.json, weights, tokenizer, architecture, step tag
    from systems.tts import checkpoint
    if is_local(m.weights):
        checkpoint.inspect("model", m, "generator")
    if is_local(v.weights):
        checkpoint.inspect("verifier", v, "verifier", real_engine=cfg.backend.name != "sim")
    checkpoint.check_tokenizers(cfg)
    # token spaces and the step tag (FastTTS §1.3); a local tokenizer defines its own ids
    if not is_local(m.weights) and (not 0 <= w.step_delimiter_id < m.vocab_size or not 0 <= w.eos_token_id < m.vocab_size):
        raise ConfigError(f"workload.step_delimiter_id={w.step_delimiter_id} / eos_token_id={w.eos_token_id} "
                          f"are not allowed: both must be ids of the generator's vocabulary [0, {m.vocab_size})")
    if not is_local(v.weights) and (v.step_tag_id is None or not 0 <= v.step_tag_id < v.vocab_size):
        raise ConfigError(f"verifier.step_tag_id={v.step_tag_id} is not allowed: the verifier {v.name} needs a "
                          f"step tag inside its vocabulary [0, {v.vocab_size})")
    both_random = not is_local(m.weights) and not is_local(v.weights)
    if both_random and tokenizer_family(m) != tokenizer_family(v) and v.step_tag_id == w.step_delimiter_id:
        raise ConfigError(f"verifier.step_tag_id={v.step_tag_id} is not allowed: generator {m.name} (tokenizer "
                          f"{tokenizer_family(m)}) and verifier {v.name} (tokenizer {tokenizer_family(v)}) have "
                          f"different token spaces, so the generator's step delimiter {w.step_delimiter_id} cannot serve as the "
                          f"verifier's step tag; give the verifier its own tag (inserted at each step)")
    if both_random and tokenizer_family(m) == tokenizer_family(v) and v.step_tag_id == w.eos_token_id:
        raise ConfigError(f"verifier.step_tag_id={v.step_tag_id} is not allowed: it is the generator's end token")
    # the data set: unknown file or malformed line -> ConfigError naming the line
    from workloads.math import load_problems
    load_problems(_data_path(w.path), w.num_problems)
    if cfg.backend.name == "vllm" and v.prm_kind == "lm" and not is_local(v.weights):
        raise ConfigError(f"verifier.weights=random is not allowed for verifier={v.name!r} with backend=vllm: a "
                          f"prm_kind=lm verifier reads its tokenizer's good/bad tokens; allowed: verifier.weights=/dir "
                          f"(a local *ForCausalLM checkpoint with its tokenizer), or backend=sim")
    if cfg.backend.name == "vllm" and v.prm_kind == "head" and v.hf_model_type != "qwen2":
        raise ConfigError(f"verifier={v.name!r} is not allowed with backend=vllm: the real path runs Qwen2 PRMs "
                          f"(Qwen2ForProcessRewardModel) and prm_kind=lm causal LMs; use backend=sim for it")
    try:
        _check_memory(cfg, _real_cpu(cfg))
    except RunOOM:
        pass            # weights alone exceed the simulated device: run() records status oom


def _data_path(p: str) -> Path:
    path = Path(os.path.expanduser(str(p)))
    return path if path.is_absolute() else ROOT / path


def _check_memory(cfg, real_cpu: bool) -> Allocation:
    w = cfg.workload
    gen, ver = _shapes(cfg)
    mean, cap = step_model(cfg, real_cpu)
    s_ctx = min(w.max_model_len, 400 + mean * w.num_iterations / 2 + mean)
    alloc = plan_memory(cfg, real_cpu, int(w.n), s_ctx - mean, s_ctx, mean)
    one_gen, one_ver = one_sequence_kv(cfg, gen), one_sequence_kv(cfg, ver)
    if alloc.gen_kv_bytes < one_gen or alloc.ver_kv_bytes < one_ver:
        raise ConfigError(f"KV memory too small for the chosen batch: generator {alloc.gen_kv_bytes / 2**20:.1f} MiB "
                          f"(needs >= {one_gen / 2**20:.1f} MiB for one {w.max_model_len}-token sequence), verifier "
                          f"{alloc.ver_kv_bytes / 2**20:.1f} MiB (needs >= {one_ver / 2**20:.1f} MiB); raise kv_budget "
                          f"or lower workload.max_model_len")
    return alloc


def validate_backend(cfg, backend) -> None:
    if backend.name == "vllm":
        _check_memory(cfg, _real_cpu(cfg, backend))


def settings(cfg, real_cpu: bool, score_source: str, space=None):
    """Search settings; ``space`` (a local generator's :class:`TokenSpace`) supplies the step
    delimiter and end ids instead of ``workload.step_delimiter_id`` / ``eos_token_id``."""
    from systems.tts.search import SearchSettings
    w, s = cfg.workload, cfg.system
    _, cap = step_model(cfg, real_cpu)
    delims = space.delimiters if space else (int(w.step_delimiter_id),)
    ends = space.ends if space else (int(w.eos_token_id),)
    return SearchSettings(search=s.search, n=int(w.n), beam_width=int(w.beam_width),
                          num_iterations=int(w.num_iterations), max_step_tokens=cap,
                          max_model_len=int(w.max_model_len), agg=w.agg_strategy, seed=int(cfg.seed),
                          speculative=bool(s.speculative), prefix_aware=bool(s.prefix_aware),
                          r_mean=float(s.spec_truncation_ratio), r_std=float(s.spec_truncation_std),
                          spec_max_beams=int(s.spec_max_beams), lookahead=bool(s.lookahead_verification),
                          vg_short_iterations=int(s.vg_short_iterations), vg_short_tokens=int(s.vg_short_tokens),
                          score_source=score_source, delimiter_id=delims[0], eos_id=ends[0],
                          delimiter_ids=tuple(delims), eos_ids=tuple(ends))


def build(cfg, backend, workdir: Path):
    """(search settings, problems, prompts, generator, verifier, before_iteration hook, allocation, closer).

    Local checkpoints: prompts come from the generator's tokenizer (chat template), steps end at its
    "\n\n" tokens (on vLLM: no logit bias, real weights), and, with a local verifier too, the PRM
    reads the decoded steps re-encoded by its own tokenizer with its "\n\n" step tag
    (``VerifierText``; Math-Shepherd, ``prm_kind=lm``: its " ки" tag after every step,
    ``ShepherdText``). Otherwise ids are folded between token spaces (``TokenMap``). Simulated
    runs use the tokenizers for prompt lengths and ids only."""
    from systems.tts import checkpoint
    from systems.tts.engines import PrmScorer, TokenMap
    from workloads.math import load_problems, prompt_tokens, stand_in_tokens
    w, s, m, v = cfg.workload, cfg.system, cfg.model, cfg.verifier
    real_cpu = _real_cpu(cfg, backend)
    problems = load_problems(_data_path(w.path), w.num_problems)
    space = checkpoint.token_space(str(m.weights)) if is_local(m.weights) else None
    vtok = checkpoint.load_tokenizer(str(v.weights)) if is_local(v.weights) else None
    prompts = {p.index: prompt_tokens(p, m.vocab_size, space.tok if space else None) for p in problems}
    if space and vtok is not None:
        tmap = (checkpoint.ShepherdText(space, str(v.weights), v.step_tag, v.step_tag_id) if v.prm_kind == "lm"
                else checkpoint.VerifierText(space, str(v.weights)))
        vprompts = {p.index: tmap.prompt(p.text) for p in problems}
    else:
        tag = checkpoint.step_tag_id(vtok) if vtok is not None and v.prm_kind == "head" else v.step_tag_id
        tmap = TokenMap(tokenizer_family(m), tokenizer_family(v), v.vocab_size, w.step_delimiter_id, tag)
        vprompts = {p.index: (checkpoint.verifier_prompt(vtok, p.text) if vtok is not None
                              else stand_in_tokens(p.text + "\n", v.vocab_size)) for p in problems}
    mean, cap = step_model(cfg, real_cpu)
    bias_d, bias_e = step_logit_biases(m.vocab_size, float(w.temperature), mean, float(w.steps_per_answer_mean))
    src = s.score_source
    if src == "auto":
        src = "prm" if (is_local(v.weights) and not backend.simulated) else "synthetic"
    st = settings(cfg, real_cpu, src, None if backend.simulated else space)   # sim: its own step ids
    gen_shape, ver_shape = _shapes(cfg)
    avg_prompt = sum(len(x) for x in prompts.values()) / len(prompts)
    s_ctx0 = min(w.max_model_len, avg_prompt + mean * (w.num_iterations / 2 + 1))
    alloc = plan_memory(cfg, real_cpu, st.n, s_ctx0 - mean, s_ctx0, mean)
    hook = None
    if backend.simulated:
        from systems.tts.sim import SimGenerator, SimVerifier, StepModel
        hw = Roofline.of(cfg.hardware)
        p_d = 1.0 / mean
        p_e = 1.0 / (mean * float(w.steps_per_answer_mean))
        gen = SimGenerator(gen_shape, hw, StepModel(p_d, p_e, st.delimiter_id, st.eos_id, m.vocab_size),
                           kv_bytes=alloc.gen_kv_bytes, max_num_seqs=alloc.b_dec)
        ver = SimVerifier(ver_shape, hw, kv_bytes=alloc.ver_kv_bytes, max_num_seqs=alloc.b_pre,
                          tag_inserted=tmap.insert, prompts=vprompts)
        if s.memory:        # re-plan whenever the state changes (each iteration), §4.3
            def hook(it, active, prompt_len):
                ctx = prompt_len + sum(len(b.tokens) for b in active) / max(1, len(active))
                a = plan_memory(cfg, False, len(active), ctx, min(w.max_model_len, ctx + mean), mean)
                bw = float(cfg.hardware.h2d_bw) if a.offload else None
                gen.configure(a.gen_kv_bytes, a.b_dec, bw)
                ver.configure(a.ver_kv_bytes, a.b_pre, bw)
                hook.last = a
        closer = lambda: None
    else:
        from systems.tts.engines import VllmGenerator, VllmVerifier
        gen = VllmGenerator(m, workdir, max_model_len=int(w.max_model_len), kv_bytes=alloc.gen_kv_bytes,
                            max_num_seqs=alloc.b_dec, block_size=int(s.block_size), seed=int(cfg.seed),
                            delimiter_ids=st.delimiter_ids, eos_ids=st.eos_ids,
                            logit_bias=None if space else {st.delimiter_id: bias_d, st.eos_id: bias_e},
                            temperature=float(w.temperature), top_p=float(w.top_p))
        vv = VllmVerifier(v, workdir, max_model_len=int(w.max_model_len), kv_bytes=alloc.ver_kv_bytes,
                          max_num_seqs=alloc.b_pre, block_size=int(s.block_size), seed=int(cfg.seed))
        ver = PrmScorer(vv, tmap, vprompts)

        def closer():
            gen.shutdown()
            vv.shutdown()
    return st, problems, prompts, gen, ver, hook, alloc, closer


def grade(cfg, backend, problems, results, n: int):
    """Top-1 / Pass@N (``systems.tts.accuracy``) of every problem's completed paths.

    Returns (summary fields, per-problem table or None). Graded only with local generator weights on
    a real engine; otherwise the accuracy fields are None and ``accuracy_note`` says why."""
    import pandas as pd
    from systems.tts import accuracy, checkpoint
    none = dict(top1_acc=None, top1_naive_acc=None, pass_at_n=None)
    if backend.simulated:
        return dict(none, accuracy_note="not graded: simulated backend (no text is generated)"), None
    if not is_local(cfg.model.weights):
        return dict(none, accuracy_note="not graded: random generator weights (model.weights=random), "
                                        "so the paths have no text to grade"), None
    space = checkpoint.token_space(str(cfg.model.weights))
    by_index = {p.index: p for p in problems}
    rows = []
    for r in results:
        prob = by_index[r.problem]
        g = accuracy.grade_problem([space.decode(b.tokens) for b in r.completions],
                                   [b.scores for b in r.completions], prob.answer, n)
        rows.append({"problem": r.problem, "reference": prob.answer, "top1_answer": g.top1_answer,
                     "top1_correct": g.top1_correct, "top1_naive_correct": g.top1_naive_correct,
                     "pass_at_n": g.pass_at_n, "paths": g.paths, "answered": g.answered, "correct": g.correct})
    mean = lambda k: accuracy.mean_or_none([row[k] for row in rows])
    return dict(top1_acc=mean("top1_correct"), top1_naive_acc=mean("top1_naive_correct"),
                pass_at_n=mean("pass_at_n"), accuracy_note=None), pd.DataFrame(rows)


def run(cfg, ctx) -> RunResult:
    from systems.tts import metrics
    from systems.tts.search import Search
    workdir = Path(tempfile.mkdtemp(prefix="tts_models_"))
    st, problems, prompts, gen, ver, hook, alloc, closer = build(cfg, ctx.backend, workdir)
    results = []
    try:
        bar = ctx.progress(len(problems) * (1 if st.search == "best_of_n" else st.num_iterations),
                           f"{cfg.system.name} n={st.n}")
        search = Search(st, gen, ver, on_iteration=lambda rec: bar.update(1), before_iteration=hook)
        for p in problems:
            r = search.run_problem(p.index, prompts[p.index])
            bar.update(st.num_iterations - len(r.iterations) if st.search != "best_of_n" else 0)
            results.append(r)
        bar.close()
    finally:
        closer()
    summ = metrics.summarize(results)
    acc, acc_table = grade(cfg, ctx.backend, problems, results, st.n)
    summ.update(acc)
    real_cpu = _real_cpu(cfg, ctx.backend)
    mean, cap = step_model(cfg, real_cpu)
    summ.update(n=st.n, step_tokens_mean_model=mean, max_step_tokens=cap, score_source=st.score_source,
                kv_budget_bytes=kv_budget(cfg, real_cpu), gen_kv_bytes=alloc.gen_kv_bytes,
                ver_kv_bytes=alloc.ver_kv_bytes, b_dec=alloc.b_dec, b_pre=alloc.b_pre,
                offload=bool(alloc.offload), simulated=bool(ctx.backend.simulated))
    f2, pct = (lambda x: f"{x:.2f}"), (lambda x: f"{100 * x:.1f} %")
    display = [("goodput (tok/s)", "goodput_tok_s", f2), ("completion latency (s/problem)", "latency_s", f2),
               ("  generator (s)", "gen_latency_s", f2), ("  verifier (s)", "ver_latency_s", f2),
               ("mean completion time (s)", "completion_time_s", f2),
               ("completion length (tokens)", "completion_tokens", lambda x: f"{x:.1f}"),
               ("mean step (tokens)", "mean_step_tokens", lambda x: f"{x:.1f}"),
               ("generator prefix-cache hit rate", "gen_prefix_hit_rate", pct),
               ("verifier prefix-cache hit rate", "ver_prefix_hit_rate", pct),
               ("speculative tokens generated / kept", "spec_tokens_generated", str),
               ("  kept", "spec_tokens_kept", str),
               ("steps from speculation (no generator call)", "gen_skipped", str),
               ("decode batch B_dec / prefill batch B_pre", "b_dec", str), ("  B_pre", "b_pre", str),
               ("Top-1 accuracy (PRM-weighted vote)", "top1_acc", pct), (f"Pass@N (N={st.n})", "pass_at_n", pct),
               ("problems", "problems", str)]
    tables = metrics.tables(results)
    if acc_table is not None:
        tables["accuracy"] = acc_table
    return RunResult(status="ok", summary=summ, display=display, tables=tables)
