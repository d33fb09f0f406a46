"""FastTTS as its artifact ran it (issue 38, items 1, 4, 5; ``systems/verifier_search/artifact.py``): the
verifier's prefix cache off for ALL / STEP pooling PRMs (vLLM 0.9.2), the verifier inputs truncated
as the artifact's, a path's completion time stamped before its completing iteration's verifier call.
Each test's docstring names the mutation it catches."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.backend import Backend
from systems.verifier_search import artifact, runner
from systems.verifier_search.protocol import GenOutput, GenResult, VerifierOutput
from systems.verifier_search.search import Search, SearchSettings
from systems.verifier_search.vllm_engine import TokenMap

SIM = Backend("sim", "cpu", True, "test")


def _sim_search(compose_cfg, *extra, system="vllm_tts", n=16):
    cfg = compose_cfg(f"system={system}", "backend=sim", f"n={n}", "workload.num_problems=2", *extra)
    runner.validate(cfg)
    st, problems, prompts, gen, ver, hook, alloc, *_ = runner.build(cfg, SIM, None)
    recs = []
    s = Search(st, gen, ver, on_iteration=recs.append, before_iteration=hook)
    results = [s.run_problem(p.index, prompts[p.index]) for p in problems]
    return recs, results, ver


# ------------------------------------------------------------------ item 1: the verifier's prefix cache
def test_auto_follows_vllm_092_pooling_rule():
    """auto = off for ALL (Skywork) and STEP (Math-Shepherd) pooling, on for LAST; true/false force it.
    Mutation caught: auto returning True (vLLM 0.32's behaviour, ours before issue 38)."""
    sky, shep = SimpleNamespace(prm_kind="head"), SimpleNamespace(prm_kind="lm")
    assert artifact.pooling_type(sky) == "ALL" and artifact.pooling_type(shep) == "STEP"
    assert not artifact.verifier_prefix_cache("auto", sky) and not artifact.verifier_prefix_cache("auto", shep)
    assert artifact.verifier_prefix_cache(True, sky) and artifact.verifier_prefix_cache("true", shep)
    assert not artifact.verifier_prefix_cache(False, sky)
    with pytest.raises(ValueError):
        artifact.verifier_prefix_cache("sometimes", sky)


@pytest.mark.parametrize("verifier", ["skywork-prm-1.5b", "math-shepherd-7b"])
def test_simulated_verifier_reprefills_every_paths_whole_text_without_cache(compose_cfg, verifier):
    """With the cache off (auto for both PRMs) every verification prefills each path's whole input:
    no verifier token of any iteration is cached, the prompt tokens are those of the whole inputs,
    and the verifier takes longer than with system.verifier_prefix_cache=true, whose cached share
    is the hit rate. Mutations caught: SimVerifier ignoring ``prefix_cache`` (hashing and hitting as
    before); the runner not passing the setting to the simulated verifier."""
    model = ["model=qwen2.5-math-1.5b", f"verifier={verifier}", "workload.num_iterations=4"]
    off, res_off, ver = _sim_search(compose_cfg, *model)
    on, res_on, _ = _sim_search(compose_cfg, *model, "system.verifier_prefix_cache=true")
    assert all(r.ver_cached_tokens == 0 for r in off) and sum(r.ver_prompt_tokens for r in off) > 0
    assert sum(r.ver_cached_tokens for r in on) > 0.3 * sum(r.ver_prompt_tokens for r in on)
    # same search (same paths and scores): the same whole inputs, only their cached share differs
    assert [r.ver_prompt_tokens for r in off] == [r.ver_prompt_tokens for r in on]
    assert sum(r.ver_time_s for r in off) > 1.2 * sum(r.ver_time_s for r in on)
    # the whole text of iteration 1's items (every active path re-sent from its prompt)
    prompts = ver.prompts
    r1 = [r for r in off if r.problem == off[0].problem and r.iteration == 1][0]
    assert r1.ver_requests == 16 and r1.ver_prompt_tokens > 16 * len(prompts[r1.problem])


@pytest.mark.vllm
@pytest.mark.parametrize("setting,expected", [("auto", False), ("true", True)])
def test_vllm_verifier_engine_built_with_the_rules_prefix_caching(
    compose_cfg, monkeypatch, tmp_path, setting, expected
):
    """The real verifier engine's EngineArgs (captured, no engine started): enable_prefix_caching
    and enable_chunked_prefill False for a Skywork-style PRM under auto (vLLM 0.9.2 turns both off),
    its step budget then at least max_model_len; both True when forced. Mutations caught: ``_engine``
    keeping ``enable_prefix_caching=True``; the runner not passing the setting to VllmVerifier; the
    verifier keeping ``enable_chunked_prefill=True``."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    pytest.importorskip("vllm")
    from vllm.v1.engine.llm_engine import LLMEngine

    from systems.verifier_search import vllm_engine

    seen = []

    class Fake:
        engine_core = SimpleNamespace(engine_core=SimpleNamespace(scheduler=SimpleNamespace(waiting=[])))

    monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(lambda cls, args, **kw: seen.append(args) or Fake()))
    monkeypatch.setattr(vllm_engine.VllmGenerator, "shutdown", lambda self: None)
    cfg = compose_cfg(
        "system=vllm_tts",
        "backend=vllm",
        "model=tiny-qwen2",
        "verifier=tiny-prm",
        "n=8",
        "workload.num_problems=1",
        f"system.verifier_prefix_cache={setting}",
    )
    runner.build(cfg, Backend("vllm", "cpu", False, "test"), Path(tmp_path))
    gen_args, ver_args = seen
    assert gen_args.enable_prefix_caching is True
    assert ver_args.enable_prefix_caching is expected
    assert ver_args.enable_chunked_prefill is expected
    assert ver_args.max_num_batched_tokens >= (1 if expected else cfg.workload.max_model_len)


# ------------------------------------------------------------------ item 5: the verifier's inputs
def _long_path(prompt_len=10, steps=50, step=100):
    prompt = list(range(1000, 1000 + prompt_len))
    tokens, ends = [], []
    for k in range(steps):
        tokens += [2000 + k] * (step - 1) + [271]
        ends.append(len(tokens))
    return prompt, tokens, ends


def test_truncation_lengths_on_a_constructed_long_path():
    """A 10-token prompt + 5000 path tokens (50 steps of 100): Skywork's input keeps the prompt and
    the response's last 3072 - 10 - 1 tokens (steps cut away: no position), Math-Shepherd's its
    first 4096 tokens (the later steps' tags cut away). Mutations caught: truncating the response on
    the right, keeping ``limit - |prompt|`` tokens (no -1), positions not shifted by the cut."""
    prompt, tokens, ends = _long_path()
    tm = TokenMap("qwen2", "qwen2", 151936, 271, 271)
    ids, pos = artifact.TruncatedInput(tm, "response_left", 3072).build(prompt, tokens, ends)
    assert len(ids) == 3071 and ids[:10] == prompt and ids[10:] == tokens[-3061:]
    kept = [p for p in pos if p != artifact.CUT]
    assert len(kept) == 31 and all(ids[p] == 271 for p in kept) and kept[-1] == len(ids) - 1
    assert pos[:19] == [artifact.CUT] * 19  # step 19 keeps its last 61 tokens, its tag
    ids, pos = artifact.TruncatedInput(tm, "right", 4096).build(prompt, tokens, ends)
    assert len(ids) == 4096 and ids == (prompt + tokens)[:4096]
    assert pos[:40] == [10 + e - 1 for e in ends[:40]] and pos[40:] == [artifact.CUT] * 10
    ids, pos = artifact.TruncatedInput(tm, "none", 4096).build(prompt, tokens, ends)
    assert len(ids) == 5010


def test_runner_builds_the_artifacts_inputs_per_verifier(compose_cfg):
    """Skywork: truncation response_left at 3072; Math-Shepherd: right at 4096 and its prompt the
    system prompt + "\\n" + question + "\\n"; ``verifier.input_truncation=none`` / ``system_prompt=false``
    give the plain inputs. Mutations caught: the runner not wrapping the token map; the system
    prompt left out of Math-Shepherd's prompt."""
    from workloads.math import SYSTEM_PROMPT, stand_in_tokens

    def texts(*o):
        return runner.texts(compose_cfg("system=vllm_tts", "backend=sim", "workload.num_problems=1", *o))

    sky = texts("verifier=skywork-prm-1.5b")
    assert (sky.tmap.mode, sky.tmap.limit) == ("response_left", 3072)
    assert not hasattr(texts("verifier=skywork-prm-1.5b", "verifier.input_truncation=none").tmap, "mode")
    shep = texts("verifier=math-shepherd-7b")
    assert (shep.tmap.mode, shep.tmap.limit) == ("right", 4096)
    p = shep.problems[0]
    assert shep.vprompts[p.index] == stand_in_tokens(SYSTEM_PROMPT + "\n" + p.text + "\n", 32000)
    bare = texts("verifier=math-shepherd-7b", "verifier.system_prompt=false")
    assert bare.vprompts[p.index] == stand_in_tokens(p.text + "\n", 32000)


def test_simulated_search_sends_truncated_inputs_and_keeps_the_artifacts_scores(compose_cfg):
    """A Skywork input limit 150 tokens above the longest prompt: every verifier request is at most
    limit - 1 tokens, and the search still completes, each path with the scores of the steps not
    cut away before they were scored. Mutation caught: the simulated verifier building untruncated
    inputs."""
    cfg = compose_cfg("system=vllm_tts", "backend=sim", "workload.num_problems=2")
    limit = max(map(len, runner.texts(cfg).vprompts.values())) + 150
    recs, results, ver = _sim_search(compose_cfg, f"verifier.input_limit={limit}", "workload.num_iterations=4", n=8)
    for r in recs:
        assert r.ver_prompt_tokens <= (limit - 1) * r.ver_requests
    assert sum(r.ver_requests for r in recs) > 8
    for r in results:
        for b in r.completions:
            assert b.scores and all(s == s for s in b.scores) and len(b.scores) <= len(b.step_ends)


class _Gen:
    """Every request ends its one step at the end token (the path completes in iteration 0), or with
    ``delimiter`` at the step delimiter; 1 s."""

    def __init__(self, delimiter=False):
        self.out = ([5, 271], "delimiter") if delimiter else ([5, 7], "eos")

    def extend(self, requests, policy):
        toks, fin = self.out
        return GenResult({r.uid: GenOutput(list(toks), fin, 2, 0, len(r.prompt_ids)) for r in requests}, 1.0)


class _CutVer:
    """Every step's position cut away (Math-Shepherd's right truncation past a step's tag)."""

    def verify(self, problem, items, paths=None):
        return VerifierOutput([[artifact.CUT_SCORE] * len(ends) for _, ends in items], 1.0)


def test_a_step_cut_away_gets_no_score_as_in_the_artifact():
    """A step whose score position the truncation cut away has no score (the artifact's shorter
    list; ``agg_strategy=last`` reads the last there is, none here: 0). Mutation caught: the cut
    step's NaN kept among the path's scores."""
    st = SearchSettings(n=4, beam_width=2, num_iterations=2)
    res = Search(st, _Gen(delimiter=True), _CutVer()).run_problem(0, [1, 2, 3])
    assert len(res.completions) >= 4 and all(b.scores == [] for b in res.completions)


# ------------------------------------------------------------------ item 4: the completion stamp
class _Ver:
    """Scores every step 0.5; 10 s per call."""

    def verify(self, problem, items, paths=None):
        return VerifierOutput([[0.5] * len(ends) for _, ends in items], 10.0)


@pytest.mark.parametrize("stamp,expected", [("before_verifier", 1.0), ("after_verifier", 11.0)])
def test_completion_time_is_stamped_before_the_verifiers_call(stamp, expected):
    """A scripted search (generator 1 s, verifier 10 s; every path ends in iteration 0): the
    artifact's stamp is 1 s, the generator's time only; ``after_verifier`` adds the call's 10 s.
    Mutation caught: the stamp taken after the verifier call (ours before issue 38)."""
    st = SearchSettings(n=4, beam_width=2, num_iterations=3, completion_stamp=stamp)
    res = Search(st, _Gen(), _Ver()).run_problem(0, [1, 2, 3])
    assert len(res.completions) == 4 and res.latency_s == 11.0
    assert [b.completion_time_s for b in res.completions] == [expected] * 4


def test_completion_stamp_setting_reaches_the_search(compose_cfg):
    """``system.completion_stamp`` is the search's. Mutation caught: runner.settings dropping it."""
    cfg = compose_cfg("system=vllm_tts", "backend=sim", "system.completion_stamp=after_verifier")
    assert runner.settings(cfg, False, "synthetic").completion_stamp == "after_verifier"
    assert runner.settings(compose_cfg("system=vllm_tts"), False, "synthetic").completion_stamp == "before_verifier"
