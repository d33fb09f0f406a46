"""Experiment files compose on the TTS family and their reports write tables and figures."""

import importlib

import pytest

from harness.run import validate

EXPERIMENTS = [
    "fasttts_goodput",
    "fasttts_latency",
    "fasttts_ablation",
    "fasttts_r_sweep",
    "fasttts_memory",
    "fasttts_methods",
    "fasttts_gpus",
    "fasttts_workload_sensitivity",
]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_names_a_report(compose_cfg, name):
    cfg = compose_cfg(f"experiment={name}")
    assert cfg.system.family == "verifier_search" and cfg.workload.kind == "math"
    mod, fn = cfg.report.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(mod), fn))
    validate(cfg)


def test_goodput_and_ablation_reports_from_sim_runs(compose_cfg, tmp_path):
    from harness.report import gather_runs
    from harness.run import run
    from systems.verifier_search import report

    sweep = tmp_path / "sweep"
    for system in ("vllm_tts", "fasttts_p", "fasttts_pm", "fasttts"):
        rec = run(
            compose_cfg(f"system={system}", "backend=sim", "n=8", "workload.num_problems=1", output_dir=sweep / system)
        )
        assert rec["status"] == "ok" and rec["backend"]["simulated"]
    runs = gather_runs(sweep)
    t = report.report_goodput(sweep, runs, None)
    assert len(t) == 1 and t["paper vllm_tts"].iloc[0] == 88 and t["fasttts/base (sim)"].iloc[0] > 0
    assert (sweep / "fig12_goodput.md").exists() and (sweep / "fig12_goodput.png").exists()
    a = report.report_ablation(sweep, runs, None)
    assert a["fasttts paper %"].iloc[0] == 31 and "fasttts_pm gain % (sim)" in a
    md = (sweep / "fig12_goodput.md").read_text()
    assert "(sim)" in md and "(simulated)" in md.splitlines()[0] and "(measured)" not in md


def test_mixed_sweep_labels_each_value_by_its_own_record(tmp_path):
    """A sweep whose baseline point at n=8 is measured and the rest simulated: each value sits in a
    column labelled by its own record, a ratio is only taken within one label, the title says both.
    Mutation caught: taking the label of a group's first record (the old rule)."""
    import pandas as pd

    from systems.verifier_search import report

    rows = []
    for n, system, sim, gp in [
        (8, "vllm_tts", False, 10.0),
        (8, "vllm_tts", True, 20.0),
        (8, "fasttts", True, 30.0),
        (16, "vllm_tts", True, 5.0),
        (16, "fasttts", False, 9.0),
        (16, "fasttts", True, 7.5),
    ]:
        rows.append(
            {
                "status": "ok",
                "system": system,
                "simulated": sim,
                "summary.precise_goodput_tok_s": gp,
                "summary.latency_s": 1.0,
                "summary.gen_latency_s": 0.5,
                "summary.ver_latency_s": 0.5,
                "config.model.name": "qwen2.5-math-1.5b",
                "config.verifier.name": "skywork-prm-1.5b",
                "config.workload.name": "aime24",
                "config.workload.n": n,
                "config.system.spec_truncation_ratio": 0.85,
                "config.system.search": "beam_search",
                "config.hardware.name": "rtx4090",
            }
        )
    t = report.report_goodput(tmp_path, pd.DataFrame(rows)).set_index("n")
    assert t.loc[8, "vllm_tts (measured)"] == 10 and t.loc[8, "vllm_tts (sim)"] == 20
    assert t.loc[8, "fasttts/base (sim)"] == 1.5 and t.loc[16, "fasttts/base (sim)"] == 1.5
    assert t.loc[16, "fasttts (measured)"] == 9 and pd.isna(t.loc[16, "vllm_tts (measured)"])
    assert "fasttts/base (measured)" not in t  # no measured pair: never a ratio across labels
    head = (tmp_path / "fig12_goodput.md").read_text().splitlines()[0]
    assert "(simulated and measured: each value labelled)" in head


def test_fig15_offloads_both_systems_on_the_3070ti_only(compose_cfg):
    """fasttts_gpus follows the artifact's per-configuration offload: on the RTX 3070 Ti both the
    baseline and FastTTS sleep (each engine's KV from 0.95 of the device, offload on); on the 4070 Ti
    neither. Without it the baseline's 0.45 share of 8 GB cannot hold the generator's weights and
    vLLM's profiling peak (a recorded oom for every 3070 Ti baseline job). Mutations caught: the
    resolver returning True everywhere, or the experiment's offload_mode left at swap."""
    from systems.verifier_search import runner
    from systems.verifier_search.config import ae_offload_for

    assert ae_offload_for("rtx3070ti") and not ae_offload_for("rtx4070ti")
    from .test_m_inputs import SIM

    for system in ("vllm_tts", "fasttts"):
        for hw, offload in (("rtx3070ti", True), ("rtx4070ti", False)):
            cfg = compose_cfg("experiment=fasttts_gpus", f"system={system}", f"hardware={hw}", "n=8")
            validate(cfg)
            assert bool(cfg.system.offload) is offload and cfg.system.offload_mode == "sleep"
            b = runner.build(cfg, SIM, None)
            assert bool(b.alloc.offload) is offload and (b.gen.offload_mode == "sleep") is offload
