"""Hydra callbacks: at multirun end, gather the sweep's records and draw its report."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional, Tuple

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepReport(Callback):
    """On multirun end: write ``runs.parquet`` (one row per job) and ``summary.csv`` (the same rows, flat:
    swept values, status, summary keys; harness.sweep_summary) in the sweep dir, print the count
    per status and, when the config names ``report: module.function``, call
    ``report(sweep_dir, runs, cfg)``. Last, exit 1 when any job's status is ``error`` (``oom`` is a
    recorded result, not an error), so scripts and CI see a failed sweep. Hydra calls end hooks in
    reverse order: listed first under ``hydra.callbacks``, this one runs after the others."""

    started_at: Optional[float] = None  # time.time() at multirun start
    driver: Optional[Tuple[str, int]] = None  # (host, pid) of the sweep's driver process

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started_at = time.time()
        self.driver = (socket.gethostname(), os.getpid())

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """In the job's process (this object travels to workers with Hydra's context): a process
        the sweep's driver started itself (a joblib worker, a submitit-local job) watches the driver
        and exits within a second of its death (``kill -9``). Without it, orphaned joblib workers
        run the rest of their chunk of jobs beside a re-run of the sweep, then idle for minutes.
        The interrupted job has no record, so the re-run runs it (Ray workers and SLURM jobs are
        not the driver's children: Ray ends its own, SLURM jobs outlive the driver by design)."""
        from harness.process import exit_if_parent_gone, watch_parent

        if self.driver is None or self.driver[0] != socket.gethostname() or self.driver[1] == os.getpid():
            return
        if os.getppid() == self.driver[1]:
            watch_parent("the sweep's driver")
        exit_if_parent_gone()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import get_method

        from harness.records import atomic_write_parquet, remove_stale_temp_files
        from harness.report import gather_runs, run_report

        sweep_dir = Path(config.hydra.sweep.dir)
        if self.started_at is not None:  # left by processes killed mid-write, e.g. an earlier driver
            remove_stale_temp_files(sweep_dir, older_than=self.started_at)
        runs = gather_runs(sweep_dir)
        flat = runs.astype({c: str for c in runs.columns if runs[c].dtype == object})  # mixed-type columns
        if len(runs):
            atomic_write_parquet(sweep_dir / "runs.parquet", flat)
            from harness.sweep_summary import write_summary_csv

            write_summary_csv(sweep_dir, runs)  # one flat row per job: swept values, status, summary.*
        counts = runs["status"].value_counts() if len(runs) else {}
        by_status = ", ".join(f"{int(n)} {st}" for st, n in sorted(dict(counts).items(), key=lambda kv: kv[0] != "ok"))
        print(f"sweep {sweep_dir}: {len(runs)} records ({by_status or 'none'})")
        target = config.get("report")
        report_failed = False
        t_report = time.time()
        # the verdicts of an earlier report are set aside: harness.reproduce collects verdicts.csv,
        # and this report's failure must not leave the earlier one there as if it were this sweep's
        verdicts, previous = sweep_dir / "verdicts.csv", sweep_dir / ".verdicts.previous.csv"
        if verdicts.exists():
            verdicts.replace(previous)
        try:
            if target:
                run_report(get_method(target), sweep_dir, runs, config)  # with repeats: intervals
            else:  # an ad-hoc sweep: a summary table (+ figure)
                from harness.sweep_summary import write_summary

                write_summary(sweep_dir, runs)
            written = sorted(
                p.name
                for p in sweep_dir.iterdir()
                if p.is_file()
                and p.suffix in (".png", ".pdf", ".md", ".tex", ".csv")
                and p.stat().st_mtime >= t_report - 1
            )
            if written:
                print(f"report: {', '.join(written)} in {sweep_dir}")
            previous.unlink(missing_ok=True)
        except Exception:
            log.error("report %s failed: %s", target or "summary", traceback.format_exc())
            print(f"report {target or 'summary'} failed: {traceback.format_exc().splitlines()[-1]}", file=sys.stderr)
            if previous.exists():
                print(
                    f"the earlier report's verdicts are kept in {previous}, out of harness.reproduce's collection",
                    file=sys.stderr,
                )
            report_failed = True
        if self._any_written_since_start(runs):
            self._mirror_to_wandb(config, sweep_dir, flat)
        elif len(runs):
            print("every job was already recorded: the sweep's W&B run is not logged again")
        errors = int(dict(counts).get("error", 0))
        if errors:
            print(
                f"sweep failed: {errors} job(s) with status error (their message: the 'message' column of "
                f"{sweep_dir / 'runs.parquet'}); re-running the same command runs them again",
                file=sys.stderr,
            )
            sys.exit(1)
        if report_failed:
            print(
                f"sweep failed: its report ({target}) raised; the records and runs.parquet are written", file=sys.stderr
            )
            sys.exit(1)

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
        tr = make_tracker(
            {
                "experiment": config.get("experiment_name"),
                "sweep_params": OmegaConf.to_container(params) if params is not None else None,
                "overrides": OmegaConf.to_container(config.hydra.overrides.task),
                "jobs": len(runs),
            },
            tracking,
            sweep_dir,
            name=f"{config.get('sweep_name')}-sweep",
            group=config.get("sweep_name"),
        )
        try:
            tr.log_table("runs", runs)
            for png in sorted(sweep_dir.glob("*.png")):
                tr.log_image(png.stem, png)
        finally:
            tr.finish()
