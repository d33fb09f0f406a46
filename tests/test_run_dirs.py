"""Where a job writes: an empty results_dir refused."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import ConfigError
from tests.test_exit_status import ROOT


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
