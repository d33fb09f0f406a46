"""DVFS actuator: locked SM clocks set from a background thread through NVML, restored on every exit.

``DvfsActuator(actuate=False)`` (the default) only records the requested clocks. With
``actuate=True`` (a user's own NVIDIA GPU; needs root / CAP_SYS_ADMIN, see beam.md §3.2) a worker
thread calls ``nvmlDeviceSetGpuLockedClocks(h, f, f)`` on the job's GPUs -- asynchronously, as BEAM
does (7-10 ms per call, off the critical path). The job's GPUs are found in NVML by UUID / PCI bus
id (:mod:`harness.gpus`), never by NVML index. Locked clocks are reset with
``nvmlDeviceResetGpuLockedClocks`` on ``close()``, on leaving a ``with`` block (also after an
exception), at interpreter exit, on every catchable terminating signal (:data:`RESTORING_SIGNALS`),
and at Hydra job end (:class:`ClockRestoreCallback`). For what cannot be caught (``kill -9``, a
fault signal, the OOM killer) a lock record (:mod:`harness.clock_locks`) is written before the
first lock: the next run warns and ``python -m systems.energy_serving.actuator --restore`` resets exactly
those GPUs. A permission error disables actuation and is recorded; requests keep being logged.
Never enable it on shared GPUs.
"""

from __future__ import annotations

import argparse
import atexit
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, List, Optional

from harness import clock_locks

_LIVE: "set[DvfsActuator]" = set()  # actuating and not closed (kept alive for the exit paths)
_HANDLERS_INSTALLED = False
_PREVIOUS_HANDLERS: dict = {}
NVML_ERROR_NO_PERMISSION = 4


def _signals(*names: str) -> tuple:
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


# Signals whose default action ends the process and that a Python handler can run for: every one
# restores clocks, then the previous handler runs (SIGINT: KeyboardInterrupt) or the default action
# is taken again, so the exit status still names the signal. Not here: SIGKILL/SIGSTOP (cannot be
# caught), the fault signals SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGTRAP/SIGSYS (a Python handler would
# return to the faulting instruction; the lock record covers those), and SIGPIPE/SIGXFSZ, which
# Python ignores (they become OSErrors, not exits).
RESTORING_SIGNALS = _signals(
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGTERM",
    "SIGABRT",
    "SIGUSR1",
    "SIGUSR2",
    "SIGALRM",
    "SIGVTALRM",
    "SIGPROF",
    "SIGXCPU",
    "SIGPWR",
    "SIGIO",
    "SIGSTKFLT",
) + tuple(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))


def restore_all() -> None:
    """Stop actuation and reset the locked clocks of every live actuator (idempotent): what exit
    paths call (atexit, signals, the Hydra callback)."""
    for a in list(_LIVE):
        a.stop_actuating("clocks restored at exit")


def _on_signal(signum, frame):
    restore_all()
    prev = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(prev):
        return prev(signum, frame)
    signal.signal(signum, signal.SIG_DFL)  # the default action: end the process
    signal.raise_signal(signum)


def _install_handlers() -> None:
    """Once per process, from the main thread (Python runs signal handlers there): atexit, and every
    RESTORING_SIGNALS whose handler is the default or a Python function (chained). A signal that is
    ignored, or handled in C by a library, is left alone."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    atexit.register(restore_all)
    for sig in RESTORING_SIGNALS:
        prev = signal.getsignal(sig)
        if prev is signal.SIG_DFL or (callable(prev) and prev is not _on_signal):
            _PREVIOUS_HANDLERS[sig] = prev
            signal.signal(sig, _on_signal)
    _HANDLERS_INSTALLED = True


class DvfsActuator:
    """Requests SM clocks (MHz); applies them only when ``actuate`` is true and NVML allows it.

    Args:
        actuate: apply clocks (default False: record only).
        gpu_indices: the job's CUDA device indices (``cuda:k``; mapped to NVML by UUID / PCI bus
            id, see :mod:`harness.gpus`); None = every GPU the job sees.
        nvml: an NVML-like module (tests pass a fake); default ``pynvml``.
    Attributes:
        log: rows [time_s, clock_mhz, applied (bool), error (str or None)], one per request.
        available: False (with ``reason``) when actuation is off or failed.
        gpus: the :class:`harness.gpus.JobGpu` s whose clocks are set.
    """

    def __init__(self, actuate: bool = False, gpu_indices: Optional[List[int]] = None, nvml: Any = None):
        self.actuate, self.available, self.reason = bool(actuate), False, "actuation off (record only)"
        self.log: List[list] = []
        self.gpus: list = []
        self._locked: set = set()
        self._lock = threading.RLock()  # a signal handler may call restore() inside restore()
        self._q: "queue.Queue" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self.nvml = None
        if not self.actuate:
            return
        try:
            from harness.gpus import open_job_gpus

            self.nvml, self.gpus = open_job_gpus(nvml, gpu_indices)
            clock_locks.lock_dir().mkdir(parents=True, exist_ok=True)
            self.available, self.reason = True, ""
        except Exception as e:
            self.reason = f"actuation unavailable: {type(e).__name__}: {e}"
            return
        _LIVE.add(self)
        _install_handlers()
        self._thread = threading.Thread(target=self._worker, name="dvfs-actuator", daemon=True)
        self._thread.start()

    @property
    def num_gpus(self) -> int:
        """GPUs whose clocks this actuator controls."""
        return len(self.gpus)

    def request(self, clock_mhz: float, t: float = 0.0) -> None:
        """Record (and, when actuating, queue) a clock request. Never blocks."""
        row = [float(t), float(clock_mhz), False, None]
        self.log.append(row)
        if self.available:
            self._q.put(row)

    def _previous_state(self, gpu) -> dict:
        out = {"locked_clocks": "unknown (NVML cannot read them); --restore resets to the driver default"}
        for key, fn in (("sm_clock_mhz", "nvmlDeviceGetClockInfo"), ("max_sm_clock_mhz", "nvmlDeviceGetMaxClockInfo")):
            try:
                out[key] = getattr(self.nvml, fn)(gpu.handle, getattr(self.nvml, "NVML_CLOCK_SM", 1))
            except Exception:
                out[key] = None
        return out

    def _lock_clock(self, f: int) -> None:
        """Lock every GPU at ``f`` MHz; before a GPU's first lock, write its lock record."""
        for g in self.gpus:
            if g.ordinal not in self._locked:
                clock_locks.write(g, self._previous_state(g))
                self._locked.add(g.ordinal)
            self.nvml.nvmlDeviceSetGpuLockedClocks(g.handle, f, f)

    def _apply(self, row: list) -> None:
        try:
            with self._lock:
                if not self.available:
                    row[3] = self.reason
                    return
                self._lock_clock(int(round(row[1])))
            row[2] = True
        except Exception as e:
            row[3] = f"{type(e).__name__}: {e}"
            if isinstance(e, OSError):
                self.stop_actuating(f"actuation disabled: the clock lock record cannot be written ({e})")
            elif getattr(e, "value", None) == NVML_ERROR_NO_PERMISSION or "Permission" in type(e).__name__:
                self.stop_actuating(f"actuation disabled: no permission to lock clocks ({e})")

    def _worker(self) -> None:
        while True:
            row = self._q.get()
            try:
                if row is None:
                    return
                self._apply(row)
            finally:
                self._q.task_done()

    def wait(self, timeout: float = 5.0) -> None:
        """Block until queued requests are applied (tests, shutdown)."""
        t0 = time.perf_counter()
        while self._q.unfinished_tasks and time.perf_counter() - t0 < timeout:
            time.sleep(0.001)

    def restore(self) -> None:
        """Reset the locked clocks this actuator set and remove their lock records (errors
        recorded in ``reason``, never raised; a GPU whose reset failed keeps its record)."""
        with self._lock:
            for g in self.gpus:
                if g.ordinal not in self._locked:
                    continue
                try:
                    self.nvml.nvmlDeviceResetGpuLockedClocks(g.handle)
                    clock_locks.remove(g.uuid)
                except Exception as e:
                    self.reason = f"reset of GPU {g.uuid} failed: {type(e).__name__}: {e}"
                self._locked.discard(g.ordinal)

    def stop_actuating(self, reason: str) -> None:
        """Apply no further requests (they are still logged) and restore clocks."""
        with self._lock:
            self.available, self.reason = False, reason
            self.restore()

    def close(self) -> None:
        """Stop the worker, restore clocks, shut NVML down."""
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=5.0)
            self._thread = None
        if self.nvml is not None:
            self.restore()
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.nvml = None
        _LIVE.discard(self)

    def __enter__(self) -> "DvfsActuator":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


try:
    from hydra.experimental.callback import Callback

    class ClockRestoreCallback(Callback):
        """Hydra callback: reset locked clocks of live actuators at job end (add it under
        ``hydra.callbacks`` as ``_target_: systems.energy_serving.actuator.ClockRestoreCallback``)."""

        def on_job_end(self, config, job_return=None, **kwargs) -> None:
            restore_all()
except ImportError:  # pragma: no cover
    pass


# --- python -m systems.energy_serving.actuator --restore ------------------------------------------------


def restore_from_records(nvml=None, out=sys.stdout) -> int:
    """Reset the clocks of every GPU whose lock record is stale (its process died), remove those
    records, and say what was done; leave GPUs of live runs and of other hosts alone; drop records
    from before the last reboot. Returns the number of GPUs whose reset failed."""
    recs = clock_locks.read_all()
    if not recs:
        print(f"no clock lock records in {clock_locks.lock_dir()}: nothing to restore", file=out)
        return 0
    failed, nvml_ready = 0, False
    for r in recs:
        state, uuid = clock_locks.owner_state(r), r["uuid"]
        if state == "live":
            print(f"GPU {uuid}: clocks held by running pid {r.get('pid')}: left alone", file=out)
        elif state == "elsewhere":
            print(f"GPU {uuid}: record from host {r.get('host')}: run --restore there", file=out)
        elif state == "obsolete":
            os.unlink(r["path"])
            print(f"GPU {uuid}: locked before the last reboot, which reset it: record removed", file=out)
        else:
            try:
                if not nvml_ready:
                    if nvml is None:
                        import pynvml as nvml
                    nvml.nvmlInit()
                    nvml_ready = True
                nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByUUID(uuid))
                os.unlink(r["path"])
                print(
                    f"GPU {uuid} ({r.get('name')}, PCI {r.get('pci_bus_id')}): locked clocks reset "
                    f"(left by pid {r.get('pid')})",
                    file=out,
                )
            except Exception as e:
                failed += 1
                print(f"GPU {uuid}: reset failed ({type(e).__name__}: {e}); record kept in {r['path']}", file=out)
    return failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m systems.energy_serving.actuator",
        description="Reset GPU clocks left locked by a run that was killed.",
    )
    ap.add_argument(
        "--restore", action="store_true", help=f"reset the GPUs named by stale lock records in {clock_locks.lock_dir()}"
    )
    args = ap.parse_args(argv)
    if not args.restore:
        ap.print_help()
        return 2
    return 1 if restore_from_records() else 0


if __name__ == "__main__":
    sys.exit(main())
