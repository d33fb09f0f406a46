"""An ad-hoc sweep (no experiment report) gets summary.md (+ a figure when a swept parameter is
numeric); runs.parquet carries the git SHA, dirty flag, config hash and overrides of every job; the
console names the report's files and lists no jobs up front.

Mutations caught: numeric sweep values sorted as text; overrides not recorded."""
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def test_adhoc_sweep_summary_and_runs_columns(tmp_path):
    p = subprocess.run([sys.executable, "run.py", "-m", "system=lbs,layerwise", "beams=4,16", "gen_len=256",
                        "tracking=none", f"results_dir={tmp_path}", "sweep_name=s"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    d = tmp_path / "sweeps" / "s"
    assert "report: summary.md, summary.pdf, summary.png in" in p.stdout
    assert "sweep: 4 jobs ->" in p.stdout and "#0 :" not in p.stdout          # no up-front job list
    md = (d / "summary.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| l")]
    assert [r.split("|")[1].strip() + r.split("|")[2].strip() for r in rows] == \
        ["layerwise4", "layerwise16", "lbs4", "lbs16"]
    runs = pd.read_parquet(d / "runs.parquet")
    assert runs["git_sha"].str.len().eq(40).all() and runs["config_hash"].str.len().eq(16).all()
    assert set(runs["overrides"].str.split().str[:2].str.join(" ")) == {
        "system=lbs beams=4", "system=lbs beams=16", "system=layerwise beams=4", "system=layerwise beams=16"}
    assert (d / "beams=4,gen_len=256,system=lbs" / "run.log").read_text().count("status=ok") == 1
