"""Bad inputs give a clear ConfigError before any work; the math workloads read the shared data."""
import pytest

from harness.errors import ConfigError
from harness.run import validate
from workloads.math import load_problems, stand_in_tokens

REAL = ["system=vllm_tts", "backend=vllm", "model=tiny-qwen2", "verifier=tiny-prm", "workload=aime24"]


@pytest.mark.parametrize("name,count", [("aime24", 30), ("amc23", 40), ("math500", 500)])
def test_problem_sets_load(shared_data, name, count):
    probs = load_problems(shared_data / "math" / name / "test.jsonl")
    assert len(probs) == count
    assert all(p.text and p.answer for p in probs)


def test_default_config_reads_shared_data(compose_cfg, shared_data):
    cfg = compose_cfg("system=fasttts")
    assert cfg.workload.name == "aime24" and cfg.model.name == "qwen2.5-math-1.5b"
    assert cfg.verifier.name == "skywork-prm-1.5b" and cfg.workload.n == 64
    validate(cfg)        # the file resolves through TTC_DATA_DIR's default


def test_n_not_multiple_of_beam_width(compose_cfg):
    with pytest.raises(ConfigError, match=r"n=10 .*multiple of the beam width \(4\)"):
        validate(compose_cfg("system=fasttts", "n=10"))


def test_unknown_dataset_file(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match="no such dataset file"):
        validate(compose_cfg("system=fasttts", f"workload.path={tmp_path}/missing.jsonl"))


def test_malformed_jsonl_names_the_line(compose_cfg, tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": "4"}\n{"problem": oops}\n')
    with pytest.raises(ConfigError, match="line 3 is not valid JSON"):
        validate(compose_cfg("system=fasttts", f"workload.path={p}"))
    p.write_text('{"problem": "1+1?", "answer": "2"}\n{"question_text": "x"}\n')
    with pytest.raises(ConfigError, match="line 2 lacks"):
        load_problems(p)


def test_step_tag_outside_verifier_vocab(compose_cfg):
    with pytest.raises(ConfigError, match=r"verifier.step_tag_id=200000 .*\[0, 151936\)"):
        validate(compose_cfg(*REAL, "n=8", "verifier.step_tag_id=200000"))


def test_token_spaces_not_matching_step_tag(compose_cfg):
    # math-shepherd (Mistral tokenizer) told to use the Qwen generator's delimiter id as its tag
    with pytest.raises(ConfigError, match="different token spaces"):
        validate(compose_cfg("system=fasttts", "verifier=math-shepherd-7b", "verifier.step_tag_id=271"))
    # its own inserted tag is fine
    validate(compose_cfg("system=fasttts", "verifier=math-shepherd-7b", "backend=sim"))


def test_kv_memory_too_small(compose_cfg):
    with pytest.raises(ConfigError, match="KV memory too small"):
        validate(compose_cfg(*REAL, "n=8", "kv_budget=4MiB"))
    with pytest.raises(ConfigError, match="KV memory too small"):
        validate(compose_cfg("system=fasttts", "kv_budget=100MiB"))          # M on, paper scale


def test_real_backend_rejects_non_qwen2_prm(compose_cfg):
    with pytest.raises(ConfigError, match="backend=sim"):
        validate(compose_cfg("system=fasttts", "backend=vllm", "verifier=math-shepherd-7b"))


def test_stand_in_tokens_deterministic_and_in_range():
    a = stand_in_tokens("Find $x$ such that 2x+3=7.", 151936)
    assert a == stand_in_tokens("Find $x$ such that 2x+3=7.", 151936)
    assert all(1000 <= t < 151936 - 1000 for t in a) and 10 <= len(a) <= 30
