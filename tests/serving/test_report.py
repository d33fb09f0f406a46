"""BEAM report functions on real (short, simulated) records: ours computed from runs, paper beside."""
import pytest

from harness.report import gather_runs, load_reference
from harness.run import run
from systems.serving import report


def test_fig10_report_from_records(compose_cfg, tmp_path):
    sweep = tmp_path / "sweep"
    for s in ("vanilla", "beam_dvfs_only", "beam"):
        run(compose_cfg(f"system={s}", "workload=ablation", "workload.duration_s=15", output_dir=sweep / s))
    runs = gather_runs(sweep)
    tab = report.fig10(sweep, runs, None).set_index("system")
    e = runs.set_index("system")["summary.energy_j"]
    assert tab.loc["beam (sim)", "energy_vs_vanilla"] == pytest.approx(e["beam"] / e["vanilla"], abs=1e-3)
    assert tab.loc["beam_dvfs_only (sim)", "paper_vs_vanilla"] == 0.73      # drawn beside, from beam.csv
    assert tab.loc["beam (sim)", "energy_vs_vanilla"] < 1.0
    assert (sweep / "beam_fig10.md").exists() and (sweep / "beam_fig10.png").exists()
    assert "(sim)" in (sweep / "beam_fig10.md").read_text()


def test_reference_table_is_well_formed():
    ref = load_reference("beam")
    assert set(ref.figure) >= {"fig1", "fig7", "fig10", "tab1", "tab2"}
    f7 = ref[(ref.figure == "fig7") & ref.config.str.contains("system=beam")]
    assert set(f7.metric) >= {"energy_vs_vanilla", "energy_vs_window_dvfs", "slo_ttft_attainment", "slo_tbt_attainment"}
