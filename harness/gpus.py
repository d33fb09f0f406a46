"""The job's GPUs as NVML devices.

CUDA numbers the GPUs a job may use (``CUDA_VISIBLE_DEVICES``) from 0; NVML numbers every GPU of
the machine, in an order NVML does not promise to keep. So a job's device ``cuda:k`` is found in
NVML by UUID or PCI bus id, never by index (NVML API reference, "Device Queries"; CUDA C
Programming Guide, "CUDA Environment Variables"):

* ``CUDA_VISIBLE_DEVICES`` unset: every GPU, in CUDA's order.
* integers: positions in CUDA's order of all GPUs. That order is PCI bus order when
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or when all GPUs are the same model (CUDA's default
  ``FASTEST_FIRST`` breaks ties by PCI bus id); with mixed models it cannot be known here.
* ``GPU-<uuid>`` (or a unique prefix of one): that GPU.
* ``MIG-...``: a MIG instance; NVML's energy counter and locked clocks belong to the whole GPU,
  which other instances share, so it is refused.
* As CUDA does, the list ends at the first entry that names no GPU (``0,-1,1`` = GPU 0 only).

Any GPU that cannot be mapped raises :class:`GpuMappingError` saying why and what to set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, List, Mapping, Optional, Sequence


class GpuMappingError(RuntimeError):
    """The job's CUDA devices cannot be matched to NVML devices; the message says what to set."""


@dataclass(frozen=True)
class JobGpu:
    """One GPU of the job: ``ordinal`` = its CUDA index in the job (``cuda:ordinal``),
    ``nvml_index`` = NVML's index for it, ``handle`` = its NVML handle."""

    ordinal: int
    nvml_index: int
    uuid: str
    pci_bus_id: str
    name: str
    handle: Any


def text(x) -> str:
    """An NVML string (bytes in older pynvml releases) as str."""
    return x.decode() if isinstance(x, bytes) else str(x)


def _devices(nvml) -> List[JobGpu]:
    """Every NVML device (ordinal -1: not yet assigned)."""
    out = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        out.append(
            JobGpu(
                -1,
                i,
                text(nvml.nvmlDeviceGetUUID(h)),
                text(nvml.nvmlDeviceGetPciInfo(h).busId).upper(),
                text(nvml.nvmlDeviceGetName(h)),
                h,
            )
        )
    return out


def _cuda_order(devices: List[JobGpu], env: Mapping[str, str]) -> List[JobGpu]:
    """All GPUs in CUDA's enumeration order (raises when it cannot be known)."""
    if env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and len({d.name for d in devices}) > 1:
        raise GpuMappingError(
            f"CUDA's device order cannot be matched to NVML on a machine with mixed GPU models "
            f"({', '.join(sorted({d.name for d in devices}))}): set CUDA_DEVICE_ORDER=PCI_BUS_ID, or "
            f"name the GPUs by UUID in CUDA_VISIBLE_DEVICES (nvidia-smi -L lists them)"
        )
    return sorted(devices, key=lambda d: d.pci_bus_id)


def _visible(devices: List[JobGpu], env: Mapping[str, str]) -> List[JobGpu]:
    """The job's GPUs in CUDA order, from ``CUDA_VISIBLE_DEVICES``."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return _cuda_order(devices, env) if len(devices) > 1 else devices
    out: List[JobGpu] = []
    for entry in (e.strip() for e in spec.split(",")):
        if entry.upper().startswith("MIG-"):
            raise GpuMappingError(
                f"CUDA_VISIBLE_DEVICES={spec!r} names a MIG instance ({entry}): NVML's energy counter and "
                f"locked clocks belong to the whole GPU, which other instances share; run on whole GPUs "
                f"to measure energy or set clocks"
            )
        if entry.upper().startswith("GPU-"):
            hits = [d for d in devices if d.uuid.upper().startswith(entry.upper())]
            if len(hits) != 1:
                raise GpuMappingError(
                    f"CUDA_VISIBLE_DEVICES={spec!r}: {entry} matches {len(hits)} GPUs "
                    f"({', '.join(d.uuid for d in hits) or 'none of ' + ', '.join(d.uuid for d in devices)})"
                )
            gpu = hits[0]
        elif entry.lstrip("+").isdigit() and int(entry) < len(devices):
            gpu = _cuda_order(devices, env)[int(entry)]
        else:
            break  # CUDA ignores this entry and the rest
        if gpu in out:
            raise GpuMappingError(f"CUDA_VISIBLE_DEVICES={spec!r} names GPU {gpu.uuid} twice")
        out.append(gpu)
    return out


def job_gpus(nvml, ordinals: Optional[Sequence[int]] = None, env: Optional[Mapping[str, str]] = None) -> List[JobGpu]:
    """The job's GPUs (``ordinals``: CUDA device indices in the job, e.g. ``[0]`` for ``cuda:0``;
    None = all the job sees) with their NVML handles. ``nvml``: an initialised NVML module;
    ``env``: default ``os.environ``. Raises GpuMappingError (see the module docstring)."""
    env = os.environ if env is None else env
    visible = _visible(_devices(nvml), env)
    if not visible:
        raise GpuMappingError(
            f"no GPU visible to the job (CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}, "
            f"{nvml.nvmlDeviceGetCount()} GPUs in NVML)"
        )
    picked = range(len(visible)) if ordinals is None else list(ordinals)
    for k in picked:
        if not 0 <= k < len(visible):
            raise GpuMappingError(
                f"GPU index {k} is not allowed: the job sees {len(visible)} GPU(s), cuda:0..cuda:{len(visible) - 1}"
            )
    return [replace(visible[k], ordinal=k) for k in picked]


def open_job_gpus(nvml=None, ordinals: Optional[Sequence[int]] = None):
    """Initialise NVML and return ``(nvml_module, [JobGpu])`` for the job's GPUs. Raises whatever
    NVML raises (``NVMLError_LibraryNotFound`` on machines without a driver) or GpuMappingError.
    ``nvml``: an NVML-like module (tests pass a fake); default ``pynvml``."""
    if nvml is None:
        import pynvml as nvml
    nvml.nvmlInit()
    return nvml, job_gpus(nvml, ordinals)


__all__ = ["GpuMappingError", "JobGpu", "job_gpus", "open_job_gpus"]
