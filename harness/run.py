"""Run one job: ``validate -> run -> record``.

``run(cfg)``: validate the composed config (before any work), resolve the backend and say which on
the first line of output, skip a job whose valid record exists, run the family's ``run``
(harness.family), and write the record atomically. An OOM, a passed deadline or a failure mid-run is
a recorded result (status ``oom``/``timeout``/``error``), never a lost one. The concerns around it
have modules of their own: harness.folders (where the record goes), harness.repeats, harness.console
(what is printed), harness.process (signals, the garbage collector), harness.isolation (a child
process per real-engine job of a sweep).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import DictConfig

from harness import clock_locks, logs, machine, records
from harness.backend import Backend, resolve_backend
from harness.config import (
    check_shortcuts,
    shortcut_overridden_by,
    unused_shortcuts,
    validate_common,
)
from harness.console import print_line, print_table
from harness.errors import TYPE_WORDS, ConfigError, RunInterrupted, bad
from harness.family import Family, family_of
from harness.folders import (
    claimed_output_dir,
    in_multirun,
    job_config,
    recorded,
    set_aside,
    settle_aside,
    task_overrides,
)
from harness.logs import say
from harness.process import collector_paused, sigint_held
from harness.repeats import combine_repeats, run_repeat
from harness.stats import repeat_seeds
from harness.tracking import NullTracker, job_gets_own_run, log_record, make_tracker, mirror_later

log = logging.getLogger(__name__)


def validate(cfg) -> Tuple[Family, Backend]:
    """All checks that must pass before work starts. Returns (the system's family, backend)."""
    validate_common(cfg)
    family = family_of(cfg)
    family.validate(cfg)
    check_shortcuts(cfg, unused_shortcuts(cfg))  # the set shortcuts nothing reads: their values too
    backend = resolve_backend(cfg, family)
    family.validate_backend(cfg, backend)
    return family, backend


def validate_config(cfg) -> Tuple[Family, Backend]:
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


def exit_code(record: Dict[str, Any]) -> int:
    """Exit status of a finished job: 1 when its record's status is ``error``, else 0 (``ok``, and
    ``oom`` and ``timeout``, which are recorded results). Bad input exits 2 before any record, an
    interrupted job 130 (run.py)."""
    return 1 if record.get("status") == "error" else 0


def run(cfg: DictConfig, multirun: Optional[bool] = None, overrides: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run one job from a composed config and return its record (also written to run.json).

    ``multirun``: whether the job belongs to a Hydra multirun (decides its W&B run, see
    ``tracking.sweep_jobs``, and one printed line instead of the table); None = ask Hydra.
    ``overrides``: the job's command-line overrides, recorded (None = ask Hydra).
    Raises ConfigError (before any work and before any file is written) for bad input.
    """
    logs.quiet_engines(bool(cfg.get("verbose", False)))
    family, backend = validate_config(cfg)
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
        for text in family.ignored_settings(cfg, given):  # a family's own
            say(text, warning=True)
        if cfg.get("verifier") and cfg.verifier.get("name", "none") != "none" and not family.uses_verifier:
            say(
                f"verifier={cfg.verifier.name} has no effect: system={cfg.system.name} runs no verifier model "
                f"(the FastTTS systems do)",
                warning=True,
            )
    cfg_dict, chash = job_config(cfg)
    from workloads.data import data_files

    with claimed_output_dir(cfg, chash) as outdir:  # no other process writes there till it ends
        data = data_files(cfg.workload)
        if cfg.get("resume", True):
            prev = recorded(outdir, chash, data=data)
            if prev is not None:
                return prev
        overrides = task_overrides() if overrides is None else overrides
        with logs.job_log(outdir):
            # resume=false, or resume over a record of other data: the earlier record is set aside
            if not cfg.get("resume", True) or records.load_valid_record(outdir, chash) is not None:
                set_aside(outdir, chash)
            aside = outdir / records.REPLACED_DIR  # also one an unfinished re-run left: settled by this run's record
            try:
                return _run_job(cfg, family, backend, multirun, outdir, cfg_dict, chash, overrides)
            finally:
                if aside.is_dir():
                    settle_aside(aside, outdir)


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
        "family": family_of(cfg).name,
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
        "data_files": data_files_of(cfg),
        "overrides": overrides,
        "config": cfg_dict,
    }


def data_files_of(cfg) -> Dict[str, str]:
    """``{path: sha256}`` of the data files the job reads (``workloads.data.data_files``); {} where
    the workload cannot tell (a config that does not resolve: its error record says why)."""
    from omegaconf.errors import OmegaConfBaseException

    from workloads.data import data_files

    try:
        return data_files(cfg.workload)
    except (OmegaConfBaseException, OSError):
        return {}


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
    family: Family,
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
        return _record_job(cfg, family, backend, multirun, outdir, cfg_dict, chash, overrides)


def _record_job(
    cfg,
    family: Family,
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
        repeats.append(run_repeat(family, cfg, backend, outdir, tracker, i, seed, len(seeds)))
        if repeats[-1].result.status == "interrupted":  # no further repeat; the record keeps this one's work
            break
    with sigint_held() as held:  # the work is done: its tables, record and table are written whole
        res = combine_repeats(repeats, rec)
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
                rel = str((rep.outdir / f"{name}.parquet").relative_to(outdir))
                try:
                    sha = records.atomic_write_parquet(rep.outdir / f"{name}.parquet", df, meta)
                    rec.setdefault("table_sha256", {})[rel] = sha
                except Exception as e:  # a table that cannot be written must not lose the record
                    rec.setdefault("table_errors", {})[rel] = f"{type(e).__name__}: {e}"
        if rec.get("table_errors") and rec["status"] in records.VALID_STATUSES:
            # its results are kept in the record, but it is no result a re-run would skip
            first = next(iter(rec["table_errors"].items()))
            rec["message"] = "; ".join(
                m for m in (rec.get("message"), f"table {first[0]} could not be written ({first[1]})") if m
            )
            rec["status"], rec["status_before_table_error"] = "error", rec["status"]
        records.write_record(outdir / "run.json", rec)
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
