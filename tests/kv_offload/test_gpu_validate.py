"""scripts/gpu_validate.py's CPU dry run (TINY=1): every code path of the GPU run on a tiny model,
through the same shell wrapper as the device call; and the deadline, inside runs and in the script."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from harness.run import run

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_finishes_inside_estimates_and_deadline_and_packs_flat_files(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, TINY="1", OUT=str(out), WORK=str(work), PY=sys.executable, DEADLINE_S="300")
    p = subprocess.run(
        ["bash", "scripts/gpu_validate.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert all(f.is_file() for f in out.iterdir())  # nothing but flat files comes back
    assert len(list(out.iterdir())) <= 8  # a device call returns at most 8
    assert {f.name for f in out.iterdir()} == {
        "results.csv",
        "summary.json",
        "ceilings.json",
        "outputs.tar.gz",
        "runs.tar.gz",
        "log.txt",
        "gpu_state.txt",
    }
    with tarfile.open(out / "outputs.tar.gz") as tf:
        tf.extractall(out / "x")
    for f in (
        "results.csv",
        "estimates.csv",
        "ceilings.json",
        "copy_bw.csv",
        "cpu-measured.yaml",
        "ordering.json",
        "summary.json",
        "groups_bw.csv",
    ):
        assert (out / "x" / f).exists(), f
    log = (out / "log.txt").read_text()
    out = out / "x"
    assert log.index("estimates (s):") < log.index(": ok real")  # estimates printed first
    est, res = pd.read_csv(out / "estimates.csv"), pd.read_csv(out / "results.csv")
    assert len(est) == len(res) == 15  # 13 + the long tier
    budgeted = est[~est.config.str.startswith(("hf_offload", "in_gpu"))]
    assert len(budgeted) == 13 and budgeted.offloads.all()  # every budgeted run offloads
    ran = res[res.status == "ok"]
    assert len(ran) == 14 and set(res.status) == {"ok", "refused"}  # hf_offload needs CUDA
    assert ran.within_estimate.all() and (ran.h2d_real == ran.h2d_sim).all()
    assert set(ran.gen_len) == {32, 64}  # the long tier ran after the ordering check
    assert (ran.host_probe_before_s > 0).all() and (ran.host_probe_after_s > 0).all()  # the host's speed, per run
    lw = ran[(ran.system == "lbs") & (ran.beams == 16) & (ran.step == 16)].set_index("gen_len")
    for g in (32, 64):  # speedup against layer-wise at its own length
        layerwise = ran[(ran.system == "layerwise") & (ran.beams == 16) & (ran.gen_len == g)].real_s.item()
        assert lw.loc[g, "speedup_vs_layerwise"] == pytest.approx(layerwise / lw.loc[g, "real_s"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["total_s"] < 300
    assert json.loads((out / "ordering.json").read_text())["ok"]
    with tarfile.open(out.parent / "runs.tar.gz") as tf:
        names = tf.getnames()
    recs = [n for n in names if n.endswith("run.json") and "/real-" in n]
    assert len(recs) == 14  # hf_offload refused before work
    # every real run carried the script's hard deadline
    rec = json.loads((work / "runs" / "real-lbs-b16-s16-g32" / "run.json").read_text())
    assert rec["config"]["system"]["deadline"] == pytest.approx(summary["deadline_s"] + summary["started_at"], abs=1)


def test_past_the_deadline_configurations_are_skipped_and_outputs_still_packed(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_validate

    rc = gpu_validate.main(
        ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--tiny", "--deadline-s", "0.001"]
    )
    assert rc == 1  # a call that made no real run says so (QA: it exited 0)
    res = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(res) == 15 and res.status.str.startswith("skipped").all()
    with tarfile.open(tmp_path / "out" / "outputs.tar.gz") as tf:
        assert "ordering.json" not in tf.getnames() and "results.csv" in tf.getnames()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "finished: no real run was made"
    assert gpu_validate.main(["--out", str(tmp_path / "o2"), "--tiny", "--deadline-s", "0"]) == 2
    assert not (tmp_path / "o2").exists()  # refused before any folder or work


def test_a_run_stops_at_its_deadline_between_steps_recorded_as_timeout(compose_cfg, tmp_path, monkeypatch):
    """system.deadline: the run stops after the step during which it passed; the record says
    timeout with the steps done (a re-run does not skip it). (Mutation caught: the check removed.)"""
    from systems.kv_offload import runner

    t0 = 1.8e9  # 2027: a time, as system.deadline must be
    clock = iter([t0, t0, t0 + 2000.0, t0 + 2000.0])
    monkeypatch.setattr(runner, "_now", lambda: next(clock))
    rec = run(
        compose_cfg(
            "backend=torch",
            "backend.device=cpu",
            "system=layerwise",
            "model=tiny-opt",
            "model.num_layers=2",
            "beams=4",
            "prompt_len=8",
            "gen_len=16",
            "step=4",
            "kv_budget=128KiB",
            f"system.deadline={t0 + 1000:.0f}",
        )
    )
    assert rec["status"] == "timeout" and "after 2 of 4 steps" in rec["message"]
    assert rec["summary"]["steps_done"] == 2
    from harness.records import load_valid_record

    assert load_valid_record(Path(rec["config"]["output_dir"])) is None


def test_a_setup_that_cannot_even_simulate_stops_before_any_real_run(tmp_path, monkeypatch):
    """When no configuration composes and simulates (a package the device image lacks, e.g. the joblib
    launcher our hydra/launcher extends), the script stops before the real runs and says why,
    instead of spending the device window on runs that fail the same way. (Mutation caught: the
    SetupBroken check removed: every real run is attempted and 'refused'.)"""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_validate

    calls = []

    def broken(overrides):
        calls.append(overrides)
        return {
            "status": "refused",
            "message": "MissingConfigException: could not load hydra/launcher/joblib",
            "summary": {},
        }

    monkeypatch.setattr(gpu_validate, "quiet_run", broken)
    out = tmp_path / "out"
    rc = gpu_validate.main(["--out", str(out), "--work", str(tmp_path / "work"), "--tiny"])
    assert rc == 1
    assert not any("backend=torch" in o for c in calls for o in c)  # no real run was attempted
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"].startswith("failed: SetupBroken") and "hydra/launcher/joblib" in summary["status"]


def test_repeats_dry_run_round_robin_with_probes_and_medians(tmp_path):
    """scripts/gpu_repeat.py (the second device call) on CPU: every picked configuration runs
    --repeats times, round-robin, each row with its CPU seconds and steal; the summary's medians and
    speedup come from those rows; an unknown --only name is exit 2 before any work."""
    out = tmp_path / "out"
    env = dict(
        os.environ,
        SCRIPT="gpu_repeat",
        TINY="1",
        OUT=str(out),
        WORK=str(tmp_path / "work"),
        PY=sys.executable,
        DEADLINE_S="300",
    )
    p = subprocess.run(
        ["bash", "scripts/gpu_validate.sh", "--only", "lbs-b16-s16,layerwise-b16-s16", "--repeats", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert len(list(out.iterdir())) <= 8
    rows = pd.read_csv(out / "repeats.csv")
    assert rows.config.tolist() == [
        "lbs-b16-s16-g32-r0",
        "layerwise-b16-s16-g32-r0",
        "lbs-b16-s16-g32-r1",
        "layerwise-b16-s16-g32-r1",
    ]  # round-robin
    assert (rows.status == "ok").all() and (rows.cpu_s > 0).all() and rows.steal_s.notna().all()
    summ = pd.read_csv(out / "repeats_summary.csv").set_index("config")
    lbs, lw = rows[rows.system == "lbs"].real_s, rows[rows.system == "layerwise"].real_s
    assert summ.loc["lbs-b16-s16-g32", "real_median_s"] == pytest.approx(lbs.median())
    assert summ.loc["lbs-b16-s16-g32", "speedup_vs_layerwise_median"] == pytest.approx(lw.median() / lbs.median())
    bad = subprocess.run(
        [sys.executable, "scripts/gpu_repeat.py", "--out", str(tmp_path / "o2"), "--tiny", "--only", "lbs-b99-s1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "names no configuration" in bad.stderr


def test_the_h200_profile_holds_the_ceilings_measured_on_the_device():
    """conf/hardware/h200.yaml's ceilings are the ones scripts/gpu_validate.sh measured on the lent
    H200 (results/reference/h200/validate-2026-12-04/ceilings.json): its measured: block equals the
    file, the values the simulator uses round them (0.1 %), the datasheet values are kept beside
    them, and the efficiencies are 1.0 (measured rates are achieved rates). (Mutation caught: one
    ceiling edited in the profile.)"""
    from omegaconf import OmegaConf

    prof = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/hardware/h200.yaml"))
    ceil = json.loads((ROOT / "results/reference/h200/validate-2026-12-04/ceilings.json").read_text())
    for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw", "launch_overhead_s"):
        assert prof["measured"][k] == pytest.approx(ceil[k], rel=1e-12), k
        assert prof[k] == pytest.approx(ceil[k], rel=1e-3), k
        assert prof["datasheet"][k] != prof[k], k
    assert prof["measured"]["date"] == ceil["date"]
    assert prof["flops_efficiency"] == prof["mem_efficiency"] == 1.0


@pytest.mark.parametrize(
    "args,message",
    [
        (["--repeats", "0"], "--repeats 0 is not allowed"),
        (["--only", ","], "--only names no configuration"),
        (["--only", "lbs-b99-s1"], "--only names no configuration"),
        (["--deadline-s", "-5"], "--deadline-s -5.0 is not allowed"),
        (["--ceilings", "MISSING"], "not a readable JSON file"),
        (["--ceilings", "NEGATIVE"], "peak_flops, h2d_bw must be numbers > 0"),
    ],
)
def test_repeat_arguments_are_checked_before_any_folder_or_work(tmp_path, args, message):
    """gpu_repeat.py: what would make a device call that runs nothing (no repeat, no configuration,
    a past deadline) or runs it with nonsense ceilings is exit 2 with the reason, before OUT or a
    work folder is made (QA: exit 0 with empty CSVs; a negative ceiling replayed as 'refused').
    (Mutation caught: the ceilings' values unchecked.)"""
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"peak_flops": -1, "mem_bw": 1e12, "h2d_bw": "abc", "d2h_bw": 5e10, "launch_overhead_s": 1e-4})
    )
    args = [str(tmp_path / "nope.json") if a == "MISSING" else str(bad) if a == "NEGATIVE" else a for a in args]
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "scripts/gpu_repeat.py", "--out", str(out), "--tiny", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and message in p.stderr, p.stderr[-2000:]
    assert not out.exists()


def test_repeat_dry_run_defaults_to_the_largest_beam_count_and_cleans_its_work_folder(tmp_path):
    """Without --only the repeats take in_gpu, lbs and layerwise at the setting's largest beam count
    (QA: the GPU's 64-beam names made the CPU dry run exit 2); the default work folder is removed
    once its runs are packed; a relative OUT is taken from where the wrapper was called (QA: it
    landed in the repository)."""
    tmpd = tmp_path / "tmpd"
    tmpd.mkdir()
    env = dict(os.environ, SCRIPT="gpu_repeat", TINY="1", OUT="rel_out", PY=sys.executable, TMPDIR=str(tmpd))
    p = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_validate.sh"), "--repeats", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "rel_out" / "repeats.csv")
    assert rows.config.tolist() == ["in_gpu-b16-s16-g32-r0", "lbs-b16-s16-g32-r0", "layerwise-b16-s16-g32-r0"]
    assert list(tmpd.iterdir()) == []  # the work folder, packed into runs.tar.gz, is gone
    assert (tmp_path / "rel_out" / "runs.tar.gz").exists()


def test_an_out_that_cannot_be_made_is_exit_2_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    env = dict(os.environ, TINY="1", OUT=str(tmp_path / "afile" / "sub"), PY=sys.executable)
    p = subprocess.run(
        ["bash", "scripts/gpu_validate.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 2 and "cannot be made or written" in p.stderr and "Traceback" not in p.stderr
