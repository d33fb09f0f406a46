"""The sweeper of ``run.py -m``: Hydra's basic (Cartesian) sweep on Hydra's public Sweeper
interface, with the costs of large simulated sweeps removed and failed jobs recorded: a covering set
of jobs validated up front (every swept value checked before any work), one composition per set of
config groups (harness.compose.MemoConfigLoader), jobs batched to joblib's workers, no ``.hydra/``
copies per job, a job with a valid record skipped before launch, a lost job recorded as ``error``,
and a check-only mode (``$TTC_SWEEP_CHECK_ONLY``). Each point, with its measured reason:
docs/usage.md, "How a sweep runs".
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from harness.compose import MemoConfigLoader

LOCAL_LAUNCHERS = ("JoblibLauncher", "BasicLauncher")  # run jobs on this host
CHECK_ONLY = "TTC_SWEEP_CHECK_ONLY"  # set (non-empty): the sweep's checks only (point 7 of the module doc)


def sweep_jobs(params: Dict[str, Any], arguments: Sequence[str], parser: OverridesParser) -> List[List[str]]:
    """Every job's overrides: the Cartesian product of a sweep's ``params`` (key -> ``a,b,c``) and the
    command line's ``arguments`` (a key given on both: the command line's values). The sweeper's jobs,
    and what ``harness.reproduce`` counts. Raises HydraException for a sweep that is not a list of
    values (``interval(...)``)."""
    overrides = parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + list(arguments))
    lists: Dict[str, List[str]] = {}
    for o in overrides:
        key = o.get_key_element()
        if not o.is_sweep_override():
            lists[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            lists[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            raise HydraException(
                f"{FastBasicSweeper.__name__} does not support sweep type {o.value_type.name} "
                f"({o.input_line}); list the values (a=1,2,3) or use range(...)"
            )
    return [list(job) for job in itertools.product(*lists.values())]


class FastBasicSweeper(Sweeper):
    """Cartesian product of the swept values (``a=1,2 b=x,y`` -> 4 jobs), jobs in order of the
    parameters (config groups first in experiment files, so jobs sharing them run back to back);
    ``params`` (``hydra.sweeper.params``) and ``max_batch_size`` as in Hydra's basic sweeper."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[Dict[str, str]] = None) -> None:
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        self.config: Optional[DictConfig] = None
        self.launcher: Optional[Launcher] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context = HydraContext(
            config_loader=MemoConfigLoader.wrap(hydra_context.config_loader), callbacks=hydra_context.callbacks
        )
        self.task_function = task_function
        self.config = config

    def sweep(self, arguments: List[str]) -> List[Sequence[Any]]:
        from harness.records import atomic_write_bytes

        hydra_overrides = self.config.hydra.overrides.hydra
        if not any(str(o).split("=", 1)[0].lstrip("+~") == "hydra.output_subdir" for o in hydra_overrides):
            with read_write(self.config.hydra):
                hydra_overrides.append("hydra.output_subdir=null")  # point 4 of the module doc
                self.config.hydra.output_subdir = None
        jobs = self.jobs(arguments)
        self.check_job_folders(jobs)
        self.validate_batch_is_legal(jobs)
        n_all = len(jobs)
        if os.environ.get(CHECK_ONLY):  # point 7 of the module doc
            for job in jobs:
                self.recorded(job, tell=lambda _: None)
            print(f"sweep check: {n_all} jobs; nothing was run", flush=True)
            sys.exit(0)
        jobs = [job for job in jobs if not self.recorded(job)]  # point 6 of the module doc
        sweep_dir = Path(self.config.hydra.sweep.dir)
        atomic_write_bytes(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config).encode())
        self.launcher = self._instantiate_launcher(len(jobs))
        done = f", {n_all - len(jobs)} already recorded" if len(jobs) < n_all else ""
        print(
            f"sweep: {n_all} job{'' if n_all == 1 else 's'} -> {sweep_dir} ({type(self.launcher).__name__}{done})",
            flush=True,
        )
        size = self.max_batch_size if self.max_batch_size and self.max_batch_size > 0 else max(1, len(jobs))
        returns = []
        for start in range(0, len(jobs), size):
            batch = jobs[start : start + size]
            try:
                results: Sequence[Any] = self.launcher.launch(batch, initial_job_idx=start)
            except KeyboardInterrupt:
                self._interrupted(sweep_dir)
            except Exception as e:  # the launcher lost the batch: its jobs without a record are errors
                if not interrupted(e):
                    print(
                        f"launcher failed ({type(e).__name__}: {e}); jobs of this batch without a record "
                        f"are recorded as error",
                        file=sys.stderr,
                    )
                results = [e] * len(batch)
            failures = [(o, r if isinstance(r, Exception) else job_failure(r)) for o, r in zip(batch, results)]
            if any(interrupted(f) for _, f in failures if f is not None):
                self._interrupted(sweep_dir)
            for overrides, failure in failures:
                if failure is not None:
                    self._record_failed_job(overrides, failure)
            returns.append(results)
        return returns

    def jobs(self, arguments: List[str]) -> List[List[str]]:
        """Every job's overrides: the Cartesian product of ``params`` and the command line's."""
        return sweep_jobs(
            self.params, arguments, OverridesParser.create(config_loader=self.hydra_context.config_loader)
        )

    def recorded(self, job: Sequence[str], tell=print) -> bool:
        """Whether the job has a valid record of its config (``harness.folders.recorded``, the check
        ``harness.run.run`` makes before it would run the job, on the job's resolved config); says
        "skipping: valid record exists" when so. False when the
        job sets ``resume=false`` or ``output_dir``, or its config needs Hydra's own composition.
        Exits 2 (nothing run, nothing written) when the job's folder holds the record of another
        config (``harness.folders.check_no_other_record``: a re-used sweep_name whose jobs changed)."""
        from harness.errors import ConfigError
        from harness.folders import check_no_other_record, job_config, recorded

        cfg = self.hydra_context.config_loader.job_view(self.config, list(job))
        if cfg is None or cfg.get("output_dir"):
            return False
        outdir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        if not (outdir / "run.json").exists():
            return False
        chash = job_config(cfg)[1]
        try:
            check_no_other_record(outdir, chash, "hydra.sweep.dir")
        except ConfigError as e:
            print(f"error: {e}\n  (in the sweep job {' '.join(job)}; nothing was run)", file=sys.stderr)
            sys.exit(2)
        return bool(cfg.get("resume", True)) and recorded(outdir, chash, tell=tell) is not None

    def check_job_folders(self, jobs: Sequence[Sequence[str]]) -> None:
        """Exit 2 before anything runs when a job's folder escapes the sweep's or is another job's
        (harness.folders.check_job_folders)."""
        from harness.errors import ConfigError
        from harness.folders import check_job_folders

        try:
            check_job_folders(jobs, Path(self.config.hydra.sweep.dir), self.config.hydra.job.config.override_dirname)
        except ConfigError as e:
            print(f"error: {e}; nothing was run", file=sys.stderr)
            sys.exit(2)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        from harness.config import validate_common
        from harness.errors import ConfigError
        from harness.run import validate_config

        local = self._launcher_name() in LOCAL_LAUNCHERS
        for job in covering_jobs(batch):
            # Hydra's own check (what its basic sweeper does for every job): the job's config composes
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(job))
            try:
                if local:
                    validate_config(cfg)
                else:  # SLURM/Ray: jobs run elsewhere (a login node may lack the GPU they check for):
                    validate_common(cfg)  # only the checks that do not depend on the machine
            except ConfigError as e:
                print(f"error: {e}\n  (in the sweep job {' '.join(job)}; nothing was run)", file=sys.stderr)
                sys.exit(2)

    def _launcher_name(self) -> str:
        return str(self.config.hydra.launcher.get("_target_", "")).rsplit(".", 1)[-1]

    def _instantiate_launcher(self, n_jobs_in_sweep: int) -> Launcher:
        """The configured launcher; joblib's ``batch_size: auto`` becomes chunks of ~1/4 of a
        worker's share of the sweep (point 3 of the module doc)."""
        launcher_cfg = self.config.hydra.launcher
        auto = self._launcher_name() == "JoblibLauncher" and launcher_cfg.get("batch_size", "auto") == "auto"
        if auto:
            n_jobs = int(launcher_cfg.get("n_jobs") or 1)
            workers = max(1, os.cpu_count() + 1 + n_jobs if n_jobs < 0 else n_jobs)
            with read_write(launcher_cfg), open_dict(launcher_cfg):
                launcher_cfg.batch_size = str(max(1, n_jobs_in_sweep // (4 * workers)))
        try:
            return Plugins.instance().instantiate_launcher(
                hydra_context=self.hydra_context, task_function=self.task_function, config=self.config
            )
        finally:
            if auto:
                with read_write(launcher_cfg), open_dict(launcher_cfg):
                    launcher_cfg.batch_size = "auto"

    @staticmethod
    def _interrupted(sweep_dir: Path) -> None:
        """Stop the sweep after SIGINT (Ctrl-C): exit 130. Jobs keep the records they wrote (a job
        interrupted while running: status interrupted, when it got to write it); jobs that did not
        start get none, so re-running the same command runs exactly those and the interrupted ones."""
        print(
            f"sweep interrupted: the records written so far stay in {sweep_dir}; re-running the same "
            f"command runs the jobs without a valid record",
            file=sys.stderr,
        )
        sys.exit(130)

    def _record_failed_job(self, overrides: Sequence[str], why: Any) -> None:
        """An ``error`` record for a job that ended without writing one (a finished record stays)."""
        from harness import records
        from harness.run import error_record

        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        outdir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        rec_path = outdir / "run.json"
        if rec_path.exists():
            return
        message = f"job failed outside its run ({type(why).__name__}: {why})"
        records.write_record(rec_path, error_record(cfg, outdir, list(overrides), message))
        print(f"{' '.join(overrides)}: {message}; recorded as error in {rec_path}", file=sys.stderr)


def interrupted(e: Optional[BaseException]) -> bool:
    """Whether ``e`` is a KeyboardInterrupt (SIGINT) or was raised while handling one (joblib's
    sequential backend fails in its own clean-up after Ctrl-C: an AttributeError whose context is
    the KeyboardInterrupt)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def job_failure(ret: JobReturn) -> Optional[BaseException]:
    """The exception a job's task raised, or None when it completed."""
    if ret.status == JobStatus.COMPLETED:
        return None
    try:
        ret.return_value  # re-raises the task's exception (and names the job on stderr)
    except BaseException as e:  # noqa: B036 (whatever the task raised is the job's failure)
        return e
    return RuntimeError(f"job status {ret.status.name}")


def covering_jobs(batch: Sequence[Sequence[str]]) -> List[Sequence[str]]:
    """A few jobs of ``batch`` that together contain every override string of the batch (greedy set
    cover, in batch order; for a Cartesian sweep about as many jobs as the longest value list)."""
    todo = {o for job in batch for o in job}
    chosen = []
    while todo:
        best = max(batch, key=lambda job: len(todo.intersection(job)))
        chosen.append(best)
        todo.difference_update(best)
    return chosen
