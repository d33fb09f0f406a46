"""Experiment tracking: W&B (offline by default) mirrors the local record; ``tracking=none`` disables.

Local run.json/parquet files are the source of truth; a W&B failure never fails a run.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class NullTracker:
    def log_summary(self, summary: dict) -> None: ...
    def log_table(self, name: str, df) -> None: ...
    def log_image(self, name: str, path) -> None: ...
    def finish(self, status: str = "ok") -> None: ...


# W&B's host metadata (git, pip, machine) and system-metrics sampler cost ~0.35 CPU-s per run,
# more than a simulated job itself; run.json already records git, packages and the host inventory.
LEAN_SETTINGS = dict(x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                     save_code=False, disable_git=True, x_save_requirements=False, disable_job_creation=True)


class WandbTracker(NullTracker):
    def __init__(self, cfg_dict: dict, tracking, outdir: Path, name: str, group: str | None,
                 system_metrics: bool = False):
        import wandb
        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        mode = os.environ.get("WANDB_MODE", tracking.mode)
        settings = dict(console="off", silent=True, **({} if system_metrics else LEAN_SETTINGS))
        self.run = wandb.init(project=tracking.project, entity=tracking.entity, mode=mode,
                              dir=str(outdir), config=cfg_dict, name=name, group=group,
                              job_type=cfg_dict.get("system", {}).get("name"), reinit="finish_previous",
                              settings=wandb.Settings(**settings))

    def log_summary(self, summary: dict) -> None:
        for k, v in summary.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                self.run.summary[k] = v

    def log_table(self, name: str, df) -> None:
        if df is not None and len(df):
            self.run.log({name: self.wandb.Table(dataframe=df.head(10000))})

    def log_image(self, name: str, path) -> None:
        self.run.log({name: self.wandb.Image(str(path))})

    def finish(self, status: str = "ok") -> None:
        self.run.finish(exit_code=0 if status in ("ok", "oom", "skipped") else 1)


def tracking_on(tracking) -> bool:
    """Whether ``tracking`` (the config group) mirrors anything to W&B."""
    return tracking is not None and tracking.name != "none" and tracking.mode != "disabled"


def job_gets_own_run(tracking, simulated: bool, in_multirun: bool) -> bool:
    """Whether a job opens its own W&B run (``tracking.sweep_jobs``, see harness.config.TrackingConfig).

    Outside a multirun always; in a multirun unless ``sweep_jobs`` is ``table``, or ``auto`` and the
    job is simulated (then harness.callbacks.SweepReport logs it as a row of the sweep's run)."""
    if not tracking_on(tracking):
        return False
    mode = tracking.get("sweep_jobs", "auto")
    return not in_multirun or mode == "runs" or (mode == "auto" and not simulated)


def make_tracker(cfg_dict: dict, tracking, outdir: Path, name: str, group: str | None = None,
                 system_metrics: bool = False):
    """A tracker for the run; falls back to NullTracker (with a warning) if W&B cannot start.

    ``system_metrics``: let W&B sample host/GPU utilisation and collect host metadata (real runs);
    otherwise the run is lean (simulated jobs, sweep reports)."""
    if not tracking_on(tracking):
        return NullTracker()
    try:
        return WandbTracker(cfg_dict, tracking, outdir, name, group, system_metrics)
    except Exception as e:  # tracking is a mirror: never let it fail the run
        log.warning("W&B tracking disabled for this run: %s", e)
        return NullTracker()
