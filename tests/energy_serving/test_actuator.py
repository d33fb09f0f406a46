"""DVFS actuator against a fake NVML (tests/nvml_fake/pynvml.py): clocks restored on every exit path
-- an exception, each catchable terminating signal in a child process -- and, after ``kill -9``, a
lock record that the next run warns about and ``--restore`` uses to reset exactly those GPUs."""

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import clock_locks
from systems.energy_serving.actuator import RESTORING_SIGNALS, DvfsActuator, restore_all

ROOT = Path(__file__).resolve().parents[2]
FAKE_NVML_DIR = ROOT / "tests" / "nvml_fake"
U0, U1 = "GPU-00000000-aaaa-0000-0000-000000000000", "GPU-11111111-bbbb-0000-0000-000000000000"
TWO = [(U0, "00000000:1A:00.0"), (U1, "00000000:3B:00.0")]


@pytest.fixture(autouse=True)
def all_gpus_visible(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_record_only_by_default():
    a = DvfsActuator()
    a.request(900, 1.0)
    assert not a.available and a.log == [[1.0, 900.0, False, None]]
    a.close()


def test_clocks_applied_then_restored_after_an_exception(fake_nvml):
    nv = fake_nvml(TWO)
    with pytest.raises(RuntimeError, match="engine crashed"):
        with DvfsActuator(actuate=True, nvml=nv) as a:
            a.request(1005, 0.1)
            a.wait()
            assert nv.locked() == {U0: (1005, 1005), U1: (1005, 1005)}
            raise RuntimeError("engine crashed mid-run")
    assert nv.locked() == {U0: None, U1: None}
    assert a.log[0][2] is True


def test_permission_error_is_recorded_and_disables_actuation(fake_nvml):
    nv = fake_nvml(TWO, deny=True)
    a = DvfsActuator(actuate=True, nvml=nv)
    a.request(800, 0.0)
    a.wait()
    a.request(900, 0.5)
    a.close()
    assert not a.available and "no permission" in a.reason
    assert a.log[0][2] is False and "999" not in a.log[0][3] and a.log[1][2] is False
    assert all(v is None for v in nv.locked().values())
    assert not list(clock_locks.lock_dir().glob("*.json"))  # reset GPUs leave no record


def test_failure_mid_run_keeps_logging_and_restore_all_resets(fake_nvml):
    nv = fake_nvml(TWO, fail_after=2)  # the second request's first GPU call fails
    a = DvfsActuator(actuate=True, nvml=nv)
    a.request(700, 0.0)
    a.wait()
    a.request(1200, 1.0)
    a.wait()
    assert a.log[0][2] is True and a.log[1][2] is False and "999" in a.log[1][3]
    restore_all()  # what atexit / signals / the Hydra callback call
    assert all(v is None for v in nv.locked().values())
    a.request(800, 2.0)  # after an exit path: logged, never applied
    a.wait()
    assert a.log[2] == [2.0, 800.0, False, None] and a.reason == "clocks restored at exit"
    assert all(v is None for v in nv.locked().values())
    a.close()


def test_lock_record_written_before_the_first_lock_and_removed_after_reset(fake_nvml):
    """Mutations caught: writing the record after the lock call (no record on disk at the first
    lock, and its "previous" clock is the locked one); not removing it on reset."""
    nv = fake_nvml(TWO)
    seen = []
    real_lock = nv.nvmlDeviceSetGpuLockedClocks

    def lock_and_look(h, lo, hi):  # the record must exist when NVML is called
        seen.append(sorted(p.stem for p in clock_locks.lock_dir().glob("*.json")))
        real_lock(h, lo, hi)

    nv.nvmlDeviceSetGpuLockedClocks = lock_and_look
    with DvfsActuator(actuate=True, gpu_indices=[1], nvml=nv) as a:
        a.request(1005, 0.0)
        a.request(1500, 0.1)
        a.wait()
        (rec,) = clock_locks.read_all()
        assert rec["uuid"] == U1 and rec["pci_bus_id"] == "00000000:3B:00.0" and rec["pid"] == os.getpid()
        assert rec["previous"]["sm_clock_mhz"] == 1980 and rec["previous"]["max_sm_clock_mhz"] == 1980
        assert clock_locks.owner_state(rec) == "live" and clock_locks.stale_warnings() == []
    assert seen == [[U1], [U1]]
    assert nv.locked() == {U0: None, U1: None} and clock_locks.read_all() == []


def test_a_failed_reset_keeps_the_record(fake_nvml):
    nv = fake_nvml(TWO, fail_reset=True)
    a = DvfsActuator(actuate=True, gpu_indices=[0], nvml=nv)
    a.request(1005, 0.0)
    a.wait()
    a.close()
    assert "reset of GPU " + U0 + " failed" in a.reason
    assert [r["uuid"] for r in clock_locks.read_all()] == [U0]


def test_an_unwritable_lock_record_folder_disables_actuation_before_any_lock(fake_nvml, monkeypatch):
    nv = fake_nvml(TWO)
    monkeypatch.setenv("TTC_CLOCK_LOCK_DIR", "/dev/null/locks")
    a = DvfsActuator(actuate=True, nvml=nv)
    a.request(1005, 0.0)
    a.close()
    assert not a.available and "actuation unavailable" in a.reason and "/dev/null/locks" in a.reason
    assert nv.state()["log"] == []


# --- exit paths in child processes ----------------------------------------------------------------

CHILD = """
import time
from systems.energy_serving.actuator import DvfsActuator
a = DvfsActuator(actuate=True, gpu_indices=[0])
a.request(1005, 0.0)
a.wait()
assert a.log[0][2], a.log
print("locked", flush=True)
time.sleep(120)
"""


def start_child(tmp, gpus=TWO):
    """A process that imports the fake NVML as ``pynvml``, locks cuda:0 at 1005 MHz and sleeps."""
    tmp.mkdir(parents=True, exist_ok=True)
    state = tmp / "nvml-state.json"
    env = dict(
        os.environ,
        PYTHONPATH=f"{FAKE_NVML_DIR}{os.pathsep}{ROOT}",
        FAKE_NVML_STATE=str(state),
        TTC_CLOCK_LOCK_DIR=str(tmp / "locks"),
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    _write_state(state, gpus)
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_child_setup,
    )
    return p, state, env


def _child_setup():
    """No core files, and every tested signal at its default disposition, as a process started from
    a terminal has it: a suite run under ``nohup`` would hand the child an ignored SIGHUP, which the
    actuator rightly leaves alone (the test then waited 30 s and failed)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _write_state(path, gpus):
    gpu = {"locked": None, "energy_mj": 0, "energy_step_mj": 1000, "default_clock_mhz": 1980, "name": "H100"}
    path.write_text(
        json.dumps(
            {
                "gpus": [dict(gpu, uuid=u, pci_bus_id=b) for u, b in gpus],
                "deny": False,
                "fail_after": None,
                "fail_reset": False,
                "lock_calls": 0,
                "log": [],
            }
        )
    )


def locked(state):
    return {g["uuid"]: g["locked"] for g in json.loads(state.read_text())["gpus"]}


def wait_locked(p):
    line = p.stdout.readline()
    assert line.strip() == "locked", p.stderr.read()


SIGNALS = [s for s in RESTORING_SIGNALS if s < signal.SIGRTMIN] + [signal.SIGRTMIN, signal.SIGRTMAX]


def test_every_catchable_terminating_signal_restores_clocks(tmp_path):
    """One child per signal (run side by side): each locks GPU 0, gets the signal, resets the
    clocks, removes its lock record and still dies of that signal (SIGINT through
    KeyboardInterrupt). Mutation caught: handlers for SIGTERM/SIGINT only (the old code): SIGQUIT,
    SIGHUP, ... leave clocks locked."""
    kids = {sig: start_child(tmp_path / signal.Signals(sig).name) for sig in SIGNALS}
    for p, _, _ in kids.values():
        wait_locked(p)
    for sig, (p, state, _) in kids.items():
        assert locked(state)[U0] == [1005, 1005]
        p.send_signal(sig)
    failures = []
    for sig, (p, state, env) in kids.items():
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "none (still running after 30 s)"
        left = locked(state)[U0]
        records = list(Path(env["TTC_CLOCK_LOCK_DIR"]).glob("*.json"))
        if rc != -sig or left is not None or records:
            failures.append(f"{signal.Signals(sig).name}: exit {rc}, clocks {left}, records {len(records)}")
    assert not failures, failures


def test_kill_9_leaves_a_record_the_next_run_warns_about_and_restore_resets_exactly_that_gpu(
    tmp_path, compose_cfg, monkeypatch, capsys
):
    p, state, env = start_child(tmp_path / "child")
    wait_locked(p)
    _lock_by_someone_else(state, U1)  # another user's lock, no record of ours
    p.kill()
    assert p.wait(timeout=30) == -signal.SIGKILL
    assert locked(state) == {U0: [1005, 1005], U1: [600, 600]}
    monkeypatch.setenv("TTC_CLOCK_LOCK_DIR", env["TTC_CLOCK_LOCK_DIR"])
    (rec,) = clock_locks.read_all()
    assert rec["uuid"] == U0 and rec["pid"] == p.pid and clock_locks.owner_state(rec) == "stale"

    from harness.run import run  # the next run (simulated) warns and records it

    out = run(compose_cfg("system=lbs", "beams=4"))
    assert "was left with locked SM clocks by pid" in capsys.readouterr().err
    assert out["warnings"] == clock_locks.stale_warnings() and U0 in out["warnings"][0]

    restore = [sys.executable, "-m", "systems.energy_serving.actuator", "--restore"]
    r = subprocess.run(restore, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"GPU {U0} (H100, PCI 00000000:1A:00.0): locked clocks reset (left by pid {p.pid})" in r.stdout
    assert locked(state) == {U0: None, U1: [600, 600]}  # exactly that GPU
    assert clock_locks.read_all() == []
    again = subprocess.run(restore, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "nothing to restore" in again.stdout


def test_restore_leaves_gpus_of_live_runs_alone(tmp_path, monkeypatch):
    """A record whose process still runs (this test's) is not reset. Mutation caught: resetting
    every recorded GPU."""
    from harness.gpus import JobGpu
    from systems.energy_serving.actuator import restore_from_records

    monkeypatch.setenv("TTC_CLOCK_LOCK_DIR", str(tmp_path / "locks"))
    clock_locks.write(JobGpu(0, 0, U1, "00000000:3B:00.0", "H100", None), {"sm_clock_mhz": 1980})

    class NoNVML:
        def __getattr__(self, name):
            raise AssertionError(f"NVML called: {name}")

    lines = []
    assert restore_from_records(nvml=NoNVML(), out=type("W", (), {"write": lambda s, x: lines.append(x)})()) == 0
    assert any(f"GPU {U1}: clocks held by running pid {os.getpid()}: left alone" in x for x in lines)
    assert [r["uuid"] for r in clock_locks.read_all()] == [U1]


def _lock_by_someone_else(state, uuid):
    st = json.loads(state.read_text())
    for g in st["gpus"]:
        if g["uuid"] == uuid:
            g["locked"] = [600, 600]
    state.write_text(json.dumps(st))


def test_device_profiler_measures_at_each_locked_clock(fake_nvml):
    from harness.meters import EnergyMeter
    from systems.energy_serving.profiler import device_measure

    nv = fake_nvml([(U0, "00000000:1A:00.0", "H100", 0)])  # energy only from the fake "GPU" below
    seen = []

    def run_batch(n):  # a fake "GPU": work n tokens, energy grows with clock
        f = nv.locked()[U0][0]
        seen.append((n, f))
        nv.add_energy(0, n * f)  # mJ

    with DvfsActuator(actuate=True, nvml=nv) as act:
        meas = device_measure(run_batch, act, EnergyMeter(nvml=nv), clocks=[600, 1200], reps=2)
        lat, en = meas([[16], [64]], [[600, 1200]])
        assert nv.locked()[U0] is None  # restored after profiling
    assert {f for _, f in seen} == {600, 1200}
    assert en.shape == (2, 2)
    assert en[0, 0] == pytest.approx(16 * 600 / 1e3) and en[1, 1] == pytest.approx(64 * 1200 / 1e3)
    assert (lat > 0).all()
    with pytest.raises(RuntimeError, match="needs clock actuation"):
        device_measure(run_batch, DvfsActuator(), EnergyMeter(nvml=nv), [600])
