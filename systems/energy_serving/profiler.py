"""Offline profiler: the per-shard latency/energy lookup table L(n, f), E(n, f) (BEAM §2.5).

The table is sampled sparsely over (num_tokens n, clock f) and expanded to every n in [1, n_max]:

* small-token region (n <= ``small_max``): tile-quantised sampling, one point at the end of each
  ``tile``-token tile (latency steps at tile boundaries, so L(n) = L(ceil(n / tile) * tile));
* large-token region: only the chunk sizes S1 may choose (plus ``n_max``), linear in between.

Latency is made non-increasing in the clock (a cumulative max from the highest clock down), which
the controllers' bisection over clocks relies on; a measured table with noise is smoothed so.

Samples come from a ``measure(n, f) -> (latency_s, energy_j_per_gpu)`` callable: a profiling pass
over the backend the controller runs on -- iterations charged by the simulator (:func:`sim_measure`)
seen through a profiling error (:func:`with_error`), latencies measured on vLLM
(:func:`clock_scaled` where the clock is not set), or a device measured at locked clocks
(:func:`device_measure`). A controller never reads the simulator's cost model directly.
Sampling in the small region uses single-token sequences with ``ctx`` tokens of context each
(decode batches); the large region one prefill chunk of n tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from systems.common.profile_error import ProfileError
from systems.energy_serving.protocol import iteration_shape


@dataclass
class LatencyEnergyTable:
    """L[n, i] seconds and E[n, i] joules per GPU for one stage iteration of n tokens at clocks[i].

    Shapes: clocks (F,) MHz ascending; L, E (n_max + 1, F) (row 0 unused); idle_w (F,) = P_idle(f)
    per GPU. ``samples``: the (n) values that were measured.
    """

    clocks: np.ndarray
    L: np.ndarray
    E: np.ndarray
    idle_w: np.ndarray
    samples: List[int] = field(default_factory=list)

    @property
    def n_max(self) -> int:
        return self.L.shape[0] - 1

    def rows(self, n) -> Tuple[np.ndarray, np.ndarray]:
        """(L, E) rows for token counts ``n`` (int array, clipped to [1, n_max]): shape (*n.shape, F)."""
        idx = np.clip(np.asarray(n, dtype=np.int64), 1, self.n_max)
        return self.L[idx], self.E[idx]


def sample_points(tile: int, small_max: int, chunks: Sequence[int], n_max: int) -> List[int]:
    """Token counts to measure: tile ends up to ``small_max``, then the chunk sizes and ``n_max``."""
    pts = {1} | set(range(tile, small_max + 1, tile)) | {int(c) for c in chunks if c > small_max} | {n_max}
    return sorted(p for p in pts if 1 <= p <= n_max)


def build_table(
    measure: Callable[[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]],
    clocks: np.ndarray,
    idle_w: np.ndarray,
    n_max: int,
    tile: int,
    small_max: int,
    chunks: Sequence[int],
) -> LatencyEnergyTable:
    """Sample ``measure`` at :func:`sample_points` x ``clocks`` and expand to every n.

    Small region: step-wise (the next sampled tile end at or above n); large region: linear
    between samples. ``measure(n (S,1), f (1,F))`` returns arrays broadcastable to (S, F).
    """
    pts = sample_points(tile, small_max, chunks, n_max)
    n_s = np.asarray(pts, dtype=np.int64)
    lat, en = measure(n_s[:, None], np.asarray(clocks, float)[None, :])
    lat = np.broadcast_to(lat, (len(pts), len(clocks))).astype(float)
    en = np.broadcast_to(en, (len(pts), len(clocks))).astype(float)
    n_all = np.arange(n_max + 1)
    L = np.empty((n_max + 1, len(clocks)))
    E = np.empty_like(L)
    small = n_s <= small_max
    ns, nl = n_s[small], n_s[~small]
    # step-wise below small_max: index of the first sample >= n
    k = np.searchsorted(ns, np.clip(n_all, 1, ns[-1]), side="left")
    L[: ns[-1] + 1], E[: ns[-1] + 1] = lat[small][k[: ns[-1] + 1]], en[small][k[: ns[-1] + 1]]
    if ns[-1] < n_max:
        xs = np.concatenate([[ns[-1]], nl])
        ls = np.vstack([lat[small][-1:], lat[~small]])
        es = np.vstack([en[small][-1:], en[~small]])
        rest = n_all[ns[-1] + 1 :]
        for i in range(len(clocks)):
            L[ns[-1] + 1 :, i] = np.interp(rest, xs, ls[:, i])
            E[ns[-1] + 1 :, i] = np.interp(rest, xs, es[:, i])
    # latency must not grow with the clock (noise in a measured table): cumulative max from the top
    L = np.maximum.accumulate(L[:, ::-1], axis=1)[:, ::-1]
    return LatencyEnergyTable(np.asarray(clocks, float), L, E, np.asarray(idle_w, float), pts)


def decode_batch_max(small_max: int, max_num_seqs: int, ctx: float, kv_tokens: float = math.inf) -> int:
    """Largest decode batch the profiling pass measures as one: at most ``small_max`` sequences (the
    small region), the engine's ``max_num_seqs``, and as many sequences of ``ctx`` context tokens as
    ``kv_tokens`` (the KV tokens that fit per device or stage) holds; a larger batch cannot run at
    once, so larger n are measured as one n-token prefill chunk (on the simulator and on vLLM)."""
    fit = math.inf if not math.isfinite(kv_tokens) else int(kv_tokens // max(ctx, 1.0))
    return int(max(0, min(int(small_max), int(max_num_seqs), fit)))


def sim_measure(cost, ctx: float, small_max: int, max_decodes: Optional[int] = None):
    """A ``measure`` callable that charges iterations exactly as the simulated executor does
    (:func:`systems.energy_serving.protocol.iteration_shape`, then ``cost.step1``): a batch of ``n``
    decodes with ``ctx`` tokens of context each for n <= small_max (and <= ``max_decodes``,
    :func:`decode_batch_max`: a larger decode batch cannot run), one n-token prefill chunk otherwise.
    ``cost``: an :class:`systems.energy_serving.protocol.IterationCost` (e.g. a StageModel)."""
    dec_max = small_max if max_decodes is None else min(small_max, int(max_decodes))

    def measure(n, f):
        n, f = np.asarray(n), np.asarray(f, float)
        shape = np.broadcast_shapes(n.shape, f.shape)
        nb, fb = np.broadcast_to(n, shape), np.broadcast_to(f, shape)
        lat, en = np.empty(shape), np.empty(shape)
        shapes: dict = {}
        for idx in np.ndindex(shape):
            k = int(nb[idx])
            sh = shapes.get(k)
            if sh is None:
                batch = [(i, 1, ctx - 1) for i in range(k)] if k <= dec_max else [(0, k, 0)]
                sh = shapes[k] = iteration_shape(batch)
            lat[idx], en[idx] = cost.step1(sh[0], float(fb[idx]), sh[1], sh[2], sh[3])
        return lat, en

    return measure


def clock_scaled(latency_now: Callable[[np.ndarray], np.ndarray], stage):
    """A ``measure`` callable for a device whose clock is not set (vLLM on CPU, or the simulator
    charged by a profile measured there): ``latency_now(n)`` (s, measured at the device's own
    clock) stands for the latency at f_max and is scaled over the clock menu by the hardware
    profile's latency model ``stage`` (a StageModel), energy from its power model at the same scale.
    The controller then decides what BEAM would request on that GPU; the clocks are recorded only."""

    def measure(n, f):
        n = np.asarray(n)
        lat_m, e_m = stage.step(n, f)
        lat_ref, _ = stage.step(n, stage.f_max)
        scale = latency_now(n) / lat_ref
        return lat_m * scale, e_m * scale

    return measure


def with_error(measure, error: ProfileError, rng: np.random.Generator):
    """``measure`` as a profiling pass with ``error`` sees it (latency and energy, independently)."""

    def noisy(n, f):
        lat, en = measure(n, f)
        shape = np.broadcast_shapes(np.shape(lat), np.shape(en))
        return (error.apply(np.broadcast_to(lat, shape), rng), error.apply(np.broadcast_to(en, shape), rng))

    return noisy


class TableCost:
    """An :class:`systems.energy_serving.protocol.IterationCost` read from a controller's table: what the
    controller believes an iteration of n tokens costs at a table clock (context ignored)."""

    has_energy = True
    follows_clock = True

    def __init__(self, table: "LatencyEnergyTable"):
        self.L, self.E, self.idle_w, self.n_max = table.L, table.E, table.idle_w, table.n_max
        self.col = {float(f): i for i, f in enumerate(table.clocks)}

    def step1(self, n, f, ctx_tokens=0.0, attn_pairs=0.0, seqs=1):
        i, k = self.col[float(f)], min(max(int(n), 1), self.n_max)
        return float(self.L[k, i]), float(self.E[k, i])

    def idle1(self, f):
        return float(self.idle_w[self.col[float(f)]])


def table_error(table: LatencyEnergyTable, measure, n_values: Sequence[int]) -> dict:
    """Mean absolute percentage error (%) of L and E against ``measure`` at ``n_values`` x clocks."""
    n = np.asarray(n_values, dtype=np.int64)
    lat, en = measure(n[:, None], table.clocks[None, :])
    L, E = table.rows(n)
    return {
        "latency_mape_pct": float(100 * np.mean(np.abs(L - lat) / lat)),
        "energy_mape_pct": float(100 * np.mean(np.abs(E - en) / en)),
    }


def device_measure(
    run_batch: Callable[[int], None], actuator, meter, clocks: Sequence[float], reps: int = 3, gpus: int = 1
):
    """A ``measure`` callable that times ``run_batch(n)`` on a real device at each locked clock.

    ``actuator``: a :class:`systems.energy_serving.actuator.DvfsActuator` that is actuating (``available``);
    ``meter``: a :class:`harness.meters.EnergyMeter`. For each (n, f): lock f, run ``reps`` batches
    inside one energy window (NVML counters need windows of >~100 ms: batch the reps), and return
    the mean latency (s) and energy per GPU (J; NaN when energy is unavailable). Clocks are restored
    by the actuator afterwards. Raises RuntimeError if the actuator cannot lock clocks.
    """
    if not getattr(actuator, "available", False):
        raise RuntimeError(f"device profiling needs clock actuation: {getattr(actuator, 'reason', '')}")

    def measure(n, f):
        n_s = np.asarray(n).reshape(-1).astype(int)
        f_s = np.asarray(f).reshape(-1)
        lat = np.empty((len(n_s), len(f_s)))
        en = np.empty_like(lat)
        for j, fj in enumerate(f_s):
            actuator.request(float(fj))
            actuator.wait()
            for i, ni in enumerate(n_s):
                run_batch(int(ni))  # warm-up at this clock
                meter.begin_window("profile")
                for _ in range(reps):
                    run_batch(int(ni))
                m = meter.end_window("profile")
                lat[i, j] = m.time_s / reps
                en[i, j] = (m.energy_j / reps / gpus) if m.energy_j is not None else np.nan
        actuator.restore()
        return lat, en

    return measure
