"""LBS reports against the paper: one verdict per paper number (harness/verdict.py's rule, written
to verdicts.csv and shown in each table), and figures / tables whose labels and units cannot be
misread. One small simulated sweep (OPT-6.7B on the RTX 4090 profile, 7 GiB KV, 17 jobs; ~8 s
with the reports at load 5) feeds every report."""

import re

import pandas as pd
import pytest

from harness import reproduce
from harness.report import gather_runs, load_reference
from harness.run import run
from systems.kv_offload import report
from systems.kv_offload.display import byte_unit, display_rows
from systems.kv_offload.paper import paper_numbers

JOBS = (
    [("layerwise", b, 32) for b in (4, 8, 16, 64)]
    + [("layerwise", 64, 128)]
    + [("lbs", b, 32) for b in (4, 8, 16, 64)]
    + [("lbs", 64, 128)]
    + [
        ("lbs_intertoken", 4, 32),
        ("lbs_intertoken", 64, 32),
        ("lbs_intertoken", 64, 128),
        ("lbs_interbeam", 64, 32),
        ("lbs_interbeam", 64, 128),
        ("in_gpu", 4, 32),
        ("in_gpu", 64, 32),
    ]
)
# report -> (figure, the jobs it is given)
REPORTS = {
    "fig4": ("fig4", lambda r: (r.system == "layerwise") & (r.step == 32)),
    "fig5": ("fig5", lambda r: (r.system == "layerwise") & (r.step == 32) & (r.beams > 4)),
    "fig7": ("fig7", lambda r: r.system.isin(["layerwise", "lbs_intertoken"]) & (r.beams == 64)),
    "fig9": ("fig9", lambda r: r.beams > 0),
    "fig10": ("fig10", lambda r: (r.beams == 64) & (r.system != "in_gpu")),
    "fig11": ("fig11", lambda r: r.system.isin(["layerwise", "lbs"]) & (r.step == 32) & (r.beams > 4)),
    "fig12": ("fig12", lambda r: (r.step == 32) & (r.beams > 4) & (r.system != "in_gpu")),
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from hydra import compose, initialize_config_dir

    from tests.conftest import ROOT

    d = tmp_path_factory.mktemp("lbs_paper")
    for system, beams, step in JOBS:
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose(
                "config",
                overrides=[
                    f"system={system}",
                    f"beams={beams}",
                    f"step={step}",
                    "backend=sim",
                    "kv_budget=7GiB",
                    "tracking=none",
                    "progress=false",
                    f"output_dir={d / 'jobs' / f'{system}-{beams}-{step}'}",
                ],
            )
        run(cfg, multirun=True)
    runs = gather_runs(d / "jobs")
    runs["beams"], runs["step"] = runs["config.workload.beams"].astype(int), runs["config.workload.step"].astype(int)
    return d, runs, cfg


@pytest.fixture(scope="module")
def reports(sweep, tmp_path_factory):
    """Every LBS report run on its slice of the sweep, each in results/sweeps/lbs_<name>; the
    figures kept open for inspection: {name: (folder, {figure name: matplotlib figure})}."""
    d, runs, cfg = sweep
    out = {}
    real_save = report.save_figure
    for name, (_, pick) in REPORTS.items():
        figs = {}

        def keep(fig, sweep_dir, fname, figs=figs):
            figs[fname] = fig
            fig.canvas.draw()  # tick labels are set at draw time
            real_save(fig, sweep_dir, fname)

        report.save_figure = keep
        try:
            folder = d / "results" / "sweeps" / f"lbs_{name}"
            getattr(report, name)(folder, runs[pick(runs)].reset_index(drop=True), cfg)
        finally:
            report.save_figure = real_save
        out[name] = (folder, figs)
    return out


def test_every_paper_number_gets_one_verdict(reports):
    """verdicts.csv of each report: one row per paper number of its figure in lbs.csv (a min/max pair
    is one range), the figure file as source, simulated from the records; REPRODUCTION.md lists them
    all. (Mutations caught: a min/max pair kept as two rows; a paper number skipped when ours is
    missing instead of 'no result'; simulated taken as False.)"""
    total = 0
    for name, (folder, _) in reports.items():
        v = pd.read_csv(folder / "verdicts.csv")
        ref = load_reference("lbs", REPORTS[name][0])
        assert len(v) == (ref.bound != "max").sum() == len(paper_numbers(REPORTS[name][0])), name
        assert set(v.source) == {f"{name}.png"} and (folder / f"{name}.png").exists()
        assert v.simulated.all() and v.verdict.isin(["reproduced", "partly", "not reproduced", "no result"]).all()
        assert "verdict" in (folder / f"{name}.md").read_text()
        total += len(v)
    root = next(iter(reports.values()))[0].parent.parent
    md = reproduce.write_reproduction(root, reproduce.collect(root)).read_text()
    assert f"of {total} paper numbers" in md and md.count("| lbs | ") == total
    assert "[fig11.png](sweeps/lbs_fig11/fig11.png)" in md


def test_verdicts_follow_the_rule_on_our_numbers(sweep, reports):
    """Ours is recomputed from the records and judged by the one rule. (Mutations caught: the speedup
    inverted (LBS time / layer-wise time); the Fig.9 range taken over every beam count, 4-8 included;
    a lower bound (>=) judged as a point; fractions compared without the % scale on one side.)"""
    _, runs, _ = sweep
    e2e = runs.set_index(["system", "beams", "step"])["summary.e2e_s"]
    v = pd.read_csv(reports["fig9"][0] / "verdicts.csv").set_index("quantity")
    opt = v.loc["speedup over layer-wise (model=opt-6.7b, system=lbs, hardware=rtx4090)"]
    ours = [e2e["layerwise", b, s] / e2e["lbs", b, s] for b, s in ((16, 32), (64, 32), (64, 128))]
    assert (opt.ours, opt.ours_hi) == (pytest.approx(min(ours)), pytest.approx(max(ours)))
    assert (opt.kind, opt.paper_value, opt.paper_hi) == ("range", 3.39, 9.72)
    assert v.loc["speedup over layer-wise (model=llama-2-7b, system=lbs, hardware=rtx4090)"].verdict == "no result"
    v10 = pd.read_csv(reports["fig10"][0] / "verdicts.csv").set_index("quantity")
    reuse = v10.loc["volume cut by prefix reuse (system=lbs_interbeam, hardware=rtx4090)"]
    assert reuse.kind == ">=" and reuse.ours > 2 and reuse.verdict == "reproduced"
    v11 = pd.read_csv(reports["fig11"][0] / "verdicts.csv").set_index("quantity")
    lbs64 = v11.loc["I/O share of latency (model=opt-6.7b, beams=64, step=32, system=lbs, hardware=rtx4090)"]
    share = runs[(runs.system == "lbs") & (runs.beams == 64) & (runs.step == 32)]["summary.io_share"].iloc[0]
    assert (lbs64.ours, lbs64.paper_value, lbs64.unit) == (pytest.approx(100 * share), 10.0, "%")


def test_fig9_about_equal_note_follows_the_data(reports):
    """The Fig.9 'all methods about equal at 4-8 beams' rows say, from the records, where layer-wise
    offloads and in-GPU is OOM at that beam count (here: 8 beams offload with a 7 GiB budget), and the
    paper's own remark is marked as the paper's. (Mutations caught: the offload count taken over
    in-GPU's rows; the text fixed as '(no offload)' without the paper's label.)"""
    v = pd.read_csv(reports["fig9"][0] / "verdicts.csv").set_index("quantity")
    four = v.loc["speedup over layer-wise (beams=4, hardware=rtx4090)"].note
    eight = v.loc["speedup over layer-wise (beams=8, hardware=rtx4090)"].note
    assert "at 4 beams layer-wise offloads in 0 of 1 model x step configurations, in-GPU is OOM in 0 of 1" in four
    assert "at 8 beams layer-wise offloads in 1 of 1 model x step configurations" in eight
    assert "in-GPU" not in eight  # no in-GPU job at 8 beams here
    assert eight.endswith("; paper: at 4-8 beams all methods are about equal (no offload)")


def test_fig11_io_starts_at_zero_beside_the_papers_absolute_share(reports):
    """The I/O segment is stacked first, from 0, so its top is the share the paper's marker gives;
    ticks say 'beams' in words. (Mutations caught: I/O stacked on compute (the issue's misleading
    figure); the paper marker drawn at 1 - share; ticks '64b layerwise'.)"""
    ax = reports["fig11"][1]["fig11"].axes[0]
    io = next(c for c in ax.containers if c.get_label().startswith("I/O stall"))
    assert all(p.get_y() == 0 for p in io.patches)
    marker = next(ln for ln in ax.lines if ln.get_label() == "paper I/O share (this config)")
    ticks = [x.get_text() for x in ax.get_xticklabels()]
    pairs = dict(zip(ticks, [p.get_height() for p in io.patches]))
    lbs64 = [x for x, tk in zip(ax.get_xticks(), ticks) if tk == "LBS (full)\n64 beams"]
    assert lbs64 and pytest.approx(0.10) in list(marker.get_ydata()) and lbs64[0] in list(marker.get_xdata())
    assert pairs["LBS (full)\n64 beams"] < 0.15 and not any(re.search(r"\d+b ", tk) for tk in ticks)


def test_speedup_figure_ticks_oom_and_paper_band(reports):
    """Beam ticks are the beam counts; OOM is written in the panel, never a plotted point; the paper's
    range is a band over the offloading beam counts (>= 16) only. (Mutations caught: 2^k tick labels;
    OOM drawn as an x at a speedup value; the band drawn over all beams.)"""
    fig = reports["fig9"][1]["fig9"]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "8", "16", "64"]
    assert not any("OOM" in ln.get_label() for a in fig.axes for ln in a.lines)
    assert any(t.get_text() == "in-GPU (sim): OOM at 64 beams" for t in ax.texts)
    v = pd.read_csv(reports["fig9"][0] / "verdicts.csv")
    assert v.quantity.str.contains("beams=8").sum() == 1  # 'about 1x at 8 beams': every system that fits
    band = next(c for c in ax.collections if c.get_label().startswith("paper: LBS range"))
    xs = band.get_paths()[0].vertices[:, 0]
    assert xs.min() == 16 and xs.max() == 64
    assert ax.get_ylim()[0] == 0


def test_tables_have_units_and_no_float_residue(reports):
    """Column headers name their unit; a zero is 0, not 1.3e-15; the Fig.7 axis says host->device.
    (Mutations caught: the residue mask removed from report.tidy; the y label 'host->GPU'.)"""
    fig4 = (reports["fig4"][0] / "fig4.md").read_text()
    header = fig4.splitlines()[2]
    for col in ("KV share (%)", "end-to-end (s)", "I/O stall (s)", "I/O share (%)", "paper I/O share (%)"):
        assert col in header
    assert not re.search(r"\de-\d", fig4)
    assert reports["fig7"][1]["fig7"].axes[0].get_ylabel() == "host->device (GiB)"
    assert "moved (GiB)" in (reports["fig7"][0] / "fig7.md").read_text()


def test_run_table_one_byte_unit_host_device_and_the_eq_bound(compose_cfg):
    """The printed run table: one byte unit chosen by magnitude (16 MiB beside GiB of transfers reads
    in MiB), host->device not host->GPU, the Eq. row naming the bound that applies to the system, and
    the staging that lets the peak exceed the budget. (Mutations caught: per-value units (size_text);
    the unit of the largest value only (budget 0.0156 GiB); the LBS Eq. row without 'upper bound'.)"""
    rec = run(
        compose_cfg("system=layerwise", "model=tiny-opt", "backend=sim", "beams=16", "gen_len=256", "kv_budget=16MiB")
    )
    rows = display_rows(rec["summary"], rec["config"]["system"])
    text = {label: fmt(rec["summary"][key]) for label, key, fmt in rows if rec["summary"].get(key) is not None}
    sizes = [t for t in text.values() if t.endswith("iB")]
    assert len(sizes) >= 6 and all(t.endswith(" MiB") for t in sizes)
    assert text["KV budget"] == "16.00 MiB"
    assert any(k.startswith("host->device") for k in text) and not any("GPU" in k for k in text)
    assert "  of which staging beyond the budget (largest step)" in text
    lbs = {label for label, _, _ in display_rows({}, {"scheduler": "lbs", "inter_beam": True})}
    assert any("upper bound" in label and "Eq.4-5" in label for label in lbs)
    inter = {label for label, _, _ in display_rows({}, {"scheduler": "lbs", "inter_beam": False})}
    assert any(label.startswith("paper Eq.4-5 prediction") for label in inter)
    assert byte_unit([96 << 10, 5 << 30]) == ("MiB", 1 << 20) and byte_unit([7 << 30, 5000 << 30])[0] == "GiB"
    # each equation once: the system's own row, then the other one (QA: Eq.4-5 twice for lbs), and
    # 'beyond the budget' only when the peak is above it (QA: printed for a peak far under it)
    # (mutations caught: both sub-rows kept; the staging label fixed)
    assert sum("Eq.4-5" in label for label in lbs) == 1 and sum("Eq.1-3" in label for label in lbs) == 1
    lw = [label for label, _, _ in display_rows({}, {"scheduler": "layerwise"})]
    assert sum("Eq.1-3" in label for label in lw) == 1 and sum("Eq.4-5" in label for label in lw) == 1
    under = {
        label
        for label, _, _ in display_rows(
            {"peak_device_kv_bytes": 1 << 20, "kv_budget_bytes": 8 << 20}, {"scheduler": "lbs"}
        )
    }
    assert "  of which staging, within the budget (largest step)" in under
    # a real run's seconds say their basis (a newcomer read the CPU-time latency as wall time); a
    # simulated run has no such row (mutation caught: the row never shown)
    basis = {"time_basis": "CPU time of the engine's thread (time.thread_time)"}
    real = {label: key for label, key, _ in display_rows(basis, {"scheduler": "lbs"})}
    assert real["  seconds measured as"] == "time_basis" and list(real).index("  seconds measured as") == 1
    assert "  seconds measured as" not in text


@pytest.mark.parametrize("name", ["fig4", "fig5", "fig7", "fig9", "fig10", "fig11", "fig12", "lbs_energy"])
def test_reports_without_the_layerwise_baseline(sweep, tmp_path, name):
    """A sweep without the layer-wise baseline (``experiment=lbs_fig12 system=lbs_intertoken``) still
    gets its report: ratios to layer-wise are n/a (not 'nanx'), and every report says which run is
    missing and how to add it (QA). (Mutations caught: fig12's pivot without dropna=False: KeyError
    'lbs_intertoken' after every job had run; the note dropped from a report; 'nanx' speedups.)"""
    from systems.kv_offload import energy_report

    d, runs, cfg = sweep
    pick = REPORTS.get(name, (None, lambda r: r.step == 32))[1]
    if name in ("fig4", "fig5", "lbs_energy"):  # layer-wise only (fig4, fig5): LBS runs in its place
        pick = lambda r: (r.step == 32) & (r.beams > 4)
    sub = runs[pick(runs) & (runs.system != "layerwise")].reset_index(drop=True)
    assert len(sub)
    getattr(energy_report if name == "lbs_energy" else report, name)(tmp_path, sub, cfg)
    text = (tmp_path / f"{name}.md").read_text()
    assert "No layer-wise run in this sweep" in text and "add `layerwise` to `system=`" in text  # why, every report
    assert "nanx" not in text
    if name == "fig12":
        assert re.search(r"\|\s+nan\s+\|", text)


def test_lbs_fidelity_report_on_simulated_runs_only_says_why(sweep, tmp_path, capsys):
    """``experiment=lbs_fidelity backend=sim`` has no real run to replay: the report says so (a note
    and a warning) instead of KeyError 'system' in the empty replay (QA). Mutation caught: the
    early return dropped."""
    from systems.kv_offload.fidelity import report_repeats

    d, runs, cfg = sweep
    assert report_repeats(tmp_path, [runs]).empty
    assert "no ok real-engine runs in the sweep" in (tmp_path / "fidelity.md").read_text()
    assert "warning: no ok real-engine runs" in capsys.readouterr().err


def _relabel(runs, **cols):
    """The same records with some config values changed (standing for a run at another setting)."""
    out = runs.copy()
    for col, value in cols.items():
        out[col] = value
    return out


def test_ours_is_taken_at_the_papers_setting_only(sweep, tmp_path):
    """A paper number is judged only from runs at its own setting (harness.paper.in_setting): a 32-beam
    sweep against Fig.7's 64-beam volumes, an A100 sweep against Fig.9's RTX 4090 speedups, LBS's
    growth against Fig.5's layer-wise claim give 'no result' with the setting named, and Fig.9's title
    names the profile the runs used (QA). (Mutations caught: the setting filter dropped; the filter
    on the wrong column; fig5 judging every system; the title fixed as 'RTX 4090'.)"""
    d, runs, cfg = sweep
    fig7 = runs[REPORTS["fig7"][1](runs)]
    report.fig7(tmp_path / "b32", _relabel(fig7, **{"config.workload.beams": 32}).reset_index(drop=True), cfg)
    v = pd.read_csv(tmp_path / "b32" / "verdicts.csv")
    assert (v.verdict == "no result").all()
    assert v.note.str.contains("no run at the paper's setting (beams=64", regex=False).all()
    assert v.note.str.contains("this sweep has beams=32", regex=False).all()
    rows = [ln for ln in (tmp_path / "b32" / "fig7.md").read_text().splitlines() if "| opt-6.7b |" in ln]
    assert len(rows) == 4 and all(re.search(r"\|\s+32 \|.*\|\s+nan \|\s+\| simulated", ln) for ln in rows)

    a100 = _relabel(runs, hardware="a100-80gb").reset_index(drop=True)
    figs = {}
    real = report.save_figure
    report.save_figure = lambda fig, sweep_dir, name: figs.setdefault(name, fig)
    try:
        report.fig9(tmp_path / "a100", a100, cfg)
    finally:
        report.save_figure = real
    v = pd.read_csv(tmp_path / "a100" / "verdicts.csv")
    assert (v.verdict == "no result").all() and v.note.str.contains("hardware=rtx4090").all()
    title = figs["fig9"]._suptitle.get_text()
    assert "a100-80gb" in title and "4090" not in title
    for name in ("fig10", "fig11", "fig12"):  # the paper ran these on its RTX 4090 too (lbs.csv, QA)
        sub = a100[REPORTS[name][1](a100)].reset_index(drop=True)
        getattr(report, name)(tmp_path / f"a100-{name}", sub, cfg)
        v = pd.read_csv(tmp_path / f"a100-{name}" / "verdicts.csv")
        assert (v.verdict == "no result").all() and v.note.str.contains("hardware=rtx4090").all(), name

    lbs = runs[(runs.system == "lbs") & (runs.step == 32) & (runs.beams > 4)].reset_index(drop=True)
    report.fig5(tmp_path / "lbs5", lbs, cfg)
    v = pd.read_csv(tmp_path / "lbs5" / "verdicts.csv")
    assert list(v.verdict) == ["no result"]
    assert "| no" not in (tmp_path / "lbs5" / "fig5.md").read_text().split("Paper numbers")[0]


def test_fig4_kv_share_uses_each_runs_own_model(sweep, tmp_path):
    """KV share = KV / (KV + weights) with the weights of the run's own model (its record), not the
    sweep's base config: a report given another model's cfg computes the same shares (QA: opt-2.7b
    runs divided by opt-6.7b's weights). (Mutation caught: weight_bytes(cfg.model).)"""
    from omegaconf import OmegaConf

    from harness.model_facts import weight_bytes

    d, runs, cfg = sweep
    other = OmegaConf.merge(cfg, {"model": {"num_layers": 2}})
    lw = runs[REPORTS["fig4"][1](runs)].reset_index(drop=True)
    report.fig4(tmp_path, lw, other)
    v = pd.read_csv(tmp_path / "verdicts.csv").set_index("quantity")
    r = lw[lw.beams == 64].iloc[0]
    kv = float(r["summary.full_kv_bytes"])
    want = 100 * kv / (kv + weight_bytes(cfg.model))
    assert v.loc["KV share of memory (model=opt-6.7b, beams=64, hardware=rtx4090)", "ours"] == pytest.approx(want)
