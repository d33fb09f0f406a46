"""The printed table of an LBS-family run (``harness.family.RunResult.display``): label, summary key,
formatter. Shared by ``systems.kv_offload.runner`` and ``systems.kv_offload.hf_offload``.

One byte unit per table, chosen by magnitude (:func:`byte_unit`), so a 16 MiB budget and a 39 MiB
peak read as 16.00 MiB and 39.00 MiB, never as 0.02 GiB beside 0.04 GiB. Transfers are
host->device / device->host (the device is a GPU, or on a CPU run a second pool of CPU memory).
The Eq. row says which of the paper's equations applies to the run's scheduler and whether it is a
prediction or a bound.
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Tuple

from harness.family import WARMUP_KEY
from harness.units import GiB

Rows = List[Tuple[str, str, Callable[[Any], str]]]
BYTE_KEYS = (
    "h2d_bytes",
    "d2h_bytes",
    "eq_prediction_bytes",
    "eq3_layerwise_bytes",
    "eq5_lbs_bytes",
    "kv_budget_bytes",
    "peak_device_kv_bytes",
    "max_staging_bytes",
    "peak_device_physical_bytes",
    "cuda_max_memory_allocated_bytes",
)
UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


def size_text(v: float) -> str:
    """Bytes as GiB, or MiB below 0.01 GiB (one value in a message; tables use :func:`display_rows`)."""
    return f"{v / GiB:,.2f} GiB" if v >= GiB / 100 or v == 0 else f"{v / 2**20:,.2f} MiB"


def byte_unit(values) -> Tuple[str, int]:
    """(name, bytes) of one unit for ``values`` (None and 0 ignored): the largest binary unit in which
    the smallest value is >= 1, but at most one unit below the largest value's (so 16 MiB beside
    5 GiB reads 16.00 MiB and 5,120 MiB; 96 KiB beside 5 GiB reads 0.0938 MiB)."""
    vals = [abs(float(v)) for v in values if isinstance(v, (int, float)) and v]
    if not vals:
        return UNITS[0]
    at = lambda x: next(i for i, (_, f) in enumerate(UNITS) if x >= f or f == 1)
    return UNITS[min(at(min(vals)), at(max(vals)) + 1)]


def _number(x: float) -> str:
    """Three significant digits at least; thousands separated; 0 as 0."""
    if x == 0:
        return "0"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.2f}" if abs(x) >= 1 else f"{x:.3g}"


def eq_label(system) -> str:
    """What ``eq_prediction_bytes`` is for this system (LBS paper Eq.1-5)."""
    sched = system.get("scheduler")
    if sched == "layerwise":
        return "paper Eq.1-3 prediction, layer-wise (host->device)"
    if sched == "lbs" and system.get("inter_beam", True):
        return "paper Eq.4-5, inter-token only: an upper bound (prefix reuse moves less)"
    if sched == "lbs":
        return "paper Eq.4-5 prediction, inter-token only (host->device)"
    if sched == "in_gpu":
        return "paper Eq. prediction (in-GPU: nothing moves)"
    return "paper Eq. prediction (none for this system)"


def display_rows(summary: Mapping[str, Any], system) -> Rows:
    """The table's rows for a run's ``summary`` and its ``system`` config (scheduler, inter_beam)."""
    unit, size = byte_unit(summary.get(k) for k in BYTE_KEYS)
    b = lambda v: f"{_number(v / size)} {unit}"
    s = lambda v: f"{v:,.3f} s"
    return [
        ("end-to-end latency", "e2e_s", s),
        *([("  seconds measured as", "time_basis", str)] if summary.get("time_basis") else []),  # real runs
        ("compute", "compute_s", s),
        ("I/O stall", "io_stall_s", s),
        ("other (plan, prune + expand)", "other_s", s),
        ("I/O share of latency", "io_share", lambda v: f"{100 * v:.1f} %"),
        ("host->device", "h2d_bytes", b),
        ("device->host", "d2h_bytes", b),
        (eq_label(system), "eq_prediction_bytes", b),
        # the other equation beside the system's own (that one is the row above, not repeated)
        *[
            row
            for row, own in (
                (("  Eq.1-3 layer-wise (token by token)", "eq3_layerwise_bytes", b), "layerwise"),
                (("  Eq.4-5 LBS, inter-token only", "eq5_lbs_bytes", b), "lbs"),
            )
            if system.get("scheduler") != own
        ],
        ("groups per step (mean)", "groups_per_step", lambda v: f"{v:.2f}"),
        ("KV budget", "kv_budget_bytes", b),
        ("peak device KV (resident within the budget + staging)", "peak_device_kv_bytes", b),
        (_staging_label(summary), "max_staging_bytes", b),
        ("peak device KV tensors (physical)", "peak_device_physical_bytes", b),
        ("peak CUDA memory allocated (all)", "cuda_max_memory_allocated_bytes", b),
        ("warm-up (excluded)", WARMUP_KEY, s),
        (energy_label(summary), "energy_j", lambda v: f"{v:,.0f} J"),
        ("  of which waiting on PCIe (I/O stall)", "energy_io_stall_j", lambda v: f"{v:,.0f} J"),
        ("energy per generated token", "energy_per_token_j", lambda v: f"{v:.3g} J"),
        ("average power", "avg_power_w", lambda v: f"{v:,.1f} W"),
    ] + (
        [("energy unavailable", "energy_unavailable_reason", lambda v: str(v).removeprefix("energy unavailable: "))]
        if summary.get("energy_unavailable_reason")
        else []
    )


def _staging_label(summary: Mapping[str, Any]) -> str:
    """The staging row says 'beyond the budget' only when the peak is above the budget."""
    peak, budget = summary.get("peak_device_kv_bytes"), summary.get("kv_budget_bytes")
    beyond = peak is not None and budget is not None and peak > budget
    return f"  of which staging{' beyond the budget' if beyond else ', within the budget'} (largest step)"


def energy_label(summary: Mapping[str, Any]) -> str:
    """The energy row's label: how the value was obtained (simulated power model or NVML)."""
    src = summary.get("energy_source")
    return f"energy ({src})" if src else "energy"
