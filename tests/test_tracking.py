"""W&B mirror (offline): which runs are opened, and that a sweep's jobs reach W&B as table rows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.tracking import job_gets_own_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "sweep_jobs,simulated,in_multirun,own_run",
    [
        ("auto", True, False, True),  # a single run always gets its W&B run
        ("auto", False, False, True),
        ("auto", True, True, False),  # simulated sweep job -> a row of the sweep's run
        ("auto", False, True, True),  # real-engine sweep job -> its own run
        ("runs", True, True, True),
        ("table", False, True, False),
    ],
)
def test_job_gets_own_run(sweep_jobs, simulated, in_multirun, own_run):
    tracking = OmegaConf.create({"name": "wandb", "mode": "offline", "sweep_jobs": sweep_jobs})
    assert job_gets_own_run(tracking, simulated, in_multirun) is own_run


def test_no_run_when_tracking_is_off():
    for t in (
        {"name": "none", "mode": "disabled", "sweep_jobs": "runs"},
        {"name": "wandb", "mode": "disabled", "sweep_jobs": "runs"},
    ):
        assert not job_gets_own_run(OmegaConf.create(t), simulated=False, in_multirun=False)


def _sweep(tmp_path, *extra):
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=lbs,layerwise",
            "beams=4",
            "gen_len=64",
            "progress=false",
            f"results_dir={tmp_path}",
            "sweep_name=t",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return tmp_path / "sweeps" / "t"


@pytest.mark.slow
def test_simulated_sweep_jobs_reach_wandb_as_rows_of_the_sweep_run(tmp_path):
    sweep = _sweep(tmp_path)
    assert not list(sweep.glob("*/wandb")), "simulated jobs must not open W&B runs of their own"
    runs = list(sweep.glob("wandb/offline-run-*"))
    assert len(runs) == 1
    tables = list(runs[0].glob("files/media/table/runs_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert len(table["data"]) == 2
    col = table["columns"].index("system")
    assert sorted(row[col] for row in table["data"]) == ["layerwise", "lbs"]
    assert "summary.e2e_s" in table["columns"] and "config.workload.beams" in table["columns"]


@pytest.mark.slow
def test_sweep_jobs_runs_gives_every_job_its_own_wandb_run(tmp_path):
    sweep = _sweep(tmp_path, "tracking.sweep_jobs=runs")
    assert len(list(sweep.glob("*/wandb/offline-run-*"))) == 2


def test_bad_sweep_jobs_is_rejected_before_work(tmp_path):
    out = subprocess.run(
        [sys.executable, "run.py", "tracking.sweep_jobs=some", "tracking=wandb", f"results_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "tracking.sweep_jobs='some' is not allowed: one of auto, runs, table" in out.stderr
    assert not list(tmp_path.rglob("run.json"))


@pytest.mark.slow
def test_rerun_of_a_finished_sweep_does_not_log_it_again(tmp_path):
    sweep = _sweep(tmp_path)
    _sweep(tmp_path)  # every job skipped: its valid record exists
    assert len(list(sweep.glob("wandb/offline-run-*"))) == 1


# run.py, then the modules it loaded (written at exit): a simulated run needs none of these
HEAVY = ("torch", "pynvml", "vllm", "pandas", "tqdm", "wandb")
_RUN_AND_LIST = (
    "import atexit, json, runpy, sys\n"
    "out = sys.argv[1]\n"
    "atexit.register(lambda: open(out, 'w').write(json.dumps(sorted(sys.modules))))\n"
    "sys.argv = ['run.py'] + sys.argv[2:]\n"
    "runpy.run_path('run.py', run_name='__main__')\n"
)


def _single_run(tmp_path, wandb_mode):
    """A simulated single run as a user starts it (default tracking: W&B offline); returns its folder
    and the heavy modules its process loaded."""
    env = dict(os.environ, WANDB_MODE=wandb_mode, WANDB_SILENT="true")
    modules = tmp_path / "modules.json"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN_AND_LIST,
            str(modules),
            "system=lbs",
            "beams=4",
            "gen_len=64",
            "progress=false",
            f"results_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    loaded = set(json.loads(modules.read_text()))
    return run_dir, sorted(m for m in HEAVY if m in loaded)


@pytest.mark.slow
def test_a_simulated_single_run_is_mirrored_to_wandb_after_it_returns(tmp_path):
    """The job returns once its record is written, having loaded neither W&B nor torch, NVML, pandas
    or tqdm; a detached process then writes its W&B run with the record's tables (the same rows as
    the parquet files). Mutations caught: no mirror started for a simulated single run (W&B logged
    in-process as before); pandas imported by the TTC runner; NVML asked without the driver's files;
    tqdm imported for a bar that is not drawn."""
    import time

    import pandas as pd

    run_dir, heavy = _single_run(tmp_path, "offline")
    assert heavy == []
    log = run_dir / "wandb" / "mirror.log"
    assert log.exists(), "no background mirror was started"
    deadline = time.time() + 120
    while "mirrored" not in log.read_text() and time.time() < deadline:
        time.sleep(0.5)
    assert "mirrored" in log.read_text(), log.read_text()
    (wb,) = run_dir.glob("wandb/offline-run-*")
    (steps,) = wb.glob("files/media/table/steps_*.table.json")
    table = json.loads(steps.read_text())
    want = pd.read_parquet(run_dir / "steps.parquet")
    assert table["columns"] == list(want.columns) and len(table["data"]) == len(want) == 2


def test_no_mirror_when_wandb_is_disabled(tmp_path):
    """``WANDB_MODE=disabled``: no background process, no W&B folder. Mutation caught: the mirror
    started whatever the mode."""
    run_dir, _ = _single_run(tmp_path, "disabled")
    assert (run_dir / "run.json").exists() and not (run_dir / "wandb").exists()


def _small_lbs_run(*overrides, env=None) -> subprocess.CompletedProcess:
    """``run.py system=lbs beams=4 gen_len=64 progress=false *overrides`` in a subprocess."""
    cmd = [sys.executable, "run.py", "system=lbs", "beams=4", "gen_len=64", "progress=false", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def untracked_run(tmp_path_factory):
    """A simulated single run made with ``tracking=none``: its record and no W&B folder."""
    res = tmp_path_factory.mktemp("untracked")
    out = _small_lbs_run("tracking=none", f"results_dir={res}")
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = (res / "runs").iterdir()
    assert not (run_dir / "wandb").exists()
    return run_dir


def _mirror_by_hand(run_dir, *args, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return subprocess.run(
        [sys.executable, "-m", "harness.tracking", str(run_dir), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**base, "WANDB_SILENT": "true", **env},
    )


@pytest.mark.slow
def test_mirror_by_hand_says_when_nothing_was_mirrored_and_mirrors_with_a_mode(untracked_run, tmp_path):
    """A tracking=none record by hand: exit 2, "not mirrored" and the fix, nothing written (before:
    "mirrored ... to W&B (disabled)", exit 0); ``--mode offline`` mirrors it, over $WANDB_MODE=disabled;
    online without an API key: exit 1 with W&B's reason (before: exit 0 and "mirrored ... (online)").
    Mutations caught: the disabled check removed; --mode not applied to the record's tracking; --mode
    not set over $WANDB_MODE; W&B's failure caught into a NullTracker again (make_tracker)."""
    out = _mirror_by_hand(untracked_run)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        f"error: not mirrored: W&B is disabled for this record (tracking=none, tracking.mode=disabled); "
        f"`python -m harness.tracking {untracked_run} --mode offline` mirrors it anyway\n"
    )
    assert not (untracked_run / "wandb").exists()

    out = _mirror_by_hand(untracked_run, "--mode", "online", HOME=str(tmp_path))  # no API key anywhere
    assert out.returncode == 1 and "mirrored" not in out.stdout
    assert out.stderr.startswith("error: not mirrored: W&B (online) failed: ") and "API key" in out.stderr

    out = _mirror_by_hand(untracked_run, "--mode", "offline", WANDB_MODE="disabled")
    assert out.returncode == 0, out.stderr
    (wb,) = untracked_run.glob("wandb/offline-run-*")
    assert out.stdout == f"mirrored {untracked_run / 'run.json'} to W&B (offline) in {wb}\n"
    (steps,) = wb.glob("files/media/table/steps_*.table.json")
    import pandas as pd

    want = pd.read_parquet(untracked_run / "steps.parquet")
    table = json.loads(steps.read_text())
    assert table["columns"] == list(want.columns) and len(table["data"]) == len(want) == 2


def test_mirror_by_hand_of_a_folder_without_a_record_exits_2(tmp_path, capsys):
    from harness.tracking import main

    assert main([str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {tmp_path}: no run.json here (pass a job's folder, e.g. results/runs/<run>)\n"
    )


def test_mirror_by_hand_of_a_json_that_is_no_runs_record_exits_2(tmp_path, capsys):
    """run.json = {} was a KeyError traceback, exit 1 (QA). Mutation caught: the field check left out."""
    from harness.tracking import main

    (tmp_path / "run.json").write_text("{}")
    assert main([str(tmp_path), "--mode", "offline"]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'run.json'} is not a run's record (it lacks config, status, "
        "backend, system, run_id); pass a job's folder written by run.py\n"
    )


def _online_without_a_key(tmp_path):
    """The environment of a user with tracking.mode=online and no W&B API key anywhere."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return {
        **base,
        "HOME": str(tmp_path / "home"),
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
    }


@pytest.mark.slow
def test_an_online_single_run_that_w_and_b_refuses_says_so_on_the_console(tmp_path):
    """``tracking.mode=online`` without an API key: the run exits 0 with its record (W&B is a
    mirror), and the console says the mirror failed, with W&B's reason and the command that mirrors
    it again; the mirror itself exited 1 (before: exit 0 and nothing said; only mirror.log knew).
    Mutations caught: the online mirror not waited for; its exit status not read."""
    out = _small_lbs_run("tracking.mode=online", f"results_dir={tmp_path / 'r'}", env=_online_without_a_key(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = (tmp_path / "r" / "runs").iterdir()
    assert (run_dir / "run.json").is_file()
    assert (
        "warning: W&B (online) did not mirror this run (exit 1: error: not mirrored: W&B (online) failed: "
        in out.stderr
        and "API key" in out.stderr
    )
    assert f"`python -m harness.tracking {run_dir} --mode online` mirrors it again" in out.stderr


def test_a_tracker_that_cannot_start_is_a_console_warning(tmp_path, monkeypatch, capsys):
    """A real-engine job or a sweep's report opens W&B in-process: when it cannot start the run goes
    on without it, and the console says so (before: a log line only run.log received). Mutation
    caught: the warning logged, not said."""
    from harness import tracking

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(tracking, "WandbTracker", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("No API key")))
    tr = tracking.make_tracker({}, {"name": "wandb", "mode": "online", "project": "p"}, tmp_path, "n")
    assert isinstance(tr, tracking.NullTracker)
    assert (
        "warning: W&B (online) could not start, nothing of this run goes to W&B: No API key" in capsys.readouterr().err
    )


def test_a_wandb_folder_that_cannot_be_made_is_a_warning_with_the_records_exit_status(tmp_path):
    """``<run>/wandb`` that cannot be made (here a file of that name) after the record is written:
    a console warning naming the folder, exit 0 and the record ok (before: a FileExistsError
    traceback from mirror_later after the record). Mutation caught: mirror_later's mkdir outside
    its try (the traceback)."""
    out = tmp_path / "x"
    out.mkdir()
    (out / "run.log").write_text("an earlier run\n")
    (out / "wandb").write_text("not a folder")
    r = subprocess.run(
        [sys.executable, "run.py", "beams=4", "progress=false", f"output_dir={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"warning: W&B: the mirror could not start (File exists: {out / 'wandb'}); the local record is complete" in (
        r.stderr
    )
    assert json.loads((out / "run.json").read_text())["status"] == "ok"


def test_a_tracker_that_fails_after_the_record_is_a_console_warning(capsys):
    """W&B failing while it mirrors a finished job (its disk, its folder) is a warning; the job's
    exit status stays its record's. Mutation caught: log_record without its except (the error
    raised after the record: a traceback, exit 1)."""
    from harness import tracking

    class Failing(tracking.NullTracker):
        def log_summary(self, summary):
            raise OSError(28, "No space left on device")

    tracking.log_record(Failing(), "ok", True, {"x": 1}, {})
    assert "warning: W&B could not mirror this run: OSError: [Errno 28] No space left on device" in (
        capsys.readouterr().err
    )
