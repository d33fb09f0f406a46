"""DVFS actuator: locked SM clocks set from a background thread through NVML, restored on every exit.

``DvfsActuator(actuate=False)`` (the default) only records the requested clocks. With
``actuate=True`` (a user's own NVIDIA GPU; needs root / CAP_SYS_ADMIN, see beam.md §3.2) a worker
thread calls ``nvmlDeviceSetGpuLockedClocks(h, f, f)`` for every GPU -- asynchronously, as BEAM does
(7-10 ms per call, off the critical path). Locked clocks are reset with
``nvmlDeviceResetGpuLockedClocks`` on ``close()``, on leaving a ``with`` block (also after an
exception), at interpreter exit, on SIGTERM/SIGINT, and at Hydra job end
(:class:`ClockRestoreCallback`). A permission error disables actuation and is recorded; requests
keep being logged. Never enable it on shared GPUs.
"""
from __future__ import annotations

import atexit
import queue
import signal
import threading
import time
import weakref
from typing import Any, List, Optional

_LIVE: "weakref.WeakSet[DvfsActuator]" = weakref.WeakSet()
_HANDLERS_INSTALLED = False
NVML_ERROR_NO_PERMISSION = 4


def restore_all() -> None:
    """Reset locked clocks of every live actuator (idempotent)."""
    for a in list(_LIVE):
        a.restore()


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    atexit.register(restore_all)
    for sig in (signal.SIGTERM, signal.SIGINT):
        prev = signal.getsignal(sig)

        def handler(signum, frame, prev=prev):
            restore_all()
            if callable(prev):
                prev(signum, frame)
            elif prev == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)
        signal.signal(sig, handler)
    _HANDLERS_INSTALLED = True


class DvfsActuator:
    """Requests SM clocks (MHz); applies them only when ``actuate`` is true and NVML allows it.

    Args:
        actuate: apply clocks (default False: record only).
        gpu_indices: NVML indices; None = all GPUs.
        nvml: an NVML-like module (tests pass a fake); default ``pynvml``.
    Attributes:
        log: rows [time_s, clock_mhz, applied (bool), error (str or None)], one per request.
        available: False (with ``reason``) when actuation is off or failed.
    """

    def __init__(self, actuate: bool = False, gpu_indices: Optional[List[int]] = None, nvml: Any = None):
        self.actuate, self.available, self.reason = bool(actuate), False, "actuation off (record only)"
        self.log: List[list] = []
        self._handles: dict = {}
        self._locked: set = set()
        self._lock = threading.Lock()
        self._q: "queue.Queue" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self.nvml = None
        if not self.actuate:
            return
        try:
            from harness.meters import nvml_handles
            self.nvml, self._handles = nvml_handles(nvml, gpu_indices)
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
        return len(self._handles)

    def request(self, clock_mhz: float, t: float = 0.0) -> None:
        """Record (and, when actuating, queue) a clock request. Never blocks."""
        row = [float(t), float(clock_mhz), False, None]
        self.log.append(row)
        if self.available:
            self._q.put(row)

    def _worker(self) -> None:
        while True:
            row = self._q.get()
            if row is None:
                return
            if not self.available:
                row[3] = self.reason
                continue
            f = int(round(row[1]))
            try:
                with self._lock:
                    for i, h in self._handles.items():
                        self._locked.add(i)
                        self.nvml.nvmlDeviceSetGpuLockedClocks(h, f, f)
                row[2] = True
            except Exception as e:
                row[3] = f"{type(e).__name__}: {e}"
                if getattr(e, "value", None) == NVML_ERROR_NO_PERMISSION or "Permission" in type(e).__name__:
                    self.available = False
                    self.reason = f"actuation disabled: no permission to lock clocks ({e})"
                    self.restore()

    def wait(self, timeout: float = 5.0) -> None:
        """Block until queued requests are processed (tests, shutdown)."""
        t0 = time.perf_counter()
        while not self._q.empty() and time.perf_counter() - t0 < timeout:
            time.sleep(0.001)
        time.sleep(0.002)

    def restore(self) -> None:
        """Reset the locked clocks this actuator set (errors recorded, never raised)."""
        with self._lock:
            for i in sorted(self._locked):
                try:
                    self.nvml.nvmlDeviceResetGpuLockedClocks(self._handles[i])
                except Exception as e:
                    self.reason = f"reset of GPU {i} failed: {type(e).__name__}: {e}"
            self._locked.clear()

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
        ``hydra.callbacks`` as ``_target_: systems.serving.actuator.ClockRestoreCallback``)."""

        def on_job_end(self, config, job_return=None, **kwargs) -> None:
            restore_all()
except ImportError:  # pragma: no cover
    pass
