"""harness.reproduce: REPRODUCTION.md counts and rows come from the sweeps' verdicts.csv files and
results/reference/*.csv (every paper number, run or not), index.html shows every figure and table;
--only collects only the named experiments; a bad --only exits 2."""

import os
from pathlib import Path

import pytest

from harness import reproduce as R
from harness import verdict as V


def _sweep(root, name, rows, png=True):
    d = root / "sweeps" / name
    V.write(d, rows)
    (d / "table.md").write_text("# t\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    if png:
        (d / "fig.png").write_bytes(b"\x89PNG\r\n")


def test_pages_from_verdicts(tmp_path):
    _sweep(
        tmp_path,
        "lbs_fig9",
        [
            V.Row(
                "lbs",
                "fig9",
                "speedup OPT-6.7B",
                3.39,
                "range",
                9.72,
                ours=5.26,
                ours_hi=14.55,
                unit="x",
                source="fig9.png",
            )
        ],
    )
    _sweep(
        tmp_path,
        "beam_fig7",
        [
            V.Row("beam", "fig7", "energy vs vanilla", 0.49, ours=0.496, unit="fraction"),
            V.Row("beam", "fig7", "TTFT attainment", 0.949, ours=None),
        ],
        png=False,
    )
    v = R.collect(tmp_path)
    assert list(v["sweep"]) == ["beam_fig7", "beam_fig7", "lbs_fig9"]  # by paper, then figure
    assert list(v["verdict"]) == ["reproduced", "no result", "partly"]
    md = R.write_reproduction(tmp_path, v).read_text()
    assert (
        "Verdicts of 3 paper numbers (one per source of ours; a stated min-max pair is one range): **1 reproduced, 1 partly, "
        "0 not reproduced, 1 no result** (beam: 1 / 0 / 0 / 1 of 2; lbs: 0 / 1 / 0 / 0 of 1, as reproduced / partly "
        "/ not reproduced / no result)." in md
    )  # per paper too: the counts the docs once copied by hand, and let go stale (issue 40)
    assert (
        "| lbs | fig9 | speedup OPT-6.7B | 5.26-14.6 x | 3.39-9.72 x | partly | sim | [fig9.png](sweeps/lbs_fig9/fig9.png) |"
        in md
    )
    page = R.write_index(tmp_path).read_text()
    assert "sweeps/lbs_fig9/fig.png" in page and "<table>" in page and "beam_fig7" in page


def test_bad_only_exits_2(capsys):
    assert R.main(["--only", "lbs_fig99", "--collect-only"]) == 2
    assert "not a paper experiment" in capsys.readouterr().err


@pytest.mark.parametrize("only", [[""], [","], [" , "]])
def test_an_only_naming_nothing_exits_2_instead_of_running_everything(tmp_path, capsys, only):
    """``--only ""`` ran every experiment and ``--only ,`` a KeyError 'rc' after the work (QA).
    Mutation caught: the empty-list check dropped (exit 0, the whole suite collected)."""
    argv = [x for o in only for x in ("--only", o)]
    assert R.main([*argv, "--collect-only", "--results-dir", str(tmp_path)]) == 2
    assert "names no experiment; one or more of beam_fig1," in capsys.readouterr().err
    assert not (tmp_path / "REPRODUCTION.md").exists()


def test_repeated_only_options_are_their_union(tmp_path):
    """``--only lbs_fig9 --only beam_fig7`` kept only the last (QA). Mutation caught: action="store"."""
    _sweep(tmp_path, "lbs_fig9", [V.Row("lbs", "fig9", "speedup", 3.39, "range", 9.72, ours=5.0, unit="x")])
    _sweep(tmp_path, "beam_fig7", [V.Row("beam", "fig7", "energy vs vanilla", 0.49, ours=0.496, unit="fraction")])
    assert (
        R.main(["--only", "lbs_fig9", "--only", "beam_fig7,lbs_fig9", "--collect-only", "--results-dir", str(tmp_path)])
        == 0
    )
    md = (tmp_path / "REPRODUCTION.md").read_text()
    assert "Only these experiments' sweeps are collected (--only): lbs_fig9, beam_fig7;" in md
    assert "energy vs vanilla" in md


def test_rows_in_natural_figure_order(tmp_path):
    for name, fig in (("lbs_fig10", "fig10"), ("lbs_3080ti", "3080ti"), ("lbs_fig4", "fig4")):
        _sweep(tmp_path, name, [V.Row("lbs", fig, "q", 1.0, ours=1.0)], png=False)
    assert list(R.collect(tmp_path)["figure"]) == ["3080ti", "fig4", "fig10"]


def _reference_rows(paper, figure=None):
    """Rows of results/reference/<paper>.csv (of one figure), counted from the file itself."""
    csv = Path(__file__).resolve().parent.parent / "results" / "reference" / f"{paper}.csv"
    rows = [ln for ln in csv.read_text().splitlines()[1:] if ln.strip() and not ln.startswith(("#", "figure,"))]
    return [ln for ln in rows if figure is None or ln.startswith(figure + ",")]


def test_only_collects_the_named_experiments_and_counts_every_paper_number(tmp_path):
    """--only lbs_fig9 with another sweep (beam_fig7) in the folder: only lbs_fig9's verdicts, the
    counts line gives lbs fig9's reference rows of all of them, beam fig7's are listed as not run.
    Mutations caught: collect() ignoring its sweep list (beam_fig7's verdict is collected);
    not_run() returning nothing (no 'Not run' list, count 0); the total counting only the rows run."""
    _sweep(tmp_path, "lbs_fig9", [V.Row("lbs", "fig9", "speedup", 3.39, "range", 9.72, ours=5.0, unit="x")])
    _sweep(tmp_path, "beam_fig7", [V.Row("beam", "fig7", "energy vs vanilla", 0.49, ours=0.496, unit="fraction")])
    assert R.main(["--only", "lbs_fig9", "--collect-only", "--results-dir", str(tmp_path)]) == 0
    md = (tmp_path / "REPRODUCTION.md").read_text()
    total = sum(len(_reference_rows(p)) for p in ("lbs", "beam", "fasttts"))
    ran = len(_reference_rows("lbs", "fig9"))
    assert 0 < ran < total
    assert (
        f"**{ran} of {total} paper numbers run** (rows of results/reference/*.csv), **{total - ran} not run** "
        "(not collected (--only) or no sweep here;"
    ) in md
    assert "Only these experiments' sweeps are collected (--only): lbs_fig9;" in md
    assert "**1 reproduced, 0 partly" in md and "energy vs vanilla" not in md
    assert (
        f"## Not run ({total - ran} paper numbers: no sweep of their figure collected (--only), or none here)"
    ) in md  # beam_fig7 has a sweep here: not "no sweep here" (a newcomer's report)
    assert f"- beam fig7: {len(_reference_rows('beam', 'fig7'))} not run (energy_vs_vanilla, " in md
    assert "- lbs fig9:" not in md
    page = (tmp_path / "index.html").read_text()  # the figure page follows --only too
    assert "href='#lbs_fig9'" in page and "beam_fig7" not in page


@pytest.mark.parametrize(
    "extra,message",
    [
        (["tracking=nonee"], "tracking='nonee' is not allowed: one of none, wandb (conf/tracking/*.yaml)"),
        (
            ["sytem.prefetch=false"],
            "'sytem.prefetch' is not a config key; did you mean 'system'? "
            "(python run.py --help lists the groups and shortcuts)",
        ),
        (
            ["experiment=lbs_fig9"],
            "experiment=lbs_fig9: set by this command (use --only NAME,... for experiments, "
            "--results-dir PATH for the results folder)",
        ),
        (
            ["seed=-1"],
            "experiment=lbs_fig7 refuses seed=-1 (exit 2; nothing was run):\nerror: seed=-1 is not allowed: "
            "an integer >= 0 (repeats use seeds seed..seed+repeats-1)\n  (in the sweep job system=layerwise "
            "step=32 experiment=lbs_fig7 results_dir={d} progress=False seed=-1; nothing was run)",
        ),
        (
            ["beams=abc"],
            "experiment=lbs_fig7 refuses beams=abc (exit 2; nothing was run):\nerror: beams='abc' is not "
            "allowed: an integer (sets workload.beams)\n  (in the sweep job system=layerwise step=32 "
            "experiment=lbs_fig7 results_dir={d} progress=False beams=abc; nothing was run)",
        ),
    ],
)
def test_bad_extra_argument_exits_2_before_anything_runs(tmp_path, capsys, monkeypatch, extra, message):
    """Before: every experiment ran with it (each exiting 2, the reason only in its log), then both
    pages were rewritten and the command exited 1. Mutations caught: check_overrides not called;
    run.py's preflight left out of it; the experiments' sweeps not asked to check them (seed=-1,
    beams=abc: each experiment ran and exited 2)."""
    monkeypatch.setattr(R, "_run", lambda *a, **k: pytest.fail("an experiment ran"))
    assert R.main(["--only", "lbs_fig7", "--results-dir", str(tmp_path), *extra]) == 2
    assert capsys.readouterr().err == f"error: {message.format(d=tmp_path)}\n"
    assert not list(tmp_path.iterdir())


def test_overrides_are_checked_with_each_experiments_jobs(tmp_path, capsys, monkeypatch):
    """The check is each experiment's own sweep check (``$TTC_SWEEP_CHECK_ONLY``), on its jobs, not its
    base config: ``tp=3`` passes beam_fig7 but not beam_fig1 (whose jobs run pp=4 on 8 GPUs), a swept
    list (``seed=0,1``) and a group its jobs use (``workload=ablation`` for beam_fig1) pass, and
    nothing is written. Mutations caught: the base config validated instead (beam_fig1's base is
    LBS's: workload=ablation refused; tp=3 passed); Hydra's compose() (seed=0,1: a traceback)."""
    monkeypatch.setattr(R, "_run", lambda *a, **k: pytest.fail("an experiment ran"))
    assert R.main(["--only", "beam_fig7,beam_fig1", "--results-dir", str(tmp_path), "tp=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: experiment=beam_fig1 refuses tp=3 (exit 2; nothing was run):\nerror: tp x pp = "
        "3 x 4 = 12 GPUs is not allowed: hardware 'a100-80gb' has 8 GPUs (choose tp x pp <= 8)\n"
    )
    R.check_overrides(["seed=0,1"], False, ["lbs_fig7"], tmp_path)
    R.check_overrides(["workload=ablation", "tracking=none"], False, ["beam_fig1"], tmp_path)
    assert not (tmp_path / "sweeps").exists() and not (tmp_path / "runs").exists()  # (a request cache: no record)


def test_overrides_with_collect_only_exit_2(tmp_path, capsys):
    assert R.main(["--collect-only", "--results-dir", str(tmp_path), "tracking=none"]) == 2
    assert capsys.readouterr().err == (
        "error: tracking=none: --collect-only runs no experiment, so these overrides "
        "would be ignored (drop them, or drop --collect-only)\n"
    )
    assert not list(tmp_path.iterdir())


def test_failed_experiment_prints_the_reason_from_its_log(tmp_path, capsys, monkeypatch):
    """An experiment whose jobs fail when they run (the LBS runner raises: tests/test_exit_status.py's
    FAIL_MID_RUN) -- the reason is printed, not only "exit 1". Mutation caught: _tell_failure not called."""
    from tests.test_exit_status import FAIL_MID_RUN

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAIL_MID_RUN)
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{R.ROOT}")
    monkeypatch.setenv("FAIL_MID_RUN", "1")
    out_dir = tmp_path / "r"
    assert R.main(["--only", "lbs_fig7", "--results-dir", str(out_dir), "tracking=none"]) == 1
    out = capsys.readouterr()
    assert "[reproduce] experiment=lbs_fig7: exit 1 in " in out.out
    assert f"[reproduce] last lines of {out_dir / 'reproduce' / 'lbs_fig7.log'}:\n" in out.err
    assert "  sweep failed: 6 job(s) with status error (their message: the 'message' column of " in out.err


def _runs(root, name, *statuses, mtime):
    import os

    import pandas as pd

    d = root / "sweeps" / name
    pd.DataFrame({"status": list(statuses)}).to_parquet(d / "runs.parquet")
    os.utime(d / "verdicts.csv", (mtime, mtime))


def test_a_second_sweep_of_a_figure_counts_its_paper_numbers_once(tmp_path):
    """Two sweeps of lbs fig9 (the experiment's and a re-run under another sweep_name): one verdict
    per paper number, from the newest complete sweep, the other named as left out; an incomplete
    newer sweep (a job with status error) loses to a complete older one. Before: both sweeps' rows,
    "Verdicts of 2" for 1 paper number. Mutations caught: no choice (every sweep's rows); completeness
    ignored; age ignored (the sweep's name decides)."""
    row = dict(paper="lbs", figure="fig9", quantity="speedup", paper_value=3.39, kind="range", paper_hi=9.72, unit="x")
    _sweep(tmp_path, "lbs_fig9", [V.Row(**row, ours=5.0)], png=False)
    _sweep(tmp_path, "a_rerun", [V.Row(**row, ours=20.0)], png=False)
    _runs(tmp_path, "lbs_fig9", "ok", "oom", mtime=1_000_000)
    _runs(tmp_path, "a_rerun", "ok", "ok", mtime=2_000_000)
    v = R.collect(tmp_path)
    assert list(v["sweep"]) == ["a_rerun"] and list(v["verdict"]) == ["not reproduced"]
    md = R.write_reproduction(tmp_path, v).read_text()
    ran = len(_reference_rows("lbs", "fig9"))
    assert f"**{ran} of " in md and "Verdicts of 1 paper numbers" in md
    assert "**0 reproduced, 0 partly, 1 not reproduced, 0 no result**" in md
    assert "- lbs fig9: `a_rerun` (left out: lbs_fig9)" in md
    assert md.count("| lbs | fig9 | speedup |") == 1
    _runs(tmp_path, "a_rerun", "ok", "error", mtime=2_000_000)
    v = R.collect(tmp_path)
    assert list(v["sweep"]) == ["lbs_fig9"] and list(v["verdict"]) == ["reproduced"] and list(v["over"]) == ["a_rerun"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--results-dir", ""], "--results-dir '': a folder (an empty one wrote into the current directory)"),
        (["--only", "lbs_fig9", "--timeout", "-5"], "--timeout -5: seconds per command, > 0"),
        (["--collect-only", "--real"], "--collect-only runs nothing: --real and --timeout have no effect with it"),
        (
            ["--collect-only", "--results-dir", "{tmp}/none"],
            "--collect-only: {tmp}/none/sweeps does not exist: nothing to collect",
        ),
    ],
)
def test_bad_arguments_exit_2_before_anything_is_written(tmp_path, capsys, monkeypatch, args, message):
    """QA: --results-dir '' ran every experiment into the current folder (the repository root);
    --timeout -5 wrote an empty REPRODUCTION.md; --collect-only of a missing folder was a traceback.
    Mutation caught: the checks left out."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(R, "_run", lambda *a, **k: pytest.fail("an experiment ran"))
    assert R.main([a.format(tmp=tmp_path) for a in args]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message.format(tmp=tmp_path)}")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_reproduce_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the experiments run: one line (was a KeyboardInterrupt traceback), exit 130, no
    REPRODUCTION.md rewritten. Mutation caught: the KeyboardInterrupt not caught."""

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(R, "run_all", interrupted)
    assert R.main(["--only", "lbs_fig9", "--results-dir", str(tmp_path)]) == 130
    assert capsys.readouterr().err.startswith("interrupted: every record written before is intact")
    assert not (tmp_path / "REPRODUCTION.md").exists()


def test_a_sweep_on_a_subset_of_the_problems_says_so_in_reproduction(tmp_path):
    """fasttts_goodput run with workload.num_problems=2: REPRODUCTION.md gave 27 verdicts against the
    paper's full-dataset numbers without a word (QA). Mutation caught: _subset returning ''."""
    import pandas as pd

    _sweep(tmp_path, "fasttts_goodput", [V.Row("fasttts", "fig12", "goodput gain", 1.2, ours=1.1, unit="x")])
    pd.DataFrame({"status": ["ok", "ok"], "config.workload.num_problems": [2, 2]}).to_parquet(
        tmp_path / "sweeps" / "fasttts_goodput" / "runs.parquet"
    )
    _sweep(tmp_path, "lbs_fig9", [V.Row("lbs", "fig9", "speedup", 3.39, ours=3.3, unit="x")])
    md = R.write_reproduction(tmp_path, R.collect(tmp_path)).read_text()
    assert (
        "Sweeps run on a subset of the problems (`workload.num_problems`), judged against the paper's "
        "full-dataset numbers: fasttts fig12 (first 2 problems)."
    ) in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert any("goodput gain" in ln and "| sim, first 2 problems |" in ln for ln in rows)
    assert any("speedup" in ln and "| sim |" in ln for ln in rows)


def test_a_reproduction_tracks_nothing_unless_asked(tmp_path, monkeypatch):
    """W&B is opt-in for harness.reproduce (issue 40): every experiment gets tracking=none unless the
    command chooses tracking itself. (Mutation caught: the overrides passed on as given.)"""
    seen = []

    def fake_run_all(names, results_dir, real, overrides, timeout):
        seen.append(overrides)
        raise KeyboardInterrupt  # stop before collecting

    monkeypatch.setattr(R, "run_all", fake_run_all)
    R.main(["--only", "lbs_fig7", "--results-dir", str(tmp_path)])
    R.main(["--only", "lbs_fig7", "--results-dir", str(tmp_path), "tracking=wandb"])
    R.main(["--only", "lbs_fig7", "--results-dir", str(tmp_path), "tracking.mode=online"])
    assert seen == [["tracking=none"], ["tracking=wandb"], ["tracking.mode=online"]]


def test_the_figure_page_puts_each_papers_figures_first_and_ad_hoc_sweeps_last(tmp_path):
    """index.html (issue 40): per paper its figures, then its numbers beside ours, then its tables;
    ad-hoc sweeps last; REPRODUCTION.md linked, not its 192-row table before any figure; tables in a
    scrolling box; a list after a paragraph line a list (was one paragraph); an infinite value of
    ours "not reached" (was "inf tokens/s"). Mutations caught: the old page (REPRODUCTION.md first,
    sweeps by name); _markdown_html without the blank line before lists; fmt_range without its
    infinite case."""
    _sweep(
        tmp_path, "beam_fig9", [V.Row("beam", "fig9", "load where all miss", 6400, ours=float("inf"), unit="tokens/s")]
    )
    _sweep(tmp_path, "lbs_fig9", [V.Row("lbs", "fig9", "speedup", 3.4, ours=3.5, unit="x")])
    (tmp_path / "sweeps/aaa_mine").mkdir()  # an ad-hoc sweep: a figure and a summary, no verdicts
    (tmp_path / "sweeps/aaa_mine/fig.png").write_bytes(b"\x89PNG\r\n")
    (tmp_path / "sweeps/lbs_fig9/notes.md").write_text("Notes:\n- first\n- second\n")
    R.write_reproduction(tmp_path, R.collect(tmp_path))
    page = R.write_index(tmp_path).read_text()
    at = {
        k: page.index(k)
        for k in (
            "sweeps/lbs_fig9/fig.png",
            "lbs: paper numbers beside ours",
            "lbs_fig9: tables",
            "sweeps/beam_fig9/fig.png",
            "beam: paper numbers beside ours",
            "Other sweeps (no paper experiment)",
            "sweeps/aaa_mine/fig.png",
        )
    }
    assert list(at.values()) == sorted(at.values()), at
    assert "<td>not reached</td>" in page and "inf" not in page
    assert "<ul>\n<li>first</li>" in page
    assert page.count("<div class='wide'><table>") == page.count("<table>") >= 4
    assert "href='REPRODUCTION.md'" in page and "Not run (" not in page
