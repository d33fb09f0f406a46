"""BEAM reports against the paper: one verdict per paper number (harness/verdict.py's rule, written to
verdicts.csv and shown at the end of each table), and figures / tables whose labels and units cannot
be misread. One small simulated sweep (10 jobs: the burst workload at TTFT 2 s for vanilla,
Window-DVFS and BEAM at TP2/PP4, the last two also at TP4/PP2; the ablation's five systems on 20 s)
feeds every report."""

import re

import numpy as np
import pandas as pd
import pytest

from harness import reproduce
from harness.report import gather_runs, load_reference
from harness.run import run
from systems.energy_serving import report
from systems.energy_serving.paper import OUR_SLO_TTFT_S, UNSTATED, numbers

BURST = ["workload=burst", "workload.slo_ttft_s=2.0"]
JOBS = {f"{s}-2x4": [f"system={s}", *BURST] for s in ("vanilla", "window_dvfs", "beam")}
JOBS.update({f"{s}-4x2": [f"system={s}", *BURST, "system.parallel=4x2"] for s in ("window_dvfs", "beam")})
JOBS.update(
    {
        f"abl-{s}": [f"system={s}", "workload=ablation", "workload.duration_s=20"]
        for s in ("vanilla", "beam_dvfs_only", "beam_s1", "beam", "beam_s2")
    }
)
# report -> the jobs it is given (by job folder name)
REPORTS = {
    "fig1": lambda j: j == "abl-vanilla",
    "fig2": lambda j: j == "abl-vanilla",
    "fig7": lambda j: j.endswith("-2x4"),
    "fig8": lambda j: j in ("window_dvfs-2x4", "beam-2x4"),
    "fig9": lambda j: j.endswith("-2x4"),
    "fig10": lambda j: j.startswith("abl-"),
    "fig11": lambda j: not j.startswith(("abl-", "vanilla")),
    "tab1": lambda j: j.startswith("beam-"),
    "tab2": lambda j: j in ("beam-2x4", "abl-beam_dvfs_only"),
}
FIGURES = ("fig1", "fig2", "fig7", "fig8", "fig9", "fig10", "fig11")
# ours is judged only at the paper number's setting (harness.paper.in_setting): Fig.11's is TTFT SLO
# 1 s, and the burst jobs (TTFT 2 s, shared with Fig.7-9) stand in for runs at it
RELABEL = {"fig11": {"summary.slo_ttft_s": 1.0}}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from hydra import compose, initialize_config_dir

    from tests.conftest import ROOT

    d = tmp_path_factory.mktemp("beam_paper")
    for name, over in JOBS.items():
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose(
                "config",
                overrides=[*over, "backend=sim", "tracking=none", "progress=false", f"output_dir={d / 'jobs' / name}"],
            )
        assert run(cfg, multirun=True)["status"] == "ok", name
    runs = gather_runs(d / "jobs")
    runs["job"] = runs.run_dir.map(lambda p: p.rsplit("/", 1)[-1])
    return d, runs


def _report(name, folder, runs, keep):
    """Run one report with its figures kept open (tick labels are set at draw time)."""
    real_save = report.save_figure

    def save(fig, sweep_dir, fname):
        keep[fname] = fig
        fig.canvas.draw()
        real_save(fig, sweep_dir, fname)

    report.save_figure = save
    try:
        return getattr(report, name)(folder, runs, None)
    finally:
        report.save_figure = real_save


@pytest.fixture(scope="module")
def reports(sweep):
    """Every BEAM report on its slice of the sweep, each in results/sweeps/beam_<name>:
    {name: (folder, table it returned, {figure name: matplotlib figure})}."""
    d, runs = sweep
    out = {}
    for name, pick in REPORTS.items():
        figs = {}
        folder = d / "results" / "sweeps" / f"beam_{name}"
        tab = _report(
            name, folder, runs[runs.job.map(pick)].reset_index(drop=True).assign(**RELABEL.get(name, {})), figs
        )
        out[name] = (folder, tab, figs)
    return out


def _n_verdicts(ref: pd.DataFrame) -> int:
    """Verdict rows of these beam.csv rows: one per paper number (a min/max pair is one range), and
    one per TTFT SLO of ours for a number whose SLO the paper does not state."""
    each = ref.config.str.contains(f"slo_ttft_s={UNSTATED}", regex=False).map({True: len(OUR_SLO_TTFT_S), False: 1})
    return int(each[ref.bound != "max"].sum())


def test_every_paper_number_gets_one_verdict(reports):
    """verdicts.csv of each report: one row per paper number of its figure in beam.csv (a min/max
    pair is one range; one per TTFT SLO of ours where the paper states none), our figure (or table)
    file as source, simulated from the records except the decision time (measured on this CPU);
    REPRODUCTION.md lists them all. (Mutations caught: a min/max pair kept as two rows; a paper
    number skipped when ours is missing instead of 'no result'; the decision time labelled
    simulated.)"""
    total = 0
    for name, (folder, _, _) in reports.items():
        v = pd.read_csv(folder / "verdicts.csv")
        ref = load_reference("beam", name)
        assert len(v) == _n_verdicts(ref) == len(numbers(name)), name
        src = f"beam_{name}.{'png' if name in FIGURES else 'md'}"
        assert set(v.source) == {src} and (folder / src).exists(), name
        assert v.verdict.isin(["reproduced", "partly", "not reproduced", "no result"]).all()
        measured = v[~v.simulated.astype(bool)].quantity.tolist()
        assert measured == (["decision time (S1, S2)"] if name == "tab2" else []), name
        assert "| verdict " in (folder / f"beam_{name}.md").read_text()
        total += len(v)
    assert total == _n_verdicts(load_reference("beam"))
    root = next(iter(reports.values()))[0].parent.parent
    md = reproduce.write_reproduction(root, reproduce.collect(root)).read_text()
    assert f"of {total} paper numbers" in md and md.count("| beam | ") == total
    assert "[beam_fig7.png](sweeps/beam_fig7/beam_fig7.png)" in md


def test_verdicts_follow_the_rule_on_our_numbers(sweep, reports):
    """Ours is recomputed from the records, in the paper's terms: energies as ratios (the paper's
    '-30 % against Window-DVFS' is 0.70 of its energy), Fig.10's steps as differences of those
    ratios, Tab.1 as the range over runs, the actuation delay not ours (a config value from the
    paper: no result). (Mutations caught: the Window-DVFS ratio as a difference (ratio - 1); the
    Fig.10 step against vanilla instead of the previous step; Tab.1's range over one run; the
    actuation delay judged from the config.)"""
    _, runs = sweep
    e = runs.set_index("job")["summary.energy_j"]
    v7 = pd.read_csv(reports["fig7"][0] / "verdicts.csv").set_index("quantity")
    llama = "(model=llama-3.3-70b, parallel=2x4, system=beam, slo_ttft_s=2.0)"  # the sweep runs at 2 s
    assert v7.loc[f"energy / vanilla's {llama}", "ours"] == pytest.approx(
        100 * e["beam-2x4"] / e["vanilla-2x4"], abs=0.1
    )
    w = v7.loc[f"energy / Window-DVFS's {llama}"]
    assert (w.ours, w.paper_value) == (pytest.approx(100 * e["beam-2x4"] / e["window_dvfs-2x4"], abs=0.1), 70.0)
    assert v7.loc["energy / vanilla's (model=qwen2.5-32b, parallel=2x2, system=beam, slo_ttft_s=2.0)", "verdict"] == (
        "no result"
    )
    v10 = pd.read_csv(reports["fig10"][0] / "verdicts.csv").set_index("quantity")
    step = v10.loc[
        "energy change of this step (points of vanilla's energy) "
        "(model=llama-3.3-70b, parallel=2x4, workload=ablation, system=beam_s1)"
    ]
    assert step.ours == pytest.approx(100 * (e["abl-beam_s1"] - e["abl-beam_dvfs_only"]) / e["abl-vanilla"], abs=0.1)
    v1 = pd.read_csv(reports["tab1"][0] / "verdicts.csv").set_index("quantity")
    v1 = v1.loc["predictor MAPE, TTFT (slo_ttft_s=2.0)"]
    mape = runs[runs.job.str.startswith("beam-")]["summary.pred_ttft_mape_pct"]
    assert (v1.ours, v1.ours_hi, v1.kind) == (pytest.approx(mape.min()), pytest.approx(mape.max()), "range")
    act = pd.read_csv(reports["tab2"][0] / "verdicts.csv").set_index("quantity").loc["DVFS actuation delay"]
    assert act.verdict == "no result" and "not measured" in act.note
    for name in ("fig2", "fig8", "fig11"):  # qualitative claims: 1 or 0, with the tests behind them
        v = pd.read_csv(reports[name][0] / "verdicts.csv")
        assert v.ours.isin([0.0, 1.0]).all() and v.note.str.startswith("ours: ").all(), name


def _axes_with_data(fig):
    return [a for a in fig.axes if a.lines or a.patches or a.collections]


def test_every_axis_has_a_unit_and_every_title_its_slos(reports):
    """Each plotted axis names its unit in parentheses or is a ratio ('/'); power and energy axes say
    how many GPUs; every figure's title states its SLOs (Fig.1/2: 'no SLOs', they show the model).
    (Mutations caught: Fig.9's power axis back to 'power (kW)' without the GPUs; Fig.7's y label
    'energy' without 'vanilla'; the SLOs dropped from Fig.11's title.)"""
    unit = re.compile(r"\(.+\)|/")
    for name in FIGURES:
        for fname, fig in reports[name][2].items():
            title = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
            assert ("SLOs TTFT" in title) != ("no SLOs" in title), (fname, title)
            for ax in _axes_with_data(fig):
                for label in (ax.get_xlabel(), ax.get_ylabel()):
                    if label:
                        assert unit.search(label), (fname, label)
                    if re.search(r"power|energy,", label):
                        assert "GPUs" in label, (fname, label)
                assert ax.get_ylabel(), (fname, "no y label")


def test_fig7_ratios_not_differences_and_attainment_named(reports):
    """Fig.7's table has two ratio columns (vanilla's and Window-DVFS's energy, each system's own 1.0)
    and no difference column; ticks say which attainment they show; setups the paper does not run
    are marked. (Mutations caught: 'energy / window_dvfs' as ratio - 1 (the old vs_window_dvfs
    column); ticks back to 'TTFT x %'.)"""
    folder, tab, figs = reports["fig7"]
    win = tab[tab.system.str.startswith("window_dvfs")]
    assert (win["energy / window_dvfs"] == 1.0).all() and (tab["energy / window_dvfs"] > 0).all()
    assert (tab[tab.system.str.startswith("vanilla")]["energy / vanilla"] == 1.0).all()
    header = (folder / "beam_fig7.md").read_text().splitlines()[2]
    assert "energy / vanilla" in header and "energy / window_dvfs" in header and "vs_window" not in header
    ax = figs["beam_fig7"].axes[0]
    assert all(re.search(r"TTFT met [\d.]+ %\nTBT met [\d.]+ %", t.get_text()) for t in ax.get_xticklabels())
    assert "TP2/PP4" in ax.get_title() and "not in paper" not in ax.get_title()


def test_fig9_draws_coinciding_systems_visibly(sweep, tmp_path):
    """Two systems with identical series (Window-DVFS at max clock in every window behaves like
    vanilla) are both visible: the first thick and pale under the second, and the legend says they
    are identical. (Mutation caught: equal line widths, the old figure where vanilla hid under
    Window-DVFS.)"""
    _, runs = sweep
    van = runs[runs.job == "vanilla-2x4"]
    twin = pd.concat([van, van.assign(system="window_dvfs")], ignore_index=True)
    figs = {}
    _report("fig9", tmp_path, twin, figs)
    lines = [ln for ln in figs["beam_fig9"].axes[0].lines if not ln.get_label().startswith("paper")]
    assert [ln.get_label() for ln in lines] == ["vanilla (sim)", "window_dvfs (sim) = vanilla (sim) (identical)"]
    assert lines[0].get_linewidth() > 2 * lines[1].get_linewidth() and lines[0].get_alpha() < 1


def test_timelines_plot_whole_bins_only(sweep, reports):
    """Fig.8's clock and power lines end at the last whole 1-s bin: the partial bin after the last
    iteration would read as a drop to a low clock and to no power. (Mutation caught: the full
    timeline plotted.)"""
    _, runs = sweep
    makespan = runs.set_index("job")["summary.makespan_s"]
    ax_clock, ax_power = reports["fig8"][2]["beam_fig8"].axes[:2]
    for ax in (ax_clock, ax_power):
        for ln, job in zip([ln for ln in ax.lines], ("window_dvfs-2x4", "beam-2x4")):
            assert np.max(ln.get_xdata()) + 1 <= makespan[job] + 1e-9


def _verdicts_of(name, runs, folder):
    _report(name, folder, runs.reset_index(drop=True), {})
    return pd.read_csv(folder / "verdicts.csv")


def test_ours_only_at_the_papers_setup_and_steps_only_from_the_run_before(sweep, tmp_path):
    """A Qwen sweep is not judged against the paper's Llama numbers (Fig.1, Fig.11: 'no result' naming
    the model, QA); Fig.10's + S2 step without a + S1 run is no result, not BEAM - DVFS-only (QA);
    Tab.2's S1/S2 decision time is not taken from DVFS-only or Window-DVFS; Fig.8 with the 20 s after
    the burst past the run's end is 'not tested', not 'no' (QA). (Mutations caught: the BEAM setting
    dropped; the step against the previous run present; tab2 over every system; NaN compared.)"""
    d, runs = sweep
    pick = lambda name: runs[runs.job.map(REPORTS[name])]
    for name in ("fig1", "fig11"):
        v = _verdicts_of(name, pick(name).assign(model="qwen2.5-32b", **RELABEL.get(name, {})), tmp_path / name)
        assert (v.verdict == "no result").all(), name
        assert v.note.str.contains("no run at the paper's setting (model=llama-3.3-70b)", regex=False).all(), name

    abl = pick("fig10")
    v = _verdicts_of("fig10", abl[abl.system != "beam_s1"], tmp_path / "f10").set_index("quantity")
    s2 = v.loc[
        "energy change of this step (points of vanilla's energy) "
        "(model=llama-3.3-70b, parallel=2x4, workload=ablation, system=beam)"
    ]
    assert s2.verdict == "no result" and "no beam_s1 run" in s2.note
    assert "+ S2 = BEAM needs beam_s1" in (tmp_path / "f10" / "beam_fig10.md").read_text()
    v = _verdicts_of("fig10", abl.assign(**{"summary.tp": 4, "summary.pp": 2}), tmp_path / "f10-4x2")  # paper: TP2/PP4
    assert (v.verdict == "no result").all() and v.note.str.contains("parallel=2x4", regex=False).all()

    v = _verdicts_of("tab2", runs[runs.job.isin(["abl-beam_dvfs_only", "window_dvfs-2x4"])], tmp_path / "t2")
    dec = v.set_index("quantity").loc["decision time (S1, S2)"]
    assert dec.verdict == "no result" and "makes S1/S2 decisions" in dec.note

    short = pick("fig8").copy()
    short["config.workload.burst_end_s"] = short["summary.makespan_s"].astype(float)  # nothing after it
    v = _verdicts_of("fig8", short, tmp_path / "f8")
    assert list(v.verdict) == ["no result"] and "not tested" in v.note.iloc[0]
    assert "Window-DVFS's power after it above BEAM's" in v.note.iloc[0]


def test_fig7_and_tab1_judged_at_each_of_our_ttft_slos(sweep, tmp_path):
    """The paper states no TTFT SLO for Fig. 7 or Tab. 1 (shared/reference/beam.md §2.8), so each of
    their numbers has one verdict row per TTFT SLO of ours (1 s, 2 s), each judged from the runs at
    its own SLO: the sweep's 2 s runs plus a copy relabelled 1 s with BEAM's energy x 0.8 and its
    MAPEs + 5 points give, hand-worked, the 1 s rows 0.8 x the 2 s energy ratio and the 2 s range + 5.
    A sweep with 1 s runs only says the 2 s rows lack their SLO. (Mutations caught: the 2 s row taken
    for both, as before issue 38 (``slo_ttft_s`` left out of paper.SETTING, or _fig7_ours reading a
    fixed 2 s); the unstated numbers not expanded, one row each.)"""
    d, runs = sweep
    pick = lambda name: runs[runs.job.map(REPORTS[name])]
    f7 = pick("fig7")
    at1 = f7.assign(**{"summary.slo_ttft_s": 1.0})
    at1.loc[at1.system == "beam", "summary.energy_j"] *= 0.8
    v = _verdicts_of("fig7", pd.concat([f7, at1]), tmp_path / "f7").set_index("quantity")
    q = "energy / vanilla's (model=llama-3.3-70b, parallel=2x4, system=beam, slo_ttft_s={})"
    e = f7.set_index("system")["summary.energy_j"]
    assert v.loc[q.format("2.0"), "ours"] == pytest.approx(100 * e["beam"] / e["vanilla"], abs=0.1)
    assert v.loc[q.format("1.0"), "ours"] == pytest.approx(80 * e["beam"] / e["vanilla"], abs=0.1)
    for slo in ("1.0", "2.0"):  # every Fig. 7 number at both, saying why
        at = v[v.index.str.endswith(f"slo_ttft_s={slo})")]
        assert len(at) == len(load_reference("beam", "fig7")), slo
        assert at.note.str.contains("the paper states no TTFT SLO for this number", regex=False).all()
        llama = at[at.index.str.contains("llama-3.3-70b")]
        assert llama.note.str.contains(f"ours: TTFT SLO {float(slo):g} s, TBT 200 ms", regex=False).all()

    v = _verdicts_of("fig7", at1, tmp_path / "f7-1s").set_index("quantity")
    assert v.loc[q.format("1.0"), "verdict"] != "no result"
    two = v[v.index.str.endswith("slo_ttft_s=2.0)") & v.index.str.contains("llama-3.3-70b")]  # no Qwen run here
    assert len(two) and (two.verdict == "no result").all()
    assert two.note.str.contains(
        "no run at the paper's setting (slo_ttft_s=2.0); this sweep has slo_ttft_s=1", regex=False
    ).all()

    t1 = pick("tab1")
    up = t1.assign(**{"summary.slo_ttft_s": 1.0, "summary.pred_ttft_mape_pct": t1["summary.pred_ttft_mape_pct"] + 5})
    v = _verdicts_of("tab1", pd.concat([t1, up]), tmp_path / "t1").set_index("quantity")
    mape = t1["summary.pred_ttft_mape_pct"]
    for slo, add in (("2.0", 0), ("1.0", 5)):
        r = v.loc[f"predictor MAPE, TTFT (slo_ttft_s={slo})"]
        assert (r.ours, r.ours_hi) == (pytest.approx(mape.min() + add), pytest.approx(mape.max() + add)), slo
        assert f"runs at TTFT SLO {float(slo):g} s" in r.note and "states no TTFT SLO" in r.note


def test_a_stated_slo_is_judged_only_there(sweep, tmp_path):
    """Fig. 11's numbers, whose TTFT SLO the paper states (1 s), stay one row each at 1 s, and runs at
    2 s alone are not judged against them ('no result' naming slo_ttft_s=1.0), nor are the Fig. 7
    and Tab. 1 numbers, stated nowhere, pinned to one SLO. (Mutations caught: Fig. 11's row marked
    unstated in beam.csv (judged at 2 s too); ``slo_ttft_s`` left out of paper.SETTING.)"""
    d, runs = sweep
    f11 = numbers("fig11")
    assert [n.cfg["slo_ttft_s"] for n in f11] == ["1.0"] * len(load_reference("beam", "fig11"))
    for fig in ("fig7", "tab1"):
        assert sorted({n.cfg["slo_ttft_s"] for n in numbers(fig)}) == ["1.0", "2.0"], fig
    two = runs[runs.job.map(REPORTS["fig11"])]  # the burst jobs, at TTFT 2 s
    assert set(two["summary.slo_ttft_s"]) == {2.0}
    v = _verdicts_of("fig11", two, tmp_path / "f11")
    assert len(v) == len(f11) and (v.verdict == "no result").all()
    assert v.note.str.contains(
        "no run at the paper's setting (slo_ttft_s=1.0); this sweep has slo_ttft_s=2", regex=False
    ).all()
