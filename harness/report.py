"""Sweep reports: gather a sweep's records, read the papers' reference numbers, save figures/tables.

An experiment file names ``report: <module.function>``; at multirun end
:class:`harness.callbacks.SweepReport` calls ``report(sweep_dir, runs, cfg)`` where ``runs`` comes
from :func:`gather_runs`. Paper numbers are read from ``results/reference/<paper>.csv`` (columns
figure, config, metric, value, unit, note) and only ever drawn beside ours.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = ROOT / "results" / "reference"
REFERENCE_COLUMNS = ["figure", "config", "metric", "value", "unit", "note"]


def _flatten(prefix: str, obj: Any, out: Dict[str, Any]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, list):
        out[prefix] = json.dumps(obj)
    else:
        out[prefix] = obj


def record_row(rec: Dict[str, Any], run_dir: Path) -> Dict[str, Any]:
    """One flat row for a run.json: status, system, model, simulated, run_dir, wall_s, finished_at
    (ISO time, UTC), summary.*, config.*."""
    row: Dict[str, Any] = {
        "status": rec.get("status"), "message": rec.get("message", ""),
        "system": rec.get("system"), "model": rec.get("model"),
        "hardware": rec.get("hardware_profile"),
        "simulated": bool(rec.get("backend", {}).get("simulated")),
        "backend": rec.get("backend", {}).get("name"),
        "run_dir": str(run_dir), "wall_s": rec.get("wall_s"), "finished_at": rec.get("finished_at"),
    }
    _flatten("summary", rec.get("summary", {}), row)
    _flatten("config", rec.get("config", {}), row)
    return row


def gather_runs(sweep_dir: Path) -> pd.DataFrame:
    """Every ``run.json`` below ``sweep_dir`` as one row (see :func:`record_row`)."""
    rows = []
    for p in sorted(Path(sweep_dir).rglob("run.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        rows.append(record_row(rec, p.parent))
    return pd.DataFrame(rows)


def load_reference(paper: str, figure: Optional[str] = None) -> pd.DataFrame:
    """The paper's reported numbers (``results/reference/<paper>.csv``), optionally one figure's."""
    path = REFERENCE_DIR / f"{paper}.csv"
    df = pd.read_csv(path, comment="#")
    missing = set(REFERENCE_COLUMNS) - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}; expected {REFERENCE_COLUMNS}")
    if figure is not None:
        df = df[df["figure"] == figure]
    return df.reset_index(drop=True)


def save_figure(fig, sweep_dir: Path, name: str) -> Dict[str, Path]:
    """Save a matplotlib figure as ``<sweep_dir>/<name>.png`` and ``.pdf``; returns both paths."""
    import matplotlib.pyplot as plt
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for ext in ("png", "pdf"):
        p = sweep_dir / f"{name}.{ext}"
        fig.savefig(p, dpi=130, bbox_inches="tight")
        paths[ext] = p
    plt.close(fig)
    return paths


def write_markdown(df: pd.DataFrame, path: Path, title: str = "", notes: str = "",
                   floatfmt: str = ",.4g") -> Path:
    """Write a DataFrame as a markdown table (with an optional title and notes) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = df.to_markdown(index=False, floatfmt=floatfmt) if len(df) else "(no rows)"
    text = (f"# {title}\n\n" if title else "") + body + "\n" + (f"\n{notes}\n" if notes else "")
    path.write_text(text)
    return path


def sim_label(simulated: bool) -> str:
    """Suffix used in tables and legends for simulated values."""
    return " (sim)" if simulated else ""
