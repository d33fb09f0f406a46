"""Where records go: results_dir defaults to the repository's results/ from any current directory
(the same folder harness.reproduce uses), $TTC_RESULTS_DIR overrides it."""
import os
import subprocess
import sys
from pathlib import Path

import yaml

from harness import reproduce

ROOT = Path(__file__).resolve().parent.parent


def _results_dir(cwd: Path, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k != "TTC_RESULTS_DIR"}
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), "--cfg", "job", "--resolve", "tracking=none"],
                         cwd=cwd, capture_output=True, text=True, timeout=120, env=dict(base, **env))
    assert out.returncode == 0, out.stderr[-2000:]
    return yaml.safe_load(out.stdout)["results_dir"]


def test_results_dir_is_the_repositorys_from_any_directory_unless_the_env_names_one(tmp_path, monkeypatch):
    """run.py and harness.reproduce agree; an exported but empty $TTC_RESULTS_DIR counts as unset
    (it made every folder at the file system root: /runs/...). Mutations caught: conf/config.yaml's
    default back to a bare ``results`` (relative to the current directory: 'results' here, not
    <repo>/results); back to ``oc.env`` (the empty variable gives results_dir '')."""
    monkeypatch.delenv("TTC_RESULTS_DIR")
    assert _results_dir(tmp_path) == str(ROOT / "results") == str(reproduce.default_results_dir())
    monkeypatch.setenv("TTC_RESULTS_DIR", "")
    assert _results_dir(tmp_path, TTC_RESULTS_DIR="") == str(ROOT / "results") == str(reproduce.default_results_dir())
    monkeypatch.setenv("TTC_RESULTS_DIR", str(tmp_path / "r"))
    assert _results_dir(tmp_path, TTC_RESULTS_DIR=str(tmp_path / "r")) == str(tmp_path / "r")
    assert reproduce.default_results_dir() == tmp_path / "r"
