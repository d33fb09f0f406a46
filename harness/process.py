"""What a run's process does besides the job: SIGINT/SIGTERM handled as an interruption that is
recorded, a sweep worker's (or an isolated job's) watch on the process that started it, and Python's
cyclic garbage collector paused where it only costs time.
"""

from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

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


_watched: Optional[Tuple[int, str]] = None  # (pid, what it is) of the parent this process watches


def watch_parent(what: str) -> None:
    """Exit (status 3, one line on stderr) as soon as this process's parent ends: a sweep's worker
    when the sweep's driver is killed (``kill -9``), an isolated job's child when its worker or
    run.py's process is. A daemon thread waits on the parent (``os.pidfd_open``: woken when it ends;
    polled every 0.1 s where there is no pidfd); :func:`exit_if_parent_gone` closes the gap before a
    record is written. Measured (tests/test_sweeps.py's kill of Fig.9's 25-job sweep, 2 workers):
    the workers ended 0.06-0.16 s after the kill; a job that finished in that time wrote its record
    up to 0.01 s after the kill, which this check now stops. One watch per process (later calls
    with the same parent do nothing)."""
    import threading

    global _watched
    pid = os.getppid()
    if _watched is not None and _watched[0] == pid:
        return
    _watched = (pid, what)
    threading.Thread(target=_wait_for, args=(pid, what), name="parent-watch", daemon=True).start()


def exit_if_parent_gone() -> None:
    """Exit as :func:`watch_parent` does when the watched parent has ended (call it just before
    writing a record: a process whose driver died writes none, so a re-run of the sweep finds no
    record it did not write itself). Nothing happens where no parent is watched."""
    if _watched is not None and not _alive(_watched[0]):
        _parent_gone(*_watched)


def _wait_for(pid: int, what: str) -> None:
    import select
    import time

    try:
        fd = os.pidfd_open(pid)  # Linux >= 5.3: readable once the process has ended
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        select.select([fd], [], [])
    else:
        while _alive(pid):
            time.sleep(0.1)
    _parent_gone(pid, what)


def _parent_gone(pid: int, what: str) -> None:
    print(
        f"{what} (pid {pid}) is gone: process {os.getpid()} stops (jobs without a record run again when the "
        f"sweep is re-run)",
        file=sys.stderr,
        flush=True,
    )
    os._exit(3)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
