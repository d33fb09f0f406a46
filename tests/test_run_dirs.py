"""Where a job writes: every single run its own folder, an empty results_dir refused."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import ConfigError
from tests.test_exit_status import ROOT

RUN_DIR = re.compile(r"\d{8}-\d{6}\.\d{6}-p(\d+)-lbs-opt-6\.7b")    # <date>-<time>.<microseconds>-p<pid>-<system>-<model>


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    """Two runs started together (as a fast shell loop or a parallel start does): two folders, each
    named by time to the microsecond and the run's process id, each with its own record and log.
    Mutation caught: hydra.run.dir back to ``${now:%Y%m%d-%H%M%S}-...`` (one folder: the later
    run.json replaced the earlier)."""
    cmd = [sys.executable, "run.py", "tracking=none", "progress=false", f"results_dir={tmp_path}"]
    env = dict(os.environ, WANDB_MODE="disabled")
    procs = {b: subprocess.Popen([*cmd, f"beams={b}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for b in (4, 8)}
    for b, p in procs.items():
        assert p.wait(timeout=120) == 0, p.stderr.read()[-2000:]
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(RUN_DIR.fullmatch(f.name) for f in folders), folders
    by_beams = {json.loads((f / "run.json").read_text())["config"]["beams"]: f for f in folders}
    assert sorted(by_beams) == [4, 8]
    for b, f in by_beams.items():
        assert RUN_DIR.fullmatch(f.name).group(1) == str(procs[b].pid)
        assert (f / "run.log").read_text().count("record: ") == 1


@pytest.mark.parametrize("args", [["results_dir="], ["results_dir=null"],
                                  ["-m", "system=lbs,in_gpu", "results_dir=", "sweep_name=t"]])
def test_an_empty_results_dir_exits_2_before_any_folder_is_made(args, tmp_path):
    """``results_dir=`` made every folder at the file system root (/runs/..., /sweeps/...). Run from
    tmp_path as the current directory, so a relative folder (``None/``) would land there. Mutation
    caught: the check left out of OutputDirCheck._check (Hydra makes /runs/<run>, and run() refuses
    only then; ``null``: a folder None/ here)."""
    at_root = {d: Path(d).exists() for d in ("/runs", "/sweeps")}
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), *args, "tracking=none", "progress=false"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, WANDB_MODE="disabled"))
    assert out.returncode == 2, out.stderr[-2000:]
    value = "None" if "results_dir=null" in args else "''"
    assert out.stderr == (f"error: results_dir={value} is not allowed: a folder (records, sweeps and caches go "
                          "under it; leave results_dir out for $TTC_RESULTS_DIR, else <repo>/results)\n")
    assert list(tmp_path.iterdir()) == []
    assert {d: Path(d).exists() for d in at_root} == at_root


def test_run_refuses_an_empty_results_dir(compose_cfg):
    """API callers (output_dir set: no Hydra run dir) get the same error. Mutation caught: the check
    left out of validate_common (the run writes its record, serving caches would go to /cache)."""
    from harness.run import run
    with pytest.raises(ConfigError, match=r"^results_dir='' is not allowed: a folder"):
        run(compose_cfg("system=lbs", "beams=4", "results_dir="))
