"""Meters: energy windows from a fake NVML; unavailable energy is None, never 0; byte counters."""
import types

import pytest

from harness.meters import ByteCounter, EnergyMeter, WallTimer


def test_energy_window_sums_gpus_in_joules(fake_nvml, monkeypatch):
    """Two GPUs whose counters advance by 1 J and 3 J per read; per-GPU energy keyed by CUDA index
    (PCI bus order: the 1 J GPU is cuda:0 though NVML lists it second)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    m = EnergyMeter(nvml=fake_nvml([("GPU-b", "00000000:3B:00.0", "H100", 3000),
                                    ("GPU-a", "00000000:1A:00.0", "H100", 1000)]))
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
