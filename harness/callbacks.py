"""Hydra callbacks: at multirun end, gather the sweep's records and draw its report."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepReport(Callback):
    """On multirun end: write ``runs.parquet`` (one row per job) in the sweep dir and, when the
    config names ``report: module.function``, call ``report(sweep_dir, runs, cfg)``."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import get_method

        from harness.records import atomic_write_parquet
        from harness.report import gather_runs
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = gather_runs(sweep_dir)
        if len(runs):
            atomic_write_parquet(sweep_dir / "runs.parquet", runs.astype({c: str for c in runs.columns
                                                                          if runs[c].dtype == object}))
        n_ok = int((runs["status"] == "ok").sum()) if len(runs) else 0
        print(f"sweep {sweep_dir}: {len(runs)} records ({n_ok} ok)")
        target = config.get("report")
        if target:
            get_method(target)(sweep_dir, runs, config)
            print(f"report written under {sweep_dir}")
            self._mirror_to_wandb(config, sweep_dir)

    @staticmethod
    def _mirror_to_wandb(config: DictConfig, sweep_dir: Path) -> None:
        """Send the sweep's figures and tables to one W&B run of the sweep's group (offline by default)."""
        from omegaconf import OmegaConf

        from harness.tracking import make_tracker
        tracking = config.get("tracking")
        if tracking is None or tracking.name == "none":
            return
        tr = make_tracker({"experiment": config.get("experiment_name"),
                           "sweep_params": OmegaConf.to_container(config.hydra.sweeper.params)},
                          tracking, sweep_dir, name=f"{config.get('sweep_name')}-report",
                          group=config.get("sweep_name"))
        for png in sorted(sweep_dir.glob("*.png")):
            tr.log_image(png.stem, png)
        tr.finish()
