"""Sweeps through the Ray and submitit launchers (issue 15): the commands of docs/usage.md, restricted to 6
simulated jobs of the Fig.9 experiment, give the records and runs.parquet of the local launcher, and
a re-run skips the recorded jobs. Ray runs a local cluster started by the sweep (CPU only); the SLURM
path runs through submitit's local executor (same launcher code, jobs as local processes).
Needs the ``cluster`` extra (CI installs it); elsewhere these tests skip without it."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent

# in_gpu at 64 beams does not fit: an oom row beside the ok rows
JOBS = [
    "experiment=lbs_fig9",
    "model=opt-6.7b",
    "system=in_gpu,layerwise,lbs",
    "beams=4,64",
    "step=128",
    "tracking=none",
]
ENV = dict(
    os.environ,
    WANDB_MODE="disabled",
    PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),  # Ray workers import this tree
    RAY_USAGE_STATS_ENABLED="0",  # no usage report sent home
    RAY_AUTH_MODE="disabled",  # no token written to ~/.ray
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
)  # a local-only cluster: Ray binds to the loopback address
# columns that differ between any two sweeps: where and when each job ran
WHERE_WHEN = ["run_dir", "wall_s", "finished_at", "config.results_dir"]


def needs(module: str):
    """Skip without ``module``, except in CI, which installs the cluster extra: there it fails."""
    return pytest.mark.skipif(
        not os.environ.get("CI") and importlib.util.find_spec(module) is None,
        reason=f"{module} is not installed: pip install -e .[cluster]",
    )


def sweep(results_dir: Path, *launcher: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "run.py", "-m", *JOBS, *launcher, f"results_dir={results_dir}"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


def records(results_dir: Path) -> dict:
    """job folder -> run.json, for every job of the sweep."""
    return {p.parent.name: json.loads(p.read_text()) for p in (results_dir / "sweeps/lbs_fig9").glob("*/run.json")}


def runs_table(results_dir: Path) -> pd.DataFrame:
    df = pd.read_parquet(results_dir / "sweeps/lbs_fig9/runs.parquet")
    df["job"] = df["run_dir"].map(lambda d: Path(d).name)
    df["overrides"] = df["overrides"].str.replace(r" ?results_dir=\S+", "", regex=True)  # where, not what
    return df.drop(columns=WHERE_WHEN).sort_values("job").reset_index(drop=True)


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("local")
    sweep(d)
    return d


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher", [pytest.param("ray", marks=needs("ray")), pytest.param("submitit_local", marks=needs("submitit"))]
)
def test_cluster_launcher_records_equal_local_ones_and_rerun_skips(launcher, local_sweep, tmp_path):
    """Mutation: a Ray launcher that composes every job from the first job's overrides (all jobs
    write one folder) fails here."""
    sweep(tmp_path, f"hydra/launcher={launcher}")
    got, want = records(tmp_path), records(local_sweep)
    assert len(want) == 6 and sorted(got) == sorted(want)
    assert {r["status"] for r in want.values()} == {"ok", "oom"}
    for job, rec in want.items():
        assert (got[job]["status"], got[job]["config_hash"], got[job]["summary"]) == (
            rec["status"],
            rec["config_hash"],
            rec["summary"],
        ), job
    pd.testing.assert_frame_equal(runs_table(tmp_path), runs_table(local_sweep))

    sweep(tmp_path, f"hydra/launcher={launcher}")  # the same command again: nothing re-runs
    again = records(tmp_path)
    assert {j: r["finished_at"] for j, r in again.items()} == {j: r["finished_at"] for j, r in got.items()}


@pytest.mark.parametrize(
    "backend,device,cluster_has_gpu,gpu",
    [
        ("sim", "auto", True, False),  # simulated: CPUs only, even on a GPU cluster
        ("torch", "cpu", True, False),  # a real engine on the CPU
        ("vllm", "cuda", False, True),  # asked for CUDA: a GPU (or the job waits for one)
        ("torch", "auto", True, True),
        ("torch", "auto", False, False),
        ("auto", "auto", True, True),  # auto runs the real engine where a GPU is
        ("auto", "auto", False, False),  # ... and the simulator on a CPU-only cluster
    ],
)
def test_ray_job_asks_for_a_gpu_only_when_its_backend_needs_one(backend, device, cluster_has_gpu, gpu):
    """Mutation: dropping the ``backend_name == "sim"`` test (a simulated job on a GPU cluster takes
    a GPU) fails the first case."""
    from hydra_plugins.harness_ray_launcher import needs_gpu

    assert needs_gpu(backend, device, cluster_has_gpu) is gpu


def test_ray_launcher_config_gives_cpu_jobs_no_gpu():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=["hydra/launcher=ray"], return_hydra_config=True)
    res = cfg.hydra.launcher.resources
    assert "num_gpus" not in res.cpu_job and res.cpu_job.num_cpus == 1
    assert res.gpu_job.num_gpus == 1
