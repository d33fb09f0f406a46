"""FastTTS reports that cannot be misread: units on every axis and title, simulated/measured labels,
a verdict (harness.verdict, the one rule) beside every paper number and one row per paper number in
the sweep's verdicts.csv; Fig. 18 rows in budget order; Fig. 17's paper numbers found."""

import re

import pandas as pd
import pytest

from harness import verdict as vd
from harness.report import gather_runs, load_reference
from systems.verifier_search import report

# report -> (table file, paper figures it covers with their metrics)
REPORTS = {
    "report_goodput": (
        "fig12_goodput.md",
        {"fig12": None, "headline": ("goodput_gain_mean", "goodput_gain_min", "goodput_gain_max")},
    ),
    "report_latency": (
        "fig13_latency.md",
        {"fig13": None, "headline": ("latency_reduction_min", "latency_reduction_max")},
    ),
    "report_ablation": ("fig16_ablation.md", {"fig16": None}),
    "report_r_sweep": ("fig17_r_sweep.md", {"fig17": None}),
    "report_memory": ("fig18_memory.md", {"fig18": None}),
    "report_methods": ("fig11_methods.md", {"fig11": None}),
    "report_gpus": ("fig15_gpus.md", {"fig15": None}),
}
UNIT = re.compile(r"\((tok/s|s per problem|%|GB, both engines)\)|tok/s|s per problem|\(%|%\)")


def _paper_numbers(figures) -> int:
    n = 0
    for fig, metrics in figures.items():
        ref = load_reference("fasttts", fig)
        n += len(ref) if metrics is None else int(ref["metric"].isin(metrics).sum())
    return n


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory):
    """The baseline, P and FastTTS, simulated, n=8, AIME problem 1, a 2 GB KV budget (Fig. 18's): a
    sweep every report can read."""
    from hydra import compose, initialize_config_dir

    from harness.run import run
    from tests.conftest import ROOT

    sweep = tmp_path_factory.mktemp("sweep")
    for system in ("vllm_tts", "fasttts_p", "fasttts"):
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose(
                "config",
                overrides=[
                    "tracking=none",
                    "progress=false",
                    f"output_dir={sweep / system}",
                    f"system={system}",
                    "backend=sim",
                    "n=8",
                    "workload.num_problems=1",
                    "kv_budget=2GB",
                ],
            )
        assert run(cfg)["status"] == "ok"
    return gather_runs(sweep)


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_every_report_says_units_labels_and_verdicts(small_sweep, tmp_path, monkeypatch, name):
    """Each report's figure axes and title, and its table's title, name units and say simulated; the
    table has a verdict column where it holds a paper number; verdicts.csv has one row per paper
    number of the figure (no result where the sweep has no point), each judged by harness.verdict.
    Mutations caught: an axis label without its unit (the issue's 'goodput'); dropping from
    verdicts.csv the paper numbers the sweep did not reach."""
    drawn = []
    real_save = report.save_figure

    def spy(fig, sweep_dir, fname):
        drawn.append((fig.get_suptitle(), [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes if ax.get_visible()]))
        return real_save(fig, sweep_dir, fname)

    monkeypatch.setattr(report, "save_figure", spy)
    table, figures = REPORTS[name]
    getattr(report, name)(tmp_path, small_sweep, None)
    ((title, axes),) = drawn
    assert "(simulated)" in title and axes
    for x, y in axes:
        assert UNIT.search(y), f"{name}: y axis {y!r} has no unit"
        assert x.startswith("n (paths per problem") or "(GB" in x, x
    md = (tmp_path / table).read_text().splitlines()
    assert "(simulated)" in md[0] and UNIT.search(md[0]), md[0]
    v = pd.read_csv(tmp_path / "verdicts.csv")
    assert len(v) == _paper_numbers(figures)
    assert set(v["verdict"]) <= set(vd.VERDICTS) and v["simulated"].all()
    for r in v.itertuples():
        ours = None if pd.isna(r.ours) else r.ours
        assert r.verdict == vd.verdict(ours, r.paper_value, r.kind), r.quantity
    if name in ("report_goodput", "report_latency", "report_gpus", "report_r_sweep"):
        assert any(h.startswith("| ") and "verdict " in h for h in md)


def test_goodput_verdicts_hold_our_values(small_sweep, tmp_path):
    """The row of the paper's 1.5B+1.5B AIME n=8 baseline point holds our run's goodput and its verdict."""
    t = report.report_goodput(tmp_path, small_sweep, None)
    ours = float(small_sweep.loc[small_sweep.system == "vllm_tts", "summary.precise_goodput_tok_s"].iloc[0])
    v = pd.read_csv(tmp_path / "verdicts.csv").set_index("quantity")
    row = v.loc["goodput vllm_tts 1.5B+1.5B aime24 n=8"]
    assert row["ours"] == pytest.approx(ours) and row["paper_value"] == 88
    assert row["verdict"] == vd.verdict(ours, 88) == t["verdict vllm_tts (sim)"].iloc[0]
    assert v.loc["goodput vllm_tts 1.5B+1.5B aime24 n=512", "verdict"] == "no result"
    # a 'no result' names the setting the sweep lacked (QA; mutation caught: the note dropped)
    assert v.loc["goodput vllm_tts 1.5B+1.5B aime24 n=512", "note"].startswith(
        "ours: no run at pair=1.5B+1.5B, dataset=aime24, n=512 in this sweep; "
    )


def _runs(rows):
    base = {
        "status": "ok",
        "simulated": True,
        "summary.latency_s": 1.0,
        "summary.gen_latency_s": 0.5,
        "summary.ver_latency_s": 0.5,
        "config.workload.name": "aime24",
        "config.system.search": "beam_search",
        "config.hardware.name": "rtx4090",
        "config.model.name": "qwen2.5-math-1.5b",
        "config.verifier.name": "skywork-prm-1.5b",
        "config.system.spec_truncation_ratio": 0.85,
    }
    return pd.DataFrame([dict(base, **r) for r in rows])


def test_memory_rows_in_budget_order_and_gains_judged_as_ratios(tmp_path):
    """Fig. 18: rows 1.5GB, 2GB, 14GB (not as strings: 1.5GB, 14GB, 2GB); a gain of 1 % against the
    paper's 0 % is reproduced (ratio 1.01 vs 1.00), 58 % against 58 % too. Mutations caught: sorting
    the budget as text; judging the gains in % (1 % vs 0 % would be 'not reproduced')."""
    rows = []
    for kv, gain_p in (("1.5GB", 1.58), ("14GB", 1.01), ("2GB", 1.5)):
        for system, g in (("vllm_tts", 10.0), ("fasttts_p", 10.0 * gain_p), ("fasttts_pm", 20.0)):
            rows.append(
                {
                    "system": system,
                    "config.system.kv_budget": kv,
                    "config.workload.n": 128,
                    "summary.precise_goodput_tok_s": g,
                }
            )
    t = report.report_memory(tmp_path, _runs(rows), None)
    assert t["kv_budget"].tolist() == ["1.5GB", "2GB", "14GB"]
    assert t["verdict fasttts_p gain (sim)"].tolist() == ["reproduced", "not reproduced", "reproduced"]
    body = (tmp_path / "fig18_memory.md").read_text()
    assert body.index("| 1.5GB") < body.index("| 2GB") < body.index("| 14GB")


def test_r_sweep_finds_the_papers_numbers(tmp_path):
    """Fig. 17: the paper's baseline, R = 0.0 and R = 0.85 goodput are matched to ours (the paper's
    config 'system=fasttts;R=0.85' is two keys). Mutations caught: looking the series up as one system
    name (no paper number found: every verdict 'no result'); the verdict's arguments swapped (ours
    taken as the paper's: 30 vs 23 tok/s would read 'partly')."""
    rows = [
        {
            "system": s,
            "config.system.spec_truncation_ratio": r,
            "config.workload.n": 64,
            "config.verifier.name": "math-shepherd-7b",
            "summary.precise_goodput_tok_s": g,
        }
        for s, r, g in (
            ("vllm_tts", 0.85, 12.0),
            ("vllm_tts", 0.0, 12.0),
            ("fasttts", 0.0, 18.0),
            ("fasttts", 0.85, 30.0),
        )
    ]
    t = report.report_r_sweep(tmp_path, _runs(rows), None)
    assert (t["paper vllm_tts"].iloc[0], t["paper fasttts;R=0.0"].iloc[0], t["paper fasttts;R=0.85"].iloc[0]) == (
        12.5,
        18.5,
        23,
    )
    assert t["verdict fasttts;R=0.0 (sim)"].iloc[0] == "reproduced"
    assert t["verdict fasttts;R=0.85 (sim)"].iloc[0] == "not reproduced"


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_a_sweep_where_nothing_fit_still_reports(tmp_path, name):
    """Every job oom (e.g. only the 7B+7B pair on a 24 GB card): the table is written and every paper
    number reads 'no result'. Mutation caught: tidy returning a frame without its columns (the
    reports raised KeyError: 'pair')."""
    runs = pd.DataFrame([{"status": "oom", "system": "vllm_tts", "simulated": True}])
    getattr(report, name)(tmp_path, runs, None)
    table, figures = REPORTS[name]
    assert (tmp_path / table).exists()
    v = pd.read_csv(tmp_path / "verdicts.csv")
    assert len(v) == _paper_numbers(figures) and set(v["verdict"]) == {"no result"}


def test_r_sweep_keeps_the_baseline_whatever_r_the_sweep_ran(tmp_path):
    """A sweep of R=0.0 only still has its baseline (it was kept at R=0.85 only, QA): the baseline
    does not speculate, so one run of it per setting. Mutation caught: the R=0.85 filter back."""
    rows = [
        {
            "system": s,
            "config.system.spec_truncation_ratio": 0.0,
            "config.workload.n": 64,
            "config.verifier.name": "math-shepherd-7b",
            "summary.precise_goodput_tok_s": g,
        }
        for s, g in (("vllm_tts", 12.0), ("fasttts", 18.0))
    ]
    t = report.report_r_sweep(tmp_path, _runs(rows), None)
    assert t["vllm_tts (sim)"].tolist() == [12.0] and t["verdict vllm_tts (sim)"].iloc[0] == "reproduced"


def test_memory_judges_only_the_papers_n(tmp_path):
    """Fig. 18 is at n=128: an n=16 row is shown but not judged against it (QA: looked up by the KV
    budget alone). Mutation caught: the n key dropped from the lookup."""
    rows = [
        {"system": s, "config.system.kv_budget": "2GB", "config.workload.n": 16, "summary.precise_goodput_tok_s": g}
        for s, g in (("vllm_tts", 10.0), ("fasttts_p", 15.0))
    ]
    t = report.report_memory(tmp_path, _runs(rows), None)
    assert t["fasttts_p gain % (sim)"].tolist() == [pytest.approx(50.0)]
    assert t["verdict fasttts_p gain (sim)"].isna().all()
    v = pd.read_csv(tmp_path / "verdicts.csv")
    assert set(v.verdict) == {"no result"}


@pytest.mark.parametrize("name", ["report_goodput", "report_ablation", "report_memory", "report_methods"])
def test_without_the_baseline_the_notes_say_why(tmp_path, name):
    """No vllm_tts in the sweep: the notes say there is no gain and what to add (QA: notes began with
    '; paper: ...' and the gain figures were silently missing). Mutation caught: the note not added."""
    rows = [
        {"system": s, "config.system.kv_budget": "2GB", "config.workload.n": 128, "summary.precise_goodput_tok_s": 10.0}
        for s in ("fasttts_p", "fasttts_pm", "fasttts")
    ]
    getattr(report, name)(tmp_path, _runs(rows), None)
    text = (tmp_path / REPORTS[name][0]).read_text()
    assert "No gain: no vllm_tts run" in text and "\n; " not in text and "add it to system=" in text


def test_an_all_oom_sweep_says_simulated_in_its_title(tmp_path):
    """Every job oom: the title still says where the records came from (QA: '(simulated)' was lost).
    Mutation caught: the title's source taken from the successful runs only."""
    runs = pd.DataFrame([{"status": "oom", "system": "vllm_tts", "simulated": True}])
    report.report_goodput(tmp_path, runs, None)
    assert "(simulated)" in (tmp_path / "fig12_goodput.md").read_text().splitlines()[0]


def test_r_sweep_without_the_baseline_and_at_other_r(tmp_path):
    """FastTTS alone (no vllm_tts) is still judged against the paper's absolute goodput (QA: n became
    64.0 in the concatenation with the empty baseline and no paper number matched); a run at another R
    is shown and named, not dropped (QA). (Mutations caught: the int cast dropped; the extra series
    dropped.)"""
    rows = [
        {
            "system": "fasttts",
            "config.system.spec_truncation_ratio": r,
            "config.workload.n": 64,
            "config.verifier.name": "math-shepherd-7b",
            "summary.precise_goodput_tok_s": g,
        }
        for r, g in ((0.0, 18.0), (0.85, 30.0), (0.5, 25.0))
    ]
    t = report.report_r_sweep(tmp_path, _runs(rows), None)
    assert t["verdict fasttts;R=0.0 (sim)"].iloc[0] == "reproduced"
    assert t["fasttts;R=0.5 (sim)"].tolist() == [25.0]
    text = (tmp_path / "fig17_r_sweep.md").read_text()
    assert "without a paper number" in text and "fasttts;R=0.5" in text and "No gain: no vllm_tts run" in text
