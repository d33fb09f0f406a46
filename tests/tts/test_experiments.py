"""Experiment files compose on the TTS family and their reports write tables and figures."""
import importlib

import pytest

from harness.run import validate

EXPERIMENTS = ["fasttts_goodput", "fasttts_latency", "fasttts_ablation", "fasttts_r_sweep", "fasttts_memory",
               "fasttts_methods", "fasttts_gpus"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_names_a_report(compose_cfg, name):
    cfg = compose_cfg(f"experiment={name}")
    assert cfg.system.family == "tts" and cfg.workload.kind == "math"
    mod, fn = cfg.report.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(mod), fn))
    validate(cfg)


def test_goodput_and_ablation_reports_from_sim_runs(compose_cfg, tmp_path):
    from harness.report import gather_runs
    from harness.run import run
    from systems.tts import report
    sweep = tmp_path / "sweep"
    for system in ("vllm_tts", "fasttts_p", "fasttts_pm", "fasttts"):
        rec = run(compose_cfg(f"system={system}", "backend=sim", "n=8", "workload.num_problems=1",
                              output_dir=sweep / system))
        assert rec["status"] == "ok" and rec["backend"]["simulated"]
    runs = gather_runs(sweep)
    t = report.report_goodput(sweep, runs, None)
    assert len(t) == 1 and t["paper base"].iloc[0] == 88 and t["fasttts/base"].iloc[0] > 0
    assert (sweep / "fig12_goodput.md").exists() and (sweep / "fig12_goodput.png").exists()
    a = report.report_ablation(sweep, runs, None)
    assert a["fasttts paper %"].iloc[0] == 31 and "fasttts_pm gain %" in a
    assert "(sim)" in (sweep / "fig12_goodput.md").read_text()
