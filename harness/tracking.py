"""Experiment tracking: W&B (offline by default) mirrors the local record; ``tracking=none`` disables.

Local run.json/parquet files are the source of truth; a W&B failure never fails a run.

A simulated single job takes well under a second; starting W&B takes longer (importing it ~1 s,
``wandb.init`` ~0.7 s of CPU on a 2-core machine). So such a job writes its record, starts
``python -m harness.tracking RUN_DIR`` as a detached process and returns: that process mirrors the
record (config, summary, tables) into the job's W&B run (``RUN_DIR/wandb``, its output in
``RUN_DIR/wandb/mirror.log``) a few seconds later. Real-engine jobs open their W&B run before the
run (W&B samples the host/GPU meanwhile) and log into it in-process. The same command mirrors any
record by hand: ``python -m harness.tracking RUN_DIR`` (``--mode offline`` for a record made with
``tracking=none``); it says whether anything was mirrored and exits 0 only if it was.

Online W&B can fail for reasons of its own (no API key, no network). Such a failure never fails a
run, and it is never silent: a tracker that cannot start is a warning on the console, and in
``online`` mode a single job waits for its mirror (at most :data:`ONLINE_WAIT_S`) and warns when it
exited non-zero.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from harness.logs import say

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent
MIRROR_LOG = Path("wandb") / "mirror.log"  # in the job's folder: the detached mirror's output
ONLINE_WAIT_S = 120.0  # how long a single online job waits for its mirror


class NullTracker:
    def log_summary(self, summary: dict) -> None: ...
    def log_table(self, name: str, df) -> None: ...
    def log_image(self, name: str, path) -> None: ...
    def finish(self, status: str = "ok") -> None: ...


# W&B's host metadata (git, pip, machine) and system-metrics sampler cost ~0.35 CPU-s per run,
# more than a simulated job itself; run.json already records git, packages and the host inventory.
LEAN_SETTINGS = dict(
    x_disable_stats=True,
    x_disable_meta=True,
    x_disable_machine_info=True,
    save_code=False,
    disable_git=True,
    x_save_requirements=False,
    disable_job_creation=True,
)


class WandbTracker(NullTracker):
    def __init__(
        self, cfg_dict: dict, tracking, outdir: Path, name: str, group: str | None, system_metrics: bool = False
    ):
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        settings = dict(console="off", silent=True, **({} if system_metrics else LEAN_SETTINGS))
        self.run = wandb.init(
            project=tracking["project"],
            entity=tracking.get("entity"),
            mode=wandb_mode(tracking),
            dir=str(outdir),
            config=cfg_dict,
            name=name,
            group=group,
            job_type=cfg_dict.get("system", {}).get("name"),
            reinit="finish_previous",
            settings=wandb.Settings(**settings),
        )

    def log_summary(self, summary: dict) -> None:
        for k, v in summary.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                self.run.summary[k] = v

    def log_table(self, name: str, table) -> None:
        """A DataFrame, a list of row dicts or a dict of columns (harness.family.RunResult.tables); its
        first 10,000 rows."""
        if isinstance(table, dict):
            import pandas as pd

            table = pd.DataFrame(table)
        if table is None or not len(table):
            return
        if isinstance(table, list):
            cols = list(table[0])
            self.run.log({name: self.wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in table[:10000]])})
        else:
            self.run.log({name: self.wandb.Table(dataframe=table.head(10000))})

    def log_image(self, name: str, path) -> None:
        self.run.log({name: self.wandb.Image(str(path))})

    def finish(self, status: str = "ok") -> None:
        self.run.finish(exit_code=0 if status in ("ok", "oom", "skipped") else 1)


def tracking_on(tracking) -> bool:
    """Whether ``tracking`` (the config group) mirrors anything to W&B."""
    return tracking is not None and tracking["name"] != "none" and tracking["mode"] != "disabled"


def wandb_mode(tracking) -> str:
    """The W&B mode in effect: ``$WANDB_MODE`` when set, else ``tracking.mode``."""
    return os.environ.get("WANDB_MODE", tracking["mode"])


def job_gets_own_run(tracking, simulated: bool, in_multirun: bool) -> bool:
    """Whether a job opens its own W&B run (``tracking.sweep_jobs``, see harness.config.TrackingConfig).

    Outside a multirun always; in a multirun unless ``sweep_jobs`` is ``table``, or ``auto`` and the
    job is simulated (then harness.callbacks.SweepReport logs it as a row of the sweep's run)."""
    if not tracking_on(tracking):
        return False
    mode = tracking.get("sweep_jobs", "auto")
    return not in_multirun or mode == "runs" or (mode == "auto" and not simulated)


def make_tracker(
    cfg_dict: dict, tracking, outdir: Path, name: str, group: str | None = None, system_metrics: bool = False
):
    """A tracker for the run; falls back to NullTracker (with a warning) if W&B cannot start.

    ``system_metrics``: let W&B sample host/GPU utilisation and collect host metadata (real runs);
    otherwise the run is lean (simulated jobs, sweep reports)."""
    if not tracking_on(tracking):
        return NullTracker()
    try:
        return WandbTracker(cfg_dict, tracking, outdir, name, group, system_metrics)
    except Exception as e:  # tracking is a mirror: never let it fail the run
        say(
            f"W&B ({wandb_mode(tracking)}) could not start, nothing of this run goes to W&B: {e} (the local "
            f"record is complete)",
            warning=True,
        )
        return NullTracker()


def log_record(tracker, status: str, simulated: bool, summary: Dict[str, Any], tables: Dict[str, Any]) -> None:
    """Mirror a finished job into ``tracker``: its summary (with status and whether simulated) and
    tables, then finish the W&B run. A failure of W&B (its folder, its disk) is a console warning:
    the job's record is written by then, and the run's exit status is the record's."""
    try:
        try:
            tracker.log_summary({"status": status, "simulated": simulated, **summary})
            for name, table in tables.items():
                tracker.log_table(name, table)
        finally:
            tracker.finish(status)
    except Exception as e:  # noqa: BLE001 (W&B raises many kinds; tracking is a mirror)
        say(f"W&B could not mirror this run: {type(e).__name__}: {e} (the local record is complete)", warning=True)


def mirror_later(outdir: Path, tracking, name: str, group: Optional[str]) -> Optional[Path]:
    """Start the detached process that mirrors the record in ``outdir`` into its own W&B run (module
    doc); returns its log file, or None when W&B is disabled (``$WANDB_MODE=disabled``) or the
    process could not start (its folder ``outdir/wandb`` cannot be made: a warning). In
    ``online`` mode it waits for that process (:data:`ONLINE_WAIT_S`) and prints a warning when the
    mirror failed or is still running."""
    if wandb_mode(tracking) == "disabled":
        return None
    logfile = Path(outdir).resolve() / MIRROR_LOG
    cmd = [sys.executable, "-m", "harness.tracking", str(logfile.parent.parent), "--name", name]
    try:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(logfile, "ab") as out:
            proc = subprocess.Popen(
                cmd + (["--group", group] if group else []),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    except OSError as e:  # the record is written: a warning, and the run's exit status is the record's
        say(
            f"W&B: the mirror could not start ({e.strerror or e}: {e.filename or logfile}); the local record is "
            f"complete; `python -m harness.tracking {logfile.parent.parent}` mirrors it later",
            warning=True,
        )
        return None
    if wandb_mode(tracking) != "online":
        return logfile
    again = f"`python -m harness.tracking {logfile.parent.parent} --mode online` mirrors it again"
    try:
        rc = proc.wait(timeout=ONLINE_WAIT_S)
    except subprocess.TimeoutExpired:
        say(
            f"W&B (online): the mirror is still running after {ONLINE_WAIT_S:.0f} s; it goes on in the background "
            f"(its output: {logfile})",
            warning=True,
        )
        return logfile
    if rc != 0:
        lines = [ln for ln in logfile.read_text(errors="replace").splitlines() if ln.strip()]
        say(
            f"W&B (online) did not mirror this run (exit {rc}: {lines[-1] if lines else 'no output'}); the local "
            f"record is complete; {again}",
            warning=True,
        )
    return logfile


class MirrorError(RuntimeError):
    """Nothing was mirrored: W&B is off for the record (``disabled``) or could not start or log."""

    def __init__(self, message: str, disabled: bool = False):
        super().__init__(message)
        self.disabled = disabled


def mirror(outdir: Path, name: Optional[str] = None, group: Optional[str] = None, mode: Optional[str] = None) -> str:
    """Mirror the record in ``outdir`` (run.json and its parquet tables) into a new W&B run there,
    named ``name`` (default ``<system>-<run_id>``) in ``group``, as its job would have. ``mode``
    (``offline``/``online``): W&B in this mode whatever the record's tracking (``tracking=none``
    too); it does not override ``$WANDB_MODE`` (:func:`main` sets that). Returns what was done;
    raises MirrorError when nothing was mirrored."""
    import pandas as pd

    outdir = Path(outdir)
    rec = json.loads((outdir / "run.json").read_text())
    cfg = rec["config"]
    tracking = {**cfg["tracking"], **({"name": "wandb", "mode": mode} if mode else {})}
    if not tracking_on(tracking) or wandb_mode(tracking) == "disabled":
        why = (
            f"tracking={tracking['name']}, tracking.mode={tracking['mode']}"
            if not tracking_on(tracking)
            else "$WANDB_MODE=disabled"
        )
        raise MirrorError(
            f"not mirrored: W&B is disabled for this record ({why}); "
            f"`python -m harness.tracking {outdir} --mode offline` mirrors it anyway",
            disabled=True,
        )
    tables = {
        t: pd.read_parquet(outdir / f"{t}.parquet") for t in rec.get("tables", []) if (outdir / f"{t}.parquet").exists()
    }
    try:
        tracker = WandbTracker(cfg, tracking, outdir, name=name or f"{rec['system']}-{rec['run_id']}", group=group)
        log_record(tracker, rec["status"], rec["backend"]["simulated"], rec.get("summary") or {}, tables)
    except Exception as e:  # noqa: BLE001 (W&B raises many kinds; each is reported)
        raise MirrorError(f"not mirrored: W&B ({wandb_mode(tracking)}) failed: {e}") from e
    return f"mirrored {outdir / 'run.json'} to W&B ({wandb_mode(tracking)}) in {Path(tracker.run.dir).parent}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.tracking",
        description="Mirror a run's record (run.json + tables) into a W&B run in its folder.",
    )
    ap.add_argument("run_dir", type=Path, help="the job's folder (holds run.json)")
    ap.add_argument("--name", help="W&B run name (default: <system>-<run folder>)")
    ap.add_argument("--group", help="W&B group (a single run's: its sweep_name)")
    ap.add_argument(
        "--mode",
        choices=("offline", "online"),
        help="W&B mode for this command, over the record's tracking and $WANDB_MODE (default: "
        "the record's tracking.mode, or $WANDB_MODE; a record made with tracking=none needs it)",
    )
    args = ap.parse_args(argv)
    if not (args.run_dir / "run.json").is_file():
        print(
            f"error: {args.run_dir}: no run.json here (pass a job's folder, e.g. results/runs/<run>)", file=sys.stderr
        )
        return 2
    from harness.records import read_record

    rec = read_record(args.run_dir)
    if rec is None:
        print(f"error: {args.run_dir / 'run.json'} is not a record (not a readable JSON object)", file=sys.stderr)
        return 2
    missing = [k for k in ("config", "status", "backend", "system", "run_id") if k not in rec]
    if missing or not isinstance(rec.get("config"), dict) or "tracking" not in rec["config"]:
        print(
            f"error: {args.run_dir / 'run.json'} is not a run's record (it lacks "
            f"{', '.join(missing) or 'config.tracking'}); pass a job's folder written by run.py",
            file=sys.stderr,
        )
        return 2
    if args.mode:
        os.environ["WANDB_MODE"] = args.mode
    try:
        print(mirror(args.run_dir, args.name, args.group, args.mode), flush=True)
    except MirrorError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2 if e.disabled else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
