"""DVFS actuator against a fake NVML: clocks restored on every exit path; permission errors recorded."""
import pytest

from systems.serving.actuator import DvfsActuator, restore_all


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNVML:
    """Two GPUs; records locked clocks; optionally refuses (permission) or fails after n calls."""

    def __init__(self, n=2, deny=False, fail_after=None):
        self.locked = {i: None for i in range(n)}
        self.calls, self.deny, self.fail_after, self.shut = 0, deny, fail_after, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.locked)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceSetGpuLockedClocks(self, h, lo, hi):
        self.calls += 1
        if self.deny:
            raise FakeNVMLError(4)                 # NVML_ERROR_NO_PERMISSION
        if self.fail_after is not None and self.calls > self.fail_after:
            raise FakeNVMLError(999)
        self.locked[h] = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(self, h):
        self.locked[h] = None


def test_record_only_by_default():
    a = DvfsActuator()
    a.request(900, 1.0)
    assert not a.available and a.log == [[1.0, 900.0, False, None]]
    a.close()


def test_clocks_applied_then_restored_after_an_exception():
    nv = FakeNVML()
    with pytest.raises(RuntimeError, match="engine crashed"):
        with DvfsActuator(actuate=True, nvml=nv) as a:
            a.request(1005, 0.1)
            a.wait()
            assert nv.locked == {0: (1005, 1005), 1: (1005, 1005)}
            raise RuntimeError("engine crashed mid-run")
    assert nv.locked == {0: None, 1: None} and nv.shut
    assert a.log[0][2] is True


def test_permission_error_is_recorded_and_disables_actuation():
    nv = FakeNVML(deny=True)
    a = DvfsActuator(actuate=True, nvml=nv)
    a.request(800, 0.0)
    a.wait()
    a.request(900, 0.5)
    a.close()
    assert not a.available and "no permission" in a.reason
    assert a.log[0][2] is False and "999" not in a.log[0][3] and a.log[1][2] is False
    assert all(v is None for v in nv.locked.values())


def test_failure_mid_run_keeps_logging_and_restore_all_resets():
    nv = FakeNVML(fail_after=2)                     # the second request's first GPU call fails
    a = DvfsActuator(actuate=True, nvml=nv)
    a.request(700, 0.0)
    a.wait()
    a.request(1200, 1.0)
    a.wait()
    assert a.log[0][2] is True and a.log[1][2] is False and "999" in a.log[1][3]
    restore_all()                                   # what atexit / signals / the Hydra callback call
    assert all(v is None for v in nv.locked.values())
    a.close()


def test_device_profiler_measures_at_each_locked_clock():
    from harness.meters import EnergyMeter
    from systems.serving.profiler import device_measure

    class ClockedNVML(FakeNVML):
        energy_mj = 0

        def nvmlDeviceGetTotalEnergyConsumption(self, h):
            return self.energy_mj

    nv = ClockedNVML(n=1)
    seen = []

    def run_batch(n):                           # a fake "GPU": work n tokens, energy grows with clock
        f = nv.locked[0][0]
        seen.append((n, f))
        nv.energy_mj += int(n * f)              # mJ

    with DvfsActuator(actuate=True, nvml=nv) as act:
        meas = device_measure(run_batch, act, EnergyMeter(nvml=nv), clocks=[600, 1200], reps=2)
        lat, en = meas([[16], [64]], [[600, 1200]])
        assert nv.locked[0] is None                 # restored after profiling
    assert {f for _, f in seen} == {600, 1200}
    assert en.shape == (2, 2)
    assert en[0, 0] == pytest.approx(16 * 600 / 1e3) and en[1, 1] == pytest.approx(64 * 1200 / 1e3)
    assert (lat > 0).all()
    with pytest.raises(RuntimeError, match="needs clock actuation"):
        device_measure(run_batch, DvfsActuator(), EnergyMeter(nvml=nv), [600])
