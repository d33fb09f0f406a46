"""Where a job writes: every single run its own folder, a folder holding the record of another
config never written over (exit 2 before any work), an empty results_dir refused."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import ConfigError
from tests.test_exit_status import ROOT, run_py

RUN_DIR = re.compile(r"\d{8}-\d{6}\.\d{6}-p(\d+)-lbs-opt-6\.7b")  # <date>-<time>.<microseconds>-p<pid>-<system>-<model>


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    """Two runs started together (as a fast shell loop or a parallel start does): two folders, each
    named by time to the microsecond and the run's process id, each with its own record and log.
    Mutation caught: hydra.run.dir back to ``${now:%Y%m%d-%H%M%S}-...`` (one folder: the later
    run.json replaced the earlier)."""
    cmd = [sys.executable, "run.py", "tracking=none", "progress=false", f"results_dir={tmp_path}"]
    env = dict(os.environ, WANDB_MODE="disabled")
    procs = {
        b: subprocess.Popen(
            [*cmd, f"beams={b}"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for b in (4, 8)
    }
    for b, p in procs.items():
        assert p.wait(timeout=120) == 0, p.stderr.read()[-2000:]
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(RUN_DIR.fullmatch(f.name) for f in folders), folders
    by_beams = {json.loads((f / "run.json").read_text())["config"]["beams"]: f for f in folders}
    assert sorted(by_beams) == [4, 8]
    for b, f in by_beams.items():
        assert RUN_DIR.fullmatch(f.name).group(1) == str(procs[b].pid)
        assert (f / "run.log").read_text().count("record: ") == 1


def test_output_dir_is_the_run_folder(tmp_path):
    """``output_dir=PATH`` on the command line: the record, run.log and Hydra's .hydra/ all in PATH,
    nothing under results_dir. Mutation caught: hydra.run.dir not following output_dir (a second
    folder under results_dir/runs holding only .hydra/ and a copy of run.log)."""
    out = tmp_path / "mine"
    r = subprocess.run(
        [
            sys.executable,
            "run.py",
            "tracking=none",
            "progress=false",
            "beams=4",
            f"results_dir={tmp_path / 'results'}",
            f"output_dir={out}",
        ],
        cwd=ROOT,
        env=dict(os.environ, WANDB_MODE="disabled"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert {p.name for p in out.iterdir()} >= {"run.json", "run.log", ".hydra"}
    assert (out / "run.log").read_text().count("record: ") == 1
    assert not (tmp_path / "results" / "runs").exists()


def test_sweeps_started_in_the_same_second_get_their_own_folders(tmp_path):
    """Two ad-hoc sweeps (no sweep_name) started together: each in its own folder, named by time and
    the id of the process that composed it, both jobs of each in it, though they ran in loky worker
    processes (with ``isolate=true`` a third job runs in a child of its own). Mutations caught: the
    default sweep_name without the pid (one folder: a summary mixing both sweeps' jobs); the pid
    resolver not cached (each worker resolved its own pid: jobs scattered over other folders)."""
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        "tracking=none",
        "progress=false",
        "report=null",
        f"results_dir={tmp_path}",
        "hydra.launcher.n_jobs=2",
    ]
    env = dict(os.environ, WANDB_MODE="disabled")
    procs = {
        g: subprocess.Popen(
            [*cmd, f"beams={g}"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for g in ("4,8", "16,32")
    }
    procs["iso"] = subprocess.Popen(
        [*cmd, "beams=4", "isolate=true"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for p in procs.values():
        assert p.wait(timeout=240) == 0, p.stderr.read()[-2000:]
    folders = {f.name: f for f in (tmp_path / "sweeps").iterdir()}
    assert len(folders) == 3, sorted(folders)
    for g, p in procs.items():
        name = next(n for n in folders if n.endswith(f"-p{p.pid}"))
        assert re.fullmatch(rf"\d{{8}}-\d{{6}}-p{p.pid}", name)
        beams = sorted(json.loads(r.read_text())["config"]["beams"] for r in folders[name].glob("*/run.json"))
        assert beams == ([4] if g == "iso" else [int(b) for b in g.split(",")])


def test_a_folder_holding_another_configs_record_is_refused_before_any_work(tmp_path):
    """``hydra.run.dir`` re-used: beams=16 into beams=8's folder exits 2 naming the folder and the
    fix, and leaves its run.json, .hydra/ and run.log as they were; beams=8 again is skipped by
    resume; beams=8 resume=false re-runs the same config in place. Mutations caught: no check in
    run() (and OutputDirCheck) -> the record replaced; OutputDirCheck.on_run_start not checking ->
    Hydra writes beams=16's .hydra/ over the first run's (run() still refuses); the same config also
    refused (the resume=false re-run fails)."""
    d = tmp_path / "x"
    first = run_py(f"hydra.run.dir={d}", "beams=8")
    assert first.returncode == 0, first.stderr[-2000:]
    kept = {p: p.read_bytes() for p in [d / "run.json", d / "run.log", *(d / ".hydra").iterdir()]}
    started = json.loads((d / "run.json").read_text())["started_at"]

    other = run_py(f"hydra.run.dir={d}", "beams=16")
    assert other.returncode == 2, other.stderr[-2000:]
    assert other.stderr.startswith(
        f"error: hydra.run.dir: {str(d)!r} holds the record of a different config "
        "(run.json, status ok, overrides: beams=8 tracking=none progress=false; "
    )
    assert other.stderr.rstrip().endswith(
        f"nothing was run. Pass another folder (hydra.run.dir=PATH) or delete {str(d)!r} to run here"
    )
    assert {p: p.read_bytes() for p in kept} == kept

    same = run_py(f"hydra.run.dir={d}", "beams=8")
    assert same.returncode == 0 and f"skipping: valid record exists ({d / 'run.json'}, status ok)" in same.stdout
    assert json.loads((d / "run.json").read_text())["started_at"] == started

    again = run_py(f"hydra.run.dir={d}", "beams=8", "resume=false")
    assert again.returncode == 0, again.stderr[-2000:]
    rec = json.loads((d / "run.json").read_text())
    assert rec["started_at"] != started and rec["config"]["beams"] == 8


@pytest.mark.parametrize("isolate", [False, True])
def test_run_refuses_an_output_dir_holding_another_configs_record(compose_cfg, tmp_path, isolate):
    """run() (API callers, sweep jobs) and run_isolated() (before it starts the child) refuse too;
    the record stays. Mutations caught: writable_output_dir without check_no_other_record (the
    record replaced); run_isolated without it (the child fails, the parent returns the old record)."""
    from harness.isolation import run_isolated
    from harness.run import run

    out = tmp_path / "job"
    rec = run(compose_cfg("system=lbs", "beams=8", output_dir=out))
    with pytest.raises(
        ConfigError,
        match=rf"^output_dir: '{re.escape(str(out))}' holds the record of a different "
        r"config .* Pass another folder \(output_dir=PATH\)",
    ):
        (run_isolated if isolate else run)(compose_cfg("system=lbs", "beams=16", output_dir=out))
    assert json.loads((out / "run.json").read_text()) == json.loads(json.dumps(rec))


def test_a_sweep_job_never_replaces_another_configs_record(tmp_path):
    """A sweep re-used (sweep_name=t) with a changed value its folder names leave out: refused before
    any work (exit 2, the sweeper's check); with a ``+key=`` override the sweeper cannot check before
    launching, each job refuses itself and its folder keeps the record. The same sweep again resumes
    as before: both jobs skipped, exit 0. Mutation caught: run.py's invalid-job record written over
    the existing run.json (the +tag sweep replaces both records with error records)."""
    base = ["-m", "system=lbs", "beams=4,8", f"results_dir={tmp_path}", "sweep_name=t"]
    first = run_py(*base)
    assert first.returncode == 0, first.stderr[-2000:]
    recs = {p: p.read_bytes() for p in (tmp_path / "sweeps/t").glob("*/run.json")}
    assert len(recs) == 2
    hidden = "hydra.job.config.override_dirname.exclude_keys=[gen_len,tag,tracking,progress,results_dir,sweep_name]"
    changed = run_py(*base, "gen_len=128", hidden)
    assert changed.returncode == 2 and "holds the record of a different config" in changed.stderr, changed.stderr[
        -2000:
    ]
    assert "nothing was run" in changed.stderr and "sweep:" not in changed.stdout
    tagged = run_py(*base, "+tag=x", hidden)
    assert tagged.stderr.count("holds the record of a different config") == 2, tagged.stderr[-2000:]
    assert {p: p.read_bytes() for p in recs} == recs
    again = run_py(*base)
    assert again.returncode == 0 and again.stdout.count("skipping: valid record exists") == 2, again.stderr[-2000:]
    assert {p: p.read_bytes() for p in recs} == recs


@pytest.mark.parametrize(
    "args", [["results_dir="], ["results_dir=null"], ["-m", "system=lbs,in_gpu", "results_dir=", "sweep_name=t"]]
)
def test_an_empty_results_dir_exits_2_before_any_folder_is_made(args, tmp_path):
    """``results_dir=`` made every folder at the file system root (/runs/..., /sweeps/...). Run from
    tmp_path as the current directory, so a relative folder (``None/``) would land there. Mutation
    caught: the check left out of OutputDirCheck._check (Hydra makes /runs/<run>, and run() refuses
    only then; ``null``: a folder None/ here)."""
    at_root = {d: Path(d).exists() for d in ("/runs", "/sweeps")}
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args, "tracking=none", "progress=false"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, WANDB_MODE="disabled"),
    )
    assert out.returncode == 2, out.stderr[-2000:]
    value = "None" if "results_dir=null" in args else "''"
    assert out.stderr == (
        f"error: results_dir={value} is not allowed: a folder (records, sweeps and caches go "
        "under it; leave results_dir out for $TTC_RESULTS_DIR, else <repo>/results)\n"
    )
    assert list(tmp_path.iterdir()) == []
    assert {d: Path(d).exists() for d in at_root} == at_root


def test_run_refuses_an_empty_results_dir(compose_cfg):
    """API callers (output_dir set: no Hydra run dir) get the same error. Mutation caught: the check
    left out of validate_common (the run writes its record, serving caches would go to /cache)."""
    from harness.run import run

    with pytest.raises(ConfigError, match=r"^results_dir='' is not allowed: a folder"):
        run(compose_cfg("system=lbs", "beams=4", "results_dir="))


@pytest.mark.parametrize("text", ["[1, 2]", "{bad", "\xff"])
def test_a_run_json_that_is_no_json_object_is_no_record(tmp_path, text):
    """A run.json holding valid JSON that is not an object (or no JSON) is no record: the folder's
    checks treat it as none (it crashed them with AttributeError, QA), and mirroring it by hand
    exits 2 saying so. Mutation caught: read_record returning any parsed JSON."""
    from harness.records import read_record
    from harness.tracking import main as mirror_main

    (tmp_path / "run.json").write_text(text, encoding="latin-1")
    assert read_record(tmp_path) is None
    assert mirror_main([str(tmp_path)]) == 2


def test_an_error_record_without_a_result_is_no_obstacle(tmp_path):
    """A folder holding another config's record of status error with no summary (a job found invalid,
    lost or dead: ``harness.run.error_record``, which carries a config hash) is replaced as before; one
    of status error that holds a summary (a failed repeat after others that ran) is refused. Mutations
    caught: error records refused like results (the first raises); every error record replaced (the
    second passes)."""
    from harness import records
    from harness.folders import check_no_other_record

    out = tmp_path / "job"
    records.atomic_write_json(out / "run.json", {"status": "error", "config_hash": "a" * 16, "summary": {}})
    check_no_other_record(out, "b" * 16, "hydra.sweep.dir")
    records.atomic_write_json(out / "run.json", {"status": "error", "config_hash": "a" * 16, "summary": {"e2e_s": 1.0}})
    with pytest.raises(ConfigError, match="holds the record of a different config"):
        check_no_other_record(out, "b" * 16, "hydra.sweep.dir")


@pytest.mark.parametrize(
    "backend,simulated", [(["backend=torch", "backend.device=cuda"], False), (["backend=sim"], True)]
)
def test_an_error_record_names_a_backend_it_cannot_resolve_by_the_one_asked_for(
    compose_cfg, tmp_path, backend, simulated
):
    """``error_record`` of a job whose backend does not resolve here (a CUDA device on this CPU machine):
    the record says the backend it asked for and that it is not simulated, with the job's overrides; a
    resolvable one gets the full header. Mutations caught: the fallback's ``== "sim"`` turned into
    ``!= "sim"`` (a real-engine job said simulated); the fallback without overrides."""
    from harness.run import error_record

    cfg = compose_cfg("system=lbs", *backend)
    rec = error_record(cfg, tmp_path / "job", ["system=lbs", *backend], "invalid configuration: x")
    assert rec["backend"]["name"] == cfg.backend.name and rec["backend"]["simulated"] is simulated
    assert rec["overrides"] == ["system=lbs", *backend] and rec["status"] == "error" and rec["summary"] == {}
    assert ("config_hash" in rec) is simulated  # the full header only where the backend resolved


def test_an_unfinished_resume_false_rerun_keeps_the_earlier_record(compose_cfg, tmp_path, monkeypatch):
    """resume=false over a valid record, interrupted: the earlier record and its tables are kept in
    replaced-record/ (a QA report: the interrupted re-run's record replaced the ok one); a sweep's
    summary does not count it; the next run that ends valid removes it. Mutations caught: nothing
    set aside (the ok record lost); the folder not removed once the new record is valid; the
    report's gather reading the set-aside record as a second job."""
    from harness.records import REPLACED_DIR
    from harness.report import gather_runs
    from harness.run import run
    from tests.conftest import replace_run

    out = tmp_path / "sweep" / "job"
    over = ["system=lbs", "beams=4"]
    first = run(compose_cfg(*over, output_dir=out), multirun=False, overrides=[])
    assert first["status"] == "ok"
    with monkeypatch.context() as m:
        replace_run(m, "kv_offload", lambda cfg, ctx: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            run(compose_cfg(*over, "resume=false", output_dir=out), multirun=False, overrides=[])
    kept = out / REPLACED_DIR
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    assert json.loads((kept / "run.json").read_text())["finished_at"] == first["finished_at"]
    assert {p.name for p in kept.iterdir()} == {"run.json", *(f"{t}.parquet" for t in first["tables"])}
    assert len(gather_runs(tmp_path / "sweep")) == 1
    again = run(compose_cfg(*over, output_dir=out), multirun=False, overrides=[])  # resume: the record is not valid
    assert again["status"] == "ok" and not kept.exists()


@pytest.mark.parametrize("name", ["../../escape", "a/b", ".."])
def test_a_sweep_name_that_is_a_path_exits_2_before_any_folder_is_made(name, tmp_path):
    """sweep_name names the sweep's folder under results_dir/sweeps: ``../../escape`` wrote the records
    two folders above it (QA). Mutation caught: the check left out (exit 0, records outside sweeps/)."""
    r = tmp_path / "r"
    out = run_py("-m", "system=lbs", "beams=4", f"sweep_name={name}", f"results_dir={r}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr == (
        f"error: sweep_name={name!r} is not allowed: a name: the sweep's folder under "
        f"{r / 'sweeps'}, no '/' or '..' (leave it out for a timestamp; hydra.sweep.dir=PATH puts "
        "a sweep elsewhere)\n"
    )
    assert not any(tmp_path.rglob("run.json")) and not (tmp_path / "escape").exists()


def test_a_sweep_job_whose_folder_escapes_or_collides_is_refused_before_any_work(tmp_path):
    """Issue 39: ``model.name=../../../../escaped`` wrote both jobs of a sweep to one folder outside it
    (one record lost, exit 0); two jobs differing only in a setting left out of folder names wrote one
    folder. Now a value's path segments are percent-encoded into one folder name inside the sweep
    (harness.config.job_folder_name), and a job whose folder would still not be a folder of its own
    inside the sweep (every override left out of folder names: the sweep's own folder) or would be
    another job's exits 2 naming the job, before anything runs. Mutations caught: the
    inside-the-sweep test dropped; the collision test dropped."""
    from omegaconf import OmegaConf

    from harness.errors import ConfigError
    from harness.folders import check_job_folders

    names = OmegaConf.create({"exclude_keys": ["resume", "sweep_name"], "item_sep": ",", "kv_sep": "="})
    sweep = tmp_path / "sweeps" / "q"
    check_job_folders([["beams=16"], ["beams=64"]], sweep, names)
    check_job_folders([["beams=16", "model.name=../../../../escaped"]], sweep, names)  # one folder, inside
    with pytest.raises(ConfigError, match=r"its folder .*/q is not inside the sweep's folder"):
        check_job_folders([["resume=false"]], sweep, names)
    with pytest.raises(ConfigError, match=r"is also the folder of the job beams=4 resume=false"):
        check_job_folders([["beams=4", "resume=false"], ["beams=4", "resume=true"]], sweep, names)


@pytest.mark.parametrize("name", ["../../../escaped", "a/b", "..", "", "x" * 101, "a\tb"])
def test_a_name_that_would_name_another_folder_exits_2_and_makes_none(tmp_path, name):
    """A run's folder is ``<time>-<system>-<model>``: ``model.name=../../../escaped`` put it outside
    results/runs. Names are one path segment of 1-100 bytes of printable characters (a tab made a
    folder ``...-lbs-a<TAB>b``). Mutations caught: check_names not called before Hydra makes the run
    folder (a folder outside runs/ is left); the printable-characters rule dropped (the tab)."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "system=lbs",
            f"model.name={name}",
            "tracking=none",
            f"results_dir={tmp_path / 'r'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "model.name=" in out.stderr and "is not allowed: a name of 1-100 bytes" in out.stderr
    assert not any(tmp_path.rglob("*")), sorted(tmp_path.rglob("*"))


def test_a_job_folder_name_is_one_safe_name_of_bounded_length():
    """harness.config.job_folder_name (hydra.sweep.subdir): '/', a backslash, '%' and control
    characters percent-encoded (a path value made nested folders, and '../' ones outside the sweep);
    a name over 200 bytes cut with a hash of the whole, so two long names that differ only at their
    end stay two folders; an ordinary name unchanged (every existing sweep keeps its folders).
    Mutations caught: no encoding ('/' kept); the hash of the cut part instead of the whole (the
    two long names collide); no cut (a 300-byte name)."""
    from harness.config import JOB_FOLDER_MAX_BYTES, job_folder_name

    assert job_folder_name("beams=4,system=lbs") == "beams=4,system=lbs"
    assert job_folder_name("workload.path=/d/x.jsonl,a=50%") == "workload.path=%2Fd%2Fx.jsonl,a=50%25"
    assert job_folder_name("model.name=a\tb\\c") == "model.name=a%09b%5Cc"
    long_a, long_b = "x=" + "a" * 300 + "1", "x=" + "a" * 300 + "2"
    fa, fb = job_folder_name(long_a), job_folder_name(long_b)
    assert fa != fb and len(fa.encode()) == len(fb.encode()) == JOB_FOLDER_MAX_BYTES
    assert fa.startswith("x=aaa") and "/" not in fa


def test_a_sweep_over_a_path_value_writes_one_folder_per_job_inside_the_sweep(tmp_path):
    """``-m ... workload.path=/abs/x.jsonl``: each job's folder is one folder directly in the sweep's
    (was nested folders named by the path's parts). Mutation caught: hydra.sweep.subdir back to
    ${hydra.job.override_dirname}."""
    import shutil
    import subprocess
    import sys

    data = tmp_path / "data" / "x.jsonl"
    data.parent.mkdir()
    shutil.copy(ROOT / "tests/fixture_data/math/aime24/test.jsonl", data)
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=fasttts",
            "workload=aime24",
            f"workload.path={data}",
            "n=16,32",
            "workload.num_problems=1",
            "tracking=none",
            "progress=false",
            f"results_dir={tmp_path / 'r'}",
            "sweep_name=p",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    sweep = tmp_path / "r" / "sweeps" / "p"
    records = sorted(p.relative_to(sweep) for p in sweep.rglob("run.json"))
    enc = str(data).replace("/", "%2F")
    assert records == [
        Path(f"n={n},system=fasttts,workload.num_problems=1,workload.path={enc},workload=aime24/run.json")
        for n in (16, 32)
    ]
