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


# --- the shape rule (issue 39): check_model_shapes, at validation for every family and backend ----
VERIFIERS = sorted(p.stem for p in (ROOT / "conf" / "verifier").glob("*.yaml") if p.stem != "none")


@pytest.mark.parametrize("group,name", [("model", n) for n in MODELS] + [("verifier", n) for n in VERIFIERS])
def test_every_shipped_model_and_verifier_passes_the_shape_rule(group, name):
    """Every conf/model and conf/verifier option passes as it ships (qwen-4b's 20 heads, OPT's
    head_dim 80, math-shepherd's Mistral, the tiny ones). Mutations caught: the GQA rule reversed
    (``kv % heads``) or OPT's ``num_kv_heads == num_heads`` applied to every type (the GQA models fail:
    llama-3.1-8b, qwen2.5-*, tiny-llama)."""
    mf.check_model_shapes(load(group, name), group)


def shaped(name: str, **over):
    m = load("verifier" if name in VERIFIERS else "model", name)
    for k, v in over.items():
        m[k] = v
    return m


# (model, overrides, the message or None when allowed): each rule just inside and just outside
SHAPE_CASES = [
    ("tiny-llama", {"num_layers": 1}, None),
    ("tiny-llama", {"num_layers": 0}, "model.num_layers=0 is not allowed: a count > 0"),
    ("tiny-llama", {"vocab_size": 1}, None),
    ("tiny-llama", {"vocab_size": 0}, "model.vocab_size=0 is not allowed: a count > 0"),
    ("tiny-opt", {"vocab_size": 2}, None),
    (
        "tiny-opt",
        {"vocab_size": 1},
        "model.vocab_size=1 is not allowed: more than 1, the padding-token id of this OPT config: the input "
        "embedding's padding_idx must be a token of the vocabulary (OPT with vocab_size=1 ended in transformers' "
        "'Padding_idx must be within num_embeddings' after the engine started)",
    ),
    ("tiny-llama", {"max_position": 1}, None),
    ("tiny-llama", {"max_position": 0}, "model.max_position=0 is not allowed: a token count > 0"),
    ("tiny-llama", {"intermediate_size": -1}, "model.intermediate_size=-1 is not allowed: a count > 0"),
    ("tiny-llama", {"num_kv_heads": 4}, None),
    (
        "tiny-llama",
        {"num_kv_heads": 3},
        "model.num_kv_heads=3 is not allowed: a divisor of model.num_heads=8 (grouped-query attention)",
    ),
    (
        "tiny-llama",
        {"num_kv_heads": 16},
        "model.num_kv_heads=16 is not allowed: a divisor of model.num_heads=8 (grouped-query attention)",
    ),
    ("tiny-opt", {"num_kv_heads": 4}, None),
    (
        "tiny-opt",
        {"num_kv_heads": 2},
        "model.num_kv_heads=2 is not allowed: equal to model.num_heads=4 (OPT has multi-head attention only)",
    ),
    (
        "tiny-opt",
        {"head_dim": 32},
        "model.head_dim=32 is not allowed: model.hidden_size / model.num_heads = 64 (OPT has no head_dim "
        "setting: transformers and vLLM derive it as hidden_size / num_heads)",
    ),
    ("tiny-llama", {"hidden_size": 264}, None),  # LLaMA's head_dim is its own (32 x 8 != 264)
    (
        "tiny-llama",
        {"hidden_size": 260},
        "model.num_heads=8 is not allowed: a divisor of model.hidden_size=260 (LLaMA splits the hidden "
        "size among its heads)",
    ),
    ("tiny-qwen2", {"head_dim": 64}, None),
    (
        "tiny-qwen2",
        {"head_dim": 62},
        "model.head_dim=62 is not allowed: model.hidden_size / model.num_heads = 64 (Qwen2 has no head_dim "
        "setting: vLLM derives it as hidden_size / num_heads, so another head_dim would run a model whose "
        "KV bytes differ from the ones counted)",
    ),
    ("tiny-llama", {"head_dim": 30}, None),
    (
        "tiny-llama",
        {"head_dim": 31},
        "model.head_dim=31 is not allowed: an even count (LLaMA's rotary position embedding rotates pairs "
        "of dimensions)",
    ),
    (
        "math-shepherd-7b",
        {"head_dim": 127},
        "verifier.head_dim=127 is not allowed: an even count (Mistral's rotary position embedding rotates "
        "pairs of dimensions)",
    ),
    (
        "tiny-opt",
        {"hf_model_type": "gpt2"},
        "model.hf_model_type='gpt2' is not allowed: one of opt, llama, qwen2, mistral",
    ),
]


@pytest.mark.parametrize("name,over,message", SHAPE_CASES)
def test_each_shape_rule_just_inside_and_just_outside(name, over, message):
    """Mutations caught (each applied to harness/model_facts.py, the test seen failing, restored):
    ``v < 1`` as ``v < 0`` (0 layers / vocab / positions passed); the GQA rule dropped (3 KV heads of 8
    passed); the OPT ``num_kv_heads == num_heads`` rule dropped (2 of 4 passed, transformers' OPT
    builds 4); the OPT/Qwen2 head_dim rule dropped (the torch engine refused OPT late, vLLM ran another
    Qwen2); LLaMA's ``hidden_size % num_heads`` rule dropped (transformers' LlamaConfig refused late);
    the even-head_dim rule dropped (transformers' RoPE check refused 31 late); the padding-id rule
    dropped (OPT with vocab_size=1: the torch engine's error record). A value just inside
    builds a transformers config (the engine's own check accepts it)."""
    from harness.errors import ConfigError

    group = "verifier" if name in VERIFIERS else "model"
    m = shaped(name, **over)
    if message is None:
        mf.check_model_shapes(m, group)
        if group == "model":
            from transformers import AutoConfig

            d = {k: v for k, v in mf.hf_config_dict(m).items() if k not in ("architectures", "torch_dtype")}
            AutoConfig.for_model(**d)
        return
    with pytest.raises(ConfigError) as e:
        mf.check_model_shapes(m, group)
    assert str(e.value) == message


def test_a_count_must_be_an_integer():
    """A plain config (no schema: a dict read back from a record) with 4.0 layers or true KV heads is
    refused. Mutation caught: ``isinstance(v, numbers.Integral)`` dropped (4.0 passed, a bool counted 1)."""
    from harness.errors import ConfigError

    for key, value in (("num_layers", 4.0), ("num_kv_heads", True)):
        m = OmegaConf.create({**OmegaConf.to_container(load("model", "tiny-llama")), key: value})
        with pytest.raises(ConfigError) as e:
            mf.check_model_shapes(m)
        assert str(e.value) == f"model.{key}={value!r} is not allowed: a count > 0"


def test_the_engines_refuse_with_the_same_rule():
    """hf_config_dict (what vLLM and the torch engine build from) refuses what validation refuses, with
    the same message; the torch engine's hf_config_kwargs too (as ModelGeometryError, a ValueError).
    Mutation caught: hf_config_dict without its check_model_shapes call (its own OPT check gone, it
    wrote a config.json with 2 KV heads that OPT ignores)."""
    from harness.errors import ConfigError
    from systems.kv_offload.model import ModelGeometryError, hf_config_kwargs

    m = shaped("tiny-opt", num_kv_heads=2)
    with pytest.raises(ConfigError) as want:
        mf.check_model_shapes(m)
    with pytest.raises(ConfigError) as got:
        mf.hf_config_dict(m)
    assert str(got.value) == str(want.value)
    with pytest.raises(ModelGeometryError) as eng:
        hf_config_kwargs(m)
    assert str(eng.value) == str(want.value)
    v = shaped("tiny-prm", head_dim=32)
    with pytest.raises(ConfigError, match=r"^verifier\.head_dim=32 is not allowed"):
        mf.hf_config_dict(v, role="verifier")
