"""Where a job's record goes and what is already there: the job's identity (its resolved config and
hash), its output folder (checked before Hydra makes it: never a system folder or a folder of
someone else's files; removed when a rejected run made it), the lock a job holds on its folder while
it runs, a valid record to resume from, another config's record to refuse, and an earlier record set
aside while ``resume=false`` runs the job again.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness import records
from harness.config import check_folder, check_names, check_results_dir
from harness.errors import ConfigError, bad
from harness.logs import say
from harness.process import end_startup


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
            if key == "hydra.run.dir":  # a single run's folder is named by its system and model
                try:
                    check_names(config)
                except OmegaConfBaseException:
                    pass  # a name that does not resolve: the job's validation says so
            check_folder(key, path, "a folder (leave it out for the default under results_dir)")
            records.check_creatable(path, key)  # before any resolve(): a link loop or a file is named as such
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
            check_not_foreign(Path(path), "output_dir" if key == "hydra.run.dir" and config.get("output_dir") else key)
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


LOCK_NAME = ".job.lock"  # the lock a running job holds in its folder (job_lock); the file stays, empty

# What a job's folder holds (harness.run, Hydra): a folder holding any of these is one of ours.
OUR_FILES = ("run.json", "run.log", ".hydra", LOCK_NAME, "multirun.yaml", "runs.parquet")


def check_not_foreign(path: Path, key: str) -> None:
    """Raise ConfigError when the run or sweep folder ``path`` (named by the setting ``key``) is a
    system folder (``/``, a folder directly under it such as ``/etc`` or ``/tmp``, or the home
    folder) or an existing folder that is not empty and holds no file of a run or sweep of ours
    (:data:`OUR_FILES`, in it or in a folder of it: a sweep's job folders): Hydra and the job would write ``.hydra/``, ``run.log``, ``run.json`` and
    tables over same-named files of someone else's (``output_dir=~`` was accepted). A missing or
    empty folder, or one of an earlier run (its record, its log), passes."""
    real = Path(path).expanduser().resolve()
    system = real == Path(real.anchor) or real.parent == Path(real.anchor) or real == Path.home().resolve()
    foreign = (
        not system
        and real.is_dir()
        and any(True for _ in real.iterdir())
        and not any((d / name).exists() for d in (real, *_subfolders(real)) for name in OUR_FILES)
    )
    if system or foreign:
        what = "a system folder" if system else "a folder that is not empty and holds no run or sweep of ours"
        raise ConfigError(
            f"{key}: {str(path)!r} is {what}: a run would write .hydra/, run.log, run.json and its "
            f"tables among its files; nothing was run. Pass a new or empty folder, or one an earlier "
            f"run wrote ({', '.join(OUR_FILES[:3])})"
        )


def _subfolders(path: Path) -> List[Path]:
    return [d for d in path.iterdir() if d.is_dir() and not d.is_symlink()]


class JobFolderBusy(ConfigError):
    """Another process holds the lock of the job's folder (:func:`job_lock`): it is running a job
    there now. Nothing is written: not even an error record, which could land over its record."""


@contextmanager
def job_lock(outdir: Path, key: str) -> Iterator[None]:
    """Hold the lock of the job's folder ``outdir`` (``outdir/.job.lock``, an advisory file lock of
    the ``filelock`` library: ``flock`` where the file system has it, a marker file elsewhere) for
    the block, the whole life of the job, so two processes never write one record (two runs into one
    ``output_dir=`` started 0.3 s apart both checked the folder, both ran, and the later record
    replaced the earlier). The lock is released when the block ends or the process dies (``kill
    -9`` included). Raises :class:`JobFolderBusy`, naming ``key``, when another process holds it."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(outdir / LOCK_NAME), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise JobFolderBusy(
            f"{key}: {str(outdir)!r} is in use: another process runs a job there now (it holds "
            f"{outdir / LOCK_NAME}); nothing was run. Wait for it to end, or pass another folder "
            f"({_OTHER_FOLDER[key]})"
        ) from None
    try:
        yield
    finally:
        lock.release()


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
    lists only runs that ran (whatever ``hydra.job.name`` calls the log); then
    the folders above it that the run made and that are empty now (a new ``results_dir`` and its
    ``runs/`` were left behind), never one that existed before."""
    import shutil

    from hydra.core.hydra_config import HydraConfig

    d = OutputDirCheck.new_run_dir
    log_name = f"{HydraConfig.get().job.name}.log" if HydraConfig.initialized() else "run.log"
    # a folder holding a job's lock was claimed by a job (this one's, or one running there now): kept
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


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().get("mode") == RunMode.MULTIRUN


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


def output_dir_key(cfg) -> str:
    """The setting that names the job's folder: ``output_dir``, ``hydra.sweep.dir`` or ``hydra.run.dir``."""
    return "output_dir" if cfg.get("output_dir") else "hydra.sweep.dir" if in_multirun() else "hydra.run.dir"


def writable_output_dir(cfg, chash: str) -> Path:
    """The job's output directory, created; ConfigError naming the setting when it cannot be written
    or holds the record of a config other than the job's (config hash ``chash``, see
    :func:`check_no_other_record`)."""
    outdir = output_dir(cfg)
    key = output_dir_key(cfg)
    records.check_writable(outdir, key)
    check_no_other_record(outdir, chash, key)
    return outdir


@contextmanager
def claimed_output_dir(cfg, chash: str) -> Iterator[Path]:
    """:func:`writable_output_dir`, held by the job for the block (:func:`job_lock`) and checked
    again once held: a record another config's job wrote there since the first check is refused
    (ConfigError), never replaced. Yields the folder."""
    outdir = writable_output_dir(cfg, chash)
    key = output_dir_key(cfg)
    with job_lock(outdir, key):
        check_no_other_record(outdir, chash, key)
        yield outdir


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


def job_config(cfg: DictConfig) -> Tuple[Dict[str, Any], str]:
    """A job's resolved config as its record keeps it (``hydra``'s own node left out, as Hydra hands
    the job its config) and the config hash that identifies the job's record."""
    d = {
        k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
        for k in cfg
        if k != "hydra"
    }
    return d, records.config_hash(d)


def recorded(
    outdir: Path, chash: str, tell: Callable[[str], None] = say, data: Optional[Dict[str, str]] = None
) -> Optional[Dict[str, Any]]:
    """The job's valid record in ``outdir`` (``records.load_valid_record``: this record version, status
    ok or oom, config hash ``chash``), telling (``tell``: printed and logged to run.log) that the job is
    skipped; None when there is none, or when ``data`` (the job's data files, ``{path: sha256}``)
    differs from the record's (the job runs again; a record written before data files were recorded
    is not compared). The one resume check: :func:`run` makes it before a job."""
    prev = records.load_valid_record(outdir, chash)
    if prev is not None and data is not None and "data_files" in prev and prev["data_files"] != data:
        old = prev["data_files"]
        moved = sorted(set(old) ^ set(data)) or sorted(p for p in data if old[p] != data[p])
        tell(
            f"running again: the data differ from the record's ({moved[0]}"
            + (
                f": sha256 {old[moved[0]][:12]} -> {data[moved[0]][:12]})"
                if moved[0] in old and moved[0] in data
                else ")"
            )
            + f"; the earlier record is set aside in {outdir / records.REPLACED_DIR} until this run's is valid"
        )
        return None
    if prev is not None:
        tell(f"skipping: valid record exists ({outdir / 'run.json'}, status {prev['status']})")
    return prev


def set_aside(outdir: Path, chash: str) -> None:
    """``resume=false`` over the job's valid record (status ok/oom, same config): its run.json, tables
    and repeat folders are moved into ``outdir/replaced-record/`` before the job runs, so that a re-run
    that ends without a valid record (interrupted, error, killed) loses nothing recorded
    (:func:`settle_aside`). A folder already holding one (an earlier re-run that did not finish) is
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


def settle_aside(aside: Path, outdir: Path) -> None:
    """After the re-run (returned, raised or interrupted): a valid new record (ok/oom) in ``outdir``
    replaces the one set aside (removed); otherwise the earlier one stays in ``aside``, and the log
    says where."""
    import shutil

    status = (records.read_record(outdir) or {}).get("status")
    if status in records.VALID_STATUSES:
        shutil.rmtree(aside, ignore_errors=True)
    else:
        say(f"this run ended {status or 'without a record'}; the earlier valid record is kept in {aside}", warning=True)


def check_job_folders(jobs, sweep_dir: Path, dirname_cfg) -> None:
    """Every sweep job's folder (``hydra.sweep.subdir``: its overrides joined,
    :func:`harness.compose.job_dirname`) inside ``sweep_dir`` and no two jobs' the same: a value with
    path segments (``model.name=../../x``) would write outside the sweep, and two jobs differing only
    in a setting left out of folder names (``resume=false,true``) would write one record over the
    other. Raises ConfigError naming the job."""
    from harness.compose import job_dirname

    root = Path(sweep_dir).resolve()
    seen: Dict[Path, Any] = {}
    for job in jobs:
        folder = (root / job_dirname(list(job), dirname_cfg)).resolve()
        if folder == root or root not in folder.parents:
            raise ConfigError(
                f"the sweep job {' '.join(job)}: its folder {folder} is not inside the sweep's folder {root} "
                f"(a value with path segments)"
            )
        if folder in seen:
            raise ConfigError(
                f"the sweep job {' '.join(job)}: its folder {folder} is also the folder of the job "
                f"{' '.join(seen[folder])} (they differ only in settings left out of folder names)"
            )
        seen[folder] = job
