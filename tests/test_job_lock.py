"""A job holds its folder while it runs (two processes never write one record), and a run folder is
never a system folder or someone else's (issue 39: two configs started 0.3 s apart into one
``output_dir=`` both exited 0 and one finished record was replaced; ``output_dir=~`` was accepted)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.folders import LOCK_NAME, JobFolderBusy, check_not_foreign, claimed_output_dir, job_lock
from tests.test_exit_status import ROOT, run_py

# Loaded by a run.py process through PYTHONPATH: the LBS runner sleeps SLOW_RUN seconds first (a long
# job), so a second process can be started while the first holds its folder.
SLOW_RUN = """
import os
if os.environ.get("SLOW_RUN"):
    import dataclasses, time
    import systems.families as f
    def _slow(run):
        def slow(cfg, ctx):
            time.sleep(float(os.environ["SLOW_RUN"]))
            return run(cfg, ctx)
        return slow
    f.FAMILIES = tuple(dataclasses.replace(x, run=_slow(x.run)) if x.name == "kv_offload" else x for x in f.FAMILIES)
"""


def _run_args(out: Path, beams: int):
    return [sys.executable, "run.py", "tracking=none", "progress=false", f"beams={beams}", f"output_dir={out}"]


def test_a_second_config_started_while_the_first_runs_in_its_folder_is_refused(tmp_path):
    """The race of the issue, made certain: run A (beams=4, its job slowed to 6 s) holds
    ``output_dir=X``; run B (beams=8) into X while A runs exits 2 naming the folder as in use, and
    writes nothing; A ends ok and X holds A's record. Mutation caught: claimed_output_dir without
    job_lock (B passed the first check, since A had no record yet, ran, exited 0 and its record
    replaced A's, or A's replaced B's)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_RUN)
    out = tmp_path / "x"
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=f"{site}{os.pathsep}{ROOT}")
    a = subprocess.Popen(
        _run_args(out, 4),
        cwd=ROOT,
        env=dict(env, SLOW_RUN="6"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while not (out / "run.log").exists() and time.time() < deadline and a.poll() is None:
            time.sleep(0.1)  # run.log: A holds the lock and its job has begun
        assert a.poll() is None, a.stderr.read()[-2000:]
        b = subprocess.run(_run_args(out, 8), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        a_running_at_b_end = a.poll() is None
    finally:
        a_rc = a.wait(timeout=120)
    assert a_running_at_b_end, "run A ended before run B did: the test proves nothing (a slower machine?)"
    assert b.returncode == 2, b.stderr[-2000:]
    assert f"output_dir: {str(out)!r} is in use: another process runs a job there now" in b.stderr
    assert a_rc == 0, a.stderr.read()[-2000:]
    rec = json.loads((out / "run.json").read_text())
    assert rec["status"] == "ok" and rec["config"]["beams"] == 4
    # B wrote nothing: one job's log in the folder, and its record
    assert (out / "run.log").read_text().count("record: ") == 1


def test_the_folder_is_checked_again_once_held(tmp_path, monkeypatch):
    """A record of another config written while the job waited for the folder (the other process
    ended between the first check and the lock) is refused, not replaced. Mutation caught: the
    check_no_other_record call under the lock dropped (the job would run over the record)."""
    from omegaconf import OmegaConf

    import harness.folders as hf

    out = tmp_path / "x"
    cfg = OmegaConf.create({"output_dir": str(out)})
    real_lock = hf.job_lock

    def lock_then_other_record(outdir, key):
        (outdir / "run.json").write_text(
            json.dumps({"record_version": 1, "config_hash": "a" * 16, "status": "ok", "summary": {"x": 1}})
        )
        return real_lock(outdir, key)

    monkeypatch.setattr(hf, "job_lock", lock_then_other_record)
    with pytest.raises(ConfigError, match="holds the record of a different config"):
        with claimed_output_dir(cfg, "b" * 16):
            pytest.fail("the job ran over another config's record")


def test_job_lock_is_held_for_the_block_and_released_after(tmp_path):
    """While one holder has the folder, a second is refused (JobFolderBusy, naming the setting);
    after the block, the folder can be held again. Mutations caught: the lock not released (the
    second ``with`` fails); a timeout that waits instead of refusing (this test would hang)."""
    with job_lock(tmp_path, "output_dir"):
        assert (tmp_path / LOCK_NAME).exists()
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from harness.folders import job_lock\n"
                "try:\n    with job_lock(Path(sys.argv[1]), 'output_dir'): sys.exit(0)\n"
                "except Exception as e:\n    print(type(e).__name__, e); sys.exit(3)",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 3 and proc.stdout.startswith("JobFolderBusy output_dir:"), proc.stdout + proc.stderr
    with job_lock(tmp_path, "output_dir"):
        pass


@pytest.mark.parametrize("isolate", ["false", "true"])
def test_a_held_folder_gets_no_error_record_from_a_sweep_job(tmp_path, isolate):
    """A sweep job whose folder another process holds (running that job now) writes nothing there,
    not even the error record an invalid job gets (it could land over the other's record); the
    sweep goes on with its other jobs. Also with the job in a child process of its own
    (``isolate=true``, as real-engine jobs run). Mutations caught: _record_invalid_sweep_job not
    excepting JobFolderBusy (an error record in the held folder); run_isolated not knowing the
    child's BUSY_EXIT (the parent recorded 'job process died')."""
    sweep = tmp_path / "sweeps" / "s"
    held = sweep / "beams=4"
    held.mkdir(parents=True)
    with job_lock(held, "hydra.sweep.dir"):
        r = subprocess.run(
            [
                sys.executable,
                "run.py",
                "-m",
                "beams=4,8",
                "sweep_name=s",
                f"isolate={isolate}",
                "tracking=none",
                "progress=false",
                f"results_dir={tmp_path}",
            ],
            cwd=ROOT,
            env=dict(os.environ, WANDB_MODE="disabled"),
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert "is in use: another process runs a job there now" in r.stderr, r.stderr[-2000:]
    assert not (held / "run.json").exists()
    assert json.loads((sweep / "beams=8" / "run.json").read_text())["status"] == "ok"


@pytest.mark.parametrize("where", ["home", "root", "top", "foreign"])
def test_output_dir_is_never_a_system_folder_or_someone_elses(tmp_path, monkeypatch, where):
    """``output_dir=`` the home folder, ``/``, a folder directly under ``/`` or a non-empty folder
    holding no run of ours exits 2 before Hydra writes anything there; the files in it are as they
    were. Mutations caught: check_not_foreign not called by OutputDirCheck (Hydra's .hydra/ and the
    run's files written among the user's); its system-folder test dropped (home and / pass)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    folder = {"home": home, "root": Path("/"), "top": Path("/srv"), "foreign": home}[where]
    env = {"HOME": str(home)}
    if where == "foreign":
        folder = tmp_path / "papers"
        folder.mkdir()
        (folder / "draft.tex").write_text("mine")
    before = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None
    out = run_py("beams=4", f"output_dir={folder}", f"results_dir={tmp_path / 'r'}", env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    what = "a system folder" if where != "foreign" else "a folder that is not empty and holds no run or sweep of ours"
    assert f"error: output_dir: {str(folder)!r} is {what}" in out.stderr, out.stderr[-2000:]
    if before is not None:
        assert sorted(p.name for p in folder.iterdir()) == before
    assert not (tmp_path / "r").exists()


def test_an_empty_folder_or_an_earlier_runs_folder_is_accepted(tmp_path):
    """A new folder, an empty one and one an earlier run wrote (its run.log only: a run killed
    before its record) pass; so does a sweep folder (multirun.yaml). Mutation caught: 'ours' judged
    by run.json alone (a run killed before its record could not be run again in its folder)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "run.log").write_text("started\n")
    swept = tmp_path / "sweep"
    swept.mkdir()
    (swept / "multirun.yaml").write_text("x: 1\n")
    for folder in (tmp_path / "new", empty, killed, swept):
        check_not_foreign(folder, "output_dir")
    assert JobFolderBusy.__mro__[1] is ConfigError  # exit 2 in run.py, as every bad input


@pytest.mark.parametrize("multirun", [False, True])
def test_a_folder_that_is_a_link_loop_is_named_as_such(tmp_path, multirun):
    """``output_dir=`` (or ``hydra.sweep.dir=``) a symbolic link to itself: exit 2 naming the link
    (before: Path.resolve's 'Symlink loop' RuntimeError in our check, then Hydra's FileExistsError
    traceback, exit 1). Mutation caught: check_creatable called after the checks that resolve the
    path."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    args = ["-m", f"hydra.sweep.dir={loop}", "beams=4"] if multirun else [f"output_dir={loop}"]
    out = run_py(*args, f"results_dir={tmp_path / 'r'}")
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith(f"error: output directory {str(loop)!r} ({key}) cannot be written: {str(loop)!r} is a")
