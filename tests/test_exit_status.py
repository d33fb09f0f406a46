"""What a user's script sees from ``run.py``: exit 0 for a recorded result (ok, oom), exit 1 for a run
whose status is error (its record kept), exit 2 with our message before any work for bad input --
here an output location that cannot be written."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import records
from harness.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent

# Loaded by every Python process started with this PYTHONPATH: the LBS runner fails mid-run (a
# stand-in for any engine bug), after validation passed and the record was started.
FAIL_MID_RUN = """
import os
if os.environ.get("FAIL_MID_RUN"):
    def run(cfg, ctx):
        raise RuntimeError("injected failure mid-run")
    import dataclasses
    import systems.families as f
    f.FAMILIES = tuple(dataclasses.replace(x, run=run) if x.name == "kv_offload" else x for x in f.FAMILIES)
"""


# The same for SIGINT: the LBS runner is interrupted (KeyboardInterrupt, as on Ctrl-C) mid-run.
INTERRUPT_MID_RUN = """
import os
if os.environ.get("INTERRUPT_MID_RUN"):
    def run(cfg, ctx):
        raise KeyboardInterrupt
    import dataclasses
    import systems.families as f
    f.FAMILIES = tuple(dataclasses.replace(x, run=run) if x.name == "kv_offload" else x for x in f.FAMILIES)
"""


# A full disk when the record is written (ENOSPC from the atomic JSON write).
DISK_FULL_AT_RECORD = """
import errno, os
if os.environ.get("DISK_FULL_AT_RECORD"):
    import harness.records as rec
    def full(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    rec.atomic_write_json = full
"""


# SIGINT (or the signal named by $INTERRUPT_AT_RECORD) while the record's tables are written (the
# run's work has ended).
INTERRUPT_AT_RECORD = """
import os, signal
if os.environ.get("INTERRUPT_AT_RECORD"):
    import harness.records as rec
    write = rec.atomic_write_parquet
    def interrupted_write(path, df, *more):
        os.kill(os.getpid(), getattr(signal, os.environ["INTERRUPT_AT_RECORD"], signal.SIGINT))
        return write(path, df, *more)
    rec.atomic_write_parquet = interrupted_write
"""


# SIGTERM mid-run (as `timeout`, `kill` or SLURM's scancel send it): the runner signals itself.
TERMINATE_MID_RUN = """
import os, signal, time
if os.environ.get("TERMINATE_MID_RUN"):
    def run(cfg, ctx):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        raise RuntimeError("SIGTERM was not delivered as an interrupt")
    import dataclasses
    import systems.families as f
    f.FAMILIES = tuple(dataclasses.replace(x, run=run) if x.name == "kv_offload" else x for x in f.FAMILIES)
"""


# SIGINT when the module named by $SIGINT_ON_IMPORT is first imported, or a file whose path ends with
# $SIGINT_ON_OPEN is opened (an audit hook): a Ctrl-C at a known point of the start-up.
INTERRUPT_ON_IMPORT = """
import os, signal, sys
def _hook(event, args):
    if (event == "import" and args[0] == os.environ.get("SIGINT_ON_IMPORT")) or (
            event == "open" and os.environ.get("SIGINT_ON_OPEN") and str(args[0]).endswith(os.environ["SIGINT_ON_OPEN"])):
        os.kill(os.getpid(), signal.SIGINT)
sys.addaudithook(_hook)
"""

# SIGINT in a sweep's report (an ad-hoc sweep's summary), after its jobs were recorded.
INTERRUPT_IN_REPORT = """
import os
if os.environ.get("INTERRUPT_IN_REPORT"):
    import harness.sweep_summary as s
    def write_summary(sweep_dir, runs):
        raise KeyboardInterrupt
    s.write_summary = write_summary
"""


def run_py(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "run.py", *args, "tracking=none", "progress=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, WANDB_MODE="disabled", **(env or {})),
    )


def run_py_patched(tmp_path, patch: str, flag: str, *args, env_value: str = "1"):
    """``run_py(*args)`` with ``patch`` loaded by every Python process it starts (a sitecustomize on
    PYTHONPATH), active where the environment variable ``flag`` is set (it is, to ``env_value``)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(patch)
    return run_py(*args, env={"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", flag: env_value})


@pytest.mark.parametrize("isolate", ["false", "true"])
def test_a_run_with_status_error_exits_1_and_keeps_its_record(tmp_path, isolate):
    """Mutation caught: run.py ignoring the record (EXIT left at 0) -> exit 0 here; run_isolated
    returning None for a child that wrote its record -> the isolate=true case fails."""
    out = run_py_patched(
        tmp_path,
        FAIL_MID_RUN,
        "FAIL_MID_RUN",
        "system=lbs",
        "beams=4",
        f"isolate={isolate}",
        f"results_dir={tmp_path / 'r'}",
    )
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Error executing job" not in out.stderr  # exit 1 by decision, not by a crash
    (rec_path,) = (tmp_path / "r").glob("runs/*/run.json")
    rec = json.loads(rec_path.read_text())
    assert rec["status"] == "error"
    assert rec["message"] == "RuntimeError: injected failure mid-run"


@pytest.mark.parametrize("isolate", ["false", "true"])
def test_an_interrupted_run_is_recorded_and_exits_130(tmp_path, isolate):
    """Ctrl-C mid-run: the record says status interrupted, exit 130, one line saying where the record
    is (no traceback). Mutations caught: _run_once not catching KeyboardInterrupt (no record, a
    traceback); run.py exiting 1."""
    out = run_py_patched(
        tmp_path,
        INTERRUPT_MID_RUN,
        "INTERRUPT_MID_RUN",
        "system=lbs",
        "beams=4",
        f"isolate={isolate}",
        f"results_dir={tmp_path / 'r'}",
    )
    assert out.returncode == 130, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    (rec_path,) = (tmp_path / "r").glob("runs/*/run.json")
    rec = json.loads(rec_path.read_text())
    assert rec["status"] == "interrupted" and rec["message"].startswith("interrupted (SIGINT/Ctrl-C, or SIGTERM)")
    assert f"interrupted: the run's record (status interrupted) is {rec_path}" in out.stderr


@pytest.mark.parametrize("isolate", ["false", "true"])
def test_a_terminated_run_is_recorded_as_interrupted(tmp_path, isolate):
    """SIGTERM mid-run (``timeout``, ``kill``, ``scancel``): recorded as interrupted with the work done,
    exit 130, as Ctrl-C. Mutation caught: no SIGTERM handler (the process died: exit -15, no record;
    a QA report: runs stopped by timeout vanished from the results)."""
    out = run_py_patched(
        tmp_path,
        TERMINATE_MID_RUN,
        "TERMINATE_MID_RUN",
        "system=lbs",
        "beams=4",
        f"isolate={isolate}",
        f"results_dir={tmp_path / 'r'}",
    )
    assert out.returncode == 130, (out.returncode, out.stderr[-2000:])
    (rec_path,) = (tmp_path / "r").glob("runs/*/run.json")
    assert json.loads(rec_path.read_text())["status"] == "interrupted"
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupt_while_the_record_is_written_is_held_until_it_is_whole(tmp_path, sig):
    """Ctrl-C (or SIGTERM) after the run's work, while its tables are written: the tables and run.json
    are written whole (status ok: the work had ended), then exit 130 with one line saying so.
    Mutations caught: _record_job without sigint_held (no run.json, 'no record was written');
    sigint_held not holding SIGTERM."""
    out = run_py_patched(
        tmp_path,
        INTERRUPT_AT_RECORD,
        "INTERRUPT_AT_RECORD",
        "system=lbs",
        "beams=4",
        f"results_dir={tmp_path / 'r'}",
        env_value=sig,
    )
    assert out.returncode == 130, out.stderr[-2000:]
    (rec_path,) = (tmp_path / "r").glob("runs/*/run.json")
    rec = json.loads(rec_path.read_text())
    assert rec["status"] == "ok" and all((rec_path.parent / f"{t}.parquet").exists() for t in rec["tables"])
    assert f"interrupted after the run's work ended: its record (status ok) is {rec_path}" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "at",
    [
        ("SIGINT_ON_IMPORT", "omegaconf"),
        ("SIGINT_ON_IMPORT", "hydra._internal.logging_config"),
        ("SIGINT_ON_IMPORT", "harness.clock_locks"),
        ("SIGINT_ON_OPEN", "/.hydra/overrides.yaml"),
    ],
)
def test_an_interrupt_before_any_job_is_one_line_and_exit_130(tmp_path, at):
    """Ctrl-C while run.py imports its libraries, while Hydra starts, while the task imports the
    harness, and while Hydra writes the new run folder: exit 130, one line, no traceback, no run folder
    left. Mutations caught: no SIGINT handler for the imports, no KeyboardInterrupt handler around
    main() (a traceback, exit 1); the run folder not removed (.hydra/ and run.log left)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(INTERRUPT_ON_IMPORT)
    out = run_py(
        "system=lbs", f"results_dir={tmp_path / 'r'}", env={"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", at[0]: at[1]}
    )
    assert out.returncode == 130, out.stderr[-2000:]
    assert out.stderr == (
        "interrupted while no job was running (start-up or a sweep's report): every record written before is intact\n"
    )
    assert not list((tmp_path / "r").glob("runs/*"))


def test_an_interrupt_in_a_sweeps_report_keeps_its_records(tmp_path):
    """Ctrl-C while an ad-hoc sweep's summary is made: its records and runs.parquet stay, exit 130 with
    one line, no traceback. Mutation caught: no KeyboardInterrupt handler around main()."""
    out = run_py_patched(
        tmp_path,
        INTERRUPT_IN_REPORT,
        "INTERRUPT_IN_REPORT",
        "-m",
        "system=lbs",
        "beams=4,8",
        f"results_dir={tmp_path / 'r'}",
        "sweep_name=t",
    )
    assert out.returncode == 130, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and out.stderr.endswith(
        "interrupted while no job was running (start-up or a sweep's report): every record written before is intact\n"
    )
    d = tmp_path / "r" / "sweeps" / "t"
    assert sorted(json.loads(p.read_text())["status"] for p in d.glob("*/run.json")) == ["ok", "ok"]
    assert (d / "runs.parquet").exists()


def test_an_interrupted_sweep_stops_and_records_only_the_interrupted_job(tmp_path):
    """Ctrl-C in a sweep's first job (joblib's sequential backend): exit 130; the interrupted job is
    recorded as interrupted, the job that did not start gets no record (it was recorded as 'error: job
    failed outside its run'). Mutation caught: the sweeper not catching the launcher's
    KeyboardInterrupt."""
    out = run_py_patched(
        tmp_path,
        INTERRUPT_MID_RUN,
        "INTERRUPT_MID_RUN",
        "-m",
        "system=lbs",
        "beams=4,8",
        "hydra.launcher.n_jobs=1",
        f"results_dir={tmp_path / 'r'}",
        "sweep_name=t",
    )
    assert out.returncode == 130, out.stderr[-2000:]
    assert "sweep interrupted: the records written so far stay in" in out.stderr
    recs = {p.parent.name: json.loads(p.read_text())["status"] for p in (tmp_path / "r").glob("sweeps/t/*/run.json")}
    assert list(recs.values()) == ["interrupted"] and "beams=4" in next(iter(recs))


def test_a_full_disk_at_the_record_is_one_clear_line_and_exit_1(tmp_path):
    """No space left when run.json is written: exit 1 with one line naming the file (no traceback).
    Mutation caught: the OSError handler dropped (a traceback)."""
    out = run_py_patched(
        tmp_path, DISK_FULL_AT_RECORD, "DISK_FULL_AT_RECORD", "system=lbs", "beams=4", f"results_dir={tmp_path / 'r'}"
    )
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert (
        "error: No space left on device writing " in out.stderr
        and "run.json: this run could not be recorded" in out.stderr
    )


def test_an_oom_run_is_a_recorded_result_and_exits_0(tmp_path):
    """Mutation caught: exit_code() returning 1 for oom (status != 'ok') -> exit 1 here."""
    out = run_py("system=in_gpu", "beams=256", f"results_dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-2000:]
    (rec_path,) = tmp_path.glob("runs/*/run.json")
    assert json.loads(rec_path.read_text())["status"] == "oom"


@pytest.mark.parametrize(
    "args,path,key",
    [
        (["hydra.run.dir=/dev/null/x"], "'/dev/null/x' (hydra.run.dir)", "hydra.run.dir"),
        (["results_dir=/dev/null/r"], "'/dev/null/r/runs/", "hydra.run.dir"),
        (
            ["-m", "system=in_gpu,lbs", "results_dir=/dev/null/r", "sweep_name=t"],
            "'/dev/null/r/sweeps/t' (hydra.sweep.dir)",
            "hydra.sweep.dir",
        ),
    ],
)
def test_unwritable_output_location_exits_2_naming_path_and_fix(args, path, key):
    """A path under a file (/dev/null) cannot be created, even by root. Mutations caught: the
    OutputDirCheck callback left out of conf/config.yaml (Hydra's mkdir traceback, exit 1);
    on_multirun_start not checking (the sweep case)."""
    out = run_py(*args)
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr.strip()
    assert err.startswith("error: output directory " + path) and f"({key})" in err
    assert "'/dev/null' is not a directory; pass a writable results_dir=PATH" in err
    assert "Traceback" not in err


def test_check_creatable_refuses_a_read_only_directory_and_creates_nothing(tmp_path, monkeypatch):
    """Tests run as root, which may write into a chmod-read-only directory, so the read-only file
    system is simulated through os.access (what check_creatable asks). Mutation caught: checking
    the target itself instead of its nearest existing ancestor (it does not exist yet)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real_access(p, mode))
    with pytest.raises(
        ConfigError,
        match=r"output directory '.*/ro/a/b' \(results_dir\) cannot be written: "
        r"'.*/ro' is not writable; pass a writable results_dir=PATH",
    ):
        records.check_creatable(ro / "a" / "b")
    assert not (ro / "a").exists()
    records.check_creatable(tmp_path / "fresh" / "x")  # writable ancestor: fine, nothing made
    assert not (tmp_path / "fresh").exists()


def test_unwritable_output_dir_override_is_a_config_error_before_work(compose_cfg):
    """``output_dir=`` (tests, isolated sweep jobs) is checked by run() itself and names its own fix."""
    from harness.run import run

    with pytest.raises(
        ConfigError,
        match=r"output directory '/dev/null/x' \(output_dir\) is not writable "
        r"\(Not a directory\); pass a writable output_dir=PATH",
    ):
        run(compose_cfg("system=lbs", "beams=4", output_dir="/dev/null/x"))


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    "args,env,path,key",
    [
        (["results_dir=/proc/x"], None, "'/proc/x/runs/", "hydra.run.dir"),
        (["results_dir=/sys/foo"], None, "'/sys/foo/runs/", "hydra.run.dir"),
        (["hydra.run.dir=/proc/y"], None, "'/proc/y' (hydra.run.dir)", "hydra.run.dir"),
        ([], {"TTC_RESULTS_DIR": "/proc/q"}, "'/proc/q/runs/", "hydra.run.dir"),
        (
            ["-m", "system=in_gpu,lbs", "hydra.sweep.dir=/proc/s"],
            None,
            "'/proc/s' (hydra.sweep.dir)",
            "hydra.sweep.dir",
        ),
    ],
)
def test_output_location_on_a_pseudo_file_system_exits_2(args, env, path, key):
    """/proc and /sys are directories that root passes os.access(W_OK) on, yet mkdir there fails
    (FileNotFoundError, PermissionError): the check must try making a folder. Mutation caught:
    check_creatable without the trial mkdtemp (os.access only) -> Hydra's chained traceback, exit 1,
    for every form here."""
    out = run_py(*args, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr.strip()
    assert err.startswith("error: output directory " + path) and f"({key}) cannot be written" in err
    assert f"no folder can be made in '/{path.split('/')[1]}'" in err and "pass a writable results_dir=PATH" in err
    assert "Traceback" not in err


def test_a_run_rejected_before_work_leaves_no_run_folder(tmp_path):
    """Hydra makes the run folder (.hydra/, run.log) before our validation; a rejected run removes
    it and the folders above it that the run made (a new results_dir and its runs/), but never a
    folder that existed before. Mutations caught: run.py not calling remove_unused_run_dir (a folder
    with .hydra/ is left); the 'did not exist before' condition dropped (the user's own
    hydra.run.dir is removed); only run.log taken for the job's log; the parents' loop dropped (an
    empty results_dir/runs/ is left); topmost_missing returning the run dir's parent's parent
    regardless (the existing results_dir is removed)."""
    out = run_py("beams=63", f"results_dir={tmp_path / 'r'}")
    assert out.returncode == 2 and out.stderr.startswith("error: beams=63 is not allowed"), out.stderr[-2000:]
    assert not (tmp_path / "r").exists()  # nor the results_dir and runs/ it made
    (tmp_path / "r").mkdir()  # a results_dir that exists stays, empty
    out = run_py("beams=63", "hydra.job.name=x", f"results_dir={tmp_path / 'r'}")  # its log is x.log (QA)
    assert out.returncode == 2 and list((tmp_path / "r").iterdir()) == [], out.stderr[-2000:]
    (tmp_path / "r" / "runs" / "old").mkdir(parents=True)  # runs/ holding another run stays
    out = run_py("beams=63", f"results_dir={tmp_path / 'r'}")
    assert out.returncode == 2 and [p.name for p in (tmp_path / "r" / "runs").iterdir()] == ["old"]
    mine = tmp_path / "mine"
    mine.mkdir()
    out = run_py("beams=63", f"hydra.run.dir={mine}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert (mine / ".hydra").is_dir()
    # '..' through a folder that does not exist yet names an existing folder: it stays (QA: it was
    # deleted, the paths compared as written while mkdir and rmdir follow the real path)
    (tmp_path / "E2" / "runs").mkdir(parents=True)
    out = run_py("beams=63", f"results_dir={tmp_path / 'new10' / '..' / 'E2'}")
    assert out.returncode == 2 and (tmp_path / "E2" / "runs").is_dir(), out.stderr[-2000:]
    (tmp_path / "E3").mkdir()
    out = run_py("beams=63", f"hydra.run.dir={tmp_path / 'new11' / '..' / 'E3'}")
    assert out.returncode == 2 and (tmp_path / "E3").is_dir(), out.stderr[-2000:]


@pytest.mark.parametrize(
    "override,message",
    [
        ("beams=abc", "beams='abc' is not allowed: an integer (sets workload.beams)"),
        ("step=1.5", "step='1.5' is not allowed: an integer (sets workload.step)"),
        ("seed=x", "seed='x' is not allowed: an integer >= 0 (repeats use seeds seed..seed+repeats-1)"),
    ],
)
def test_a_shortcut_of_the_wrong_type_names_the_value_and_the_type(compose_cfg, override, message):
    """Mutations caught: validate_config without its typed-value branch (the message is OmegaConf's
    "workload.beams: While dereferencing interpolation '${first:${beams},16}': ..."); validate_common
    without its seed check (seed=x: int('x') raised mid-run, a traceback and exit 1)."""
    from harness.run import validate_config

    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg("system=lbs", override))
    assert str(e.value) == message


@pytest.mark.parametrize("repeats", [1, 2])
def test_a_run_past_its_deadline_is_recorded_as_timeout_and_exits_0(tmp_path, repeats):
    """A passed system.deadline is a recorded result like oom. Mutations caught: exit_code()
    returning 1 for any status but ok/oom -> exit 1; _combine_repeats without 'timeout' in its
    precedence -> the repeats=2 record says ok though every repeat timed out."""
    out = run_py("system=lbs", "system.deadline=1600000000", f"repeats={repeats}", f"results_dir={tmp_path}")  # 2020-09
    assert out.returncode == 0, out.stderr[-2000:]
    (rec_path,) = tmp_path.glob("runs/*/run.json")
    rec = json.loads(rec_path.read_text())
    assert rec["status"] == "timeout"
    assert [r["status"] for r in rec["repeat_runs"]] == ["timeout"] * repeats


def test_an_interrupt_is_recognised_behind_the_error_raised_while_handling_it():
    """joblib's sequential backend can fail in its own clean-up after Ctrl-C (an AttributeError whose
    context is the KeyboardInterrupt): that is an interrupt, not a lost batch. Mutation caught: not
    following ``__context__``."""
    from hydra_plugins.harness_sweeper import interrupted

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise AttributeError("'Parallel' object has no attribute '_pre_dispatch_amount'")
    except AttributeError as e:
        during = e
    assert interrupted(during) and interrupted(KeyboardInterrupt())
    assert not interrupted(RuntimeError("worker died")) and not interrupted(None)


def test_a_sweep_for_a_cluster_launcher_checks_the_machine_independent_values_first(tmp_path):
    """SLURM/Ray sweeps skip the job's full validation up front (the submitting host may lack the
    devices), but a value wrong on any machine (seed=-1) stops them before submitting: exit 2, no
    job folder. Mutation caught: the sweeper skipping every check for non-local launchers."""
    out = run_py(
        "-m", "hydra/launcher=slurm", "system=lbs", "beams=4,8", "seed=-1", f"results_dir={tmp_path}", "sweep_name=t"
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "seed=-1 is not allowed: an integer >= 0" in out.stderr and "nothing was run" in out.stderr
    assert not list(tmp_path.glob("sweeps/t/*/"))


@pytest.mark.parametrize(
    "args,key",
    [
        (["hydra.run.dir="], "hydra.run.dir"),
        (["-m", "system=lbs", "hydra.sweep.dir="], "hydra.sweep.dir"),
        (["-m", "system=lbs", "sweep_name="], "sweep_name"),
    ],
)
def test_an_empty_run_or_sweep_folder_exits_2(tmp_path, args, key):
    """``hydra.run.dir=`` wrote the run into the current folder, ``hydra.sweep.dir=`` made it the sweep
    (its report collected every run.json below it) and ``sweep_name=`` made results/sweeps itself the
    sweep (QA). Mutation caught: OutputDirCheck not checking for an empty folder / the sweeps root."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            *args,
            "beams=4",
            "tracking=none",
            "progress=false",
            f"results_dir={tmp_path / 'r'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, WANDB_MODE="disabled"),
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"error: {key}='' is not allowed:" in out.stderr
    assert not (tmp_path / "run.json").exists() and not (tmp_path / "r").exists()


def test_a_results_dir_that_is_a_dangling_link_is_exit_2_naming_it(tmp_path):
    """results_dir= a symbolic link to a folder that does not exist: exit 2 before any work, naming
    the link and its target (QA: Hydra's mkdir raised FileExistsError, a traceback and exit 1, also
    for a valid run). Mutation caught: check_creatable walking past the link as if it were missing."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    out = run_py("system=lbs", f"results_dir={link}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "is a symbolic link to" in out.stderr and "which does not exist" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_host_memory_error_is_a_recorded_oom_that_says_what_ran_out(compose_cfg, monkeypatch):
    """numpy/Python's MemoryError() has no message: the record said "host MemoryError: " (QA, FastTTS
    n=1e6). Mutation caught: the bare exception text."""
    from harness.run import run
    from tests.conftest import replace_run

    def out_of_memory(cfg, ctx):
        raise MemoryError()

    replace_run(monkeypatch, "kv_offload", out_of_memory)
    rec = run(compose_cfg("system=lbs", "beams=4"), multirun=False, overrides=[])
    assert rec["status"] == "oom"
    assert rec["message"] == (
        "host MemoryError: this process ran out of host memory (the run's own state, not a modelled KV cache)"
    )


def test_a_deadline_that_is_no_time_exits_2(tmp_path):
    """system.deadline=600 meant "10 minutes" and ran 0 steps, recorded as timeout (QA): a value before
    2020 is refused. Mutation caught: the floor check removed (exit 0, status timeout)."""
    out = run_py("system=lbs", "system.deadline=600", f"results_dir={tmp_path}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr == (
        "error: system.deadline=600 is not allowed: a time as Unix seconds (e.g. $(date -d '+10 min' "
        "+%s)), not a duration: a value before 2020 is none\n"
    )
    assert not list(tmp_path.rglob("run.json"))
