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
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "--cfg", "job", "--resolve", "tracking=none"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(base, **env),
    )
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


def test_fidelity_tools_write_where_run_py_does(tmp_path, monkeypatch):
    """The fidelity tools find their jobs' records with run.py's results rule (harness.config
    results_dir_of): $TTC_RESULTS_DIR, a results_dir= override (relative: inside the repository, where
    they run run.py), else <repo>/results; systems.verifier_search.fidelity accepts results_dir= (harness.reproduce
    --real passes it: exit 2 before) and writes under <results>/sweeps/tts_fidelity (QA: the tools
    ignored $TTC_RESULTS_DIR). (Mutations caught: the env ignored; a relative value against the
    current directory; results_dir not allowed by the tts tool.)"""
    from harness.cli import tool_args
    from harness.config import results_dir_of
    from systems.verifier_search import fidelity

    monkeypatch.chdir(tmp_path)  # a relative results_dir is not the current directory's
    monkeypatch.setenv("TTC_RESULTS_DIR", str(tmp_path / "env"))
    assert results_dir_of(["repeats=2"]) == tmp_path / "env"
    assert results_dir_of(["results_dir=out/r"]) == ROOT / "out" / "r"
    assert results_dir_of([f"results_dir={tmp_path}"]) == tmp_path
    assert fidelity.out_dir({}) == tmp_path / "env" / "sweeps" / "tts_fidelity"
    assert fidelity.out_dir({"results_dir": str(tmp_path)}) == tmp_path / "sweeps" / "tts_fidelity"
    monkeypatch.delenv("TTC_RESULTS_DIR")
    assert results_dir_of([]) == ROOT / "results"
    assert tool_args([f"results_dir={tmp_path}"], "", fidelity.KEYS) == {"results_dir": str(tmp_path)}
