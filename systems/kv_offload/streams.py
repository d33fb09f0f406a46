"""Streams and events of the TTC engine's copies, and the check that they are ordered.

The engine issues three kinds of work: model compute (the ``compute`` stream, torch's current
stream), host->device loads (``h2d``) and device->host write-backs (``d2h``). A load that reads a
host range must start after the write-back that wrote it (read-after-write): the store records an
event on ``d2h`` after each write-back region and makes ``h2d`` wait on it before reading the same
key (``TieredKVStore.h2d``/``d2h``).

:class:`CudaStreams` carries this out with CUDA streams and events. :class:`HostStreams` is the CPU
stand-in: every copy is synchronous, so program order is execution order, but it takes the same
calls, and with ``record=True`` both keep a log of them. :func:`ordering_violations` replays such a
log as a happens-before graph and lists every load that could overtake the write it reads: the
dependency graph the CUDA path would build, checked on any machine.

Log entries (tuples): ``("copy", stream, key)``, ``("write", stream, key)``,
``("record", stream, event_id)``, ``("wait_event", stream, event_id)``,
``("wait_stream", waiter, waited)``; on the CPU itself (stream ``host``): ``("host_wait", "host",
event_id)``, ``("sync", "host")`` and the CPU's own reads/writes of host ranges.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Dict, Iterator, List, Optional, Tuple

STREAMS = ("compute", "h2d", "d2h")


class HostStreams:
    """CPU: copies run synchronously on the calling thread; stream calls are only logged."""

    cuda = False

    def __init__(self, record: bool = False):
        self.log: Optional[List[tuple]] = [] if record else None
        self._ids = itertools.count()

    def _note(self, *entry) -> None:
        if self.log is not None:
            self.log.append(entry)

    @contextlib.contextmanager
    def on(self, stream: str) -> Iterator[None]:
        """Issue the enclosed work on ``stream``."""
        yield

    def record(self, stream: str):
        """An event marking the work issued on ``stream`` so far."""
        ev = next(self._ids)
        self._note("record", stream, ev)
        return ev

    def wait_event(self, stream: str, ev) -> None:
        """Work issued on ``stream`` from now on starts after ``ev``."""
        self._note("wait_event", stream, self._id(ev))

    def wait_stream(self, waiter: str, waited: str) -> None:
        """Work issued on ``waiter`` from now on starts after everything issued on ``waited``."""
        self._note("wait_stream", waiter, waited)

    def note_copy(self, stream: str, kind: str, key) -> None:
        """A copy on ``stream`` that reads (``kind="copy"``) or writes (``"write"``) host key ``key``."""
        self._note(kind, stream, key)

    def host_wait(self, ev) -> None:
        """The CPU waits for ``ev`` (before it touches host memory a copy may still write)."""
        self._note("host_wait", "host", self._id(ev))

    def synchronize(self) -> None:
        """The CPU waits for everything issued on every stream."""
        self._note("sync", "host")

    @staticmethod
    def _id(ev):
        return ev


class CudaStreams(HostStreams):
    """CUDA: ``compute`` is torch's current stream of ``device``; ``h2d`` and ``d2h`` are copy streams."""

    cuda = True

    def __init__(self, device, record: bool = False):
        import torch

        super().__init__(record)
        self._torch = torch
        self.device = device
        self.streams = {
            "compute": torch.cuda.current_stream(device),
            "h2d": torch.cuda.Stream(device),
            "d2h": torch.cuda.Stream(device),
        }
        self._event_ids: Dict[int, int] = {}

    def __getitem__(self, name: str):
        return self.streams[name]

    @contextlib.contextmanager
    def on(self, stream: str) -> Iterator[None]:
        with self._torch.cuda.stream(self.streams[stream]):
            yield

    def record(self, stream: str):
        ev = self._torch.cuda.Event()
        ev.record(self.streams[stream])
        self._event_ids[id(ev)] = next(self._ids)
        self._note("record", stream, self._event_ids[id(ev)])
        return ev

    def wait_event(self, stream: str, ev) -> None:
        self.streams[stream].wait_event(ev)
        super().wait_event(stream, ev)

    def wait_stream(self, waiter: str, waited: str) -> None:
        self.streams[waiter].wait_stream(self.streams[waited])
        super().wait_stream(waiter, waited)

    def host_wait(self, ev) -> None:
        ev.synchronize()
        super().host_wait(ev)

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.device)
        super().synchronize()

    def _id(self, ev):
        return self._event_ids.get(id(ev), -1)


def ordering_violations(log: List[tuple]) -> List[str]:
    """Loads (``copy`` entries) of a key that do not happen after the last ``write`` of that key
    issued before them, following stream order, events and stream waits (a happens-before graph).
    Entries on the ``host`` stream are the CPU itself: everything issued after them happens after.
    Returns one line per violation (empty: every read-after-write is ordered)."""
    last_on: Dict[str, int] = {}
    anc: List[int] = []  # bitset of the ops each op happens after
    event_node: Dict[int, int] = {}
    out, last_write = [], {}
    for i, entry in enumerate(log):
        kind, stream = entry[0], entry[1]
        preds = [last_on.get(stream), last_on.get("host")]
        if kind in ("wait_event", "host_wait"):
            preds.append(event_node.get(entry[2]))
        if kind == "wait_stream":
            preds.append(last_on.get(entry[2]))
        if kind == "sync":
            preds.extend(last_on.values())
        bits = 0
        for p in preds:
            if p is not None:
                bits |= anc[p] | (1 << p)
        anc.append(bits)
        if kind == "record":
            event_node[entry[2]] = i
        last_on[stream] = i
        if kind == "write":
            last_write[entry[2]] = i
        elif kind == "copy" and entry[2] in last_write and not (bits >> last_write[entry[2]]) & 1:
            w = last_write[entry[2]]
            out.append(f"load of {entry[2]!r} on {stream} (op {i}) may overtake its write on {log[w][1]} (op {w})")
    return out


def writes_and_reads(log: List[tuple]) -> Tuple[int, int]:
    """(write-backs, loads) in a log, to check a test exercised both."""
    return sum(e[0] == "write" for e in log), sum(e[0] == "copy" for e in log)
