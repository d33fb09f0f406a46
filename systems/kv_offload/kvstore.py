"""Tiered KV store of the TTC torch executor (docs/design.md "The TTC engine"; LBS paper Alg.1).

Host side, authoritative, page-locked (pinned) on CUDA so copies run asynchronously:

- :class:`HostPool` (LBS): the KV of every segment of the beam tree (a segment is the KV of a run
  of consecutive tokens of one path; the prompt is segment 0), one tensor per segment of shape
  ``[num_layers, 2, num_kv_heads, length, head_dim]`` (K at index 0, V at 1), sized to the segment,
  so a segment (all layers, or one layer) is one contiguous host range.
- :class:`HostLayers` (layer-wise offloading): per offloaded layer, every beam's dense KV,
  token-major ``[capacity, 2, num_beams, num_kv_heads, head_dim]``, so the first ``s`` tokens of a
  layer for all beams are one contiguous range (one copy per layer per token, as transformers'
  offloaded cache moves a layer).

Device side, :class:`DevicePool`: dense buffers the attention kernels read, one copy per beam
(sharing saves transfers, not device memory). It enforces a **byte budget**: a charge beyond it
raises :class:`KVBudgetExceeded`, so a scheduler that overruns fails loudly. The budget counts the
KV bytes held on the device (tokens x beams x layers x ``KV``), as the plans of ``systems.kv_offload.plan``
do; ``kind="staging"`` buffers (layer-wise offloading's layers in flight and the step's new tokens
of offloaded layers) are charged against the staging limit the plan declares. It also tracks the
**physical** bytes of its live tensors and their peak (what a device allocator would see).

:class:`TieredKVStore` owns both, moves data between them and counts every byte moved
(``bytes.h2d``, ``bytes.d2h``: :class:`harness.meters.ByteCounter`; device-side fan-out copies in
``d2d_bytes``, which cross no bus). Every host<->device copy is checked: the host side must be
contiguous, and pinned on CUDA (:class:`HostCopyError`), because PyTorch stages any other host
tensor through an unpinned temporary (a CPU gather and a blocking copy). On CUDA loads run on a
copy stream and write-backs on a second one (``systems.kv_offload.streams``); a load of a host range waits
on the event recorded after the write-back that wrote it; the compute stream's waits on the copy
streams are the measured **I/O stall** (CUDA events). On CPU the same calls run with two CPU
pools: bytes are exact, copies are synchronous and their time is the I/O stall (times on CPU are
the engine thread's CPU time: :func:`harness.meters.time_basis`).
"""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Dict, Hashable, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from harness.meters import ByteCounter, time_basis
from systems.kv_offload.streams import CudaStreams, HostStreams

LayerSel = Union[int, slice]
# A beam's path as the store sees it: [(segment id, tokens to take from it)], root first.
Path = Sequence[Tuple[int, int]]


class HostCopyError(RuntimeError):
    """A host<->device copy whose host side is strided (or, on CUDA, not pinned): PyTorch would
    gather it into an unpinned temporary and block the CPU on the copy."""


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
    ``physical`` / ``peak_physical``: bytes of the live tensors themselves (charged or not).
    Raises KVBudgetExceeded naming the request, the budget and what is in use.
    """

    def __init__(self, device: torch.device, budget: Optional[int], staging_budget: Optional[int] = 0):
        self.device = torch.device(device)
        self.budget = budget
        self.staging_budget = staging_budget
        self.used: Dict[str, int] = defaultdict(int)
        self.peak_total = 0  # max over time of kv + staging charges
        self.peak_kv = 0
        self.physical = 0
        self.peak_physical = 0
        self.live: List[DeviceBuffer] = []

    def _check(self, kind: str, new_used: int, what: str, nbytes: int) -> None:
        limit = self.budget if kind == "kv" else self.staging_budget
        if limit is not None and new_used > limit:
            raise KVBudgetExceeded(
                f"device {kind} budget exceeded: {what or 'buffer'} needs {nbytes} B, {self.used[kind]} B "
                f"already held, {kind} budget {limit} B ({limit / 2**20:.2f} MiB); the scheduler's plan "
                f"overruns the device KV budget"
            )

    def _account(self) -> None:
        total = self.used["kv"] + self.used["staging"]
        self.peak_total = max(self.peak_total, total)
        self.peak_kv = max(self.peak_kv, self.used["kv"])
        self.peak_physical = max(self.peak_physical, self.physical)

    def alloc(
        self,
        shape: Sequence[int],
        dtype: torch.dtype,
        *,
        kind: str = "kv",
        charge: Optional[int] = None,
        what: str = "",
    ) -> DeviceBuffer:
        if kind not in ("kv", "staging"):
            raise ValueError(f"kind={kind!r}: kv or staging")
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        ch = nbytes if charge is None else int(charge)
        self._check(kind, self.used[kind] + ch, what, ch)
        with torch.inference_mode(False):  # the store's buffers outlive a decode: never inference tensors
            t = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        buf = DeviceBuffer(t, kind, ch, self, what)
        self.used[kind] += ch
        self.physical += nbytes
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

    def rekind(self, buf: DeviceBuffer, kind: str) -> None:
        """Move a buffer's charge to the other allowance (e.g. the prefill's KV becomes a staging
        transient once the beams' buffers are filled from it). Raises KVBudgetExceeded."""
        if kind == buf.kind:
            return
        self._check(kind, self.used[kind] + buf.charged, buf.what, buf.charged)
        self.used[buf.kind] -= buf.charged
        self.used[kind] += buf.charged
        buf.kind = kind
        self._account()

    def free(self, buf: DeviceBuffer) -> None:
        """Return the buffer's bytes to the pool. The engine drops its other references to the tensor
        (views, caches) first, so the memory is released here, not when Python's GC runs."""
        if buf.freed:
            return
        self.used[buf.kind] -= buf.charged
        self.physical -= nbytes_of(buf.tensor)
        buf.freed = True
        self.live.remove(buf)
        buf.tensor = None

    def reset_peak(self) -> None:
        self.peak_total = self.used["kv"] + self.used["staging"]
        self.peak_kv = self.used["kv"]
        self.peak_physical = self.physical


class HostPool:
    """Authoritative KV of every segment, ``[num_layers, 2, num_kv_heads, length, head_dim]``.

    Each segment is allocated at its exact length, so whole segments (all layers, or one layer) are
    contiguous. Pinned (page-locked) when ``pin`` (CUDA runs), so copies can be asynchronous."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, pin: bool = False):
        self.shape = (num_layers, 2, num_kv_heads, head_dim)
        self.dtype, self.pin = dtype, pin
        self.segs: Dict[int, torch.Tensor] = {}

    def ensure(self, sid: int, length: int) -> torch.Tensor:
        """The segment's tensor, allocated for ``length`` tokens if new (or of another length)."""
        t = self.segs.get(sid)
        if t is None or t.shape[3] != length:
            L, two, H, D = self.shape
            with torch.inference_mode(False):  # never an inference tensor, whoever allocates it
                t = torch.empty((L, two, H, length, D), dtype=self.dtype, pin_memory=self.pin)
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


class HostLayers:
    """Layer-wise offloading's host KV: per offloaded layer, all beams' dense KV, token-major
    ``[capacity, 2, num_beams, num_kv_heads, head_dim]`` (pinned when ``pin``). ``layer(l)[:s]`` is
    one contiguous range: the first ``s`` tokens of every beam."""

    def __init__(
        self, capacity: int, num_beams: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, pin: bool = False
    ):
        self.shape = (capacity, 2, num_beams, num_kv_heads, head_dim)
        self.dtype, self.pin = dtype, pin
        self.layers: Dict[int, torch.Tensor] = {}

    def layer(self, layer: int) -> torch.Tensor:
        """Layer ``l``'s tensor (allocated on first use)."""
        t = self.layers.get(layer)
        if t is None:
            with torch.inference_mode(False):  # never an inference tensor, whoever allocates it
                t = self.layers[layer] = torch.empty(self.shape, dtype=self.dtype, pin_memory=self.pin)
        return t

    @property
    def nbytes(self) -> int:
        return sum(nbytes_of(t) for t in self.layers.values())


class TieredKVStore:
    """Host pool + budgeted device pool + byte counters + streams and stall timers (module doc).

    ``streams``: a :class:`systems.kv_offload.streams.HostStreams` (CPU) or ``CudaStreams``; pass one built
    with ``record=True`` to keep the log of stream operations (ordering tests).
    I/O stall seconds accumulate until :meth:`take_io_stall` (which synchronises the device).
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: Union[str, torch.device],
        budget: Optional[int],
        staging_budget: Optional[int] = 0,
        streams: Optional[HostStreams] = None,
    ):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.dtype = dtype
        self.host = HostPool(num_layers, num_kv_heads, head_dim, dtype, pin=self.cuda)
        self.dev = DevicePool(self.device, budget, staging_budget)
        self.bytes = ByteCounter()
        self.d2d_bytes = 0
        self.streams = streams or (CudaStreams(self.device) if self.cuda else HostStreams())
        self.clock = time_basis(self.device)[0]
        self._io_s = 0.0  # CPU: wall seconds of synchronous copies
        self._stall_events: List[tuple] = []  # CUDA: (start, end) on the compute stream
        self._written: Dict[Hashable, object] = {}  # host key -> event after its last write-back
        self._region: Optional[dict] = None  # the open io() region

    # -- streams, ordering and timing --------------------------------------------------------------
    @contextlib.contextmanager
    def io(self, direction: str = "h2d"):
        """A region of copies in one direction. CUDA: issued on the ``h2d`` or ``d2h`` copy stream,
        which first waits for the work issued on the compute stream so far (freshly allocated or
        just-computed buffers are safe); the keys written by a ``d2h`` region get one event, which
        later loads of those keys wait on. CPU: synchronous, wall time counted as I/O stall."""
        if self._region is not None:
            raise RuntimeError("io() regions do not nest")
        self.streams.wait_stream(direction, "compute")
        self._region = {"direction": direction, "writes": set(), "waited": set()}
        t0 = self.clock()
        try:
            with self.streams.on(direction):
                yield
        finally:
            region, self._region = self._region, None
            if not self.cuda:
                self._io_s += self.clock() - t0
            if region["writes"]:
                ev = self.streams.record("d2h")
                for k in region["writes"]:
                    self._written[k] = ev

    def _stall(self, waited: Sequence[str]) -> None:
        """The compute stream waits for the copy streams ``waited``; on CUDA the wait is timed."""
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(self.streams["compute"])
            for w in waited:
                self.streams.wait_stream("compute", w)
            b.record(self.streams["compute"])
            self._stall_events.append((a, b))
        else:
            for w in waited:
                self.streams.wait_stream("compute", w)

    def wait_loads(self, *buffers: torch.Tensor) -> None:
        """Compute waits for the loads issued so far (the wait is I/O stall); ``buffers`` written by
        the load stream are marked as used by it (not reused before the copies end)."""
        self._stall(["h2d"])
        self.keep_alive(*buffers, direction="h2d")

    def wait_writebacks(self) -> None:
        """Compute waits for every copy issued so far (end of a step); counted as I/O stall."""
        self._stall(["d2h", "h2d"])

    def host_ready(self, keys: Iterable[Hashable]) -> None:
        """The CPU waits for pending write-backs of ``keys`` before it touches those host ranges."""
        for k in keys:
            ev = self._written.pop(k, None)
            if ev is not None:
                self.streams.host_wait(ev)

    @contextlib.contextmanager
    def cpu_rewrite(self, key: Hashable):
        """The CPU reads and rewrites host range ``key`` in place (after its pending write-backs)."""
        self.host_ready([key])
        self.streams.note_copy("host", "copy", key)
        yield
        self.streams.note_copy("host", "write", key)

    def keep_alive(self, *tensors: torch.Tensor, direction: str) -> None:
        """Device tensors read/written by a copy stream are not reused before the copies end."""
        if self.cuda:
            for t in tensors:
                t.record_stream(self.streams[direction])

    def take_io_stall(self) -> float:
        """Seconds of I/O stall since the last call (synchronises CUDA: call at the end of a step)."""
        self.streams.synchronize()
        self._written.clear()  # everything issued so far has completed
        if self.cuda:
            s = sum(a.elapsed_time(b) for a, b in self._stall_events) / 1e3
            self._stall_events.clear()
            return s
        s, self._io_s = self._io_s, 0.0
        return s

    @contextlib.contextmanager
    def copy_span(self, direction: str = "h2d"):
        """Time the copies issued inside (use within ``io(direction)``): yields a list that holds,
        after the step's synchronisation, the copy engine's busy seconds (CUDA events on the copy
        stream) or the wall seconds (CPU). For achieved-bandwidth checks."""
        out: list = []
        if self.cuda:
            s = self.streams[direction]
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(s)
            yield out
            b.record(s)
            out.append((a, b))
        else:
            t0 = self.clock()
            yield out
            out.append(self.clock() - t0)

    @staticmethod
    def span_seconds(span: list) -> Optional[float]:
        """Seconds of a finished ``copy_span`` (CUDA: after the stream synchronised)."""
        if not span:
            return None
        v = span[0]
        return v[0].elapsed_time(v[1]) / 1e3 if isinstance(v, tuple) else float(v)

    # -- copies (checked, ordered, counted) ----------------------------------------------------------
    def _check_host(self, t: torch.Tensor, what: str) -> None:
        if not t.is_contiguous():
            raise HostCopyError(
                f"{what}: the host side (shape {tuple(t.shape)}, stride {t.stride()}) is not "
                f"contiguous; PyTorch would gather it through an unpinned temporary. "
                f"Copy whole contiguous host ranges"
            )
        if self.cuda and not t.is_pinned():
            raise HostCopyError(
                f"{what}: the host side is not pinned (page-locked); the copy would be staged and block the CPU"
            )

    def h2d(self, dst: torch.Tensor, src: torch.Tensor, key: Hashable = None) -> None:
        """Load host ``src`` (contiguous; pinned on CUDA) into device ``dst``, inside ``io("h2d")``.
        ``key`` names the host range read: the load waits for the last write-back of that key."""
        self._check_host(src, "host->device copy")
        if self._region is None or self._region["direction"] != "h2d":
            raise RuntimeError("h2d() outside an io('h2d') region")
        if key is not None:
            ev = self._written.get(key)
            if ev is not None and key not in self._region["waited"]:
                self.streams.wait_event("h2d", ev)
                self._region["waited"].add(key)
            self.streams.note_copy("h2d", "copy", key)
        dst.copy_(src, non_blocking=self.cuda)
        self.bytes.add("h2d", nbytes_of(src))

    def d2h(self, dst: torch.Tensor, src: torch.Tensor, key: Hashable = None) -> None:
        """Write device ``src`` back to host ``dst`` (contiguous; pinned on CUDA), inside
        ``io("d2h")``. ``key`` names the host range written (loads of it will wait for this copy)."""
        self._check_host(dst, "device->host copy")
        if self._region is None or self._region["direction"] != "d2h":
            raise RuntimeError("d2h() outside an io('d2h') region")
        if key is not None:
            self.streams.note_copy("d2h", "write", key)
            self._region["writes"].add(key)
        dst.copy_(src, non_blocking=self.cuda)
        self.bytes.add("d2h", nbytes_of(src))

    def d2d(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)
        self.d2d_bytes += nbytes_of(src)

    # -- group loads (Alg.1 execution: shared prefix blocks once, fanned out on the device) ------
    def load_paths(
        self,
        dst: torch.Tensor,
        slots: Sequence[int],
        paths: Sequence[Path],
        credits: Optional[Counter] = None,
        sources: Optional[Dict[int, Tuple[torch.Tensor, int, int]]] = None,
        fan_out: Optional[List[Tuple[torch.Tensor, torch.Tensor]]] = None,
    ) -> Dict[int, Tuple[torch.Tensor, int, int]]:
        """Fill each beam's dense device slot with its path's KV (all layers), inside ``io("h2d")``.

        dst: ``[num_layers, 2, G, num_kv_heads, capacity, head_dim]``.
        slots: batch index in ``dst`` of each beam; ``paths[i]`` the (segment, tokens) list of beam i
            (every segment whole: its host tensor is copied as one contiguous range).
        credits: host->device loads the plan allows per segment id (a multiset: a segment listed
            once is loaded once and fanned out device-side to every other beam that needs it; listed
            once per beam, it is loaded once per beam). ``None``: every beam loads every segment.
        sources: segments already on the device (sid -> (tensor, slot, token offset), same layout), e.g.
            prefetched beams; updated and returned.
        fan_out: a list that collects the device-side copies (destination, source views) instead of
            making them now; :meth:`fan_out` makes them, after the loads, in the same ``io`` region
            (the stream orders them after the loads they read). The caller can then time the
            host->device copies alone (``copy_span``): the fan-out of a shared prefix to every beam
            moves more bytes on the device than the loads bring over PCIe.
        Raises PlanMismatch when a needed segment has neither a credit nor a device copy.
        """
        sources = {} if sources is None else sources
        for slot, path in zip(slots, paths):
            pos = 0
            for sid, n in path:
                if n <= 0:
                    continue
                d = dst[:, :, slot, :, pos : pos + n, :]
                if credits is None or credits[sid] > 0:
                    self.h2d(d, self.host.get(sid), key=sid)
                    if credits is not None:
                        credits[sid] -= 1
                    sources.setdefault(sid, (dst, slot, pos))
                elif sid in sources:
                    t, s_slot, s_pos = sources[sid]
                    src = t[:, :, s_slot, :, s_pos : s_pos + n, :]
                    if fan_out is None:
                        self.d2d(d, src)
                    else:
                        fan_out.append((d, src))
                else:
                    raise PlanMismatch(
                        f"segment {sid} is needed on the device but the plan does not load it and no device copy exists"
                    )
                pos += n
        return sources

    def fan_out(self, copies: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Make the device-side copies :meth:`load_paths` collected (``fan_out=``), in order."""
        for d, src in copies:
            self.d2d(d, src)

    def write_back(self, src: torch.Tensor, slots: Sequence[int], segs: Sequence[int], start: int, n: int) -> None:
        """Copy tokens ``[start, start+n)`` of each beam slot of ``src`` (layout as in
        :meth:`load_paths`) to its whole host segment ``segs[i]`` (``n`` tokens), inside ``io("d2h")``."""
        for slot, sid in zip(slots, segs):
            self.d2h(self.host.get(sid), src[:, :, slot, :, start : start + n, :], key=sid)
