"""Stable real-engine timing on a shared machine: torch's thread count, and the load around a run.

Why one thread by default (``backend.threads: 1``): on this 2-core machine shared with other jobs
(1-minute load average ~5), measured with ``torch.set_num_threads`` over 8 interleaved rounds of 300
calls each (tiny-OPT sizes, [16, 64, 256] activations), the median LayerNorm took 0.21 ms with one
thread and 9.9 ms with two, and a [16, 64, 256] x [256, 256] matmul 1.3 ms vs 9.7 ms: a second
thread waits for a core another process holds, so every small op pays a scheduler time slice.
One thread is slower only on an idle machine with large GEMMs; set ``backend.threads`` (or ``0`` =
leave torch's default) for that. Simulated runs do not import torch and set nothing.

The load is ``os.getloadavg()`` (1, 5, 15 minute averages of runnable processes) before and after
the run; it is called high when the 1-minute average before or after exceeds the number of CPUs,
i.e. other processes compete for the cores the run times itself on.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

log = logging.getLogger(__name__)


def load_avg() -> Optional[list]:
    """``os.getloadavg()`` as a list [1 min, 5 min, 15 min]; None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def set_threads(threads: Optional[int]) -> Dict[str, Any]:
    """``torch.set_num_threads(threads)`` unless threads is 0/None; returns what was requested and
    what torch reports (``torch_threads``). vLLM-CPU may later rebind (vllm_cpu.md): the runner
    records what it ran with if it differs."""
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    return {"requested": threads, "torch_threads": torch.get_num_threads()}


def load_warning(before: Optional[list], after: Optional[list]) -> Optional[str]:
    """A one-line warning when the 1-minute load average before or after the run exceeds the
    number of CPUs; None otherwise."""
    cpus = os.cpu_count() or 1
    peak = max((x[0] for x in (before, after) if x), default=None)
    if peak is None or peak <= cpus:
        return None
    return (
        f"machine load {peak:.1f} (1-min average) on {cpus} CPUs during this run: other processes "
        f"competed for the cores, so measured times are less reliable (repeat when idle, or use repeats=N)"
    )


def note_load(warning: Optional[str]) -> None:
    if warning:
        from harness.logs import say

        say(warning, warning=True)


def available_memory() -> Optional[int]:
    """Host memory available now (bytes): ``MemAvailable`` of /proc/meminfo (Linux: free + what the
    kernel can reclaim without swapping); else free pages x page size (``os.sysconf``); None where
    neither exists (not checked)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_memory(need: float, field: str, value, what: str, basis: str, hint: str) -> None:
    """Exit 2 (ConfigError naming ``field`` and ``value``) when a run predicted to need ``need``
    bytes of host memory beyond the process's own would need more than this machine's available
    memory (:func:`available_memory`; not checked where it is unknown). The message says ``what``
    needs it (e.g. "160,000 expected requests of 64 output tokens"), the measurement behind the
    prediction (``basis``) and what to lower (``hint``). The one rule by which every family checks a
    run's size against the host, before any work."""
    from harness.errors import bad

    avail = available_memory()
    if avail is not None and need > avail:
        raise bad(
            field,
            value,
            f"a value whose run fits this machine's memory: {what} need ~{need / 2**30:.1f} GiB "
            f"({basis}), {avail / 2**30:.1f} GiB available (MemAvailable); {hint}",
        )
