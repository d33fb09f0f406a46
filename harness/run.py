"""Run lifecycle shared by every system.

``run(cfg)``: validate the composed config (before any work), resolve the backend and say which on
the first line of output, skip a job whose valid record exists, run the family's runner
(``systems/<family>/runner.py``: ``validate(cfg)`` and ``run(cfg, ctx) -> RunResult``), and write
the record atomically. An OOM, a passed deadline or a failure mid-run is a recorded result (status
``oom``/``timeout``/``error``), never a lost one.
"""

from __future__ import annotations

import copy
import gc
import importlib
import json
import logging
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from harness import clock_locks, logs, machine, records
from harness.backend import Backend, resolve_backend
from harness.config import (
    check_folder,
    check_results_dir,
    check_shortcuts,
    shortcut_overridden_by,
    unused_shortcuts,
    validate_common,
)
from harness.errors import TYPE_WORDS, ConfigError, RunInterrupted, RunOOM, bad
from harness.logs import say
from harness.stats import aggregate, repeat_seeds
from harness.tracking import NullTracker, job_gets_own_run, log_record, make_tracker, mirror_later

log = logging.getLogger(__name__)

# A runner that warms its engine up before measuring puts the warm-up's wall time (s) in its summary
# under this key; the warm-up is excluded from every other timing, and the record says so per repeat.
WARMUP_KEY = "warmup_s"


INTERRUPTED = "interrupted (SIGINT/Ctrl-C, or SIGTERM); re-running the same command runs the job again"


def terminate_as_interrupt() -> None:
    """SIGTERM (``timeout``, ``kill``, SLURM's ``scancel``, a cluster's preemption) handled as Ctrl-C:
    the job in progress is recorded as ``interrupted`` with the work done so far, instead of the
    process dying with no record. Set in the process ``run.py`` starts (and an isolated job's child),
    from its main thread, and only where SIGTERM has its default action (an ignored or
    library-handled one is left alone)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm)


def _sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


@dataclass
class RunResult:
    """What a family runner returns.

    summary: scalar metrics (SI units: seconds, bytes, joules) stored in run.json (``WARMUP_KEY``:
        a warm-up's wall time, excluded from the other timings).
    display: rows (label, key, formatter) for the printed table; values come from ``summary``,
        so the printed table and the record cannot disagree.
    tables: name -> pandas DataFrame, list of row dicts or dict of columns (name -> numpy array),
        each written as ``<name>.parquet``.
    """

    status: str = "ok"  # ok | oom | timeout (system.deadline passed) | error | interrupted (SIGINT)
    message: str = ""
    summary: Dict[str, Any] = field(default_factory=dict)
    display: List[Tuple[str, str, Callable[[Any], str]]] = field(default_factory=list)
    tables: Dict[str, Any] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict)  # stored verbatim in run.json


@dataclass
class RunContext:
    cfg: DictConfig
    backend: Backend
    outdir: Path
    tracker: Any
    show_progress: bool = True

    def progress(self, total: int, desc: str):
        """A tqdm bar (stderr) for steps done / total inside the job; none (a bar that draws nothing,
        without importing tqdm) when stderr is not a terminal: a log file would keep the bar's
        carriage returns glued to the next output."""
        if not (self.show_progress and sys.stderr.isatty()):
            return _NoBar()
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)


@contextmanager
def collector_paused(pause: bool = True) -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block when ``pause`` (else left as it is),
    and on again after it if it was on, also when the block raises. For code that makes many
    short-lived objects without reference cycles beside a large live heap (a simulated search's
    paths and results): every collection walks that heap, often costing more than the code."""
    on = pause and gc.isenabled()
    if on:
        gc.disable()
    try:
        yield
    finally:
        if on:
            gc.enable()


class _NoBar:
    """The part of tqdm's interface runners use (update, close, ``with``), doing nothing."""

    def update(self, n: int = 1) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc) -> None: ...


def family_of(cfg) -> str:
    return cfg.system.family


def load_runner(family: str):
    return importlib.import_module(f"systems.{family}.runner")


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().get("mode") == RunMode.MULTIRUN


def exit_code(record: Dict[str, Any]) -> int:
    """Exit status of a finished job: 1 when its record's status is ``error``, else 0 (``ok``, and
    ``oom`` and ``timeout``, which are recorded results). Bad input exits 2 before any record, an
    interrupted job 130 (run.py)."""
    return 1 if record.get("status") == "error" else 0


def end_startup() -> None:
    """End a start-up that run.py ran with Python's cyclic collector off (imports and composition
    make ~100,000 objects that live as long as the process; the ~150 collections of a FastTTS main
    command's start-up walked them: ~0.06 s): freeze them (``gc.freeze()``: left out of every later
    collection) and turn the collector on. The ~23,000 dead objects composition left (~2.5 MB) are
    frozen with them and kept until the process ends: collecting them first would cost most of what
    the pause saves (0.02-0.04 s). Called by run.py's ``main()`` and by :class:`OutputDirCheck`
    before the first job or a sweep (a parallel sweep's driver never calls ``main()``); nothing
    happens when the collector is on."""
    if gc.isenabled():
        return
    gc.freeze()
    gc.enable()


class OutputDirCheck(Callback):
    """Hydra callback (``hydra.callbacks``): before Hydra creates the run or sweep directory, check
    ``results_dir`` is not empty and the directory can be written, and that a single run's directory
    holds no record of another config (:func:`check_no_other_record`; Hydra would write its
    ``.hydra/`` over that run's); if not, print our message (the path, the fix) and exit 2. Without
    it Hydra's own ``mkdir`` fails with a traceback and exit 1."""

    new_run_dir: Optional[Path] = None  # the run dir, when it did not exist before (see remove_unused_run_dir)
    new_top: Optional[Path] = None  # the topmost of its folders that did not exist either

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        end_startup()
        path = self._check(config, "hydra.run.dir")
        real = Path(path).resolve() if path else None  # the folder mkdir makes ('..' and links followed)
        OutputDirCheck.new_run_dir = real if real is not None and not real.exists() else None
        OutputDirCheck.new_top = topmost_missing(real) if OutputDirCheck.new_run_dir else None
        if path and (Path(path) / "run.json").exists():
            self._check_no_other_record(config, Path(path))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        end_startup()
        self._check(config, "hydra.sweep.dir")

    @staticmethod
    def _check(config: DictConfig, key: str) -> Optional[str]:
        """Exit 2 unless the directory at ``key`` can be made; returns its path (None: Hydra's to report)."""
        from hydra.core.hydra_config import HydraConfig
        from omegaconf.errors import OmegaConfBaseException

        try:
            HydraConfig.instance().set_config(config)  # for ${hydra:...} in the path
            path = OmegaConf.select(config, key)
            results_dir = config.get("results_dir", "results")
        except OmegaConfBaseException:
            return None  # Hydra reports a bad interpolation itself
        try:
            check_results_dir(results_dir)
            check_folder(key, path, "a folder (leave it out for the default under results_dir)")
            name, sweeps = str(config.get("sweep_name")), Path(str(results_dir)) / "sweeps"
            named = Path(path).resolve() == (sweeps / name).resolve()  # the default hydra.sweep.dir
            not_a_name = Path(name).name != name or name in (".", "..")  # a path: its folder escapes sweeps/
            if key == "hydra.sweep.dir" and (Path(path).resolve() == sweeps.resolve() or (named and not_a_name)):
                raise bad(
                    "sweep_name",
                    name,
                    f"a name: the sweep's folder under {sweeps}, no '/' or '..' "
                    "(leave it out for a timestamp; hydra.sweep.dir=PATH puts a sweep elsewhere)",
                )
            records.check_creatable(path, key)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        return path

    @staticmethod
    def _check_no_other_record(config: DictConfig, path: Path) -> None:
        """Exit 2 when the run dir ``path`` holds the record of another config (a config that does
        not resolve is left to the job's validation)."""
        from omegaconf.errors import OmegaConfBaseException

        try:
            chash = job_config(config)[1]
        except OmegaConfBaseException:
            return
        try:
            check_no_other_record(path, chash, "hydra.run.dir")
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)


def topmost_missing(path: Path) -> Path:
    """The topmost folder of ``path`` (``path`` itself included) that does not exist yet: what making
    ``path`` creates (``results_dir=/tmp/new`` -> ``/tmp/new``, when /tmp exists). Taken on the real
    path (``..`` and links resolved, as mkdir follows them): ``/tmp/new/../old`` names ``/tmp/old``."""
    top = path = Path(path).resolve()
    for parent in path.parents:
        if parent.exists():
            break
        top = parent
    return top


def remove_unused_run_dir() -> None:
    """After a single run was rejected before any work (ConfigError, exit 2): remove the run dir
    Hydra made for it, when it did not exist before and holds nothing but Hydra's ``.hydra/`` and
    ``<hydra.job.name>.log`` (``run.log``; the message went to the console), so ``results/runs/``
    lists only runs that ran (with ``hydra.job.name=x`` the folder holding x.log was left; QA); then
    the folders above it that the run made and that are empty now (a new ``results_dir`` and its
    ``runs/`` were left behind), never one that existed before."""
    import shutil

    from hydra.core.hydra_config import HydraConfig

    d = OutputDirCheck.new_run_dir
    log_name = f"{HydraConfig.get().job.name}.log" if HydraConfig.initialized() else "run.log"
    if d is not None and d.is_dir() and {p.name for p in d.iterdir()} <= {".hydra", "run.log", log_name}:
        logging.shutdown()  # Hydra's run.log handler lets go of the file
        shutil.rmtree(d, ignore_errors=True)
        top = OutputDirCheck.new_top  # d, top: real paths
        for folder in d.parents:
            if top is None or not folder.is_relative_to(top):  # it existed before the run
                break
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break


def task_overrides() -> Optional[List[str]]:
    """The job's command-line overrides (Hydra's ``overrides.task``); None outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return [str(o) for o in HydraConfig.get().overrides.task]


def output_dir(cfg) -> Path:
    if cfg.get("output_dir"):
        return Path(cfg.output_dir)
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def writable_output_dir(cfg, chash: str) -> Path:
    """The job's output directory, created; ConfigError naming the setting when it cannot be written
    or holds the record of a config other than the job's (config hash ``chash``, see
    :func:`check_no_other_record`)."""
    outdir = output_dir(cfg)
    key = "output_dir" if cfg.get("output_dir") else "hydra.sweep.dir" if in_multirun() else "hydra.run.dir"
    records.check_writable(outdir, key)
    check_no_other_record(outdir, chash, key)
    return outdir


_OTHER_FOLDER = {
    "hydra.run.dir": "hydra.run.dir=PATH",
    "output_dir": "output_dir=PATH",
    "hydra.sweep.dir": "another sweep_name=NAME, or hydra.sweep.dir=PATH",
}


def check_no_other_record(outdir: Path, chash: str, key: str) -> None:
    """Raise ConfigError when ``outdir`` holds the record (run.json) of a config other than the
    job's, whose config hash is ``chash`` (:func:`records.same_config`, the rule of resume): running
    would replace it. The same config's record is the job's own (skipped by resume, replaced with
    ``resume=false``); a record without a hash (an unreadable file, an older error record) or with
    status error and no summary (no result: :func:`error_record`'s, a run that failed before any)
    holds nothing to lose and is replaced as before. ``key``: the setting that named the folder (``hydra.run.dir``,
    ``hydra.sweep.dir`` or ``output_dir``), for the fix."""
    prev = records.read_record(outdir)
    if (
        prev is None
        or prev.get("config_hash") is None
        or (prev.get("status") == "error" and not prev.get("summary"))
        or records.same_config(prev, chash)
    ):
        return
    theirs = " ".join(prev.get("overrides") or []) or "none"
    raise ConfigError(
        f"{key}: {str(outdir)!r} holds the record of a different config (run.json, status "
        f"{prev.get('status')}, overrides: {theirs}; config hash {prev['config_hash']}, "
        f"this job's {chash}); nothing was run. "
        f"Pass another folder ({_OTHER_FOLDER[key]}) or delete {str(outdir)!r} to run here"
    )


def validate(cfg) -> Tuple[Any, Backend]:
    """All checks that must pass before work starts. Returns (runner module, backend)."""
    validate_common(cfg)
    family = family_of(cfg)
    try:
        runner = load_runner(family)
    except ModuleNotFoundError as e:
        raise ConfigError(f"system={cfg.system.name!r}: family {family!r} is not available ({e})") from None
    runner.validate(cfg)
    check_shortcuts(cfg, unused_shortcuts(cfg))  # the set shortcuts nothing reads: their values too
    backend = resolve_backend(cfg, family)
    if hasattr(runner, "validate_backend"):
        runner.validate_backend(cfg, backend)
    return runner, backend


def validate_config(cfg) -> Tuple[Any, Backend]:
    """:func:`validate`, with OmegaConf's type and interpolation errors raised as ConfigError naming
    the field: a value of the wrong type as the setting given, the value and the type allowed
    (``beams=abc`` -> "beams='abc' is not allowed: an integer (sets workload.beams)"), without the
    ``${first:...}`` interpolation that carries a shortcut into its group."""
    import re

    from omegaconf.errors import OmegaConfBaseException

    try:
        return validate(cfg)
    except OmegaConfBaseException as e:
        msg = (getattr(e, "msg", None) or str(e)).strip().splitlines()[0]
        key = getattr(e, "full_key", None)
        typed = re.search(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", msg)
        if typed:
            shortcut = re.search(r"interpolation '\$\{first:\$\{(\w+)\}", msg)
            field_name = shortcut.group(1) if shortcut else key
            allowed = TYPE_WORDS.get(typed.group(2), typed.group(2)) + (f" (sets {key})" if shortcut and key else "")
            raise bad(field_name or "value", typed.group(1), allowed) from None
        raise ConfigError(f"{key}: {msg}" if key else msg) from None


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


def job_config(cfg: DictConfig) -> Tuple[Dict[str, Any], str]:
    """A job's resolved config as its record keeps it (``hydra``'s own node left out, as Hydra hands
    the job its config) and the config hash that identifies the job's record."""
    d = {
        k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
        for k in cfg
        if k != "hydra"
    }
    return d, records.config_hash(d)


def recorded(outdir: Path, chash: str, tell: Callable[[str], None] = say) -> Optional[Dict[str, Any]]:
    """The job's valid record in ``outdir`` (``records.load_valid_record``: this record version, status
    ok or oom, config hash ``chash``), telling (``tell``: printed and logged to run.log) that the job is
    skipped; None when there is none. The one resume check: :func:`run` makes it before a job, the
    sweeper before launching (with ``tell=print``: its log is Hydra's, which prints it again)."""
    prev = records.load_valid_record(outdir, chash)
    if prev is not None:
        tell(f"skipping: valid record exists ({outdir / 'run.json'}, status {prev['status']})")
    return prev


def run(cfg: DictConfig, multirun: Optional[bool] = None, overrides: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run one job from a composed config and return its record (also written to run.json).

    ``multirun``: whether the job belongs to a Hydra multirun (decides its W&B run, see
    ``tracking.sweep_jobs``, and one printed line instead of the table); None = ask Hydra.
    ``overrides``: the job's command-line overrides, recorded (None = ask Hydra).
    Raises ConfigError (before any work and before any file is written) for bad input.
    """
    logs.quiet_engines(bool(cfg.get("verbose", False)))
    runner, backend = validate_config(cfg)
    multirun = in_multirun() if multirun is None else multirun
    if not multirun:  # a sweep may set one for jobs of several workloads: no warning there
        given = task_overrides() if overrides is None else overrides
        for key in unused_shortcuts(cfg):
            own = shortcut_overridden_by(key, given)
            why = (
                f"{own} is set too and wins (drop one of the two)"
                if own
                else f"no setting of this run reads it (system={cfg.system.name}, "
                f"workload={cfg.workload.get('name', '?')})"
            )
            say(f"{key}={cfg.get(key)} has no effect: {why}", warning=True)
        for text in getattr(runner, "ignored_settings", lambda *_: [])(cfg, given):  # a family's own
            say(text, warning=True)
        if (
            cfg.get("verifier")
            and cfg.verifier.get("name", "none") != "none"
            and not getattr(runner, "USES_VERIFIER", False)
        ):
            say(
                f"verifier={cfg.verifier.name} has no effect: system={cfg.system.name} runs no verifier model "
                f"(the FastTTS systems do)",
                warning=True,
            )
    cfg_dict, chash = job_config(cfg)
    outdir = writable_output_dir(cfg, chash)
    if cfg.get("resume", True):
        prev = recorded(outdir, chash)
        if prev is not None:
            return prev
    overrides = task_overrides() if overrides is None else overrides
    with logs.job_log(outdir):
        if not cfg.get("resume", True):
            set_aside(outdir, chash)
        aside = outdir / records.REPLACED_DIR  # also one an unfinished re-run left: settled by this run's record
        try:
            return _run_job(cfg, runner, backend, multirun, outdir, cfg_dict, chash, overrides)
        finally:
            if aside.is_dir():
                _settle_aside(aside, outdir)


def set_aside(outdir: Path, chash: str) -> None:
    """``resume=false`` over the job's valid record (status ok/oom, same config): its run.json, tables
    and repeat folders are moved into ``outdir/replaced-record/`` before the job runs, so that a re-run
    that ends without a valid record (interrupted, error, killed) loses nothing recorded
    (:func:`_settle_aside`). A folder already holding one (an earlier re-run that did not finish) is
    kept as it is: it holds the last valid record."""
    aside = outdir / records.REPLACED_DIR
    prev = None if aside.exists() else records.load_valid_record(outdir, chash)
    if prev is None:
        return
    aside.mkdir()
    names = [
        "run.json",
        *(f"{t}.parquet" for t in prev.get("tables") or []),
        *(r.get("dir") for r in prev.get("repeat_runs") or [] if r.get("dir") not in (None, ".")),
    ]
    for name in dict.fromkeys(names):
        if (outdir / name).exists():
            (outdir / name).rename(aside / name)
    say(f"resume=false: the earlier record (status {prev['status']}) is set aside in {aside} until this run's is valid")


def _settle_aside(aside: Path, outdir: Path) -> None:
    """After the re-run (returned, raised or interrupted): a valid new record (ok/oom) in ``outdir``
    replaces the one set aside (removed); otherwise the earlier one stays in ``aside``, and the log
    says where."""
    import shutil

    status = (records.read_record(outdir) or {}).get("status")
    if status in records.VALID_STATUSES:
        shutil.rmtree(aside, ignore_errors=True)
    else:
        say(f"this run ended {status or 'without a record'}; the earlier valid record is kept in {aside}", warning=True)


@contextmanager
def sigint_held() -> Iterator[List[int]]:
    """SIGINT (Ctrl-C), and SIGTERM where it is handled as Ctrl-C, inside the block is held until the
    block ends, then the caller sees it in the list the block gets (non-empty): what the block writes
    (a record and its tables) is written whole. Only in the main thread (elsewhere Python delivers no
    signal: the list stays empty)."""
    import signal
    import threading

    got: List[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    term = signal.getsignal(signal.SIGTERM)
    if term is _sigterm:  # SIGTERM as Ctrl-C (terminate_as_interrupt): held too
        signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, previous)
        if term is _sigterm:
            signal.signal(signal.SIGTERM, term)


def record_header(
    cfg, backend: Backend, outdir: Path, cfg_dict: dict, chash: str, overrides: Optional[List[str]]
) -> Dict[str, Any]:
    """What every record of a job says of it, whatever became of it (a result, or the job's process
    dying before it wrote one): record version, run id, experiment, system, family, model, hardware
    profile, backend (whether simulated), seed, config hash, command-line overrides, resolved config.
    A sweep's summary reads its swept columns from ``overrides`` and its source from ``backend``."""
    return {
        "record_version": records.RECORD_VERSION,
        "run_id": outdir.name,
        "experiment": cfg.get("experiment_name"),
        "system": cfg.system.name,
        "family": family_of(cfg),
        "model": cfg.model.name,
        "hardware_profile": cfg.hardware.name,
        "backend": {
            "name": backend.name,
            "device": backend.device,
            "simulated": backend.simulated,
            "label": backend.label,
            "reason": backend.reason,
        },
        "seed": cfg.get("seed"),
        "config_hash": chash,
        "overrides": overrides,
        "config": cfg_dict,
    }


def error_record(
    cfg, outdir: Path, overrides: Optional[List[str]], message: str, backend: Optional[Backend] = None
) -> Dict[str, Any]:
    """The record (status error) of a job that ended without writing its own: found invalid when it
    ran (a combination the sweeper's check of a covering subset of jobs did not run), its process
    died, its task raised or a launcher lost it. The job is named as far as its config allows
    (:func:`record_header`; a backend it cannot resolve: the one it asked for), so the sweep's
    summary shows its swept values and whether it was simulated."""
    rec: Dict[str, Any] = {
        "record_version": records.RECORD_VERSION,
        "run_id": outdir.name,
        "system": cfg.system.name,
        "model": cfg.model.name,
        "overrides": overrides,
        "backend": {"name": cfg.backend.name, "simulated": cfg.backend.name == "sim"},
    }
    try:
        cfg_dict, chash = job_config(cfg)
        rec.update(
            record_header(cfg, backend or resolve_backend(cfg, family_of(cfg)), outdir, cfg_dict, chash, overrides)
        )
    except Exception:  # e.g. a real backend this machine lacks, a value that does not resolve
        pass
    rec.update(status="error", message=message, summary={})
    return rec


def _run_job(
    cfg,
    runner,
    backend: Backend,
    multirun: bool,
    outdir: Path,
    cfg_dict: dict,
    chash: str,
    overrides: Optional[List[str]],
) -> Dict[str, Any]:
    """:func:`run` after validation and the resume check, with run.log open. A simulated job runs
    and is recorded with Python's cyclic collector paused (:func:`collector_paused`): its
    collections walked the run's live objects over and over (the BEAM main command: 0.15-0.3 s of
    CPU; FastTTS: 15-20 % of the search's CPU, 2-8x that of its summaries and tables), and the
    simulators make no cyclic garbage to speak of (the BEAM main command: under 1,000 objects,
    OmegaConf's parse trees). It is on again once :func:`_record_job` has returned and its objects
    are freed, so no collection walks them either."""
    with collector_paused(backend.simulated):
        return _record_job(cfg, runner, backend, multirun, outdir, cfg_dict, chash, overrides)


def _record_job(
    cfg,
    runner,
    backend: Backend,
    multirun: bool,
    outdir: Path,
    cfg_dict: dict,
    chash: str,
    overrides: Optional[List[str]],
) -> Dict[str, Any]:
    """Run the job's repeats, write its tables and record, print its table or line."""
    if not multirun:  # sweep jobs say [SIMULATED] on their one line instead
        say(backend.reason)
    else:
        logs.log.info(backend.reason)
    warnings = clock_locks.stale_warnings()  # GPUs a killed run left with locked clocks
    for w in warnings:
        say(w, warning=True)

    rec: Dict[str, Any] = {
        **record_header(cfg, backend, outdir, cfg_dict, chash, overrides),
        "git": dict(records.git_info()),
        "packages": dict(records.package_versions()),
        "inventory": dict(records.hardware_inventory()),
        "started_at": datetime.now(timezone.utc).isoformat(),
    }
    if warnings:
        rec["warnings"] = warnings
    tracking = cfg.get("tracking")
    wandb_name, wandb_group = f"{cfg.system.name}-{outdir.name}", cfg.get("sweep_name")
    own_run = job_gets_own_run(tracking, backend.simulated, multirun)
    later = own_run and backend.simulated and not multirun  # mirrored after the job (harness.tracking)
    if own_run and not later:
        tracker = make_tracker(
            cfg_dict, tracking, outdir, name=wandb_name, group=wandb_group, system_metrics=not backend.simulated
        )
    else:
        tracker = NullTracker()  # a row of the sweep's W&B run instead (harness.callbacks)
    seeds = repeat_seeds(cfg.get("seed") or 0, cfg.get("repeats", 1))
    if not backend.simulated:  # stable timing: torch's thread count fixed and recorded
        rec["threads"] = machine.set_threads(cfg.backend.get("threads", 1))
    t0 = time.perf_counter()
    repeats = []
    for i, seed in enumerate(seeds):
        repeats.append(_run_repeat(runner, cfg, backend, outdir, tracker, i, seed, len(seeds)))
        if repeats[-1].result.status == "interrupted":  # no further repeat; the record keeps this one's work
            break
    with sigint_held() as held:  # the work is done: its tables, record and table are written whole
        res = _combine_repeats(repeats, rec)
        if res.display:  # the metric a sweep's one-line output and summary table show
            rec["headline"] = {"label": res.display[0][0], "key": res.display[0][1]}
        rec.update(
            status=res.status,
            message=res.message,
            wall_s=time.perf_counter() - t0,
            finished_at=datetime.now(timezone.utc).isoformat(),
            summary=res.summary,
            tables=sorted(res.tables),
            **res.extra,
        )
        where = backend.name if backend.device == backend.name else f"{backend.name} ({backend.device})"
        meta = records.table_metadata(
            backend.simulated, where, str(cfg.hardware.name), str(cfg.system.name), str(cfg.model.name)
        )
        for rep in repeats:  # each repeat's tables in its own folder (repeat 0: the job's)
            for name, df in rep.result.tables.items():
                try:
                    records.atomic_write_parquet(rep.outdir / f"{name}.parquet", df, meta)
                except Exception as e:  # a table that cannot be written must not lose the record
                    rec.setdefault("table_errors", {})[f"{rep.dir_name}/{name}"] = str(e)
        records.atomic_write_json(outdir / "run.json", rec)
        if later:
            mirror_log = mirror_later(outdir, tracking, wandb_name, wandb_group)
            if mirror_log:
                logs.log.info("W&B: the record is mirrored in the background (%s)", mirror_log)
        else:
            log_record(tracker, res.status, backend.simulated, res.summary, res.tables)
        (print_line if multirun else print_table)(cfg, backend, res, outdir, rec.get("summary_ci95"))
    if res.status == "interrupted" or held:
        raise RunInterrupted(str(outdir / "run.json"), res.status)
    return rec


# --- repeats (repeats=N): each with its own seed and folder, then mean and 95 % interval -----------


@dataclass
class Repeat:
    """One repeat of a job: its index, seed, folder (repeat 0: the job's own), wall time, result and,
    on a real engine, the machine's load average before and after it."""

    index: int
    seed: int
    outdir: Path
    wall_s: float
    result: RunResult
    load_avg_before: Optional[list] = None
    load_avg_after: Optional[list] = None

    @property
    def dir_name(self) -> str:
        return "." if self.index == 0 else self.outdir.name


def _run_repeat(runner, cfg, backend: Backend, outdir: Path, tracker, index: int, seed: int, repeats: int) -> Repeat:
    """Run repeat ``index`` with ``seed`` (the job's config itself when repeats == 1)."""
    if repeats > 1:
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            cfg.seed = seed
        outdir = outdir if index == 0 else outdir / f"repeat-{index}"
    ctx = RunContext(cfg, backend, outdir, tracker, show_progress=bool(cfg.get("progress", True)))
    before = None if backend.simulated else machine.load_avg()
    t0 = time.perf_counter()
    res = _run_once(runner, cfg, ctx)
    wall = time.perf_counter() - t0
    return Repeat(index, seed, outdir, wall, res, before, None if backend.simulated else machine.load_avg())


def _run_once(runner, cfg, ctx: RunContext) -> RunResult:
    """``runner.run(cfg, ctx)`` with failures as results (oom / error) and, on a real engine, the
    GPU energy of the window (NVML; None = unavailable)."""
    meter = None
    if not ctx.backend.simulated:  # measured GPU energy for the run window (NVML counter)
        from harness.meters import EnergyMeter

        meter = EnergyMeter()  # the job's GPUs (CUDA_VISIBLE_DEVICES), by UUID
        meter.begin_window("run")
    gpus = (
        [{"cuda_index": g.ordinal, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id} for g in meter.gpus]
        if meter is not None
        else None
    )
    try:
        res = runner.run(cfg, ctx)
    except KeyboardInterrupt:  # SIGINT (Ctrl-C): recorded, then the job stops (_record_job)
        res = RunResult(status="interrupted", message=INTERRUPTED)
    except RunOOM as e:
        res = RunResult(status="oom", message=str(e))
    except MemoryError as e:
        res = RunResult(
            status="oom",
            message=f"host MemoryError: this process ran out of host memory"
            f"{f' ({e})' if str(e) else ''} (the run's own state, not a modelled KV cache)",
        )
    except Exception as e:
        if type(e).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError
            res = RunResult(status="oom", message=str(e).splitlines()[0])
        else:
            log.error("run failed: %s", traceback.format_exc())
            res = RunResult(status="error", message=f"{type(e).__name__}: {e}")
    if meter is not None:
        m = meter.end_window("run")
        res.summary.setdefault("gpu_energy_j", m.energy_j)  # None = unavailable, never 0
        res.summary.setdefault("gpu_avg_power_w", m.avg_power_w)
        if m.energy_j is None:
            res.summary.setdefault("gpu_energy_note", m.reason)
        res.extra.setdefault("energy_gpus", gpus)  # stored in the record (repeat 0's at top level)
    return res


def _combine_repeats(repeats: List[Repeat], rec: Dict[str, Any]) -> RunResult:
    """The job's result from its repeats, and the repeat fields of its record.

    status: interrupted if a repeat was (the last one run), else error if any repeat errored, else oom
    if any ran out of memory, else timeout if any passed its deadline, else ok. summary: over
    the repeats that finished ok (all of them when none did), each value the mean of the repeats or
    the value they all share (:func:`harness.stats.aggregate`); ``summary_ci95`` (repeats >= 2): per
    numeric metric its mean and 95 % Student-t interval. ``repeat_runs``: every repeat's seed, folder,
    status, wall time, summary and whether a warm-up was excluded (``WARMUP_KEY`` in its summary).
    display, tables' names and ``extra`` are repeat 0's (its tables are the job folder's own)."""
    first = repeats[0].result
    if len(repeats) == 1:
        res = first
    else:
        bad_runs = [r for r in repeats if r.result.status != "ok"]
        status = next(
            (s for s in ("interrupted", "error", "oom", "timeout") if any(r.result.status == s for r in repeats)), "ok"
        )
        ok = [r.result.summary for r in repeats if r.result.status == "ok"]
        summary, intervals = aggregate(ok or [r.result.summary for r in repeats])
        rec["summary_ci95"] = intervals
        message = "; ".join(
            f"repeat {r.index} (seed {r.seed}): {r.result.status}: {r.result.message}" for r in bad_runs
        )
        res = RunResult(
            status=status,
            message=message,
            summary=summary,
            display=first.display,
            tables=first.tables,
            extra=first.extra,
        )
    rec["repeats"] = len(repeats)
    rec["seeds"] = [r.seed for r in repeats]
    rec["repeat_runs"] = [_repeat_entry(r, len(repeats)) for r in repeats]
    if repeats[0].load_avg_before is not None:
        rec["load_avg_before"], rec["load_avg_after"] = repeats[0].load_avg_before, repeats[-1].load_avg_after
        rec["load_warning"] = next(
            (w for w in (machine.load_warning(r.load_avg_before, r.load_avg_after) for r in repeats) if w), None
        )
        machine.note_load(rec["load_warning"])
    return res


def _repeat_entry(r: Repeat, repeats: int) -> Dict[str, Any]:
    entry = {
        "repeat": r.index,
        "seed": r.seed,
        "dir": r.dir_name,
        "status": r.result.status,
        "message": r.result.message,
        "wall_s": r.wall_s,
        "warmup_excluded": WARMUP_KEY in r.result.summary,
        "summary": r.result.summary,
    }
    if r.load_avg_before is not None:
        entry.update(load_avg_before=r.load_avg_before, load_avg_after=r.load_avg_after)
    if repeats > 1 and r.result.extra:
        entry["extra"] = r.result.extra
    return entry


# --- process isolation for real-engine jobs in a sweep ------------------------------------------


def _child(cfg_yaml: str, multirun: bool, overrides: Optional[List[str]] = None) -> None:
    from harness.config import register_configs, register_resolvers

    terminate_as_interrupt()
    register_resolvers()
    register_configs()
    try:
        run(OmegaConf.create(cfg_yaml), multirun=multirun, overrides=overrides)
    except KeyboardInterrupt:  # its record says so (RunInterrupted); the parent stops too
        sys.exit(130)


@contextmanager
def _stdlib_start_method() -> Iterator[None]:
    """The process-wide start method set to ``spawn`` inside the block when it is one the standard
    library does not know, and set back after it. A spawned child first sets its parent's start
    method (``multiprocessing.spawn.prepare``); inside a joblib worker (a parallel sweep's job) that
    is ``loky``, which a fresh interpreter has not registered: the child would die with "cannot find
    context for 'loky'" before running the job."""
    import multiprocessing as mp

    method = mp.get_start_method(allow_none=True)
    foreign = method is not None and method not in mp.get_all_start_methods()
    if foreign:
        mp.set_start_method("spawn", force=True)
    try:
        yield
    finally:
        if foreign:
            mp.set_start_method(method, force=True)


def run_isolated(cfg: DictConfig) -> Dict[str, Any]:
    """Run the job in a fresh child process (spawned), so no GPU/vLLM state leaks into the next
    job of the sweep; a child that dies (segfault, OOM kill) is recorded as ``error``. Returns the
    job's record."""
    import multiprocessing as mp

    _, backend = validate_config(cfg)  # bad input fails here, before any work
    cfg_dict, chash = job_config(cfg)
    outdir = writable_output_dir(cfg, chash)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["output_dir"] = str(outdir)
    p = mp.get_context("spawn").Process(
        target=_child, args=(OmegaConf.to_yaml(resolved), in_multirun(), task_overrides())
    )
    with _stdlib_start_method():
        p.start()
    rec_path = outdir / "run.json"
    try:
        p.join()
    except KeyboardInterrupt:  # Ctrl-C reaches the child too: let it write its record first
        p.join(timeout=60)
        if p.is_alive():
            p.terminate()
            p.join()
        if rec_path.exists():  # the child's record (interrupted, or its work had ended)
            raise RunInterrupted(str(rec_path), json.loads(rec_path.read_text()).get("status", "?")) from None
        raise
    if p.exitcode != 0 and not rec_path.exists():
        how = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit code {p.exitcode}"
        rec = error_record(
            cfg, outdir, task_overrides(), f"job process died ({how}) before writing its record", backend
        )
        records.atomic_write_json(rec_path, rec)
        say(f"job died ({how}); recorded as error in {rec_path}")
        return rec
    rec = json.loads(rec_path.read_text())
    if rec.get("status") == "interrupted":  # the child's RunInterrupted, raised here in turn
        raise RunInterrupted(str(rec_path))
    return rec


def should_isolate(cfg: DictConfig) -> bool:
    """``isolate: auto`` isolates real-engine jobs of a multirun; true/false force it."""
    mode = cfg.get("isolate", "auto")
    if isinstance(mode, bool):
        return mode
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:
        return False
    if not multirun or cfg.backend.name == "sim":
        return False
    return not resolve_backend(cfg, family_of(cfg)).simulated  # full validation follows in run()
