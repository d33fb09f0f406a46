"""Tiered KV store of the TTC torch executor (DESIGN.md "The TTC engine"; LBS paper Alg.1).

Two pools:

- **Host pool** (:class:`HostPool`): the KV of every segment of the beam tree (a segment is the KV
  of a run of consecutive tokens of one path; the prompt is segment 0), one tensor per segment of
  shape ``[num_layers, 2, num_kv_heads, capacity, head_dim]`` (K at index 0, V at 1). Page-locked
  (pinned) on CUDA so copies can run asynchronously on a copy stream.
- **Device pool** (:class:`DevicePool`): dense buffers the attention kernels read, one copy per
  beam (sharing saves transfers, not device memory). It enforces a **byte budget**: a charge beyond
  it raises :class:`KVBudgetExceeded`, so a scheduler that overruns fails loudly. The budget counts
  the KV bytes held on the device (tokens x beams x layers x ``KV``), exactly as the plans of
  ``systems.ttc.plan`` do; ``kind="staging"`` buffers (layer-wise offloading's layers in flight)
  are charged against a separate, declared staging limit. Peak usage is tracked.

:class:`TieredKVStore` owns both, moves data between them and counts every byte moved
(``bytes.h2d``, ``bytes.d2h``: :class:`harness.meters.ByteCounter`; device-side fan-out copies in
``d2d_bytes``, which cross no bus). On CUDA, host->device copies run on a copy stream and write-backs
on a second one; the compute stream waits on them through events and that wait is the measured
**I/O stall** (CUDA events, :class:`harness.meters.CudaEventTimer`). On CPU the same code runs with
two CPU pools: bytes are exact, times are wall-clock and copies do not overlap compute.
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from harness.meters import ByteCounter

LayerSel = Union[int, slice]
# A beam's path as the store sees it: [(segment id, tokens to take from it)], root first.
Path = Sequence[Tuple[int, int]]


class KVBudgetExceeded(RuntimeError):
    """A device KV charge would exceed the enforced budget (a scheduler overran its plan)."""


class PlanMismatch(RuntimeError):
    """A load could not be carried out as the plan says (a segment the plan does not load is
    needed and no device copy exists, or the plan loads something no beam needs)."""


def nbytes_of(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(eq=False)
class DeviceBuffer:
    """A device tensor and the bytes charged for it against the pool (see :class:`DevicePool`)."""
    tensor: torch.Tensor
    kind: str
    charged: int
    pool: "DevicePool"
    what: str = ""
    freed: bool = False

    def charge(self, nbytes: int) -> None:
        """Set the bytes this buffer holds (its KV content). Raises KVBudgetExceeded."""
        self.pool._recharge(self, int(nbytes))

    def free(self) -> None:
        self.pool.free(self)


class DevicePool:
    """Device memory for KV with an enforced budget (bytes).

    ``budget``: KV bytes allowed (``None`` = unlimited, in_gpu on a real GPU with no budget).
    ``staging_budget``: bytes allowed for ``kind="staging"`` buffers (``None`` = unlimited).
    ``alloc(shape, dtype, charge=...)`` charges ``charge`` bytes (default: the tensor's size); a
    buffer allocated for a whole step may later ``charge()`` the tokens it actually holds.
    Raises KVBudgetExceeded naming the request, the budget and what is in use.
    """

    def __init__(self, device: torch.device, budget: Optional[int], staging_budget: Optional[int] = 0):
        self.device = torch.device(device)
        self.budget = budget
        self.staging_budget = staging_budget
        self.used: Dict[str, int] = defaultdict(int)
        self.peak_total = 0                  # max over time of kv + staging charges
        self.peak_kv = 0
        self.live: List[DeviceBuffer] = []

    def _check(self, kind: str, new_used: int, what: str, nbytes: int) -> None:
        limit = self.budget if kind == "kv" else self.staging_budget
        if limit is not None and new_used > limit:
            raise KVBudgetExceeded(
                f"device {kind} budget exceeded: {what or 'buffer'} needs {nbytes} B, {self.used[kind]} B "
                f"already held, {kind} budget {limit} B ({limit / 2**20:.2f} MiB); the scheduler's plan "
                f"overruns the device KV budget")

    def _account(self) -> None:
        total = self.used["kv"] + self.used["staging"]
        self.peak_total = max(self.peak_total, total)
        self.peak_kv = max(self.peak_kv, self.used["kv"])

    def alloc(self, shape: Sequence[int], dtype: torch.dtype, *, kind: str = "kv",
              charge: Optional[int] = None, what: str = "") -> DeviceBuffer:
        if kind not in ("kv", "staging"):
            raise ValueError(f"kind={kind!r}: kv or staging")
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        ch = nbytes if charge is None else int(charge)
        self._check(kind, self.used[kind] + ch, what, ch)
        t = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        buf = DeviceBuffer(t, kind, ch, self, what)
        self.used[kind] += ch
        self.live.append(buf)
        self._account()
        return buf

    def _recharge(self, buf: DeviceBuffer, nbytes: int) -> None:
        if buf.freed:
            raise RuntimeError(f"charge on a freed device buffer ({buf.what})")
        self._check(buf.kind, self.used[buf.kind] - buf.charged + nbytes, buf.what, nbytes)
        self.used[buf.kind] += nbytes - buf.charged
        buf.charged = nbytes
        self._account()

    def free(self, buf: DeviceBuffer) -> None:
        if buf.freed:
            return
        self.used[buf.kind] -= buf.charged
        buf.freed = True
        self.live.remove(buf)
        buf.tensor = None

    def reset_peak(self) -> None:
        self.peak_total = self.used["kv"] + self.used["staging"]
        self.peak_kv = self.used["kv"]


class HostPool:
    """Authoritative KV of every segment, ``[num_layers, 2, num_kv_heads, capacity, head_dim]``.

    Pinned (page-locked) when ``pin`` (CUDA runs), so host<->device copies can be asynchronous."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 pin: bool = False):
        self.shape = (num_layers, 2, num_kv_heads, head_dim)
        self.dtype, self.pin = dtype, pin
        self.segs: Dict[int, torch.Tensor] = {}

    def ensure(self, sid: int, capacity: int) -> torch.Tensor:
        """The segment's tensor, allocated with room for ``capacity`` tokens if new."""
        t = self.segs.get(sid)
        if t is None or t.shape[3] < capacity:
            L, two, H, D = self.shape
            t = torch.empty((L, two, H, capacity, D), dtype=self.dtype, pin_memory=self.pin)
            self.segs[sid] = t
        return t

    def get(self, sid: int) -> torch.Tensor:
        try:
            return self.segs[sid]
        except KeyError:
            raise PlanMismatch(f"segment {sid} has no KV on the host") from None

    def keep_only(self, live: Iterable[int]) -> List[int]:
        """Free every segment not in ``live``; returns the freed ids."""
        live = set(live)
        dead = [s for s in self.segs if s not in live]
        for s in dead:
            del self.segs[s]
        return dead

    @property
    def nbytes(self) -> int:
        return sum(nbytes_of(t) for t in self.segs.values())


class TieredKVStore:
    """Host pool + budgeted device pool + byte counters + streams/timers (see module doc).

    Times (seconds) accumulate in ``times['compute']`` and ``times['io_stall']``; read and reset
    them with :meth:`take_times` (synchronises the device).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: Union[str, torch.device], budget: Optional[int], staging_budget: Optional[int] = 0):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.dtype = dtype
        self.host = HostPool(num_layers, num_kv_heads, head_dim, dtype, pin=self.cuda)
        self.dev = DevicePool(self.device, budget, staging_budget)
        self.bytes = ByteCounter()
        self.d2d_bytes = 0
        self.times: Dict[str, float] = defaultdict(float)
        if self.cuda:
            from harness.meters import CudaEventTimer
            self.h2d_stream = torch.cuda.Stream(self.device)
            self.d2h_stream = torch.cuda.Stream(self.device)
            self.events = CudaEventTimer()
        self._in_compute = False

    # -- timing ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def compute(self):
        """Region of model compute: wall time on CPU, CUDA events on the compute stream. I/O stalls
        inside it (layer-wise loads issued from ``Cache.update``) are moved from compute to I/O stall."""
        self._in_compute = True
        try:
            if self.cuda:
                self.events.start("compute")
                yield
                self.events.stop("compute")
            else:
                io0 = self.times["io_stall"]
                t0 = time.perf_counter()
                yield
                self.times["compute"] += time.perf_counter() - t0 - (self.times["io_stall"] - io0)
        finally:
            self._in_compute = False

    @contextlib.contextmanager
    def io(self, direction: str = "h2d"):
        """Region of copies. CUDA: enqueued on the h2d or d2h copy stream (which first waits for
        work already on the compute stream, so freshly allocated or just-computed buffers are safe).
        CPU: synchronous, wall time counted as I/O stall (nothing overlaps)."""
        if self.cuda:
            s = self.h2d_stream if direction == "h2d" else self.d2h_stream
            s.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(s):
                yield
        else:
            t0 = time.perf_counter()
            yield
            self.times["io_stall"] += time.perf_counter() - t0

    @contextlib.contextmanager
    def copy_span(self, direction: str = "h2d"):
        """Time the copies issued inside (use within ``io(direction)``): yields a list that holds,
        after ``take_times``-style synchronisation, the copy engine's busy seconds (CUDA events on
        the copy stream) or the wall seconds (CPU). For achieved-bandwidth checks."""
        out: list = []
        if self.cuda:
            s = self.h2d_stream if direction == "h2d" else self.d2h_stream
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(s)
            yield out
            b.record(s)
            out.append((a, b))
        else:
            t0 = time.perf_counter()
            yield out
            out.append(time.perf_counter() - t0)

    @staticmethod
    def span_seconds(span: list) -> Optional[float]:
        """Seconds of a finished ``copy_span`` (CUDA: after the stream synchronised)."""
        if not span:
            return None
        v = span[0]
        return v[0].elapsed_time(v[1]) / 1e3 if isinstance(v, tuple) else float(v)

    def wait_loads(self, *buffers: torch.Tensor) -> None:
        """Make compute wait for the h2d copies issued so far; the wait is the I/O stall (CUDA)."""
        if not self.cuda:
            return
        cur = torch.cuda.current_stream(self.device)
        name = "io_stall_in_compute" if self._in_compute else "io_stall"
        self.events.start(name)
        cur.wait_stream(self.h2d_stream)
        self.events.stop(name)
        for b in buffers:
            b.record_stream(self.h2d_stream)

    def wait_writebacks(self) -> None:
        """Compute waits for the write-backs issued so far (end of a step); counted as I/O stall."""
        if not self.cuda:
            return
        cur = torch.cuda.current_stream(self.device)
        self.events.start("io_stall")
        cur.wait_stream(self.d2h_stream)
        cur.wait_stream(self.h2d_stream)
        self.events.stop("io_stall")

    def keep_alive(self, t: torch.Tensor, direction: str) -> None:
        """A device tensor read/written by a copy stream must not be reused before the copy ends."""
        if self.cuda:
            t.record_stream(self.h2d_stream if direction == "h2d" else self.d2h_stream)

    def take_times(self) -> Dict[str, float]:
        """Seconds of compute and I/O stall since the last call (synchronises CUDA)."""
        if self.cuda:
            self.wait_writebacks()
            tot = self.events.sync()
            inside = tot.pop("io_stall_in_compute", 0.0)
            for k, v in tot.items():
                self.times[k] += v
            self.times["compute"] -= inside
            self.times["io_stall"] += inside
            self.events.totals.clear()
        out = {"compute": self.times.get("compute", 0.0), "io_stall": self.times.get("io_stall", 0.0)}
        self.times.clear()
        return out

    # -- copies (counted) ------------------------------------------------------------------------
    def h2d(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=self.cuda)
        self.bytes.add("h2d", nbytes_of(src))

    def d2h(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=self.cuda)
        self.bytes.add("d2h", nbytes_of(src))

    def d2d(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)
        self.d2d_bytes += nbytes_of(src)

    # -- group loads (Alg.1 execution: shared prefix blocks once, fanned out on the device) ------
    def load_paths(self, dst: torch.Tensor, layers: LayerSel, slots: Sequence[int], paths: Sequence[Path],
                   credits: Optional[Counter] = None,
                   sources: Optional[Dict[int, Tuple[torch.Tensor, int, int]]] = None
                   ) -> Dict[int, Tuple[torch.Tensor, int, int]]:
        """Fill each beam's dense device slot with its path's KV.

        dst: ``[..., G, num_kv_heads, capacity, head_dim]`` (batch at dim -4; for ``layers`` a
            slice, leading dims ``[n_layers, 2]``; for an int layer, ``[2]``).
        layers: which layers of the host segments to copy (int or slice).
        slots: batch index in ``dst`` of each beam; ``paths[i]`` the (segment, tokens) list of beam i.
        credits: host->device loads the plan allows per segment id (a multiset: a segment listed
            once is loaded once and fanned out device-side to every other beam that needs it; listed
            once per beam, it is loaded once per beam). ``None``: every beam loads every segment.
        sources: segments already on the device (sid -> (tensor, slot, token offset), same layout), e.g.
            prefetched beams; updated and returned.
        Raises PlanMismatch when a needed segment has neither a credit nor a device copy.
        """
        sources = {} if sources is None else sources
        for slot, path in zip(slots, paths):
            pos = 0
            for sid, n in path:
                if n <= 0:
                    continue
                d = dst[..., slot, :, pos:pos + n, :]
                if credits is None or credits[sid] > 0:
                    self.h2d(d, self.host.get(sid)[layers][..., :n, :])
                    if credits is not None:
                        credits[sid] -= 1
                    sources.setdefault(sid, (dst, slot, pos))
                elif sid in sources:
                    t, s_slot, s_pos = sources[sid]
                    self.d2d(d, t[..., s_slot, :, s_pos:s_pos + n, :])
                else:
                    raise PlanMismatch(f"segment {sid} is needed on the device but the plan does not "
                                       f"load it and no device copy exists")
                pos += n
        return sources

    def write_back(self, src: torch.Tensor, layers: LayerSel, slots: Sequence[int],
                   segs: Sequence[int], start: int, n: int, host_pos: int = 0) -> None:
        """Copy tokens ``[start, start+n)`` of each beam slot of ``src`` (layout as in
        :meth:`load_paths`) to its host segment ``segs[i]`` at ``host_pos`` (device -> host)."""
        for slot, sid in zip(slots, segs):
            h = self.host.get(sid)
            self.d2h(h[layers][..., host_pos:host_pos + n, :], src[..., slot, :, start:start + n, :])
