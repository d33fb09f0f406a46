"""What a job prints: its metrics as a table (a single run), or one line (a sweep's job)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Optional

from harness import logs
from harness.backend import Backend
from harness.family import RunResult
from harness.logs import say


def _interval_text(ci: Optional[Dict[str, Any]], key: str, fmt: Callable[[Any], str]) -> str:
    """``[lo, hi]`` of a metric's 95 % interval over repeats, in the metric's format; '' without one."""
    iv = (ci or {}).get(key)
    if not iv or iv.get("half_width") is None or iv["half_width"] != iv["half_width"]:
        return ""
    if iv["half_width"] == 0:
        return f"(all {iv['n']} equal)"
    return f"[{fmt(iv['lo'])}, {fmt(iv['hi'])}] (n={iv['n']})"


def print_line(cfg, backend: Backend, res: RunResult, outdir: Path, ci: Optional[Dict[str, Any]] = None) -> None:
    """One line per job of a sweep (the full table is in the record): system, model, status, the
    first displayed metric (mean and 95 % interval with repeats), the record's path."""
    tag = " [SIMULATED]" if backend.simulated else ""
    head = ""
    if res.display:
        label, key, fmt = res.display[0]
        v = res.summary.get(key)
        interval = _interval_text(ci, key, fmt) if v is not None else ""
        head = f" | {label} {'n/a' if v is None else fmt(v)}" + (f" {interval}" if interval else "")
    msg = f" ({res.message.splitlines()[0][:120]})" if res.message and res.status != "ok" else ""
    say(f"{cfg.system.name} | {cfg.model.name} | status={res.status}{tag}{msg}{head} | {outdir / 'run.json'}")


def print_table(cfg, backend: Backend, res: RunResult, outdir: Path, ci: Optional[Dict[str, Any]] = None) -> None:
    """The job's metrics as a table; with repeats (``ci``: the record's ``summary_ci95``) the value is
    the mean and a column gives the 95 % interval."""
    from rich.console import Console
    from rich.table import Table

    tag = " [SIMULATED]" if backend.simulated else ""
    t = Table(
        title=f"{cfg.system.name} | {cfg.model.name} | {cfg.hardware.name if backend.simulated else 'measured on ' + backend.device.upper()}"
        f" | status={res.status}{tag}",
        show_header=True,
    )
    t.add_column("metric")
    t.add_column(
        ("mean" if ci else "value") + (" (simulated)" if backend.simulated else " (measured)"), justify="right"
    )
    if ci:
        n = max((iv.get("n", 0) for iv in ci.values()), default=0)
        t.add_column(f"95 % interval, {n} repeats", justify="right")
    for label, key, fmt in res.display:
        v = res.summary.get(key)
        t.add_row(label, "n/a" if v is None else fmt(v), *([_interval_text(ci, key, fmt)] if ci else []))
    con = Console(width=110)
    con.print(t)
    for label, key, fmt in res.display:  # the same rows, plain, in run.log
        v = res.summary.get(key)
        logs.log.info("%s: %s", label, "n/a" if v is None else fmt(v))
    if res.message:
        say(f"status {res.status}: {res.message}")
    say(f"record: {outdir / 'run.json'}")
