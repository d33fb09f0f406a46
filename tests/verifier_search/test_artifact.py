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
from systems.verifier_search.search import Search

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
    False for a Skywork-style PRM under auto, True when forced. Mutations caught: ``_engine`` keeping
    ``enable_prefix_caching=True``; the runner not passing the setting to VllmVerifier."""
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
