"""Where our messages go: the console gets what a user must see, the job's ``run.log`` everything.

:func:`say` prints a line (stdout, or stderr for warnings) and logs it to the ``harness`` logger;
:func:`job_log` makes sure a run's ``<output dir>/run.log`` receives the log (Hydra's job logging
already writes it for a normal run, ``conf/hydra/job_logging/harness.yaml``; a spawned or remote job
and a direct ``run(cfg)`` get a handler of their own for the run's duration). :func:`quiet_engines`
keeps vLLM's INFO lines off the console unless ``verbose=true``.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("harness")
STAMPED = "[%(asctime)s][%(name)s][%(levelname)s] %(message)s"


def say(msg: str, warning: bool = False) -> None:
    """Print ``msg`` (``warning``: on stderr, prefixed ``warning:``) and log it to run.log."""
    if warning:
        print(f"warning: {msg}", file=sys.stderr, flush=True)
        log.warning(msg)
    else:
        print(msg, flush=True)
        log.info(msg)


@contextmanager
def job_log(outdir: Path):
    """Log INFO and above to ``outdir/run.log`` while the block runs, unless a handler already does."""
    path = (Path(outdir) / "run.log").resolve()
    root = logging.getLogger()
    have = any(isinstance(h, logging.FileHandler) and Path(h.baseFilename).resolve() == path for h in root.handlers)
    handler = None
    if not have:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter(STAMPED))
        handler.setLevel(logging.INFO)
        root.addHandler(handler)
        if root.level > logging.INFO or root.level == logging.NOTSET:
            old_level, root.level = root.level, logging.INFO
        else:
            old_level = None
    try:
        yield path
    finally:
        if handler is not None:
            root.removeHandler(handler)
            handler.close()
            if old_level is not None:
                root.setLevel(old_level)


def quiet_engines(verbose: bool) -> None:
    """vLLM logs at WARNING unless ``verbose`` (read by vLLM when it is first imported)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
