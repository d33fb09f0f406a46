"""Real-engine jobs of a sweep run in spawned child processes; a child that dies is recorded."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Loaded by every Python process started with this PYTHONPATH; kills spawned multiprocessing
# children at start-up (a stand-in for a segfault or an OOM kill of the job process).
DIE_IN_SPAWNED_CHILD = """
import os, sys
if os.environ.get("DIE_IN_SPAWNED_CHILD") and "--multiprocessing-fork" in sys.argv:
    os._exit(3)
"""


def test_dead_job_process_is_recorded_and_the_sweep_goes_on(tmp_path):
    sc = tmp_path / "site"
    sc.mkdir()
    (sc / "sitecustomize.py").write_text(DIE_IN_SPAWNED_CHILD)
    env = dict(os.environ, PYTHONPATH=str(sc), DIE_IN_SPAWNED_CHILD="1", WANDB_MODE="disabled")
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=lbs,layerwise",
            "backend=torch",
            "model=tiny-opt",
            "beams=4",
            "step=16",
            "gen_len=32",
            "prompt_len=16",
            "kv_budget=1MiB",
            "progress=false",
            f"results_dir={tmp_path}",
            "sweep_name=t",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 1, out.stderr[-2000:]  # the sweep went on, then says it failed
    recs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("sweeps/t/*/run.json"))]
    assert [r["system"] for r in recs] == ["layerwise", "lbs"]
    for r in recs:
        assert r["status"] == "error"
        assert r["message"] == "job process died (exit code 3) before writing its record"
    assert (tmp_path / "sweeps/t/runs.parquet").exists()


def test_a_dead_jobs_record_says_which_job_it_was(tmp_path):
    """A simulated job whose process died (``isolate=true``): its record names the job as a result's
    record does (``record_header``), so the sweep's summary shows its swept value and ``simulated``.
    Mutation caught: the dead job's record without overrides and backend (the summary's rows had no
    beams column and said ``measured``)."""
    sc = tmp_path / "site"
    sc.mkdir()
    (sc / "sitecustomize.py").write_text(DIE_IN_SPAWNED_CHILD)
    env = dict(os.environ, PYTHONPATH=str(sc), DIE_IN_SPAWNED_CHILD="1", WANDB_MODE="disabled")
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=lbs",
            "beams=4,8",
            "isolate=true",
            "tracking=none",
            "progress=false",
            f"results_dir={tmp_path}",
            "sweep_name=t",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    recs = sorted((json.loads(p.read_text()) for p in tmp_path.glob("sweeps/t/*/run.json")), key=lambda r: r["run_id"])
    assert [(r["status"], r["backend"]["simulated"], r["hardware_profile"]) for r in recs] == [
        ("error", True, "rtx4090")
    ] * 2
    assert sorted(next(o for o in r["overrides"] if o.startswith("beams=")) for r in recs) == ["beams=4", "beams=8"]
    rows = [
        line.split("|")[1:4]
        for line in (tmp_path / "sweeps/t/summary.md").read_text().splitlines()
        if line.startswith("|") and "error" in line
    ]
    assert sorted([c.strip() for c in r] for r in rows) == [["4", "error", "simulated"], ["8", "error", "simulated"]]


def test_isolated_jobs_of_a_parallel_sweep_run(tmp_path):
    """``isolate=true`` in a parallel (joblib, loky workers) sweep of simulated jobs: each job's child
    is spawned from a loky worker, whose process-wide start method is ``loky``; the child must not try
    to set it (it died with "cannot find context for 'loky'", every job recorded as error). Mutation
    caught: ``run_isolated`` starting the child without ``_stdlib_start_method``."""
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=lbs",
            "model=opt-6.7b",
            "beams=4,8",
            "isolate=true",
            "hydra.launcher.n_jobs=2",
            "tracking=none",
            "progress=false",
            f"results_dir={tmp_path}",
            "sweep_name=t",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, WANDB_MODE="disabled"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    recs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("sweeps/t/*/run.json"))]
    assert sorted((r["config"]["workload"]["beams"], r["status"]) for r in recs) == [(4, "ok"), (8, "ok")]
