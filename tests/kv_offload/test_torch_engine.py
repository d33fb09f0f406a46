"""The real TTC engine (backend=torch, CPU, float64): bytes moved vs the plans and Eq.1-5, identical
search results under every scheduler, enforced KV budget, sampling noise keyed by beam and position."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from harness.errors import RunOOM
from harness.run import run
from systems.kv_offload.analytic import dm_layerwise, dm_lbs
from systems.kv_offload.kvstore import DevicePool, KVBudgetExceeded, PlanMismatch
from systems.kv_offload.plan import KVGeometry, make_scheduler
from systems.kv_offload.torch_engine import TorchExecutor
from systems.kv_offload.tree import BeamTree, initial_beams

pytestmark = pytest.mark.usefixtures("one_thread")

# OPT architecture, 4 layers, 4 KV heads x head_dim 16, float64:
# KV (one layer, one beam, one token) = 2 * 4 * 16 * 8 B = 1 KiB; all layers 4 KiB.
KV = 1024
MODEL = [
    "model=tiny-opt",
    "model.num_layers=4",
    "model.hidden_size=64",
    "model.num_heads=4",
    "model.num_kv_heads=4",
    "model.head_dim=16",
    "model.intermediate_size=128",
    "model.vocab_size=1000",
    "model.dtype=float64",
    "model.hf_config.word_embed_proj_dim=64",
]
# 8 beams (beam size 4 x width 2), prompt 16, 32 generated tokens in steps of 8.
# Budget 480 KiB: LBS capacity 5/3/3/2 beams at steps 0-3 (balanced [4,4] with one beam prefetched,
# then [3,3,2], [3,3,2], [2,2,2,2]); layer-wise keeps L = floor(60 / s_end) = 2, 1, 1, 1 layers at
# the step ends s_end = 24, 32, 40, 48 (evictions 4 -> 2 at step 0, from the prefill, and 2 -> 1).
WORK = ["beams=8", "prompt_len=16", "gen_len=32", "step=8", "seed=7", "system.record_tree=true"]
BUDGET = 480 * KV
SYSTEMS = ["in_gpu", "layerwise", "lbs", "lbs_intertoken", "lbs_interbeam", "lbs_prefetch"]


def _run(compose_cfg, tmp_path, system, *extra, budget=BUDGET):
    over = ["backend=torch", "backend.device=cpu", f"system={system}", *MODEL, *WORK, *extra]
    tmp_path.mkdir(parents=True, exist_ok=True)
    if budget is not None:
        over.append(f"kv_budget={budget}")
    rec = run(compose_cfg(*over, output_dir=tmp_path / system))
    assert rec["status"] == "ok", rec.get("message")
    assert rec["backend"]["simulated"] is False
    return rec


@pytest.fixture(scope="module")
def records(tmp_path_factory, one_thread):
    """One real run per system (in_gpu with no budget; everything else with 480 KiB)."""
    from hydra import compose, initialize_config_dir

    from tests.conftest import ROOT

    base = tmp_path_factory.mktemp("torch_runs")
    out = {}

    def compose_cfg(*overrides, output_dir):
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            return compose(
                "config", overrides=[f"output_dir={output_dir}", "tracking=none", "progress=false", *overrides]
            )

    for s in SYSTEMS:
        out[s] = _run(compose_cfg, base, s, budget=None if s == "in_gpu" else BUDGET)
    import json

    import pandas as pd

    for s in SYSTEMS:
        out[s]["steps_df"] = pd.read_parquet(base / s / "steps.parquet")
        out[s]["kept"] = json.loads((base / s / "beam_tree.json").read_text())["steps"]
    return out


def test_offloading_runs_move_exactly_the_planned_bytes(records):
    for s in SYSTEMS[1:]:
        df = records[s]["steps_df"]
        # per step, counted at every copy by the store, equal to the plan's prediction
        assert df.h2d_bytes.tolist() == df.plan_h2d_bytes.tolist(), s
        assert df.d2h_bytes.tolist() == df.plan_d2h_bytes.tolist(), s
        assert df.peak_device_bytes.tolist() == df.plan_device_bytes.tolist(), s
        assert df.h2d_bytes.sum() > 0
        sm = records[s]["summary"]
        prompt_wb = 0 if s == "layerwise" else 16 * 4 * KV  # LBS writes the prompt to the host
        assert sm["d2h_bytes"] == sm["plan_d2h_bytes"] + prompt_wb
        # physical device memory: within the budget + the staging the plan declares (layer-wise:
        # layers in flight and the step tail), per step and over the run
        assert (df.peak_physical_bytes <= BUDGET + df.staging_bytes).all(), s
        assert sm["peak_device_physical_bytes"] <= BUDGET + sm["max_staging_bytes"]
        assert (sm["max_staging_bytes"] > 0) == (s == "layerwise")
    lw = records["layerwise"]["steps_df"]
    # step 0: prefill's layers 2,3 evicted (8 beams x 16 tokens each) + tail of 2 layers (8 beams x 8);
    # step 1: layer 1 evicted (8 x 24) + tail of 3 layers; steps 2-3: tails of 3 layers
    assert lw.d2h_bytes.tolist() == [KV * x for x in (2 * 128 + 2 * 64, 192 + 3 * 64, 3 * 64, 3 * 64)]
    lbs = records["lbs"]["steps_df"]
    assert lbs.groups.tolist() == [2, 3, 3, 4]
    assert records["lbs"]["summary"]["h2d_bytes"] < 0.7 * records["lbs_intertoken"]["summary"]["h2d_bytes"]
    ing = records["in_gpu"]["summary"]
    assert ing["h2d_bytes"] == 0 and ing["d2h_bytes"] == 0
    assert ing["peak_device_kv_bytes"] == 8 * 48 * 4 * KV


def test_lbs_intertoken_bytes_equal_eq4_5(records):
    # Eq.4-5 assumptions: the KV does not fit (every step offloads; 8 x 48 x 4 KiB = 1.5 MiB > 480 KiB),
    # no prefix sharing (each beam loads its whole prefix once per step), KV_beam at the step's start.
    eq5 = dm_lbs(num_layers=4, num_beams=8, kv=KV, prompt_len=16, gen_len=32, step=8)
    sm = records["lbs_intertoken"]["summary"]
    assert sm["h2d_bytes"] == eq5 == sm["eq5_lbs_bytes"] == 8 * 4 * KV * (16 + 24 + 32 + 40)


def test_layerwise_bytes_equal_eq1_3_at_step_1_and_less_the_step_tail_otherwise(compose_cfg, tmp_path):
    """Eq.1-3 assumptions: Eq.1 at s and the plan's reading agree (4 beams, prompt 64, 16 generated,
    budget 400 KiB: L = floor(100 / s) = 1 for s in 64..80). At step 1 every token loads each offloaded
    layer's whole KV: exactly Eq.3. At step 8 the step's earlier tokens stay on the device: Eq.3 minus
    3 layers x 4 beams x (0 + 1 + ... + 7) tokens per step. (Mutation caught: loading the tail from
    the host, or counting it, breaks the second equality.)"""
    eq3 = dm_layerwise(num_layers=4, num_beams=4, kv=KV, mem_gpu=400 * KV, prompt_len=64, gen_len=16)
    assert eq3 == 3 * 4 * KV * sum(range(64, 80))
    for step, expect in ((1, eq3), (8, eq3 - 2 * 3 * 4 * KV * sum(range(8)))):
        rec = _run(
            compose_cfg,
            tmp_path / str(step),
            "layerwise",
            "beams=4",
            "prompt_len=64",
            "gen_len=16",
            f"step={step}",
            budget=400 * KV,
        )
        sm = rec["summary"]
        assert sm["h2d_bytes"] == expect and sm["eq3_layerwise_bytes"] == eq3, step


def test_same_seed_same_search_under_every_scheduler(records):
    ref = records["in_gpu"]
    assert len(ref["kept"]) == 3 and len(ref["best_tokens"]) == 32
    assert all(len(k["kept"]) == 4 for k in ref["kept"])
    for s in SYSTEMS[1:]:
        r = records[s]
        assert r["kept"] == ref["kept"], s  # the same beams survive every step
        assert r["best_tokens"] == ref["best_tokens"], s  # the same tokens
        assert r["summary"]["best_uid"] == ref["summary"]["best_uid"], s
        assert r["summary"]["best_cum_logprob"] == pytest.approx(ref["summary"]["best_cum_logprob"], abs=1e-9)


def test_timings_threads_and_warmup_are_recorded(records):
    for s in SYSTEMS:
        sm = records[s]["summary"]
        assert sm["compute_s"] > 0 and sm["e2e_s"] >= sm["compute_s"]
        assert records[s]["threads"]["torch_threads"] == 1 and sm["warmup_s"] > 0  # excluded, recorded
        assert "thread_time" in sm["time_basis"]  # CPU: the engine thread's CPU time
        assert sm["cuda_max_memory_allocated_bytes"] is None  # CPU run
        # end to end = the prefill + every step's wall time (compute + I/O stall) + planning/expansion
        assert sm["e2e_s"] > records[s]["steps_df"].latency_s.sum() > 0
    assert records["layerwise"]["summary"]["io_stall_s"] > 0
    assert records["in_gpu"]["summary"]["io_stall_s"] == 0


# -- unit level ------------------------------------------------------------------------------------


def test_device_pool_enforces_budget():
    pool = DevicePool(torch.device("cpu"), budget=1000, staging_budget=200)
    a = pool.alloc((100,), torch.float64)  # 800 B
    with pytest.raises(KVBudgetExceeded, match="needs 800 B, 800 B already held, kv budget 1000 B"):
        pool.alloc((100,), torch.float64, what="second group")
    s = pool.alloc((25,), torch.float64, kind="staging")  # separate allowance
    with pytest.raises(KVBudgetExceeded, match="staging"):
        pool.alloc((1,), torch.float64, kind="staging")
    with pytest.raises(KVBudgetExceeded):
        a.charge(1001)
    a.charge(500)
    pool.alloc((60,), torch.float64)  # 480 B now fits
    assert pool.peak_total == 800 + 200 + 480 - 300 + 0 or pool.peak_total == 1180
    a.free()
    s.free()
    assert pool.used["kv"] == 480 and pool.used["staging"] == 0


@pytest.fixture(scope="module")
def small_model():
    from systems.kv_offload.model import build_model

    cfg = OmegaConf.create(
        dict(
            name="t",
            hf_model_type="opt",
            num_layers=2,
            hidden_size=32,
            num_heads=2,
            num_kv_heads=2,
            head_dim=16,
            intermediate_size=64,
            vocab_size=300,
            max_position=256,
            dtype="float64",
            weights="random",
            hf_config={"word_embed_proj_dim": 32},
        )
    )
    return cfg, build_model(cfg, seed=0)


@pytest.fixture(scope="module")
def gqa_model():
    """LLaMA with grouped-query attention (4 heads, 2 KV heads); same KV bytes per token as small_model."""
    from systems.kv_offload.model import build_model

    cfg = OmegaConf.create(
        dict(
            name="t-gqa",
            hf_model_type="llama",
            num_layers=2,
            hidden_size=64,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            intermediate_size=64,
            vocab_size=300,
            max_position=256,
            dtype="float64",
            weights="random",
            hf_config={},
        )
    )
    return cfg, build_model(cfg, seed=0)


def _setup(small_model, kind, exec_budget, plan_budget, beams=4, prompt=8, gen=8, **kw):
    cfg, built = small_model
    ex = TorchExecutor(cfg, "cpu", exec_budget, seed=0, scheduler=kind, model=built)
    geom = KVGeometry.from_model(cfg)
    sched = make_scheduler(kind, geom, plan_budget, prompt_len=prompt, gen_len=gen, **kw)
    tree = BeamTree(prompt)
    ex.prefill(tree, list(range(prompt)), offload=sched.prefill_offload(beams))
    return ex, sched, tree, initial_beams(tree, beams, 0)


def test_engine_overrunning_budget_fails_loudly(small_model):
    # KV per token (2 layers) 1 KiB; 4 beams, prompt 8, step 4: 12 KiB per beam, 2 beams per group.
    # The plan thinks it has 30,000 B, the store enforces 20,000 B: the first group allocation raises
    ex, sched, tree, beams = _setup(small_model, "lbs", 20_000, 30_000)
    plan = sched.plan(0, tree, beams, 4)
    with pytest.raises(KVBudgetExceeded, match="budget exceeded"):
        ex.execute_step(plan, tree, beams)
    # in_gpu whose KV does not fit is an OOM of the run
    ex, sched, tree, beams = _setup(small_model, "in_gpu", 20_000, None)
    with pytest.raises(RunOOM, match="does not fit"):
        ex.execute_step(sched.plan(0, tree, beams, 4), tree, beams)


def test_engine_follows_load_blocks_literally(small_model):
    ex, sched, tree, beams = _setup(small_model, "lbs", 30_000, 30_000, inter_beam=True, prefetch=False)
    plan = sched.plan(0, tree, beams, 4)
    assert len(plan.groups) == 2 and plan.groups[0].load_blocks == [0]  # prompt loaded once per group
    plan.groups[0].load_blocks = []  # a plan that forgets a block
    with pytest.raises(PlanMismatch, match="segment 0 is needed"):
        ex.execute_step(plan, tree, beams)
    ex, sched, tree, beams = _setup(small_model, "lbs", 30_000, 30_000, inter_beam=True, prefetch=False)
    plan = sched.plan(0, tree, beams, 4)
    plan.groups[0].load_blocks = [0, 0, 0]  # loads more than needed
    with pytest.raises(PlanMismatch, match="loads blocks no beam needs"):
        ex.execute_step(plan, tree, beams)


def test_interbeam_loads_shared_segment_once_and_fans_out(small_model):
    cfg, _ = small_model
    kv_token = KVGeometry.from_model(cfg).kv_token
    for inter_beam, loads in ((True, 2), (False, 4)):  # 2 groups of 2 beams
        ex, sched, tree, beams = _setup(small_model, "lbs", 30_000, 30_000, inter_beam=inter_beam, prefetch=False)
        plan = sched.plan(0, tree, beams, 4)
        h0, d0 = ex.store.bytes.h2d, ex.store.d2d_bytes
        ex.execute_step(plan, tree, beams)
        assert ex.store.bytes.h2d - h0 == loads * 8 * kv_token
        assert ex.store.d2d_bytes - d0 == (4 - loads) * 8 * kv_token  # fanned out on the device


@pytest.mark.parametrize(
    "arch,kind,kw",
    [
        ("small_model", "lbs", dict(inter_beam=True, prefetch=True)),
        ("small_model", "lbs", dict(inter_beam=False, prefetch=True)),
        ("small_model", "layerwise", dict(prefetch=True)),
        ("gqa_model", "lbs", dict(inter_beam=True, prefetch=True)),
        ("gqa_model", "layerwise", dict(prefetch=True)),
    ],
)
def test_each_step_moves_and_holds_what_its_plan_says(request, arch, kind, kw):
    """Step by step (8 beams, prompt 8, 3 steps of 4; KV 1 KiB per token): h2d, d2h and peak device
    bytes = the plan's, for OPT and for LLaMA with GQA."""
    model = request.getfixturevalue(arch)
    assert KVGeometry.from_model(model[0]).kv_token == 1024
    budget = 7 * 12 * 1024 + 512  # LBS: capacity 7/5/4 -> balanced groups with prefetch
    ex, sched, tree, beams = _setup(model, kind, budget, budget, beams=8, gen=12, **kw)
    from systems.kv_offload.tree import select_and_expand

    seen_prefetch = 0
    for i in range(3):
        plan = sched.plan(i, tree, beams, 4)
        o = ex.execute_step(plan, tree, beams)
        assert (o.h2d_bytes, o.d2h_bytes, o.peak_device_bytes) == (plan.h2d_bytes, plan.d2h_bytes, plan.device_bytes), (
            kind,
            i,
        )
        seen_prefetch += sum(g.prefetch_beams for g in plan.groups)
        for k, b in enumerate(beams):
            b.cum_logprob += float(o.logprob_delta[k])
            tree.segments[b.leaf].length = 4
        if i < 2:
            new = select_and_expand(tree, beams, 4, 2)
            ex.expand(plan, tree, beams, new)
            beams = new
    if kind == "lbs":
        assert set(ex.store.host.segs) == set(tree.segments)  # dead segments freed on the host
        assert seen_prefetch > 0
    else:  # layer-wise keeps dense per-beam host layers, no segments
        assert not ex.store.host.segs and set(ex.lw.host.layers) == {1}
    ex.close()


def test_hf_offload_search_loop_matches_our_engine(records):
    """system=hf_offload's beam-search loop (transformers' DynamicCache, reorder_cache) run without
    offloading on CPU gives the same search as our engine; on a GPU the same loop runs with
    DynamicCache(offloading=True)."""
    from systems.kv_offload.hf_offload import hf_beam_search
    from systems.kv_offload.model import build_model

    ref = records["in_gpu"]
    model, _ = build_model(OmegaConf.create(ref["config"]["model"]), "cpu", seed=7)
    prompt = np.random.default_rng(7).integers(0, 1000, size=16).tolist()
    res = hf_beam_search(model, seed=7, prompt=prompt, beams=8, beam_width=2, gen_len=32, step=8, offloading=False)
    best = max(res["beams"], key=lambda b: (b.cum_logprob, -b.uid))
    assert res["kept"] == ref["kept"]
    assert best.tokens == ref["best_tokens"] and str(best.uid) == ref["summary"]["best_uid"]
    assert best.cum_logprob == pytest.approx(ref["summary"]["best_cum_logprob"], abs=1e-9)
    assert all(r["h2d_bytes"] == 0 == r["d2h_bytes"] for r in res["rows"])  # nothing offloaded


def test_hf_offload_needs_cuda(compose_cfg, tmp_path):
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match="hf_offload is not allowed with backend.device='cpu'.*CUDA"):
        run(
            compose_cfg(
                "system=hf_offload", "backend=torch", "backend.device=cpu", "model=tiny-opt", output_dir=tmp_path / "hf"
            )
        )
    assert not (tmp_path / "hf" / "run.json").exists()


@pytest.mark.parametrize("backend", ["auto", "sim"])
def test_hf_offload_on_the_simulator_names_the_backend_given(compose_cfg, tmp_path, monkeypatch, backend):
    """Without CUDA, backend=auto resolves to the simulator, which cannot run transformers' cache: the
    error names the value the user gave (auto, not the 'sim' it resolved to) and why auto chose it.
    (Mutation caught: the resolved name in the message.)"""
    from harness import backend as hb
    from harness.errors import ConfigError

    monkeypatch.setattr(hb, "cuda_available", lambda: False)
    with pytest.raises(ConfigError, match=rf"backend='{backend}' is not allowed: torch for system=hf_offload") as e:
        run(compose_cfg("system=hf_offload", f"backend={backend}", "model=tiny-opt", output_dir=tmp_path / "hf"))
    assert ("no CUDA GPU found" in str(e.value)) == (backend == "auto")
    assert not (tmp_path / "hf" / "run.json").exists()


def test_in_gpu_oom_on_a_real_engine_says_it_was_predicted(compose_cfg, tmp_path):
    """in_gpu whose KV exceeds the budget is decided before any step: on torch the record says it was
    predicted, not run, and Fig.9's table writes 'OOM (predicted)' for it (a simulated record stays
    'OOM'). (Mutations caught: oom_predicted not recorded; the table ignoring it; simulated records
    marked too.)"""
    from harness.report import gather_runs
    from systems.kv_offload import report

    for backend in ("torch", "sim"):
        rec = run(
            compose_cfg(
                "system=in_gpu",
                f"backend={backend}",
                "model=tiny-opt",
                "beams=64",
                "gen_len=256",
                "kv_budget=1MiB",
                output_dir=tmp_path / backend,
            )
        )
        assert rec["status"] == "oom" and rec["summary"]["oom_predicted"] is True
        assert "predicted from the budget, not run" in rec["message"]
    df = report.tidy(gather_runs(tmp_path))
    cells = dict(zip(df.simulated, [report._fmt_speed(r) for _, r in df.iterrows()]))
    assert cells == {False: "OOM (predicted)", True: "OOM"}


def test_host_work_benchmark_prints_its_ratios():
    """scripts/bench_engine_host.py at two beams and two tokens, one round: its output, not its timing
    (a benchmark prints ratios; no test times it). Both baselines and the piecewise count appear."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, str(root / "scripts/bench_engine_host.py"), "--beams", "2", "--tokens", "2", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    for line in (
        "ratio ours / transformers (greedy): host time",
        "ratio ours / transformers sampling",
        "piecewise path:",
    ):
        assert line in p.stdout, p.stdout
    bad = subprocess.run(
        [sys.executable, str(root / "scripts/bench_engine_host.py"), "--beams", "0"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--beams 0: at least 1" in bad.stderr


def test_the_stores_buffers_are_never_inference_tensors():
    """The engine's decode runs in inference mode; a buffer the store allocates there (an LBS prefetch
    slot, a layer-wise staging buffer, a host segment or layer) outlives it and is written later outside
    it, which an inference tensor refuses. (Mutation caught: DevicePool.alloc without
    ``inference_mode(False)``.)"""
    from systems.kv_offload.kvstore import HostLayers, HostPool

    pool = DevicePool(torch.device("cpu"), budget=None)
    with torch.inference_mode():
        buf = pool.alloc((2, 3), torch.float32)
        seg = HostPool(2, 1, 4, torch.float32).ensure(0, 5)
        layer = HostLayers(8, 2, 1, 4, torch.float32).layer(0)
    for t in (buf.tensor, seg, layer):
        assert not t.is_inference()
        t.zero_()  # written outside inference mode
