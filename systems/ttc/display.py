"""The printed table of an LBS-family run (``harness.run.RunResult.display``): label, summary key,
formatter. Shared by ``systems.ttc.runner`` and ``systems.ttc.hf_offload``."""
from __future__ import annotations

from harness.units import GiB

def size_text(v: float) -> str:
    """Bytes as GiB, or MiB below 0.01 GiB."""
    return f"{v / GiB:,.2f} GiB" if v >= GiB / 100 or v == 0 else f"{v / 2**20:,.2f} MiB"


_gib = size_text
_s = lambda v: f"{v:,.3f} s"
_pct = lambda v: f"{100 * v:.1f} %"

DISPLAY = [
    ("end-to-end latency", "e2e_s", _s),
    ("compute", "compute_s", _s),
    ("I/O stall", "io_stall_s", _s),
    ("other (plan, prune + expand)", "other_s", _s),
    ("I/O share of latency", "io_share", _pct),
    ("host->GPU", "h2d_bytes", _gib),
    ("GPU->host", "d2h_bytes", _gib),
    ("paper Eq. prediction, this scheduler (host->GPU)", "eq_prediction_bytes", _gib),
    ("  Eq.1-3 layer-wise", "eq3_layerwise_bytes", _gib),
    ("  Eq.4-5 LBS, inter-token only", "eq5_lbs_bytes", _gib),
    ("groups per step (mean)", "groups_per_step", lambda v: f"{v:.2f}"),
    ("peak device KV (+ layer-wise staging)", "peak_device_kv_bytes", _gib),
    ("peak device KV tensors (physical)", "peak_device_physical_bytes", _gib),
    ("peak CUDA memory allocated (all)", "cuda_max_memory_allocated_bytes", _gib),
    ("KV budget", "kv_budget_bytes", _gib),
    ("warm-up (excluded)", "warmup_s", _s),
    ("energy", "energy_j", lambda v: f"{v:,.0f} J"),
]
