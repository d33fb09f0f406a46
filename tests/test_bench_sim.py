"""scripts/bench_sim.py refuses what it cannot measure: bad arguments exit 2, and a runner case whose
run ends other than ok (nothing simulated) stops the benchmark instead of printing 'ratio 0.00 OK'
(QA: the 256-beam LBS case became a predicted host-memory oom and read as met)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--rounds", "0"], "--rounds 0: at least 1"),
        (["--only", "bogus"], "--only bogus: not a family of cases; one or more of fasttts, "),
        (["--against", "/"], "--against /: not a checkout of this project"),
    ],
)
def test_bad_arguments_exit_2_before_any_measurement(args, message):
    out = subprocess.run(
        [sys.executable, "scripts/bench_sim.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and out.stderr.startswith(f"error: {message}"), out.stderr[-2000:]


def test_a_runner_case_that_does_not_run_stops_the_benchmark():
    """Mutation caught: the status check removed (the oom run's 0.00 s counted as a time)."""
    import bench_sim

    with pytest.raises(SystemExit, match="status oom .*a runner case times a simulation that runs"):
        bench_sim.runner_times(ROOT, ["system=lbs", "model=llama-3.1-8b", "beams=256", "gen_len=8192"], 1)
    assert "hardware.host_memory_bytes=null" in bench_sim.LBS_LONG  # the goal's case runs
