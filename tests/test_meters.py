"""Meters: energy windows from a fake NVML; unavailable energy is None, never 0; byte counters."""
import types

import pytest

from harness.meters import ByteCounter, EnergyMeter, WallTimer


def fake_nvml(counters_mj):
    """An NVML-like module whose energy counters advance by the given mJ at every read."""
    state = {i: 0 for i in range(len(counters_mj))}

    def read(h):
        state[h] += counters_mj[h]
        return state[h]
    return types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: len(counters_mj),
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetTotalEnergyConsumption=read)


def test_energy_window_sums_gpus_in_joules():
    m = EnergyMeter(nvml=fake_nvml([1000, 3000]))      # +1 J and +3 J per read
    assert m.available
    m.begin_window("run")
    r = m.end_window("run")
    assert r.energy_j == pytest.approx(4.0)
    assert r.per_gpu_j == {0: pytest.approx(1.0), 1: pytest.approx(3.0)}
    assert r.avg_power_w is not None and r.avg_power_w > 0


def test_energy_unavailable_is_none_with_reason():
    def boom():
        raise RuntimeError("NVML Shared Library Not Found")
    m = EnergyMeter(nvml=types.SimpleNamespace(nvmlInit=boom))
    m.begin_window("w")
    r = m.end_window("w")
    assert not m.available and r.energy_j is None and r.avg_power_w is None
    assert "NVML Shared Library Not Found" in r.reason


def test_real_pynvml_on_this_machine_reports_unavailable_not_zero():
    m = EnergyMeter()
    m.begin_window("w")
    r = m.end_window("w")
    assert (r.energy_j is None) == (not m.available)
    if not m.available:
        assert r.reason.startswith("energy unavailable")


def test_byte_counter_and_timer():
    c = ByteCounter()
    c.add("h2d", 10)
    c.add("h2d", 5)
    c.add("d2h", 7)
    assert (c.h2d, c.d2h) == (15, 7)
    t = WallTimer()
    with t.span("x"):
        pass
    t.add("x", 1.0)
    assert t.totals["x"] >= 1.0
