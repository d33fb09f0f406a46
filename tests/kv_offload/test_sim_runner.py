"""The TTC runner on the simulated backend: records, plans vs Eq.1-5, bad input, resume."""

import json
import os
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.run import run
from systems.kv_offload.analytic import dm_layerwise, dm_lbs

GiB = 2**30


def _run(compose_cfg, *overrides, **kw):
    return run(compose_cfg("backend=sim", *overrides, **kw))


def test_paper_scale_lbs_intertoken_moves_exactly_eq5(compose_cfg):
    rec = _run(compose_cfg, "system=lbs_intertoken", "model=opt-6.7b", "beams=64", "step=32")
    s = rec["summary"]
    assert rec["status"] == "ok" and rec["backend"]["simulated"] is True
    # assumptions of Eq.4-5: every step needs > 1 group (7 GiB < 64 beams' KV from step 0 on),
    # no prefix sharing, KV_beam evaluated at the step's start
    assert s["groups_per_step"] > 1
    eq5 = dm_lbs(num_layers=32, num_beams=64, kv=16384, prompt_len=128, gen_len=1920, step=32)
    assert s["h2d_bytes"] == eq5 == s["plan_h2d_bytes"]
    assert s["d2h_bytes"] == (128 + 64 * 1920) * 32 * 16384  # prompt + every new token, all layers
    assert s["peak_device_kv_bytes"] <= 7 * GiB


def test_interbeam_moves_less_than_intertoken(compose_cfg, tmp_path):
    a = _run(compose_cfg, "system=lbs_intertoken", "beams=32", "step=64", output_dir=tmp_path / "a")["summary"]
    b = _run(compose_cfg, "system=lbs", "beams=32", "step=64", output_dir=tmp_path / "b")["summary"]
    assert b["h2d_bytes"] < 0.7 * a["h2d_bytes"]
    assert b["e2e_s"] < a["e2e_s"]


def test_layerwise_bytes_equal_eq1_3_at_step_1(compose_cfg, tmp_path):
    """tiny-opt fp32: KV = 2*4*64*4 = 2 KiB per layer-token; 8 beams, prompt 48, 16 generated. Budget
    1 MiB: L = floor(64 / s) = 1 for every s in 48..64 (Eq.1 at s and the plan's reading agree). At
    step 1 the plan moves exactly Eq.3; at step 16 Eq.3 minus the step tail kept on the device (3
    offloaded layers x 8 beams x 0..15 tokens). (Mutation caught: per-token loads of all s tokens
    instead of the step's start.)"""
    eq3 = dm_layerwise(num_layers=4, num_beams=8, kv=2048, mem_gpu=2**20, prompt_len=48, gen_len=16)
    assert eq3 == 3 * 8 * 2048 * sum(range(48, 64))
    for step, expect in ((1, eq3), (16, eq3 - 3 * 8 * 2048 * sum(range(16)))):
        rec = _run(
            compose_cfg,
            "system=layerwise",
            "model=tiny-opt",
            "beams=8",
            f"step={step}",
            "gen_len=16",
            "prompt_len=48",
            "kv_budget=1MiB",
            output_dir=tmp_path / str(step),
        )
        assert rec["summary"]["h2d_bytes"] == expect and rec["summary"]["eq_prediction_bytes"] == eq3


def test_lbs_faster_than_layerwise_and_in_gpu_oom_at_64_beams(compose_cfg, tmp_path):
    lw = _run(compose_cfg, "system=layerwise", "beams=64", output_dir=tmp_path / "lw")
    lbs = _run(compose_cfg, "system=lbs", "beams=64", output_dir=tmp_path / "lbs")
    ing = _run(compose_cfg, "system=in_gpu", "beams=64", output_dir=tmp_path / "ing")
    assert ing["status"] == "oom" and "exceeds the KV budget" in ing["message"]
    assert lw["summary"]["io_share"] > 0.7
    assert lbs["summary"]["io_share"] < 0.2
    assert lw["summary"]["e2e_s"] / lbs["summary"]["e2e_s"] > 3


def test_four_beams_fit_everywhere_and_agree(compose_cfg, tmp_path):
    recs = {
        s: _run(compose_cfg, f"system={s}", "beams=4", output_dir=tmp_path / s)["summary"] for s in ("in_gpu", "lbs")
    }
    assert recs["lbs"]["h2d_bytes"] == 0 == recs["in_gpu"]["h2d_bytes"]
    assert recs["lbs"]["e2e_s"] == pytest.approx(recs["in_gpu"]["e2e_s"], rel=0.01)


def test_record_is_complete_and_matches_printed_table(compose_cfg, capsys):
    rec = _run(compose_cfg, "system=lbs", "beams=16")
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("backend=sim -> SIMULATED")
    for key in ("git", "packages", "inventory", "config", "config_hash", "seed", "backend", "status", "summary"):
        assert key in rec
    on_disk = json.loads((Path(rec["config"]["output_dir"]) / "run.json").read_text())
    assert on_disk["summary"]["e2e_s"] == rec["summary"]["e2e_s"]
    assert f"{rec['summary']['e2e_s']:,.3f} s" in out
    assert (Path(rec["config"]["output_dir"]) / "steps.parquet").exists()


def test_same_seed_same_result_and_resume_skips(compose_cfg, capsys):
    a = _run(compose_cfg, "system=lbs", "beams=16", "seed=3")
    b = _run(compose_cfg, "system=lbs", "beams=16", "seed=3")
    assert "skipping: valid record exists" in capsys.readouterr().out
    assert a["started_at"] == b["started_at"]


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["beams=15"], "beams=15 is not allowed: a positive multiple of beam_width=2"),
        (["step=0"], "step=0 is not allowed"),
        (["step=4000"], "step=4000 is not allowed: an integer in 1..gen_len=1920"),
        (
            ["kv_budget=1MiB"],
            r"kv_budget='1MiB' is not allowed: at least one beam's KV at full length: 1073741824 B \(1024.00 MiB\) for opt-6.7b at 2048 tokens; got 1048576 B",
        ),
        (["kv_budget=7 parsecs"], "kv_budget='7 parsecs' is not a size"),
        (["backend=torch", "backend.device=cuda"], "backend.device='cuda' is not allowed here: no CUDA GPU"),
        (["backend=vllm"], "backend='vllm' is not allowed for system='lbs'"),
        # QA: temperature=0 was a ValueError mid-run on torch; prompt_len=100000 blamed gen_len
        (["workload.temperature=0"], r"workload.temperature=0.0 is not allowed: a sampling temperature > 0"),
        (["prompt_len=2048"], r"prompt_len=2048 is not allowed: an integer below the model's max_position \(2048\)"),
        (
            ["backend=torch", "model=tiny-opt", "model.weights=/nonexistent"],  # QA: an error record after ~10 s
            r"model.weights='/nonexistent' is not allowed: no such directory; allowed: random or a local checkpoint",
        ),
        (
            ["prompt_len=100", "gen_len=1949"],
            r"gen_len=1949 is not allowed: prompt_len \+ gen_len <= the model's max_position",
        ),
    ],
)
def test_bad_input_fails_before_work(compose_cfg, tmp_path, overrides, match):
    cfg = compose_cfg(*overrides, output_dir=tmp_path / "bad")
    with pytest.raises(ConfigError, match=match):
        run(cfg)
    assert not (tmp_path / "bad").exists()


def test_unwritable_results_dir(compose_cfg, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    if os.access(ro, os.W_OK):  # root ignores permissions: use a path under a file
        ro = tmp_path / "file"
        ro.write_text("")
    with pytest.raises(ConfigError, match="is not writable"):
        run(compose_cfg("backend=sim", output_dir=ro / "x"))


def test_failure_mid_run_is_recorded_without_partial_files(compose_cfg, monkeypatch):
    from systems.kv_offload import sim

    def boom(self, plan, tree, beams):
        if plan.step == 2:
            raise RuntimeError("injected failure at step 2")
        return orig(self, plan, tree, beams)

    orig = sim.SimExecutor.execute_step
    monkeypatch.setattr(sim.SimExecutor, "execute_step", boom)
    rec = _run(compose_cfg, "system=lbs", "beams=16")
    assert rec["status"] == "error" and "injected failure at step 2" in rec["message"]
    out = Path(rec["config"]["output_dir"])
    # no partial tables (the job's lock file stays, empty: harness.folders.job_lock)
    assert sorted(p.name for p in out.iterdir()) == [".job.lock", "run.json", "run.log"]
    assert "injected failure at step 2" in (out / "run.log").read_text()  # with its traceback


def test_benchmark_paper_scale_sim_run(benchmark, compose_cfg, tmp_path):
    from harness.backend import Backend
    from harness.family import RunContext
    from harness.tracking import NullTracker
    from systems.kv_offload.runner import run as ttc_run

    cfg = compose_cfg("backend=sim", "system=lbs", "model=opt-6.7b", "beams=64")
    ctx = RunContext(cfg, Backend("sim", "sim", True, ""), tmp_path, NullTracker(), show_progress=False)
    res = benchmark(ttc_run, cfg, ctx)
    assert res.status == "ok"


@pytest.mark.parametrize("system", ["layerwise", "lbs"])
def test_on_a_cpu_profile_every_copy_adds_to_the_step_time(compose_cfg, tmp_path, system):
    """The real engine on a CPU copies synchronously (systems.kv_offload.streams.HostStreams), so its I/O stall
    is all its copy time; the simulator overlapped them as on a GPU (layer-wise stall 0.008 s simulated
    against 1.73 s measured; QA). On a ``kind: cpu`` profile the stall is now every step's bytes over the
    profile's bandwidths; the same profile as a GPU hides part of them. Mutations caught: copies_overlap
    always true; the layer-wise branch ignoring it; group_time's serial sum dropping the write-back."""
    over = (
        f"system={system}",
        "hardware=cpu",
        "model=tiny-opt",
        "backend=sim",
        "beams=8",
        "prompt_len=32",
        "gen_len=64",
        "step=16",
        "kv_budget=2MiB",
    )
    cpu = run(compose_cfg(*over, output_dir=tmp_path / "cpu"))["summary"]
    gpu = run(compose_cfg(*over, "hardware.kind=gpu", output_dir=tmp_path / "gpu"))["summary"]
    hw = compose_cfg(*over).hardware
    copies = cpu["plan_h2d_bytes"] / hw.h2d_bw + cpu["plan_d2h_bytes"] / hw.d2h_bw
    assert cpu["io_stall_s"] == pytest.approx(copies, rel=1e-9)
    assert (gpu["plan_h2d_bytes"], gpu["plan_d2h_bytes"]) == (cpu["plan_h2d_bytes"], cpu["plan_d2h_bytes"])
    assert gpu["io_stall_s"] < 0.9 * copies
    assert cpu["e2e_s"] > gpu["e2e_s"]


def test_the_eq_prediction_of_a_request_that_fits_is_zero_as_the_bytes_moved(compose_cfg, tmp_path):
    """LBS keeps a request that fits its budget resident and moves nothing; its Eq.4-5 prediction said
    125 GiB beside 0 measured (QA). Layer-wise's Eq.1-3 give 0 there by themselves; an overflowing LBS
    run keeps Eq.5. Mutation caught: eq_prediction_bytes = Eq.5 regardless of the fit."""
    fits = run(compose_cfg("system=lbs", "beams=4", "kv_budget=16GiB", output_dir=tmp_path / "a"))["summary"]
    assert (fits["h2d_bytes"], fits["eq_prediction_bytes"]) == (0, 0) and fits["eq5_lbs_bytes"] > 0
    lw = run(compose_cfg("system=layerwise", "beams=4", "kv_budget=16GiB", output_dir=tmp_path / "b"))["summary"]
    assert (lw["h2d_bytes"], lw["eq_prediction_bytes"]) == (0, 0)
    over = run(compose_cfg("system=lbs", "beams=16", output_dir=tmp_path / "c"))["summary"]
    assert over["h2d_bytes"] > 0 and over["eq_prediction_bytes"] == over["eq5_lbs_bytes"]


def test_the_fidelity_tool_runs_its_repeats_as_sweeps_run_py_accepts(tmp_path, monkeypatch):
    """``python -m systems.kv_offload.fidelity`` starts run.py once per repeat; each command must pass
    run.py's own checks (it passed ``sweep_name=lbs_fidelity/rep0``, which the sweep-folder rule
    refuses: the tool exited 2 after minutes of calibration). Here the calibration is skipped and the
    jobs are simulated; the repeats' records land in <results>/sweeps/lbs_fidelity/rep<i>."""
    import subprocess as sp

    from systems.kv_offload import fidelity

    calls = []

    def call(cmd, cwd=None):
        calls.append(cmd)
        if "harness.calibrate" in cmd:
            return 0
        cmd = [("hardware=cpu" if a == "hardware=cpu-calibrated" else a) for a in cmd]
        return sp.run([*cmd, "backend=sim", "gen_len=16", "step=8"], cwd=cwd).returncode

    monkeypatch.setattr(fidelity.subprocess, "call", call)
    assert fidelity.main(["repeats=2", "recalibrate=true", f"results_dir={tmp_path}"]) == 0
    assert len(calls) == 3
    for i in range(2):
        assert len(list((tmp_path / "sweeps" / "lbs_fidelity" / f"rep{i}").glob("*/run.json"))) == 6
