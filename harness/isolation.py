"""Real-engine jobs of a sweep in a child process of their own, so that no GPU or vLLM state leaks
into the next job; a child that dies is recorded as ``error``.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

from omegaconf import DictConfig, OmegaConf

from harness import records
from harness.backend import resolve_backend
from harness.errors import RunInterrupted
from harness.family import family_of
from harness.folders import JobFolderBusy, in_multirun, job_config, task_overrides, writable_output_dir
from harness.logs import say
from harness.process import terminate_as_interrupt, watch_parent
from harness.run import error_record, run, validate_config

BUSY_EXIT = 75  # the child found its folder held by another process (EX_TEMPFAIL): no record, no error record


def _child(cfg_yaml: str, multirun: bool, overrides: Optional[List[str]] = None) -> None:
    from harness.config import register_configs, register_resolvers

    terminate_as_interrupt()
    watch_parent("the job's parent process")  # a sweep worker or run.py's process, killed: this job stops too
    register_resolvers()
    register_configs()
    try:
        run(OmegaConf.create(cfg_yaml), multirun=multirun, overrides=overrides)
    except KeyboardInterrupt:  # its record says so (RunInterrupted); the parent stops too
        sys.exit(130)
    except JobFolderBusy as e:  # another process's job: the parent must write no record either
        print(f"error: {e}", file=sys.stderr)
        sys.exit(BUSY_EXIT)


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
    if p.exitcode == BUSY_EXIT:
        raise JobFolderBusy(f"{outdir}: another process runs a job there now (the job's process said why)")
    if p.exitcode != 0 and not rec_path.exists():
        how = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit code {p.exitcode}"
        rec = error_record(
            cfg, outdir, task_overrides(), f"job process died ({how}) before writing its record", backend
        )
        records.write_record(rec_path, rec)
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
