"""The fidelity machinery (systems.verifier_search.fidelity): token replay reproduces a run's search, and the
sim-vs-real comparison computes its errors the stated way (no vLLM needed: a simulated run stands
in for the real one)."""

import json
import shutil

import pandas as pd
import pytest

from harness.run import run
from systems.verifier_search.fidelity import compare, mean_ci

ARGS = [
    "system=fasttts",
    "backend=sim",
    "hardware=cpu-tts",
    "model=tiny-qwen2",
    "verifier=tiny-prm",
    "n=8",
    "workload.num_problems=2",
    "workload.num_iterations=4",
]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A simulated run that records its tokens (paths ending sooner than the default step model
    makes them: steps_per_answer_mean=2), and a function making more runs."""
    from hydra import compose, initialize_config_dir

    from tests.conftest import ROOT

    base = tmp_path_factory.mktemp("fid")

    def go(name, *extra):
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose(
                "config", overrides=["tracking=none", "progress=false", f"output_dir={base / name}", *ARGS, *extra]
            )
        rec = run(cfg)
        assert rec["status"] == "ok", rec["message"]
        return base / name

    return go("rec", "workload.steps_per_answer_mean=2", "system.record_tokens=true"), go


def test_replay_reproduces_the_recorded_search(recorded):
    """A run with the default step model replaying the recorded run's tokens makes its decisions
    and spends its time; without the replay it does not. Mutation caught: a TokenSource that
    ignores the recorded tokens (or keys them by anything but the request uid)."""
    rec_dir, go = recorded
    a = pd.read_parquet(rec_dir / "iterations.parquet")
    b = pd.read_parquet(go("rep", f"system.replay_tokens={rec_dir}") / "iterations.parquet")
    assert len(a) == len(b) >= 6
    assert (a.selected_keys == b.selected_keys).all() and (a.spec_generated == b.spec_generated).all()
    assert a.gen_time_s.tolist() == pytest.approx(b.gen_time_s.tolist(), rel=1e-9)
    plain = pd.read_parquet(go("plain") / "iterations.parquet")
    assert len(plain) != len(a) or (plain.selected_keys != a.selected_keys).any()


def test_compare_errors(recorded, tmp_path):
    """A 'real' run whose CPU times are 1.25 x the simulated ones: MAPE = |1/1.25 - 1| = 20 %, every
    decision and hit rate the same. Mutation caught: dividing by the simulated time (25 %), reading
    the wall columns as the real times (0 %)."""
    rec_dir, _ = recorded
    real = tmp_path / "real"
    shutil.copytree(rec_dir, real)
    it = pd.read_parquet(real / "iterations.parquet")
    it["gen_cpu_s"], it["ver_cpu_s"] = 1.25 * it.gen_time_s, 1.25 * it.ver_time_s
    it.to_parquet(real / "iterations.parquet")
    r = compare(real, rec_dir)
    assert r["iter_mape"] == pytest.approx(20.0) and r["latency_err"] == pytest.approx(-20.0)
    assert r["goodput_err"] == pytest.approx(25.0) and r["wall_iter_mape"] == pytest.approx(0.0)
    assert r["same_decisions"] == 100 and r["gen_hit_real"] == r["gen_hit_sim"] > 50
    s = json.loads((rec_dir / "run.json").read_text())["summary"]
    assert r["wall_goodput_real"] == pytest.approx(s["precise_goodput_tok_s"])  # the metrics.summarize formula


def test_mean_ci():
    assert mean_ci([1.0, 2.0, 3.0]) == "2 ± 2.5"  # t(0.975, 2) = 4.303, sd 1, n 3
    assert mean_ci([5.0]) == "5" and mean_ci([]) == ""
