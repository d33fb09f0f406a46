"""Labels that never mislead: each value, column, point and title says simulated or measured from its
own records (harness/report.py), and a sweep mixing both shows both."""

import pandas as pd

from harness.report import gather_runs, label_values, sim_label, source_of, title_label
from harness.run import run


def test_labels_follow_each_records_own_flag():
    """Mutations caught: a label taken from the first run only (mixed -> 'sim'), measured values left
    unlabelled (the issue's bug: no label read as 'measured' in a simulated table, or the reverse)."""
    assert source_of([True, True]) == "simulated" and source_of(pd.Series([False])) == "measured"
    assert source_of([True, False]) == "simulated+measured" and source_of([]) == ""
    assert (sim_label(True), sim_label(False), sim_label([False, True])) == (" (sim)", " (measured)", " (sim+measured)")
    assert title_label("Fig", [True]) == "Fig (simulated)" and title_label("Fig", [False]) == "Fig (measured)"
    assert title_label("Fig", [False, True]) == "Fig (simulated and measured: each value labelled)"
    assert label_values(["2x", None, "3x"], [True, True, False]) == ["2x (sim)", None, "3x (measured)"]
    assert label_values(["2x", "3x"], [True, True]) == ["2x", "3x"]  # the column / title says it once


def test_mixed_sweep_through_the_lbs_report_labels_both(compose_cfg, tmp_path):
    """One simulated and one real-engine (torch, CPU) layer-wise job through the Fig.9 report: the
    title says both, each value carries its own run's label. Mutation caught: the label added only
    when all runs are simulated (the LBS report before: the mixed table read 'measured')."""
    from systems.kv_offload import report

    sweep = tmp_path / "sweep"
    small = ["system=layerwise", "model=tiny-opt", "step=8", "gen_len=16", "prompt_len=8", "kv_budget=1MiB"]
    sim = run(compose_cfg(*small, "backend=sim", "beams=4", output_dir=sweep / "sim"))
    real = run(compose_cfg(*small, "backend=torch", "beams=8", output_dir=sweep / "real"))
    assert sim["backend"]["simulated"] and not real["backend"]["simulated"]
    report.fig9(sweep, gather_runs(sweep), None)
    table = (sweep / "fig9.md").read_text()
    assert "(simulated and measured: each value labelled)" in table.splitlines()[0]
    rows = {line.split("|")[3].strip(): line for line in table.splitlines() if "tiny-opt" in line}
    assert "1.00x (sim)" in rows["4"] and "1.00x (measured)" in rows["8"]
