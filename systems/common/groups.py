"""LBS's group rules (LBS paper, Algorithm 1 with prefetch), used by the LBS family's scheduler and
simulator and by the FastTTS family's LBS-scheduled KV overflow.

- ``group_capacity``: Alg.1 line 2, ``min(num_beams, floor(budget / bytes_per_beam))`` (the paper
  prints max; min is the only reading that makes sense).
- ``group_sizes``: balanced grouping keeps ``R = ceil(N / B)`` groups and spreads beams evenly
  (15 beams, capacity 7 -> [5, 5, 5], not [7, 7, 1]); unbalanced fills groups to capacity.
- ``consecutive_groups(order, sizes)``: the groups as consecutive runs of a locality order (the
  depth-first order of the beams' paths; systems/kv_offload/beamset.py shows it equals Alg.1's greedy
  BeamSet).
- ``prefetch_count``: beams of the next group loaded into a group's free slots while it computes.
- ``group_time``: seconds of one group with its loads, prefetch and write-backs; ``copies_overlap``:
  whether a hardware profile's copies run beside compute.
"""

from __future__ import annotations

import math
from typing import List, Sequence

import numpy as np


def group_capacity(num_beams: int, budget_bytes: int, bytes_per_beam: int) -> int:
    """Beams whose KV fits the device budget at once (Alg.1 line 2). May be 0 (nothing fits)."""
    if bytes_per_beam <= 0:
        return num_beams
    return max(0, min(num_beams, budget_bytes // bytes_per_beam))


def group_sizes(num_beams: int, capacity: int, balanced: bool = True) -> List[int]:
    """Sizes of the groups of one step.

    balanced: ``R = ceil(N / B)`` groups, sizes differ by at most one, larger first.
    Raises ValueError if capacity < 1.
    """
    if capacity < 1:
        raise ValueError(f"group capacity {capacity} < 1: one beam's KV does not fit the budget")
    r = math.ceil(num_beams / capacity)
    if not balanced:
        return [capacity] * (num_beams // capacity) + ([num_beams % capacity] if num_beams % capacity else [])
    base, extra = divmod(num_beams, r)
    return [base + (1 if i < extra else 0) for i in range(r)]


def prefetch_count(capacity: int, size: int, next_size: int) -> int:
    """Beams of the next group loaded into a group's free slots while it computes (LBS prefetch):
    ``min(capacity - size, next_size)`` of the next group's first beams (0 when none follow)."""
    return max(0, min(capacity - size, next_size))


def consecutive_groups(order: Sequence[int], sizes: Sequence[int]) -> List[List[int]]:
    """Groups of ``sizes`` as consecutive runs of ``order``: the greedy BeamSet groups when ``order``
    is the DFS order (module doc), inter-token-only groups when it is the rating order."""
    order = np.asarray(order).tolist()
    out, i = [], 0
    for s in sizes:
        out.append(order[i : i + s])
        i += s
    return out


def copies_overlap(hw) -> bool:
    """Whether host<->device copies run beside compute on this hardware profile: on a GPU (copy
    engines, CUDA streams) yes; on a ``kind: cpu`` profile no, since the real engine's "device" there
    is host memory and every copy is a synchronous memcpy on the computing thread
    (:class:`systems.kv_offload.streams.HostStreams`), so its time adds to the compute."""
    return str(hw.get("kind", "gpu")) != "cpu"


def group_time(load_s: float, compute_s: float, prefetch_s: float, writeback_s: float, overlap: bool = True) -> float:
    """Seconds of one LBS group (LBS paper Alg.1 with prefetch): its load not prefetched by the group
    before (``load_s``) is waited for, then it computes while the next group's first beams are
    prefetched (``prefetch_s``, one copy engine) and its new tokens are written back (``writeback_s``,
    the other): either copy shows only where it outlasts the compute. Without ``overlap``
    (:func:`copies_overlap`) every copy adds to the compute."""
    if not overlap:
        return load_s + compute_s + prefetch_s + writeback_s
    return load_s + compute_s + max(0.0, prefetch_s - compute_s) + max(0.0, writeback_s - compute_s)
