"""Meters: wall and CUDA-event timers, byte counters, and GPU energy windows.

Energy follows Zeus' window model (``begin_window``/``end_window``) on NVML's total-energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, mJ, Volta and newer). Where it cannot be read the
measurement says ``energy_j=None`` with the reason: unavailable is never recorded as 0.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple


def time_basis(device) -> Tuple[Callable[[], float], str]:
    """The clock of a real engine's measured seconds on ``device`` (``"cpu"``/``"cuda"`` or a
    torch.device) and its name. CUDA: wall time (``time.perf_counter``). CPU: the CPU time of the
    calling thread (``time.thread_time``): with one torch thread and synchronous copies all of the
    engine's work runs on that thread, and, unlike wall time, it does not count the time other jobs
    on a shared machine hold the cores."""
    if str(getattr(device, "type", device)).startswith("cuda"):
        return time.perf_counter, "wall (time.perf_counter)"
    return time.thread_time, "CPU time of the engine's thread (time.thread_time)"


class WallTimer:
    """Accumulating wall-clock timer by name (seconds, ``time.perf_counter``)."""

    def __init__(self):
        self.totals: Dict[str, float] = defaultdict(float)

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] += seconds

    class _Span:
        def __init__(self, timer, name):
            self.timer, self.name = timer, name

        def __enter__(self):
            self.t0 = time.perf_counter()
            return self

        def __exit__(self, *exc):
            self.timer.add(self.name, time.perf_counter() - self.t0)
            return False

    def span(self, name: str) -> "WallTimer._Span":
        return WallTimer._Span(self, name)


class CudaEventTimer:
    """Accumulates GPU-side durations between pairs of CUDA events, resolved lazily at ``sync()``.

    Use ``start(name)``/``stop(name)`` around work enqueued on the current stream; ``totals`` (s)
    after ``sync()``. On CPU tensors use WallTimer instead.
    """

    def __init__(self):
        import torch

        self._torch = torch
        self._pending: List[tuple] = []
        self._open: Dict[str, object] = {}
        self.totals: Dict[str, float] = defaultdict(float)

    def start(self, name: str, stream=None) -> None:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        self._open[name] = ev

    def stop(self, name: str, stream=None) -> None:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        self._pending.append((name, self._open.pop(name), ev))

    def sync(self) -> Dict[str, float]:
        self._torch.cuda.synchronize()
        for name, a, b in self._pending:
            self.totals[name] += a.elapsed_time(b) / 1e3
        self._pending.clear()
        return dict(self.totals)


@dataclass
class ByteCounter:
    """Bytes moved between memory tiers, by direction (``h2d``, ``d2h``)."""

    h2d: int = 0
    d2h: int = 0

    def add(self, direction: str, nbytes: int) -> None:
        setattr(self, direction, getattr(self, direction) + int(nbytes))


@dataclass
class Measurement:
    """One energy/time window. ``energy_j`` is None when energy could not be read (see ``reason``)."""

    name: str
    time_s: float
    energy_j: Optional[float]
    per_gpu_j: Dict[int, float] = field(default_factory=dict)
    reason: str = ""

    @property
    def avg_power_w(self) -> Optional[float]:
        if self.energy_j is None or self.time_s <= 0:
            return None
        return self.energy_j / self.time_s


def unavailable_reason(e: Exception) -> str:
    """Why NVML gave no energy, for a record and a table: no NVIDIA driver on this machine said as
    such (NVML's own words, "NVML Shared Library Not Found", read as a failure), else NVML's error."""
    if type(e).__name__ == "NVMLError_LibraryNotFound":
        return "energy unavailable: no NVIDIA driver on this machine (NVML meters NVIDIA GPUs only)"
    return f"energy unavailable: {type(e).__name__}: {e}"


class EnergyMeter:
    """GPU energy over named windows from NVML's total-energy counter.

    Args:
        gpu_indices: the job's CUDA device indices to read (``cuda:k``; mapped to NVML by UUID /
            PCI bus id, see :mod:`harness.gpus`); None = every GPU the job sees.
        nvml: an NVML-like module (tests pass a fake); default ``pynvml``.
    ``available`` is False (with ``reason``) when NVML, the job's GPUs or the counter cannot be
    read. ``gpus``: the :class:`harness.gpus.JobGpu` s read; ``per_gpu_j`` is keyed by CUDA index.
    """

    def __init__(self, gpu_indices: Optional[List[int]] = None, nvml=None):
        self.available, self.reason = False, ""
        self.gpus: list = []
        self._open: Dict[str, tuple] = {}
        try:
            from harness.gpus import open_job_gpus

            self.nvml, self.gpus = open_job_gpus(nvml, gpu_indices)
            self._read_mj()
            self.available = True
        except Exception as e:  # NVMLError_LibraryNotFound on CPU machines, NotSupported pre-Volta
            self.reason = unavailable_reason(e)

    def _read_mj(self) -> Dict[int, int]:
        return {g.ordinal: self.nvml.nvmlDeviceGetTotalEnergyConsumption(g.handle) for g in self.gpus}

    def begin_window(self, name: str) -> None:
        self._open[name] = (time.perf_counter(), self._read_mj() if self.available else {})

    def end_window(self, name: str, sync=None) -> Measurement:
        """Close a window. ``sync``: optional callable (e.g. ``torch.cuda.synchronize``) run first."""
        if sync is not None:
            sync()
        t0, e0 = self._open.pop(name)
        dt = time.perf_counter() - t0
        if not self.available:
            return Measurement(name, dt, None, reason=self.reason)
        e1 = self._read_mj()
        per = {i: (e1[i] - e0[i]) / 1e3 for i in e1}
        return Measurement(name, dt, sum(per.values()), per)
