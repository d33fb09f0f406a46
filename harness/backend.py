"""Backend resolution: which engine runs a job, and whether its numbers are measured or simulated."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from harness.errors import ConfigError


@dataclass(frozen=True)
class Backend:
    name: str  # torch | vllm | sim
    device: str  # cpu | cuda | sim
    simulated: bool
    reason: str  # one line for the first line of output and the record

    @property
    def label(self) -> str:
        return "simulated" if self.simulated else "measured"


def no_nvidia_gpu() -> bool:
    """True when this machine certainly has no NVIDIA GPU: Linux without the NVIDIA driver's device
    files (``/dev/nvidiactl``, ``/proc/driver/nvidia``) and without WSL's GPU device (``/dev/dxg``),
    and no NVML module loaded already (one that is, a test's fake included, is asked instead).
    GPU checks then need neither NVML nor torch (a simulated run imports neither)."""
    return (
        sys.platform == "linux"
        and "pynvml" not in sys.modules
        and not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg"))
    )


def cuda_available() -> bool:
    """True when a CUDA GPU is usable by torch. Looks for the driver, then NVML, then torch, so CPU
    machines stay fast."""
    if no_nvidia_gpu():
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        if n == 0:
            return False
    except Exception:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def resolve_backend(cfg, family) -> Backend:
    """Resolve ``backend.name``/``backend.device`` for a family (harness.family.Family: its
    ``real_engine``, None for a simulated-only family).

    auto: the family's real engine on a CUDA GPU, else the simulated backend on ``hardware``.
    Raises ConfigError for a real backend the family has no engine for, or device=cuda without CUDA.
    """
    name, device = cfg.backend.name, cfg.backend.device
    hw = cfg.hardware.name
    real, family = family.real_engine, family.name
    if name == "auto":
        if real is not None and cuda_available():
            name, device = real, "cuda"
            return Backend(name, device, False, real_reason("auto", name, device, hw))
        why = "no CUDA GPU found" if real is not None else f"family {family} has no real engine"
        return Backend(
            "sim",
            "sim",
            True,
            f"backend=auto -> SIMULATED backend on the '{hw}' profile ({why}); all numbers below are simulated",
        )
    if name == "sim":
        return Backend(
            "sim",
            "sim",
            True,
            f"backend=sim -> SIMULATED backend on the '{hw}' profile; all numbers below are simulated",
        )
    if name != real:
        raise ConfigError(
            f"backend={name!r} is not allowed for system={cfg.system.name!r} "
            f"(family {family}): use auto, sim" + (f" or {real}" if real else " (no real engine)")
        )
    has_cuda = cuda_available() if device in ("auto", "cuda") else False
    if device == "cuda" and not has_cuda:
        raise ConfigError(
            "backend.device='cuda' is not allowed here: no CUDA GPU is available "
            "(use backend.device=cpu or backend=sim)"
        )
    if device == "auto":
        device = "cuda" if has_cuda else "cpu"
    return Backend(name, device, False, real_reason(name, name, device, hw))


def real_reason(setting: str, name: str, device: str, hw: str) -> str:
    """The first output line of a real engine's run: the device it measures (the run table's title says
    the same) and what the hardware profile is still used for."""
    return (
        f"backend={setting} -> real {name} engine, measured on {device.upper()}; the hardware profile "
        f"'{hw}' is not what is measured: it only supplies defaults the engine does not measure, such "
        f"as a CPU run's KV budget when kv_budget is not given"
    )
