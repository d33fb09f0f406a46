"""vLLM 0.9.2's V0 engine as the FastTTS artifact ran it (``systems/verifier_search/vllm_v0.py``):
prefill-only steps, recompute preemption, 16-token blocks, sleep-mode offload; hand-worked traces of
the simulated engines."""

from collections import deque

import pytest

from harness.errors import ConfigError
from systems.verifier_search import runner, sim, vllm_v0
from systems.verifier_search.memory import ModelShape, Roofline
from systems.verifier_search.protocol import GenRequest
from systems.verifier_search.sim import SimGenerator, SimVerifier, StepModel, TokenSource, pack_passes
from systems.verifier_search.speculation import SpeculationPolicy
from systems.verifier_search.vllm_engine import TokenMap

from .test_artifact import SIM
from .test_speculation import TINY  # the tiny generator's shape, defined once

EOS, DELIM = 151643, 271
OFF = SpeculationPolicy(False)


def step(n: int, base: int) -> list:
    """A recorded step of ``n`` tokens ending at the delimiter."""
    return [base + i for i in range(n - 1)] + [DELIM]


def generator(recorded, *, blocks: int, max_num_seqs: int, scheduler: str, block: int = 16) -> SimGenerator:
    return SimGenerator(
        TINY,
        Roofline(5e10, 1e10),
        TokenSource(StepModel(1 / 4, 1 / 64, DELIM, EOS, 151936), recorded),
        kv_bytes=blocks * block * TINY.kv_bytes_per_token,
        max_num_seqs=max_num_seqs,
        block=block,
        token_budget=4096,
        max_model_len=4096,
        scheduler=scheduler,
    )


@pytest.fixture
def steps(monkeypatch):
    """Every charged generator step costs 1 s; the calls (prefill chunks, decodes) are recorded."""
    calls = []

    def one(m, hw, prefill, decodes, ctx):
        calls.append((list(prefill), decodes))
        return 1.0

    monkeypatch.setattr(sim, "_t_step", one)
    return calls


def test_v0_steps_hold_prefills_only(steps):
    """Two slots, steps of 4, 10 and 4 tokens (20-token prompts). V0: step 0 prefills r0, r1 (each
    samples its first token); 3 decode steps end r0; r2's prefill runs alone while r1 waits (no
    decode in it); 3 steps of 2 decodes end r2, 3 of r1 alone end r1: 11 steps. V1: r2's prefill
    rides with r1's decode: 4 + 4 + 2 = 10 steps.
    Mutation: the v0 admission charging the running sequences' decodes with the prefill (V1's mixed
    step) fails this; so does v0 advancing the running sequences during a prefill step."""
    rec = {"r0": step(4, 1000), "r1": step(10, 2000), "r2": step(4, 3000)}
    reqs = [GenRequest(u, list(range(100 * i, 100 * i + 20)), 64, i) for i, u in enumerate(rec)]
    res = generator(rec, blocks=64, max_num_seqs=2, scheduler="v0").extend(reqs, OFF)
    assert [len(res.outputs[u].tokens) for u in rec] == [4, 10, 4]
    assert res.time_s == 11.0 and res.engine_steps == 11
    pre = [(p, d) for p, d in steps if p]
    assert pre == [([(20, 0), (20, 0)], 0), ([(20, 0)], 0)]  # r2's prefill: no decode beside it
    assert [d for p, d in steps if not p] == [2, 2, 1]  # then 3 x 2, 3 x 2, 3 x 1 decodes
    steps.clear()
    res = generator(rec, blocks=64, max_num_seqs=2, scheduler="v1").extend(reqs, OFF)
    assert res.time_s == 10.0
    assert [(p, d) for p, d in steps if p] == [([(20, 0), (20, 0)], 0), ([(20, 0)], 1)]  # mixed


def test_v0_preempts_by_recompute_and_reprefills_the_whole_sequence(steps):
    """5 blocks of 16; r0: 16-token prompt (1 block), r1: 24 tokens (1 full block + 1 partial), steps
    of 40 and 44 tokens. V0 admits both (the prompts' blocks only: 3); after 16 decode steps r0 holds
    2 blocks (32 tokens of KV), r1 3 (40), and the next step needs a 6th of the 5 blocks: r1 (last admitted) is
    preempted, its 3 blocks freed (its 2 full ones cached); r0 decodes to its end at step 39 (4
    blocks, evicting r1's first cached block); r1 is prefilled again with its prompt and the 17
    tokens it had sampled: 41 tokens, none cached, and ends with the tokens it would have made.
    V1 reserves r0's whole step (4 blocks): r1 waits, nobody is preempted.
    Mutation: re-prefilling the prompt only (``reprefill_tokens`` without the generated tokens)
    fails this; so does preempting the first admitted sequence (r0: 33 tokens) instead of the last."""
    rec = {"r0": step(40, 1000), "r1": step(44, 2000)}
    reqs = [GenRequest("r0", list(range(16)), 64, 0), GenRequest("r1", list(range(100, 124)), 64, 1)]
    gen = generator(rec, blocks=5, max_num_seqs=8, scheduler="v0")
    res = gen.extend(reqs, OFF)
    assert gen.preemptions == 1 and gen.reprefilled == 41
    assert [p for p, _ in steps if p] == [[(16, 0), (24, 0)], [(41, 0)]]
    assert res.outputs["r0"].tokens == rec["r0"] and res.outputs["r1"].tokens == rec["r1"]
    # r0 ends at decode step 39; r1 re-admitted there with 18 tokens, 26 steps to go: 1 + 39 + 1 + 26
    assert res.time_s == 67.0
    v1 = generator(rec, blocks=5, max_num_seqs=8, scheduler="v1")
    v1.extend(reqs, OFF)
    assert v1.preemptions == 0


def test_blocks_round_up_at_16():
    """ceil(tokens / 16); a V0 admission of a 33-token prompt pins its 2 full blocks and reserves 1
    for the partial one (3 blocks; 2 with 32-token blocks).
    Mutation: ``blocks`` rounding down (tokens // block) fails this."""
    assert [vllm_v0.blocks(n, 16) for n in (1, 16, 17, 32, 33)] == [1, 1, 2, 2, 3]
    assert vllm_v0.blocks(33, 32) == 2
    for block, used in ((16, 3), (32, 2)):
        gen = generator({"r": step(8, 1000)}, blocks=64, max_num_seqs=2, scheduler="v0", block=block)
        r = GenRequest("r", list(range(33)), 64, 0)
        gen._admit(deque([r]), {}, 0)
        assert gen.cache.used() == used


def test_sleep_charges_the_weights_both_ways_and_empties_the_prefix_cache():
    """offload_mode=sleep at 1e9 B/s: each call is charged 2 x 1.6e8 B / 1e9 B/s = 0.32 s more than
    without offload, and the second call of the same prompt finds nothing cached (level 1 discards
    the KV); swap keeps the cache (and charges its KV, as before).
    Mutation: sleep charging one direction only, or keeping the cache after the call, fails this."""
    assert vllm_v0.sleep_s(1.6e8, 1e9) == pytest.approx(0.32)
    rec = {"a": step(8, 1000), "b": step(8, 1000)}
    ra = GenRequest("a", list(range(64)), 64, 0)
    rb = GenRequest("b", list(range(64)), 64, 0)
    plain = generator(dict(rec), blocks=64, max_num_seqs=4, scheduler="v0")
    t_plain = plain.extend([ra], OFF).time_s
    assert plain.extend([rb], OFF).outputs["b"].cached_tokens == 48  # 3 of the prompt's 4 blocks (the last recomputed)
    slept = generator(dict(rec), blocks=64, max_num_seqs=4, scheduler="v0")
    slept.configure(64 * 16 * TINY.kv_bytes_per_token, 4, 1e9, "sleep")
    assert slept.extend([ra], OFF).time_s == pytest.approx(t_plain + 0.32)
    assert slept.cache.used() == 0
    assert slept.extend([rb], OFF).outputs["b"].cached_tokens == 0
    swapped = generator(dict(rec), blocks=64, max_num_seqs=4, scheduler="v0")
    swapped.configure(64 * 16 * TINY.kv_bytes_per_token, 4, 1e9, "swap")
    t = swapped.extend([ra], OFF).time_s
    assert t == pytest.approx(t_plain + 2 * 4 * 16 * TINY.kv_bytes_per_token / 1e9)  # 4 blocks cached
    assert swapped.extend([rb], OFF).outputs["b"].cached_tokens == 48


def verifier(scheduler: str = "v0") -> SimVerifier:
    return SimVerifier(
        TINY,
        Roofline(5e10, 1e10),
        kv_bytes=1024 * 16 * 2048,
        max_num_seqs=8,
        block=16,
        token_budget=4096,
        token_map=TokenMap("q", "q", 151936, DELIM, DELIM),
        prompts={0: list(range(10))},
        seed=0,
        prefix_cache=False,
        scheduler=scheduler,
    )


def test_sleeping_verifier_is_charged_its_weights():
    """The verifier sleeps too: its call is charged 2 x weights / link more.
    Mutation: the verifier returning without ``offload_s`` fails this."""
    ver = verifier()
    items = [(step(8, 1000), [8])]
    t0 = ver.verify(0, items).time_s
    ver.configure(64 * 16 * 2048, 8, 1e9, "sleep")
    assert ver.verify(0, items).time_s == pytest.approx(t0 + 0.32)


def test_v0_verifier_packs_whole_inputs():
    """Without chunked prefill a pass holds whole inputs: 3 x 2500 tokens at 4096 -> 3 passes (V1's
    chunks: ceil(7500 / 4096) = 2), in the function and in the simulated verifier's charge.
    Mutation: packing by the token sum (in ``pack_passes``, or the v0 verifier not calling it) fails
    this; so does starting a new pass when an input fills the budget exactly (``>=`` for ``>``)."""
    assert pack_passes([2500, 2500, 2500], 4096) == 3
    assert pack_passes([3000, 1000, 2000], 4096) == 2 and pack_passes([0, 5], 4096) == 1
    assert pack_passes([], 4096) == 0
    # an input that fills the pass exactly still joins it (vLLM's check: the budget holds it)
    assert pack_passes([3000, 1096], 4096) == 1 and pack_passes([3000, 1097], 4096) == 2
    seen = []
    real = sim.prefill_terms

    def spy(m, new_tokens, attn, budget, passes=None):
        seen.append(passes if passes is not None else -(-new_tokens // budget))
        return real(m, new_tokens, attn, budget, passes)

    items = [(step(2490, 1000 + 3000 * i), [2490]) for i in range(3)]  # + 10 prompt tokens: 2500 each
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sim, "prefill_terms", spy)
        for scheduler in ("v0", "v1"):
            verifier(scheduler).verify(0, items)
    assert seen == [3, 2]


def test_settings_validated_and_the_real_engine_records_v1(compose_cfg):
    """Bad scheduler / offload_mode: exit-2 errors naming what is allowed; the artifact's systems
    default to v0 with 16-token blocks (a CPU engine rounds to 32), sleep for fasttts_offload; a
    real engine (V1 only) records v1. Mutation: ``scheduler_ran`` returning the setting on a real
    engine, or dropping ``vllm_v0.validate`` from ``runner.validate``, fails this."""
    with pytest.raises(ConfigError, match=r"system.scheduler='v2' is not allowed: one of v0, v1"):
        runner.validate(compose_cfg("system=vllm_tts", "backend=sim", "system.scheduler=v2"))
    with pytest.raises(ConfigError, match=r"system.offload_mode='disk' is not allowed: one of sleep, swap"):
        runner.validate(compose_cfg("system=fasttts_offload", "backend=sim", "system.offload_mode=disk"))
    for name in ("vllm_tts", "fasttts"):
        s = compose_cfg(f"system={name}").system
        assert (s.scheduler, s.block_size) == ("v0", 16)
        assert vllm_v0.scheduler_ran(s, simulated=True) == "v0"
        assert vllm_v0.scheduler_ran(s, simulated=False) == "v1"
        assert vllm_v0.engine_block_size(s, on_cpu=True) == 32 and vllm_v0.engine_block_size(s, False) == 16
    assert compose_cfg("system=fasttts_offload").system.offload_mode == "sleep"
    s = compose_cfg("system=vllm_tts").system
    assert vllm_v0.scheduler_note(s, simulated=False).startswith("system.scheduler=v0: vLLM 0.9.2's V0 engine")
    assert vllm_v0.scheduler_note(s, simulated=True) == ""


def test_sleep_plan_gives_each_engine_its_own_095(compose_cfg):
    """offload_mode=sleep on the simulated rtx4090: each engine gets 0.95 x 24 GiB less its own weights
    and its own activation reserve (kv_accounting=vllm: vLLM's profiling peak of that engine; flat: 5 %
    of the share), batch caps 256, offload on, and both engines sleep; with kv_budget set, each gets it
    whole. The record counts preemptions under v0 only. Mutations: splitting one 0.95 share between the
    engines, ignoring a set kv_budget, the flat reserve under kv_accounting=vllm, or counting
    preemptions (0) under v1 fails this."""
    from harness.vllm_memory import VLLM_092_CUDA, activation_peak_bytes
    from systems.verifier_search.memory_plan import gen_token_budget, ver_token_budget

    flat = compose_cfg(
        "system=fasttts_offload",
        "backend=sim",
        "hardware=rtx4090",
        "workload.num_problems=1",
        "system.kv_accounting=flat",
    )
    bf = runner.build(flat, SIM, None)
    share = 0.95 * float(flat.hardware.memory_bytes)
    assert bf.alloc.gen_kv_bytes == int(share - ModelShape.of(flat.model).weight_bytes - 0.05 * share)
    assert bf.alloc.ver_kv_bytes == int(share - ModelShape.of(flat.verifier).weight_bytes - 0.05 * share)
    cfg = compose_cfg("system=fasttts_offload", "backend=sim", "hardware=rtx4090", "workload.num_problems=1")
    runner.validate(cfg)
    b = runner.build(cfg, SIM, None)
    gen_w, ver_w = ModelShape.of(cfg.model).weight_bytes, ModelShape.of(cfg.verifier).weight_bytes
    share = 0.95 * float(cfg.hardware.memory_bytes)
    assert b.alloc.offload and (b.alloc.b_dec, b.alloc.b_pre) == (256, 256)
    peak_g = activation_peak_bytes(cfg.model, gen_token_budget(cfg), 256, pooling=False, profile=VLLM_092_CUDA)
    peak_v = activation_peak_bytes(cfg.verifier, ver_token_budget(cfg), 256, pooling=True, profile=VLLM_092_CUDA)
    assert b.alloc.gen_kv_bytes == int(share - gen_w - peak_g)
    assert b.alloc.ver_kv_bytes == int(share - ver_w - peak_v)
    assert b.gen.offload_mode == b.ver.offload_mode == "sleep"
    assert (
        runner._preemptions(b.gen) == 0
        and runner._preemptions(generator({}, blocks=4, max_num_seqs=1, scheduler="v1")) is None
    )
    b2 = runner.build(compose_cfg("system=fasttts_offload", "backend=sim", "kv_budget=512MiB"), SIM, None)
    assert b2.alloc.gen_kv_bytes == b2.alloc.ver_kv_bytes == 512 << 20


def test_v0_admission_leaves_the_watermark_free():
    """V0's block manager admits a sequence only if 1 % of the blocks stay free (watermark 0.01,
    ``SelfAttnBlockSpaceManager.can_allocate``): with 100 blocks of 16, a 1,568-token prompt (98
    blocks) is admitted, a 32-token one (2 blocks) is not (2 + the watermark's 1 > the 2 free), a
    16-token one is (1 + 1). Mutation: WATERMARK = 0 (or the watermark not added at admission) fails this."""
    r0, r1 = GenRequest("r0", list(range(1568)), 64, 0), GenRequest("r1", list(range(5000, 5032)), 64, 1)
    rec = {"r0": step(4, 1000), "r1": step(4, 2000)}
    gen = generator(rec, blocks=100, max_num_seqs=8, scheduler="v0")
    prefill, admitted, _ = gen._admit(deque([r0, r1]), {}, 0)
    assert [s.r.uid for s in admitted] == ["r0"] and prefill == [(1568, 0)] and gen.cache.used() == 98
    r2 = GenRequest("r2", list(range(6000, 6016)), 64, 2)  # 1 block + the watermark's 1 = the 2 free
    gen = generator({**rec, "r2": step(4, 3000)}, blocks=100, max_num_seqs=8, scheduler="v0")
    assert [s.r.uid for s in gen._admit(deque([r0, r2]), {}, 0)[1]] == ["r0", "r2"] and gen.cache.used() == 99


def test_sleep_offload_needs_no_shared_budget_from_memory_fraction(compose_cfg):
    """fasttts_offload on an RTX 3070 Ti at its pair's memory_fraction (0.4): the sleep plan gives
    each engine 0.95 of the 8 GB less its weights and activation peak; the 0.4 share (which cannot
    hold both models' weights) is not asked for. With replan=per_iteration sleep is refused (its plan
    is fixed). Mutation: MemoryPlan computing kv_budget from memory_fraction under sleep (a recorded
    oom) fails this; so does dropping the replan check."""
    from harness.errors import RunOOM
    from harness.vllm_memory import VLLM_092_CUDA, activation_peak_bytes
    from systems.verifier_search.memory_plan import MemoryPlan, gen_token_budget

    cfg = compose_cfg("system=fasttts_offload", "backend=sim", "hardware=rtx3070ti", "workload.num_problems=1")
    assert float(cfg.system.memory_fraction) == 0.4
    mp = MemoryPlan(cfg, on_cpu=False, real=False)
    a = mp.per_run(8, 100.0)
    share = 0.95 * float(cfg.hardware.memory_bytes)
    peak = activation_peak_bytes(cfg.model, gen_token_budget(cfg), 256, pooling=False, profile=VLLM_092_CUDA)
    assert a.offload and a.gen_kv_bytes == int(share - ModelShape.of(cfg.model).weight_bytes - peak)
    mp.check_fits(a)
    swap = compose_cfg("system=fasttts_offload", "backend=sim", "hardware=rtx3070ti", "system.offload_mode=swap")
    with pytest.raises(RunOOM, match="memory_fraction=0.4"):
        MemoryPlan(swap, on_cpu=False, real=False)
    with pytest.raises(ConfigError, match="system.replan='per_iteration' is not allowed"):
        runner.validate(compose_cfg("system=fasttts_offload", "system.replan=per_iteration"))
