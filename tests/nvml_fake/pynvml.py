"""A fake NVML: the part of pynvml's API the harness calls, with the GPUs' state in a JSON file.

The state file (``configure(path)``, or ``$FAKE_NVML_STATE`` in a child process) holds the GPUs in
NVML index order -- uuid, PCI bus id, name, locked clocks, energy counter -- so a test can shuffle
NVML's order against PCI bus order, and the state outlives a process killed by a signal, as a real
GPU's locked clocks do. With this folder first on PYTHONPATH a child process imports it as
``pynvml``; in-process tests load a private copy (conftest's ``fake_nvml``) and pass it as ``nvml=``.
"""

import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

NVML_CLOCK_SM = 1
NVML_ERROR_NO_PERMISSION = 4
_LOCK = threading.Lock()
_PATH = os.environ.get("FAKE_NVML_STATE")


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


class Handle:
    def __init__(self, index):
        self.index = index

    def __repr__(self):
        return f"<fake nvml handle {self.index}>"


def gpu(uuid, bus, name="NVIDIA H100 80GB HBM3", energy_step_mj=1000):
    """One GPU's state: ``energy_step_mj`` is added to its counter at every read."""
    return {
        "uuid": uuid,
        "pci_bus_id": bus,
        "name": name,
        "locked": None,
        "energy_mj": 0,
        "energy_step_mj": energy_step_mj,
        "default_clock_mhz": 1980,
    }


def configure(path, gpus=None, deny=False, fail_after=None, fail_reset=False):
    """Use ``path`` as this module's state file, writing ``gpus`` (NVML index order) if given.
    ``deny``: locking raises NO_PERMISSION; ``fail_after``: lock calls after that many raise 999;
    ``fail_reset``: resetting raises 999."""
    global _PATH
    _PATH = str(path)
    if gpus is not None:
        _write(
            {"gpus": gpus, "deny": deny, "fail_after": fail_after, "fail_reset": fail_reset, "lock_calls": 0, "log": []}
        )


def state():
    return json.loads(Path(_PATH).read_text())


def _write(st):
    tmp = f"{_PATH}.{os.getpid()}.{threading.get_ident()}.tmp"
    Path(tmp).write_text(json.dumps(st))
    os.replace(tmp, _PATH)


def _update(fn):
    with _LOCK:
        st = state()
        out = fn(st)
        _write(st)
        return out


def locked():
    """{uuid: (lo, hi) or None}."""
    return {g["uuid"]: tuple(g["locked"]) if g["locked"] else None for g in state()["gpus"]}


def set_locked(index, mhz):
    """Lock a GPU's clocks behind the harness's back (another user's run)."""

    def f(st):
        st["gpus"][index]["locked"] = [int(mhz), int(mhz)]

    _update(f)


def add_energy(index, mj):
    def f(st):
        st["gpus"][index]["energy_mj"] += int(mj)

    _update(f)


# -- the pynvml API subset ---------------------------------------------------------------------
def nvmlInit():
    if _PATH is None:
        raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED: no state configured


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(state()["gpus"])


def nvmlDeviceGetHandleByIndex(i):
    if not 0 <= i < nvmlDeviceGetCount():
        raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
    return Handle(i)


def nvmlDeviceGetHandleByUUID(uuid):
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for i, g in enumerate(state()["gpus"]):
        if g["uuid"] == uuid:
            return Handle(i)
    raise NVMLError(6)  # NVML_ERROR_NOT_FOUND


def _gpu(h):
    return state()["gpus"][h.index]


def nvmlDeviceGetUUID(h):
    return _gpu(h)["uuid"]


def nvmlDeviceGetName(h):
    return _gpu(h)["name"]


def nvmlDeviceGetPciInfo(h):
    return SimpleNamespace(busId=_gpu(h)["pci_bus_id"].encode())  # bytes, as older pynvml


def nvmlDeviceGetMemoryInfo(h):
    return SimpleNamespace(total=80 << 30, free=80 << 30, used=0)


def nvmlSystemGetDriverVersion():
    return "fake"


def nvmlDeviceGetTotalEnergyConsumption(h):
    def f(st):
        g = st["gpus"][h.index]
        g["energy_mj"] += g["energy_step_mj"]
        return g["energy_mj"]

    return _update(f)


def nvmlDeviceGetClockInfo(h, clock_type):
    g = _gpu(h)
    return g["locked"][0] if g["locked"] else g["default_clock_mhz"]


def nvmlDeviceGetMaxClockInfo(h, clock_type):
    return _gpu(h)["default_clock_mhz"]


def nvmlDeviceSetGpuLockedClocks(h, lo, hi):
    def f(st):
        st["lock_calls"] += 1
        if st["deny"]:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if st["fail_after"] is not None and st["lock_calls"] > st["fail_after"]:
            raise NVMLError(999)
        st["gpus"][h.index]["locked"] = [int(lo), int(hi)]
        st["log"].append(["lock", st["gpus"][h.index]["uuid"], int(lo)])

    _update(f)


def nvmlDeviceResetGpuLockedClocks(h):
    def f(st):
        if st["fail_reset"]:
            raise NVMLError(999)
        st["gpus"][h.index]["locked"] = None
        st["log"].append(["reset", st["gpus"][h.index]["uuid"]])

    _update(f)
