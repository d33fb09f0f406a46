"""What a run's process does besides the job: SIGINT/SIGTERM handled as an interruption that is
recorded, and Python's cyclic garbage collector paused where it only costs time.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator, List

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
