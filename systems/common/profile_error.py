"""The error of a profiling pass, one rule for every family whose planner reads a profiled table:
BEAM's controllers (``systems.energy_serving``: latency/energy tables over clock and batch) and
FastTTS's M (``systems.verifier_search.memory``: stage times over batch and context). Applied on the
simulated backend only: a real device's profile carries its own error.

``system.profile_error.bias`` is relative (-0.2 = the table is 20 % low), in [-0.5, 0.5];
``system.profile_error.noise`` is the relative standard deviation of each sample (Gaussian, clipped
at 3 sigma), in [0, 0.3]."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.errors import bad

PROFILE_BIAS_RANGE = (-0.5, 0.5)
PROFILE_NOISE_RANGE = (0.0, 0.3)


@dataclass
class ProfileErrorConfig:
    """Error of the profiling pass that builds a planner's table on the simulated backend
    (:class:`ProfileError`): every measured latency, energy and idle power off by ``bias`` (relative,
    in [-0.5, 0.5]), each sample scattered with relative std ``noise`` (in [0, 0.3]). Default: no
    bias, 2 % noise -- measured A100 profiles scatter by 0.8 % (time) and 1.4 % (energy) about a
    smooth fit over the clock (Perseus, the data folder's gpu_power/; ``python -m
    systems.energy_serving.power_fit`` prints it), rounded up for NVML's 10-100 ms energy counter
    updates on short windows (``nvmlDeviceGetTotalEnergyConsumption`` is refreshed every 10-100 ms,
    depending on the GPU). A real device's profile carries its own error; this is not applied there."""

    bias: float = 0.0
    noise: float = 0.02


@dataclass(frozen=True)
class ProfileError:
    """Error of a profiling pass (``system.profile_error``): every measured value is off by ``bias``
    (relative; -0.2 = 20 % low) and each sample scatters with relative standard deviation ``noise``
    (Gaussian, clipped at 3 sigma). See conf/system/beam.yaml for the default and its source."""

    bias: float = 0.0
    noise: float = 0.0

    def apply(self, x, rng: np.random.Generator) -> np.ndarray:
        x = np.asarray(x, float)
        z = np.clip(rng.standard_normal(x.shape), -3.0, 3.0) if self.noise else 0.0
        return x * (1.0 + self.bias) * (1.0 + self.noise * z)


def check_profile_error(pe) -> None:
    """``system.profile_error`` (bias, noise) inside :data:`PROFILE_BIAS_RANGE` /
    :data:`PROFILE_NOISE_RANGE`; ConfigError naming the field and the range otherwise (a non-number
    included)."""
    bias, noise = pe.bias, pe.noise
    number = (int, float)
    if (
        isinstance(bias, bool)
        or not isinstance(bias, number)
        or not PROFILE_BIAS_RANGE[0] <= bias <= PROFILE_BIAS_RANGE[1]
    ):
        raise bad("system.profile_error.bias", bias, "a relative error in [-0.5, 0.5] (-0.2 = the table is 20 % low)")
    if (
        isinstance(noise, bool)
        or not isinstance(noise, number)
        or not PROFILE_NOISE_RANGE[0] <= noise <= PROFILE_NOISE_RANGE[1]
    ):
        raise bad("system.profile_error.noise", noise, "a relative standard deviation in [0, 0.3]")
