"""The memory plan (M): one plan applied the same way on both backends, re-planned per iteration
only where the backend can honour it, planned on a CPU from a measured profile."""

import pytest

from harness.backend import Backend
from harness.errors import ConfigError
from harness.run import validate
from systems.verifier_search import runner
from systems.verifier_search.memory_plan import MemoryPlan, kv_budget

SIM = Backend("sim", "sim", True, "test")
CPU = Backend("vllm", "cpu", False, "test")
TINY = ["model=tiny-qwen2", "verifier=tiny-prm", "n=16", "workload.num_problems=2", "workload.num_iterations=4"]


class FakeEngine:
    """Stands in for a vLLM engine: records the size it was started with."""

    made = []

    def __init__(self, cfg, workdir, **kw):
        self.kw = kw
        FakeEngine.made.append(self)

    def shutdown(self):
        pass


def test_both_backends_size_their_engines_from_one_plan(compose_cfg, monkeypatch, tmp_path):
    """Same configuration and cost profile on both backends -> the simulated engines and the vLLM
    engines get the same KV bytes and batch caps (the plan of ``MemoryPlan.per_run``).
    Mutation caught: swapping B_dec and B_pre (or the two KV shares) in either backend's engine set-up.
    (The simulated backend's profiling error, ``system.profile_error``, is set to 0: a real engine's
    profile is a measurement and gets none.)"""
    from systems.verifier_search import vllm_engine as engines

    monkeypatch.setattr(engines, "VllmGenerator", FakeEngine)
    monkeypatch.setattr(engines, "VllmVerifier", FakeEngine)
    FakeEngine.made = []
    common = ["system=fasttts", "hardware=cpu-tts", "kv_budget=48MiB", "system.m_batch_caps=roofline", *TINY, "n=32"]
    common += ["system.profile_error.noise=0"]
    sim = runner.build(compose_cfg(*common, "backend=sim"), SIM, None)
    real = runner.build(compose_cfg(*common, "backend=vllm"), CPU, tmp_path)
    a = sim.alloc
    assert a == real.alloc and a.b_dec != a.b_pre  # one plan, and a telling one
    gen_kw, ver_kw = FakeEngine.made[0].kw, FakeEngine.made[1].kw
    assert (gen_kw["kv_bytes"], gen_kw["max_num_seqs"]) == (a.gen_kv_bytes, a.b_dec)
    assert (ver_kw["kv_bytes"], ver_kw["max_num_seqs"]) == (a.ver_kv_bytes, a.b_pre)
    gen, ver = sim.gen, sim.ver
    assert gen.max_num_seqs == a.b_dec and ver.max_num_seqs == a.b_pre
    assert gen.cache.capacity == a.gen_kv_bytes // (gen.m.kv_bytes_per_token * gen.block)
    assert ver.cache.capacity == a.ver_kv_bytes // (ver.m.kv_bytes_per_token * ver.block)
    assert gen_kw["block_size"] == gen.block and gen_kw["token_budget"] == gen.token_budget
    assert sim.hook is None and real.hook is None  # per_run: no re-planning hook


def test_per_iteration_replanning_refused_on_vllm(compose_cfg):
    with pytest.raises(
        ConfigError,
        match=r"system.replan=per_iteration is not allowed with backend=vllm: vLLM "
        r"allocates each engine's KV cache once",
    ):
        validate(compose_cfg("system=fasttts", "backend=vllm", "system.replan=per_iteration", *TINY))
    with pytest.raises(ConfigError, match="system.replan='sometimes' is not allowed: one of per_run, per_iteration"):
        validate(compose_cfg("system=fasttts", "system.replan=sometimes"))


def test_per_iteration_replanning_resizes_the_simulated_engines(compose_cfg):
    """Mutation caught: a hook that plans but does not apply the plan (or is never installed)."""
    from systems.verifier_search.search import Search

    cfg = compose_cfg("system=fasttts", "backend=sim", "system.replan=per_iteration", "n=64", "workload.num_problems=1")
    validate(cfg)
    st, problems, prompts, gen, ver, hook, alloc, *_ = runner.build(cfg, SIM, None)
    assert hook is not None
    seen = []

    def spy(it, active, prompt_len):
        hook(it, active, prompt_len)
        seen.append(((gen.max_num_seqs, gen.cache.capacity), (ver.max_num_seqs, ver.cache.capacity)))

    Search(st, gen, ver, before_iteration=spy).run_problem(problems[0].index, prompts[problems[0].index])
    assert len(seen) >= 3  # sizes follow the growing paths
    assert len({g for g, _ in seen}) > 1 and len({v for _, v in seen}) > 1


def test_m_on_a_real_cpu_plans_with_a_measured_profile(compose_cfg):
    """On a real CPU, M plans with this CPU's measured profile (cpu-tts.yaml, or hardware=<a measured
    cpu profile>), never the placeholder cpu.yaml."""
    cfg = compose_cfg("system=fasttts", "backend=vllm", *TINY)
    mp = MemoryPlan(cfg, on_cpu=True, real=True)
    assert mp.profile == "cpu-tts" and mp.dec_hw.seq_s > 0  # fitted by systems.verifier_search.calibrate
    with pytest.raises(ConfigError, match="hardware=cpu is not allowed for M .* holds no measured"):
        validate(compose_cfg("system=fasttts", "backend=vllm", "hardware=cpu", *TINY))
    validate(compose_cfg("system=vllm_tts", "backend=vllm", "hardware=cpu", *TINY))  # no M: no profile needed


def test_kv_budget_default_is_the_model_facts_rule(compose_cfg):
    """M = memory x memory_fraction - both models' weights - a reserve (harness.model_facts
    .default_kv_budget); the 1.5B+1.5B pair at 40 % of an RTX 4090, with the flat reserve (5 % of
    that share: ``system.kv_accounting=flat``; vLLM's accounting, the default: test_vllm_memory)."""
    from harness import model_facts as mf

    cfg = compose_cfg("system=fasttts", "system.kv_accounting=flat")
    share = 0.4 * cfg.hardware.memory_bytes
    want = share - mf.weight_bytes(cfg.model) - mf.weight_bytes(cfg.verifier) - 0.05 * share
    assert kv_budget(cfg, on_cpu=False) == int(want)
    assert kv_budget(compose_cfg("system=fasttts", "kv_budget=3GiB"), False) == 3 * 2**30
    assert kv_budget(compose_cfg("system=fasttts", "backend=vllm", *TINY), True) == 512 * 2**20  # cpu_kv_budget


def test_m_batch_caps_follow_the_artifact_unless_set_to_the_roofline(compose_cfg):
    """system.m_batch_caps: by default (``artifact``, the FastTTS artifact: vLLM's max_num_seqs = 256
    on both engines) M sets the KV split only and both engines keep max_num_seqs, at n=512 on the
    paper's 1.5B+1.5B RTX 4090 setting, where the roofline caps B_dec and B_pre below 256;
    ``roofline`` (the behaviour before issue 38) caps them there. The KV split is the same.
    Mutations caught: the setting ignored (always the roofline's caps, or never); the default set to
    roofline; the artifact's cap given to one engine only; a constant 256 instead of max_num_seqs."""
    common = ["system=fasttts", "backend=sim", "hardware=rtx4090", "n=512", "workload.num_problems=1"]
    art = runner.build(compose_cfg(*common), SIM, None)
    roof = runner.build(compose_cfg(*common, "system.m_batch_caps=roofline"), SIM, None)
    assert roof.alloc.b_dec < 256 and roof.alloc.b_pre < 256  # the roofline caps both here
    assert (art.alloc.b_dec, art.alloc.b_pre) == (256, 256)
    assert (art.gen.max_num_seqs, art.ver.max_num_seqs) == (256, 256)
    assert (roof.gen.max_num_seqs, roof.ver.max_num_seqs) == (roof.alloc.b_dec, roof.alloc.b_pre)
    assert (art.alloc.gen_kv_bytes, art.alloc.ver_kv_bytes) == (roof.alloc.gen_kv_bytes, roof.alloc.ver_kv_bytes)
    cap = compose_cfg(*common, "system.max_num_seqs=300")
    assert runner.build(cap, SIM, None).alloc.b_dec == 300  # the cap is max_num_seqs, not a constant
    with pytest.raises(ConfigError, match="system.m_batch_caps"):
        runner.validate(compose_cfg(*common, "system.m_batch_caps=none"))
