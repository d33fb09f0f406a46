"""Sweeps that survive failures (issue 13 items 1 and 8) and stay on Hydra's public API (issue 15)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext

from harness import records
from hydra_plugins.harness_sweeper import FastBasicSweeper

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, WANDB_MODE="disabled")


def test_no_module_of_ours_uses_hydras_private_api():
    """The sweeper, composition cache and launchers use Hydra's public plugin API only, so a Hydra
    upgrade cannot break them silently. Mutation: importing hydra._internal's BasicSweeper again
    fails here."""
    ours = [
        ROOT / "run.py",
        *ROOT.glob("harness/**/*.py"),
        *ROOT.glob("hydra_plugins/**/*.py"),
        *ROOT.glob("systems/**/*.py"),
        *ROOT.glob("workloads/**/*.py"),
        *ROOT.glob("scripts/*.py"),
    ]
    private = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in ours
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.match(r"\s*(from|import)\s+hydra\._internal", line)
    ]
    assert private == []


def test_sweep_goes_on_past_an_error_and_exits_1_after_the_counts(tmp_path):
    """4 jobs: beams=4 with beam width 8 is invalid only in combination (recorded as error, the
    sweep goes on), 64 beams do not fit in GPU memory (oom: a result, not an error). Exit 1, after
    the count per status. Mutations: counting oom as error (the message says 3) or exiting 0 on
    errors fail here."""
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=in_gpu",
            "beams=4,64",
            "workload.beam_width=2,8",
            "tracking=none",
            f"results_dir={tmp_path}",
            "sweep_name=t",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    assert "sweep " + str(tmp_path / "sweeps/t") + ": 4 records (1 ok, 2 oom, 1 error)" in out.stdout
    assert "sweep failed: 1 job(s) with status error" in out.stderr
    runs = pd.read_parquet(tmp_path / "sweeps/t/runs.parquet")
    assert sorted(runs["status"]) == ["error", "ok", "oom", "oom"]
    err = runs[runs["status"] == "error"].iloc[0]
    assert Path(err["run_dir"]).name == "beams=4,system=in_gpu,workload.beam_width=8"
    assert "beams=4 is not allowed: a positive multiple of beam_width=8" in err["message"]
    assert not list(tmp_path.rglob(".hydra"))  # run.json holds each job's config (sweeper point 4)


# --- jobs that fail outside their run: the sweeper records them ---------------------------------


class StubLauncher:
    """Returns ``results`` for the batch, or raises ``error`` (a launcher that lost its jobs)."""

    def __init__(self, results=None, error=None):
        self.results, self.error = results, error

    def launch(self, batch, initial_job_idx):
        if self.error is not None:
            raise self.error
        return self.results


SWEEP_ARGS = ["tracking=none", "sweep_name=t"]


def stub_sweep(tmp_path, launcher, systems="layerwise,lbs", beams="4"):
    """``run.py -m system=layerwise,lbs beams=4 ...`` in this process, jobs launched by ``launcher``."""
    args = [*SWEEP_ARGS, f"results_dir={tmp_path}"]
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        master = compose("config", overrides=args, return_hydra_config=True)
        sweeper = FastBasicSweeper()
        sweeper.setup(
            hydra_context=HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=None),
            task_function=None,
            config=master,
        )
        sweeper._instantiate_launcher = lambda n_jobs: launcher
        sweeper.sweep([f"system={systems}", f"beams={beams}", *args])
    return {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "sweeps/t").glob("*/run.json")}


def test_job_whose_task_raised_is_recorded_as_error(tmp_path):
    """layerwise's task raised before writing a record: an error record with the exception; lbs
    completed and its record stays as it was. Mutation: dropping the sweeper's
    ``_record_failed_job`` call fails here (and the next test)."""
    done = tmp_path / "sweeps/t/beams=4,system=lbs/run.json"
    records.atomic_write_json(done, {"status": "ok", "summary": {"x": 1}})
    failed = JobReturn(overrides=["system=layerwise", "beams=4"], status=JobStatus.FAILED)
    failed.return_value = RuntimeError("disk full")
    recs = stub_sweep(tmp_path, StubLauncher(results=[failed, JobReturn(status=JobStatus.COMPLETED)]))
    assert recs["beams=4,system=layerwise"]["status"] == "error"
    assert recs["beams=4,system=layerwise"]["message"] == "job failed outside its run (RuntimeError: disk full)"
    assert recs["beams=4,system=layerwise"]["system"] == "layerwise"
    assert recs["beams=4,system=lbs"] == {"status": "ok", "summary": {"x": 1}}


def test_jobs_a_launcher_lost_are_recorded_as_error(tmp_path):
    """A launcher that raises (a killed worker process, a lost cluster): every job of its batch
    without a record gets an error record, and the sweep returns instead of crashing. The record
    names the job (``harness.run.error_record``: its overrides, simulated backend, config hash), as
    the sweep's summary reads it. Mutation caught: the record without them (the summary's row was all
    nan and 'measured')."""
    recs = stub_sweep(tmp_path, StubLauncher(error=ConnectionError("cluster gone")))
    assert sorted(recs) == ["beams=4,system=layerwise", "beams=4,system=lbs"]
    assert {r["message"] for r in recs.values()} == {"job failed outside its run (ConnectionError: cluster gone)"}
    for name, r in recs.items():
        assert {"beams=4", f"system={name.rsplit('=', 1)[1]}"} <= set(r["overrides"])
        assert r["backend"]["simulated"] is True and r["hardware_profile"] == "rtx4090" and len(r["config_hash"]) == 16


class RecordingLauncher:
    """Completes every job it is given; remembers which."""

    def __init__(self):
        self.launched = []

    def launch(self, batch, initial_job_idx):
        self.launched += [list(job) for job in batch]
        return [JobReturn(status=JobStatus.COMPLETED) for _ in batch]


def test_jobs_with_a_valid_record_of_their_config_are_not_launched(tmp_path, capsys):
    """The sweeper skips a recorded job before launching it (a fully recorded Fig.9 re-run took
    39 s, 0.15 s per job of Hydra set-up before the job's own check), with the job's own check: lbs
    has a valid record of its config (hashed from Hydra's composition, as ``harness.run.run`` does)
    and is skipped; in_gpu's record has status error, so it is launched and checks itself.
    Mutations caught: hashing the config unresolved or with its hydra node (lbs refused as another
    config's folder); no pre-launch skip (lbs launched)."""
    kept = _record(tmp_path, "lbs")
    _record(tmp_path, "in_gpu", status="error")
    launcher = RecordingLauncher()
    recs = stub_sweep(tmp_path, launcher, systems="lbs,in_gpu")
    assert [job[0] for job in launcher.launched] == ["system=in_gpu"]
    assert recs["beams=4,system=lbs"] == kept
    assert capsys.readouterr().out.count("skipping: valid record exists") == 1


def test_a_job_folder_holding_another_configs_record_stops_the_sweep_before_any_work(tmp_path, capsys):
    """A re-used sweep_name whose job changed in a value not in its folder name: layerwise's folder
    holds the record of the beams=8 config. The sweep exits 2 naming the folder, launches nothing
    and leaves the record and the earlier sweep's multirun.yaml as they were. Mutations caught:
    not comparing the hash (layerwise skipped as recorded: no exit); the sweeper launching it (the
    job would replace the record); multirun.yaml written before the check (overwritten)."""
    other = _record(tmp_path, "layerwise", hashed_beams=8)
    multirun = tmp_path / "sweeps/t/multirun.yaml"
    multirun.write_text("earlier sweep\n")
    launcher = RecordingLauncher()
    with pytest.raises(SystemExit) as e:
        stub_sweep(tmp_path, launcher, systems="lbs,layerwise")
    assert e.value.code == 2 and launcher.launched == []
    folder = tmp_path / "sweeps/t/beams=4,system=layerwise"
    err = capsys.readouterr().err
    assert err.startswith(f"error: hydra.sweep.dir: {str(folder)!r} holds the record of a different config")
    assert f"Pass another folder (another sweep_name=NAME, or hydra.sweep.dir=PATH) or delete {str(folder)!r}" in err
    assert json.loads((folder / "run.json").read_text()) == other
    assert multirun.read_text() == "earlier sweep\n"


def test_recorded_jobs_of_one_config_group_are_each_checked_with_their_own_values(tmp_path):
    """Jobs differing in plain values share one reused config view (``MemoConfigLoader.job_view``):
    beams=4 and beams=8 each have a valid record of their own config, so a re-run launches neither
    (and refuses neither). Mutation caught: ``job_view`` not setting the job's values (beams=8
    checked with beams=4's config: its folder taken for another config's, exit 2)."""
    _record(tmp_path, "lbs", beams=8)
    _record(tmp_path, "lbs", beams=4)
    launcher = RecordingLauncher()
    stub_sweep(tmp_path, launcher, systems="lbs", beams="4,8")
    assert launcher.launched == []


def _record(tmp_path, system, status="ok", beams=4, hashed_beams=None):
    """A run.json in the stub sweep's job folder, with the config hash of ``hashed_beams`` (default:
    the folder's own) from Hydra's composition, as ``harness.run.run`` hashes it."""
    from omegaconf import OmegaConf

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose(
            "config",
            overrides=[f"system={system}", f"beams={hashed_beams or beams}", *SWEEP_ARGS, f"results_dir={tmp_path}"],
        )
    rec = {
        "record_version": records.RECORD_VERSION,
        "status": status,
        "summary": {"x": 1},
        "config_hash": records.config_hash(OmegaConf.to_container(cfg, resolve=True)),
    }
    records.atomic_write_json(tmp_path / f"sweeps/t/beams={beams},system={system}/run.json", rec)
    return rec


# --- kill -9 of the driver mid-sweep, then the same command again -------------------------------


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
def test_killed_sweep_driver_then_rerun_leaves_one_valid_record_per_job(tmp_path):
    """The sweep's driver is killed (SIGKILL) after a few of its 25 jobs; its worker processes stop
    within seconds (they would otherwise run the rest of their chunk beside the re-run and then
    idle for minutes). The same command again: 25 jobs, each with exactly one valid record, the jobs
    recorded before the kill not re-run, no temp file of a killed writer left, runs.parquet with 25
    rows. Mutations: without SweepReport.on_job_start's driver watch the workers outlive the driver
    (fails at 'workers still running'); without the stale temp file clean-up the planted temp
    files stay."""
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        "experiment=lbs_fig9",
        "model=opt-6.7b",
        "step=128",
        "tracking=none",
        f"results_dir={tmp_path}",
    ]
    sweep_dir = tmp_path / "sweeps/lbs_fig9"
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.time() + 240
        while len(list(sweep_dir.glob("*/run.json"))) < 3 and time.time() < deadline and p.poll() is None:
            time.sleep(0.2)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.time() + 120  # a worker still importing under heavy load (load 5+) took over 60 s
        while _group_alive(p.pid) and time.time() < deadline:
            time.sleep(0.5)
        assert not _group_alive(p.pid), "workers still running 120 s after their driver was killed"
    finally:
        if _group_alive(p.pid):
            os.killpg(p.pid, signal.SIGKILL)
    before = {r.parent.name: json.loads(r.read_text())["finished_at"] for r in sweep_dir.glob("*/run.json")}
    assert 3 <= len(before) < 25, "the kill came after the sweep ended: nothing to resume"
    # what a writer killed mid-write leaves: the temp files of atomic writes
    stale = [
        sweep_dir / ".runs.parquet.k1ll3d.tmp",
        sweep_dir / "beams=4,model=opt-6.7b,step=128,system=lbs/.run.json.k1ll3d.tmp",
    ]
    for f in stale:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"half a rec")
        os.utime(f, (time.time() - 60, time.time() - 60))

    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    jobs = [d for d in sweep_dir.iterdir() if d.is_dir()]
    assert len(jobs) == 25
    for d in jobs:
        assert [f.name for f in d.glob("run.json*")] == ["run.json"], d
        assert records.load_valid_record(d) is not None, d
    assert not list(tmp_path.rglob("*.tmp"))
    after = {r.parent.name: json.loads(r.read_text())["finished_at"] for r in sweep_dir.glob("*/run.json")}
    assert {job: after[job] for job in before} == before  # recorded before the kill: skipped
    runs = pd.read_parquet(sweep_dir / "runs.parquet")
    assert len(runs) == 25 and runs["run_dir"].is_unique


def test_memoised_composition_gives_hydras_error_for_a_value_the_config_refuses():
    """A job served from the composition cache whose value does not fit the field's type goes
    through Hydra, which names the override (what an unmemoised sweep says). Mutation: without the
    fallback in MemoConfigLoader.load_sweep_config, OmegaConf's ValidationError escapes instead."""
    from hydra.errors import ConfigCompositionException

    from harness.compose import MemoConfigLoader

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        master = compose("config", overrides=["tracking=none"], return_hydra_config=True)
        memo = MemoConfigLoader.wrap(GlobalHydra.instance().config_loader())
        memo.load_sweep_config(master, ["tracking=none", "workload.beam_width=2"])  # cached
        with pytest.raises(ConfigCompositionException, match="Error merging override workload.beam_width=two"):
            memo.load_sweep_config(master, ["tracking=none", "workload.beam_width=two"])


def test_memoised_composition_keeps_the_schemas_and_struct_mode():
    """A config served from the cache (a copy) is typed and closed like Hydra's: each group's node
    has its schema's type, unknown keys are refused, values are validated. Mutation: caching
    ``OmegaConf.to_container`` and re-creating the config loses the schemas (fails here)."""
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ValidationError

    from harness.compose import MemoConfigLoader

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        loader = GlobalHydra.instance().config_loader()
        master = compose("config", overrides=["tracking=none"], return_hydra_config=True)
        memo = MemoConfigLoader.wrap(loader)
        memo.load_sweep_config(master, ["tracking=none", "beams=4"])
        hits = MemoConfigLoader.hits
        got = memo.load_sweep_config(master, ["tracking=none", "beams=8"])
        want = loader.load_sweep_config(master, ["tracking=none", "beams=8"])
    assert MemoConfigLoader.hits == hits + 1
    assert {k: OmegaConf.get_type(got, k) for k in got} == {k: OmegaConf.get_type(want, k) for k in want}
    assert OmegaConf.is_struct(got) and OmegaConf.is_struct(got.workload)
    with pytest.raises(ConfigAttributeError):
        got.workload.beamz = 4
    with pytest.raises(ValidationError):
        got.workload.beam_width = "two"


def test_check_only_sweep_checks_and_runs_nothing(tmp_path):
    """``$TTC_SWEEP_CHECK_ONLY``: the sweep's up-front checks, then exit 0 with nothing written (no
    multirun.yaml, no job folder); a bad value still exits 2 naming the job. Mutation caught: the
    variable ignored (the sweep ran and wrote its records)."""
    env = dict(os.environ, TTC_SWEEP_CHECK_ONLY="1", WANDB_MODE="disabled")
    cmd = [sys.executable, "run.py", "-m", "system=lbs,layerwise", "beams=4,8", f"results_dir={tmp_path}", *SWEEP_ARGS]
    ok = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "sweep check: 4 jobs; nothing was run" in ok.stdout, ok.stderr[-2000:]
    assert not list(tmp_path.iterdir())
    bad = subprocess.run([*cmd, "seed=-1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: seed=-1 is not allowed")
    assert not list(tmp_path.iterdir())


def failing_report(sweep_dir, runs, cfg):
    """A report that raises (``report=tests.test_sweeps.failing_report``)."""
    raise RuntimeError("the report broke")


def verdict_report(sweep_dir, runs, cfg):
    """A report that writes one verdict (``report=tests.test_sweeps.verdict_report``)."""
    from harness.verdict import Row, write

    write(sweep_dir, [Row(paper="lbs", figure="t", quantity="q", paper_value=1.0, ours=1.0)])


@pytest.mark.parametrize("report,rc", [("failing_report", 1), ("verdict_report", 0)])
def test_a_failed_report_leaves_no_earlier_verdicts_to_collect(tmp_path, report, rc):
    """A failed report left the previous verdicts.csv, which harness.reproduce collected as the
    sweep's (issue 39). The earlier file is set aside before the report runs: a failure leaves it
    out of the collection (kept as .verdicts.previous.csv), a success replaces it. (Mutation
    caught: the set-aside dropped: the stale verdicts.csv stays after the failure.)"""
    sweep = tmp_path / "sweeps" / "v"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("an earlier sweep\n")  # its folder: not someone else's (check_not_foreign)
    (sweep / "verdicts.csv").write_text("figure,metric\nstale,stale\n")
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=in_gpu",
            "beams=4",
            "backend=sim",
            f"report=tests.test_sweeps.{report}",
            "tracking=none",
            f"results_dir={tmp_path}",
            "sweep_name=v",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == rc, out.stderr[-2000:]
    if rc:
        assert not (sweep / "verdicts.csv").exists()
        assert (sweep / ".verdicts.previous.csv").read_text().startswith("figure,metric\nstale")
        assert "earlier report's verdicts are kept in" in out.stderr
    else:
        assert "stale" not in (sweep / "verdicts.csv").read_text() and not (sweep / ".verdicts.previous.csv").exists()
