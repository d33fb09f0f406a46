"""Hydra callbacks: at multirun end, gather the sweep's records and draw its report."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepReport(Callback):
    """On multirun end: write ``runs.parquet`` (one row per job) in the sweep dir and, when the
    config names ``report: module.function``, call ``report(sweep_dir, runs, cfg)``."""

    started_at: Optional[float] = None          # time.time() at multirun start

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started_at = time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import get_method

        from harness.records import atomic_write_parquet
        from harness.report import gather_runs, run_report
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = gather_runs(sweep_dir)
        flat = runs.astype({c: str for c in runs.columns if runs[c].dtype == object})   # mixed-type columns
        if len(runs):
            atomic_write_parquet(sweep_dir / "runs.parquet", flat)
        counts = runs["status"].value_counts() if len(runs) else {}
        by_status = ", ".join(f"{int(n)} {st}" for st, n in sorted(dict(counts).items(), key=lambda kv: kv[0] != "ok"))
        print(f"sweep {sweep_dir}: {len(runs)} records ({by_status or 'none'})")
        target = config.get("report")
        if target:
            run_report(get_method(target), sweep_dir, runs, config)     # with repeats: intervals
            print(f"report written under {sweep_dir}")
        if self._any_written_since_start(runs):
            self._mirror_to_wandb(config, sweep_dir, flat)
        elif len(runs):
            print("every job was already recorded: the sweep's W&B run is not logged again")

    def _any_written_since_start(self, runs) -> bool:
        """Whether this invocation wrote any record (False when every job was skipped as done)."""
        if self.started_at is None:
            return bool(len(runs))
        return any((Path(d) / "run.json").stat().st_mtime >= self.started_at - 1 for d in runs.get("run_dir", []))

    @staticmethod
    def _mirror_to_wandb(config: DictConfig, sweep_dir: Path, runs) -> None:
        """One W&B run for the sweep (group = sweep name, offline by default): the ``runs`` table
        (one row per job: status, config.*, summary.*; how jobs without a W&B run of their own reach
        W&B, see ``tracking.sweep_jobs``) and the sweep's figures."""
        from omegaconf import OmegaConf

        from harness.tracking import make_tracker, tracking_on
        tracking = config.get("tracking")
        if not tracking_on(tracking) or not len(runs):
            return
        params = config.hydra.sweeper.get("params")
        tr = make_tracker({"experiment": config.get("experiment_name"),
                           "sweep_params": OmegaConf.to_container(params) if params is not None else None,
                           "overrides": OmegaConf.to_container(config.hydra.overrides.task),
                           "jobs": len(runs)},
                          tracking, sweep_dir, name=f"{config.get('sweep_name')}-sweep",
                          group=config.get("sweep_name"))
        try:
            tr.log_table("runs", runs)
            for png in sorted(sweep_dir.glob("*.png")):
                tr.log_image(png.stem, png)
        finally:
            tr.finish()
