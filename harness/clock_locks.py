"""Lock records: which GPUs a DVFS actuator locked clocks on, kept on disk until it reset them.

A process killed by something it cannot catch (``kill -9``, the OOM killer, a power cut of the
host but not of the GPU's box) leaves locked clocks behind. Before its first lock on a GPU the
actuator writes ``<lock dir>/<gpu uuid>.json`` (atomically): the GPU (UUID, PCI bus id, name), the
owner (host, pid and the pid's start time, boot id) and the GPU's state before (SM clock, max SM
clock). It removes the file after resetting that GPU. A record whose owner is gone is *stale*:
the next run warns about it and ``python -m systems.energy_serving.actuator --restore`` resets exactly
those GPUs. Records from before the last reboot are obsolete (a reboot resets locked clocks).

Lock dir: ``$TTC_CLOCK_LOCK_DIR``, else ``$XDG_STATE_HOME/ttc-sched-bench/clock-locks`` (default
``~/.local/state/...``).
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional

RESTORE_COMMAND = "python -m systems.energy_serving.actuator --restore"


def lock_dir() -> Path:
    if os.environ.get("TTC_CLOCK_LOCK_DIR"):
        return Path(os.environ["TTC_CLOCK_LOCK_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "ttc-sched-bench" / "clock-locks"


def _boot_id() -> Optional[str]:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), which
    tells a live owner from a later process that reuses its pid; None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _path(uuid: str) -> Path:
    return lock_dir() / f"{uuid}.json"


def write(gpu, previous: Dict[str, Any]) -> Path:
    """Record that this process is about to lock ``gpu``'s clocks (a :class:`harness.gpus.JobGpu`);
    ``previous``: what NVML said before. Raises OSError when the record cannot be written."""
    from harness.records import atomic_write_json

    path = _path(gpu.uuid)
    atomic_write_json(
        path,
        {
            "uuid": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "name": gpu.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_start": _start_time(os.getpid()),
            "boot_id": _boot_id(),
            "locked_at": datetime.now(timezone.utc).isoformat(),
            "previous": previous,
            "restore": f"{RESTORE_COMMAND} (resets the locked clocks of this GPU to the driver default)",
        },
    )
    return path


def remove(uuid: str) -> None:
    try:
        _path(uuid).unlink()
    except FileNotFoundError:
        pass


def owner_state(rec: Dict[str, Any]) -> str:
    """``live`` (its process still runs), ``stale`` (it died on this machine, clocks still locked),
    ``obsolete`` (written before the last reboot) or ``elsewhere`` (another host)."""
    if rec.get("host") != socket.gethostname():
        return "elsewhere"
    if rec.get("boot_id") and _boot_id() and rec["boot_id"] != _boot_id():
        return "obsolete"
    start = _start_time(int(rec.get("pid", -1)))
    alive = start is not None and (rec.get("pid_start") in (None, start))
    return "live" if alive else "stale"


def read_all() -> List[Dict[str, Any]]:
    """Every lock record (with ``path``), oldest first; unreadable files are skipped."""
    out = []
    try:
        paths = sorted(lock_dir().glob("*.json"))
    except (OSError, RuntimeError):  # no readable folder, or no home directory to find it in
        paths = []
    for p in paths:
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        out.append(dict(rec, path=str(p)))
    return sorted(out, key=lambda r: r.get("locked_at", ""))


def stale_warnings() -> List[str]:
    """One line per GPU left with locked clocks by a process that did not exit cleanly."""
    return [
        f"GPU {r['uuid']} ({r.get('name')}, PCI {r.get('pci_bus_id')}) was left with locked SM clocks by "
        f"pid {r.get('pid')} (locked at {r.get('locked_at')}), which did not exit cleanly; measurements on it "
        f"are affected until you run: {RESTORE_COMMAND}"
        for r in read_all()
        if owner_state(r) == "stale"
    ]


__all__ = ["lock_dir", "write", "remove", "owner_state", "read_all", "stale_warnings", "RESTORE_COMMAND"]
