"""harness.model_facts: parameter counts equal transformers' own count of the model built from the
same config (meta device, exact), and every family asks the same module.

Mutations tried (each fails a test here): OPT MLP counted as 3 matrices; Qwen2 q/k/v biases
dropped; tied embeddings counted twice; OPT's 2-row position offset dropped; KV bytes without
the factor 2 (K and V).
"""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness import model_facts as mf

ROOT = Path(__file__).resolve().parent.parent
MODELS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))


def load(group: str, name: str):
    """The option's YAML over its schema's defaults (as Hydra composes it)."""
    from harness.config import ModelConfig, VerifierConfig

    y = OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml")
    y.pop("defaults", None)
    return OmegaConf.merge(OmegaConf.structured(VerifierConfig if group == "verifier" else ModelConfig), y)


def transformers_count(cfg_dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = {k: v for k, v in cfg_dict.items() if k not in ("architectures", "torch_dtype")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**d))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_param_count_equals_transformers(name):
    m = load("model", name)
    assert mf.num_params(m) == transformers_count(mf.hf_config_dict(m))


def test_lm_verifier_count_equals_transformers():
    v = load("verifier", "math-shepherd-7b")
    assert mf.architecture(v) == "MistralForCausalLM"
    assert mf.num_params(v) == transformers_count(mf.hf_config_dict(v))


def test_prm_head_verifier_is_base_plus_two_label_head():
    """Qwen2ForProcessRewardModel (vLLM): the Qwen2 body, no LM head, Linear(h,h) + Linear(h,2)."""
    v = load("verifier", "skywork-prm-1.5b")
    g = load("model", "qwen2.5-math-1.5b")  # same shapes, tied LM head (counted once)
    h = 1536
    assert mf.architecture(v) == "Qwen2ForProcessRewardModel"
    assert mf.num_params(v) == mf.num_params(g) + (h * h + h + 2 * h + 2)


def test_paper_sizes_and_kv_bytes():
    """Named sizes: OPT-6.7B 6.66 B parameters, 16 KiB KV per token per layer (LBS worked
    example); Qwen2.5-Math-1.5B 1.54 B; Llama-3.3-70B 70.6 B."""
    opt = load("model", "opt-6.7b")
    assert mf.num_params(opt) == 6_658_473_984
    assert mf.kv_bytes_per_token_layer(opt) == 16 * 1024
    assert mf.kv_bytes_per_token(opt) == 32 * 16 * 1024
    assert mf.weight_bytes(opt) == 2 * 6_658_473_984
    assert round(mf.num_params(load("model", "qwen2.5-math-1.5b")) / 1e9, 2) == 1.54
    assert round(mf.num_params(load("model", "llama-3.3-70b")) / 1e9, 1) == 70.6


def test_bad_inputs():
    with pytest.raises(ValueError, match="dtype"):
        mf.dtype_bytes("int3")
    m = load("model", "tiny-opt")
    m.hf_model_type = "gpt2"
    with pytest.raises(ValueError, match="hf_model_type"):
        mf.num_params(m)


def test_forward_params_leave_out_lookups():
    """Untied: the input embedding is a lookup, the LM head a matmul; tied: the one matrix is the
    LM head; OPT also drops its learned positions."""
    llama = load("model", "llama-2-7b")
    assert mf.forward_params(llama) == mf.num_params(llama) - 32000 * 4096
    q15 = load("model", "qwen2.5-math-1.5b")  # tied
    assert mf.forward_params(q15) == mf.num_params(q15)
    opt = load("model", "opt-6.7b")  # tied, learned positions
    assert mf.forward_params(opt) == mf.num_params(opt) - (2048 + 2) * 4096


def test_default_kv_budget_per_device():
    """kv_budget = memory - weights - reserve. The RTX 4090's stated reserve leaves the LBS paper's
    7 GiB for OPT-6.7B fp16; a profile without one reserves 10 % of its memory.
    Mutations caught: reserve added instead of subtracted; weights left out."""
    hw = OmegaConf.load(ROOT / "conf" / "hardware" / "rtx4090.yaml")
    opt = load("model", "opt-6.7b")
    assert mf.default_kv_budget(hw.memory_bytes, mf.weight_bytes(opt), mf.kv_reserve_bytes(hw)) == 7 * 2**30
    a100 = OmegaConf.load(ROOT / "conf" / "hardware" / "a100-80gb.yaml")
    assert mf.kv_reserve_bytes(a100) == int(0.1 * a100.memory_bytes)
    assert mf.default_kv_budget(1000, 300, 100) == 600


def test_lbs_runs_use_the_derived_budget(compose_cfg, tmp_path):
    """The LBS family's budget with no override is the derived one; weights that leave less than one
    beam's KV are a recorded oom (exit 0), not a crash."""
    from harness.run import run

    rec = run(
        compose_cfg(
            "system=lbs", "model=opt-6.7b", "beams=4", "gen_len=64", "backend=sim", output_dir=tmp_path / "opt"
        ),
        multirun=True,
    )
    assert rec["status"] == "ok" and rec["summary"]["kv_budget_bytes"] == 7 * 2**30
    rec = run(
        compose_cfg(
            "system=lbs", "model=qwen2.5-32b", "beams=4", "gen_len=64", "backend=sim", output_dir=tmp_path / "qwen"
        ),
        multirun=True,
    )
    assert rec["status"] == "oom" and "less than one beam" in rec["message"]


def test_facts_of_a_structured_config_keep_no_caller_frame_alive():
    """A fact of a structured model config (which lacks ``prm_kind``) is read without an exception
    inside OmegaConf: its traceback would keep the callers' frames, and their locals (a whole
    simulated run's objects), alive in a reference cycle until the cyclic collector runs (with it
    paused, harness.run: until the run ends). Mutation caught: ``_get`` asking ``m.get`` first
    (the old code)."""
    import gc
    import weakref

    class Locals:
        pass

    def caller():
        mine = Locals()
        mf.weight_bytes(load("model", "llama-3.3-70b"))
        return weakref.ref(mine)

    was = gc.isenabled()
    gc.disable()
    try:
        assert caller()() is None  # freed on return: no cycle holds the caller's frame
    finally:
        if was:
            gc.enable()


def test_one_kv_budget_rule_for_every_family():
    """harness.model_facts.kv_budget_bytes, which all three families call: the configured kv_budget
    wins; else a CPU engine's cpu_kv_budget; else the measured free memory; else memory - weights -
    reserve (negative when the weights do not fit). Mutations caught: cpu_kv_budget before the
    configured value; the live budget before cpu_kv_budget; the reserve left out."""
    from harness.errors import ConfigError
    from harness.model_facts import kv_budget_bytes

    gib = 2**30
    given = {"kv_budget": "7GiB", "cpu_kv_budget": "256MiB"}
    unset = {"kv_budget": None, "cpu_kv_budget": "256MiB"}
    assert kv_budget_bytes(given, 24 * gib, 13 * gib, gib, on_cpu=True, live=5) == 7 * gib
    assert kv_budget_bytes(unset, 24 * gib, 13 * gib, gib, on_cpu=True, live=5) == 256 * 2**20
    assert kv_budget_bytes(unset, 24 * gib, 13 * gib, gib, live=5) == 5
    assert kv_budget_bytes(unset, 24 * gib, 13 * gib, gib) == 10 * gib
    assert kv_budget_bytes(unset, 24 * gib, 30 * gib, gib) == -7 * gib
    with pytest.raises(ConfigError, match=r"kv_budget='lots' is not a size"):
        kv_budget_bytes({"kv_budget": "lots"}, 24 * gib, 13 * gib, gib)
