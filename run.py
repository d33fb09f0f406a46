"""Entry point: ``python run.py system=lbs model=opt-6.7b beams=64`` (one job) or
``python run.py -m experiment=lbs_fig9`` (a paper figure's sweep). See README.md."""

import errno
import gc
import sys
from pathlib import Path

INTERRUPTED = (
    "interrupted while no job was running (start-up or a sweep's report): every record written before is intact"
)


def _interrupted_at_import(signum, frame):
    print(INTERRUPTED, file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
    gc.disable()  # until the start-up ends: harness.process.end_startup
    import signal

    signal.signal(signal.SIGINT, _interrupted_at_import)  # Ctrl-C while importing: one line, no traceback

# imported after the Ctrl-C handler above, so that an interrupt while importing is one line
import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from harness.config import register_configs, register_resolvers  # noqa: E402
from harness.errors import ConfigError, RunInterrupted  # noqa: E402

register_resolvers()
register_configs()


EXIT = {"code": 0}  # a single run's exit status, set by main() (Hydra discards its return value)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    import multiprocessing

    from harness.folders import JobFolderBusy, in_multirun, remove_unused_run_dir
    from harness.isolation import run_isolated, should_isolate
    from harness.process import end_startup, terminate_as_interrupt
    from harness.run import exit_code, run

    end_startup()  # the collector on (OutputDirCheck's callback did it, unless callbacks were replaced)
    if multiprocessing.parent_process() is None:  # the process run.py started, not a sweep's worker
        terminate_as_interrupt()  # SIGTERM (timeout, scancel) recorded as interrupted
    try:
        rec = run_isolated(cfg) if should_isolate(cfg) else run(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        if not _record_invalid_sweep_job(cfg, e):
            if not isinstance(e, JobFolderBusy):  # that folder is another run's, running now
                remove_unused_run_dir()
            sys.exit(2)
        return
    except KeyboardInterrupt as e:  # SIGINT (Ctrl-C); RunInterrupted: after the job's record was written
        if in_multirun():
            raise  # the sweeper stops the sweep (hydra_plugins.harness_sweeper)
        if isinstance(e, RunInterrupted) and e.status == "interrupted":
            print(f"interrupted: the run's record (status interrupted) is {e.record}", file=sys.stderr)
        elif isinstance(e, RunInterrupted):
            print(
                f"interrupted after the run's work ended: its record (status {e.status}) is {e.record}", file=sys.stderr
            )
        else:
            print("interrupted: no record was written", file=sys.stderr)
            remove_unused_run_dir()
        sys.exit(130)
    except OSError as e:  # a full disk or quota: say so instead of a traceback
        if in_multirun() or e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(
            f"error: {e.strerror} writing {e.filename or 'the record'}: this run could not be recorded; "
            f"records written before are intact (every file is written atomically)",
            file=sys.stderr,
        )
        sys.exit(1)
    if not in_multirun():  # status error -> exit 1 (oom is a recorded result: 0)
        EXIT["code"] = exit_code(rec)


def _record_invalid_sweep_job(cfg: DictConfig, err: Exception) -> bool:
    """In a multirun, an invalid job is recorded (status error) so the sweep goes on; a record already
    in its folder (one of another config, which the job refused to replace) stays, and a folder
    another process holds (JobFolderBusy: it runs that job now) gets nothing from this one."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    from harness.folders import JobFolderBusy

    if isinstance(err, JobFolderBusy):  # another process writes that folder's record now: nothing here
        return True
    from harness import records
    from harness.run import error_record, task_overrides

    out = Path(HydraConfig.get().runtime.output_dir)
    if (out / "run.json").exists():
        return True
    records.write_record(out / "run.json", error_record(cfg, out, task_overrides(), f"invalid configuration: {err}"))
    return True


if __name__ == "__main__":
    from harness.cli import preflight, usage

    CONF = Path(__file__).resolve().parent / "conf"
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(usage(CONF))
        sys.exit(0)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt: a job records it (main)
    try:
        preflight(sys.argv[1:], CONF)
        main()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # outside a job: composing the config, a sweep's report
        if "harness.folders" in sys.modules:  # a single run's folder Hydra made before the task began
            sys.modules["harness.folders"].remove_unused_run_dir()
        print(INTERRUPTED, file=sys.stderr)
        sys.exit(130)
    # The interpreter's shutdown collects and frees every object still alive, the imported
    # libraries' included: 0.1-0.17 s after a simulated run on a 2-core machine (0.03 s with this).
    # Everything the run writes is closed by now, and atexit handlers (logging, multiprocessing,
    # vLLM) still run; gc.freeze() only keeps those objects out of the final collections. Not after
    # a real engine ran (torch imported): triton's nanobind then reports the objects the final
    # collections did not free as ~25 lines of "leaked" warnings.
    if "torch" not in sys.modules:
        gc.freeze()
    sys.exit(EXIT["code"])
