"""The simulated executor on hand-computed schedules: energy (busy + idle gaps), the KV capacity
(queueing and vLLM-style preemption), and both backends running through the one driver."""

import ast
from pathlib import Path

import numpy as np
import pytest

from systems.energy_serving.controllers import Controller
from systems.energy_serving.driver import Driver
from systems.energy_serving.profiler import LatencyEnergyTable
from systems.energy_serving.sim import SimExecutor
from workloads.serving import Requests

ROOT = Path(__file__).resolve().parents[2]


class LinearCost:
    """An iteration of n tokens takes 0.01 n s and 2 n J per GPU; a waiting GPU draws 10 W."""

    has_energy = True
    follows_clock = False

    def step1(self, n, f, ctx_tokens=0.0, attn_pairs=0.0, seqs=1):
        return 0.01 * n, 2.0 * n

    def idle1(self, f):
        return 10.0


def vanilla(p, chunk=4096):
    table = LatencyEnergyTable(np.array([1000.0]), np.zeros((2, 1)), np.zeros((2, 1)), np.array([10.0]))
    return Controller(table=table, p=p, g=2, slo_ttft=1.0, slo_tbt=1.0, default_chunk=chunk)


def test_energy_of_a_scripted_schedule_by_hand():
    """Two stages of two GPUs (m = 2). r0 (4 prompt tokens, 2 out) at 0 s, r1 (2 prompt, 1 out) at 1 s.

    Stage iterations: r0's prefill 0.04 s (stage 0: 0-0.04, stage 1: 0.04-0.08), r0's decode 0.01 s
    (0.08-0.09, 0.09-0.10), r1's prefill 0.02 s (1.00-1.02, 1.02-1.04).
    Busy: 2 stages x 2 GPUs x (8 + 2 + 4) J = 56 J. Idle (10 W x 2 GPUs): stage 1 waits 0.04 s for
    the first microbatch (0.8 J); stage 0 waits 0.04 s for r0's first token (0.8 J), stage 1 0.01 s
    (0.2 J); before r1, stage 0 waits 0.91 s (18.2 J) and stage 1 0.92 s (18.4 J); after it stage 0
    idles 0.02 s to the end (0.4 J). Idle 38.8 J; total 94.8 J over 1.04 s.
    Mutations caught: idle gaps not charged, busy energy scaled (x0.5), the trailing idle dropped.
    """
    req = Requests(np.array([0.0, 1.0]), np.array([4, 2]), np.array([2, 1]))
    res = Driver(vanilla(p=2), req).run(SimExecutor(LinearCost(), p=2, g=2))
    assert res.makespan_s == pytest.approx(1.04)
    assert res.energy_j == pytest.approx(94.8)
    assert res.timeline["energy_j"].sum() == pytest.approx(94.8)
    assert res.iterations["energy_j"].sum() == pytest.approx(56.0 + 0.8 + 0.8 + 0.2 + 18.2 + 18.4)
    assert res.iterations["latency_s"].tolist() == pytest.approx([0.04, 0.01, 0.02])
    assert res.requests["ttft_s"].tolist() == pytest.approx([0.08, 0.04])
    assert res.gaps.tolist() == pytest.approx([0.02])


def test_kv_capacity_queues_then_preempts_the_latest_admitted():
    """KV for 10 tokens; two requests of 4 prompt + 4 output tokens. Both prefills fit (8), one
    decode round fits (10); the next round does not: r1 (admitted last) is preempted (its 5 tokens
    freed), r0 finishes, then r1 recomputes its 4 + 2 tokens and finishes. Mutations caught:
    admission without the capacity check, the earliest instead of the latest admitted preempted,
    a preempted request's KV not freed (it never fits again)."""
    req = Requests(np.array([0.0, 0.0]), np.array([4, 4]), np.array([4, 4]))
    ex = SimExecutor(LinearCost(), p=1, g=1, kv_capacity_tokens=10)
    res = Driver(vanilla(p=1), req).run(ex)
    assert res.preemptions == 1
    r = res.requests
    assert r["generated"].tolist() == [4, 4] and np.isfinite(r["finish_s"]).all()
    assert r["finish_s"][0] < r["finish_s"][1]  # r0 kept running
    its = res.iterations
    # r0 alone decodes after the preemption (1 token per iteration) until it finishes; then r1's recompute
    assert its["tokens"].tolist()[:5] == [8, 2, 1, 1, 6]
    assert ex.kv_used == 0
    with pytest.raises(ValueError, match="in order"):
        SimExecutor(LinearCost(), 1, 1).add(3, 1, 1, 0.0)


def _names(path):
    tree = ast.parse((ROOT / path).read_text())
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
    }


@pytest.mark.parametrize("path", ["systems/energy_serving/sim.py", "systems/energy_serving/vllm_engine.py"])
def test_backends_hold_no_controller_calls_or_request_accounting(path):
    """The executors never call a controller hook, build what a controller sees, or account TTFT/TBT:
    the driver is the only place (its own file has them)."""
    names = _names(path)
    forbidden = {
        "on_arrival",
        "on_finish",
        "on_decode_only",
        "on_tick",
        "initial",
        "EngineState",
        "WindowStats",
        "ttft_s",
        "gaps",
        "gap_sum",
        "first_token_s",
    }
    assert not names & forbidden, f"{path} uses {sorted(names & forbidden)}"
    assert {"on_arrival", "on_tick", "EngineState", "gap_sum"} <= _names("systems/energy_serving/driver.py")


def test_the_simulated_backend_runs_through_the_driver(compose_cfg, tmp_path, monkeypatch):
    """The runner serves through Driver.run with a SimExecutor (the vLLM path: test_vllm_real)."""
    from harness.run import run

    seen = []
    orig = Driver.run

    def spy(self, ex, progress=None):
        seen.append(type(ex).__name__)
        return orig(self, ex, progress)

    monkeypatch.setattr(Driver, "run", spy)
    rec = run(compose_cfg("system=beam", "workload=ablation", "workload.duration_s=5", output_dir=tmp_path / "b"))
    assert rec["status"] == "ok" and seen == ["SimExecutor"]


def test_a_simulated_serving_run_loads_no_heavy_module(tmp_path):
    """A simulated BEAM run started as a user starts it (progress bar on, stderr not a terminal)
    finishes and loads none of torch, NVML, vLLM, pandas, tqdm or W&B (issue 18: its tables are
    numpy columns written from Arrow buffers). Mutations caught: pandas imported by the driver or
    the metrics, the progress hook reading the bar's position (the run failed with the harness's
    no-op bar)."""
    import json
    import subprocess
    import sys

    from tests.test_tracking import _RUN_AND_LIST, HEAVY

    modules = tmp_path / "modules.json"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN_AND_LIST,
            str(modules),
            "system=beam",
            "workload=ablation",
            "workload.duration_s=5",
            "tracking=none",
            f"results_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"
    assert sorted(m for m in HEAVY if m in set(json.loads(modules.read_text()))) == []
