"""Meters: energy windows from a fake NVML; unavailable energy is None, never 0; byte counters."""

import types

import pytest

from harness.meters import ByteCounter, EnergyMeter, WallTimer


def test_energy_window_sums_gpus_in_joules(fake_nvml, monkeypatch):
    """Two GPUs whose counters advance by 1 J and 3 J per read; per-GPU energy keyed by CUDA index
    (PCI bus order: the 1 J GPU is cuda:0 though NVML lists it second)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    m = EnergyMeter(
        nvml=fake_nvml([("GPU-b", "00000000:3B:00.0", "H100", 3000), ("GPU-a", "00000000:1A:00.0", "H100", 1000)])
    )
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


def test_no_driver_is_said_as_such_and_other_nvml_errors_verbatim():
    """A machine without an NVIDIA driver (pynvml's NVMLError_LibraryNotFound, as on this CPU-only
    machine: the real pynvml is asked) reads "no NVIDIA driver", not NVML's "Shared Library Not
    Found"; any other NVML error keeps its name and message. Mutation caught: the raw exception text
    for every error (the vLLM families printed "NVMLError_LibraryNotFound: NVML Shared Library Not Found")."""
    import types

    from harness.meters import EnergyMeter

    m = EnergyMeter()
    if m.available:
        pytest.skip("an NVIDIA driver is present")
    assert m.reason == "energy unavailable: no NVIDIA driver on this machine (NVML meters NVIDIA GPUs only)"

    class NVMLError_NotSupported(Exception):
        pass

    def init():
        raise NVMLError_NotSupported("Not Supported")

    m = EnergyMeter(nvml=types.SimpleNamespace(nvmlInit=init))
    assert not m.available and m.reason == "energy unavailable: NVMLError_NotSupported: Not Supported"
