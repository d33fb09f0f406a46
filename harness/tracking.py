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


class WandbTracker(NullTracker):
    def __init__(self, cfg_dict: dict, tracking, outdir: Path, name: str, group: str | None):
        import wandb
        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        mode = os.environ.get("WANDB_MODE", tracking.mode)
        self.run = wandb.init(project=tracking.project, entity=tracking.entity, mode=mode,
                              dir=str(outdir), config=cfg_dict, name=name, group=group,
                              job_type=cfg_dict.get("system", {}).get("name"), reinit="finish_previous",
                              settings=wandb.Settings(console="off", silent=True))

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


def make_tracker(cfg_dict: dict, tracking, outdir: Path, name: str, group: str | None = None):
    """A tracker for the run; falls back to NullTracker (with a warning) if W&B cannot start."""
    if tracking is None or tracking.name == "none" or tracking.mode == "disabled":
        return NullTracker()
    try:
        return WandbTracker(cfg_dict, tracking, outdir, name, group)
    except Exception as e:  # tracking is a mirror: never let it fail the run
        log.warning("W&B tracking disabled for this run: %s", e)
        return NullTracker()
