"""An ad-hoc sweep (no experiment report) gets summary.md (+ a figure when a swept parameter is
numeric); runs.parquet carries the git SHA, dirty flag, config hash and overrides of every job; the
console names the report's files and lists no jobs up front.

Mutations caught: numeric sweep values sorted as text; overrides not recorded."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_adhoc_sweep_summary_and_runs_columns(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=lbs,layerwise",
            "beams=4,16",
            "gen_len=256",
            "tracking=none",
            f"results_dir={tmp_path}",
            "sweep_name=s",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    d = tmp_path / "sweeps" / "s"
    assert "report: summary.csv, summary.data.csv, summary.md, summary.pdf, summary.png, summary.tex in" in p.stdout
    assert "sweep: 4 jobs ->" in p.stdout and "#0 :" not in p.stdout  # no up-front job list
    md = (d / "summary.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| l")]
    assert [r.split("|")[1].strip() + r.split("|")[2].strip() for r in rows] == [
        "layerwise4",
        "layerwise16",
        "lbs4",
        "lbs16",
    ]
    runs = pd.read_parquet(d / "runs.parquet")
    assert runs["git_sha"].str.len().eq(40).all() and runs["config_hash"].str.len().eq(16).all()
    assert set(runs["overrides"].str.split().str[:2].str.join(" ")) == {
        "system=lbs beams=4",
        "system=lbs beams=16",
        "system=layerwise beams=4",
        "system=layerwise beams=16",
    }
    assert (d / "beams=4,gen_len=256,system=lbs" / "run.log").read_text().count("status=ok") == 1


def _runs():
    """Three systems x beams 4, 16, 64 as records: in_gpu ok only at 4 beams (the value the others
    share there), oom at 16 and 64."""
    rows = []
    for system, e2e in (
        ("in_gpu", (41.0, None, None)),
        ("layerwise", (41.0, 468.0, 4320.0)),
        ("lbs", (41.0, 88.0, 304.0)),
    ):
        for beams, v in zip((4, 16, 64), e2e):
            rows.append(
                {
                    "overrides": f"system={system} beams={beams}",
                    "status": "ok" if v else "oom",
                    "message": "" if v else f"in_gpu: KV of {beams} beams exceeds the KV budget",
                    "simulated": True,
                    "headline": "e2e_s",
                    "headline_label": "end-to-end latency",
                    "summary.e2e_s": v,
                }
            )
    return pd.DataFrame(rows)


def test_summary_figure_keeps_coinciding_points_visible_and_marks_failed_jobs(tmp_path):
    """At 4 beams all three systems share one value: each line has its own marker shape, drawn widest
    first (larger marker, lower zorder), so in_gpu's point is not hidden; its two oom jobs are 'x'
    markers on the x axis at 16 and 64 beams, labelled oom. Mutations caught: one marker size for
    all lines; the failed jobs not drawn."""
    import matplotlib

    matplotlib.use("Agg")
    from harness.sweep_summary import draw

    r = _runs()
    t = pd.DataFrame(
        {
            "system": r.overrides.str.split().str[0].str[7:],
            "beams": r.overrides.str.split().str[1].str[6:],
            "status": r.status,
            "source": "simulated",
            "e2e_s": r["summary.e2e_s"],
        }
    )
    ax = draw(t, "beams", ["system"], "e2e_s", "e2e", "s").axes[0]
    lines = {ln.get_label().split(" ")[0]: ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert list(lines) == ["system=in_gpu", "system=layerwise", "system=lbs"]
    sizes = [lines[k].get_markersize() for k in lines]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3
    assert len({lines[k].get_marker() for k in lines}) == 3
    z = [lines[k].get_zorder() for k in lines]
    assert z == sorted(z) and len(set(z)) == 3
    failed = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("failed:")]
    assert sorted(ln.get_xdata()[0] for ln in failed) == [16, 64]
    assert all(ln.get_color() == lines["system=in_gpu"].get_color() for ln in failed)
    assert [a.get_text() for a in ax.texts] == ["oom", "oom"]


def test_summary_md_lists_failed_jobs(tmp_path):
    """summary.md lists each job without a result with its swept values, status and message.
    Mutation caught: the list left out of the notes."""
    from harness.sweep_summary import write_summary

    write_summary(tmp_path, _runs())
    md = (tmp_path / "summary.md").read_text()
    assert "Jobs without a result (2; marked on the figure's x axis):" in md
    assert "- system=in_gpu, beams=16: oom: in_gpu: KV of 16 beams exceeds the KV budget" in md
    assert "- system=in_gpu, beams=64: oom:" in md and (tmp_path / "summary.png").exists()


def test_a_job_found_invalid_when_it_ran_is_a_named_row(tmp_path):
    """beam_width=3 with beams=4 is invalid only jointly: the sweeper checks a covering subset of jobs
    (each value once), the job itself refuses when it runs and is recorded as error. Its record names
    the job (``harness.run.error_record``): the summary's row has its swept values and says
    simulated, and no constant override becomes a column. Mutation caught: the record without top-level
    overrides and backend (the row was all nan, 'measured', and tracking/progress/... became columns)."""
    p = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=lbs",
            "workload.beam_width=2,3",
            "beams=4,6",
            "tracking=none",
            "progress=false",
            f"results_dir={tmp_path}",
            "sweep_name=s",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1 and "1 job(s) with status error" in p.stderr, p.stderr[-2000:]
    md = (tmp_path / "sweeps" / "s" / "summary.md").read_text()
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in md.splitlines() if ln.startswith("|")]
    assert rows[0] == ["workload.beam_width", "beams", "status", "source", "e2e_s"]
    assert [r[:4] for r in rows[2:]] == [
        ["2", "4", "ok", "simulated"],
        ["2", "6", "ok", "simulated"],
        ["3", "4", "error", "simulated"],
        ["3", "6", "ok", "simulated"],
    ]
    assert "- workload.beam_width=3, beams=4: error: invalid configuration: beams=4 is not allowed" in md


def test_summary_figure_title_says_simulated_and_the_axis_its_unit(tmp_path, monkeypatch):
    """The ad-hoc sweep's figure: its title names the source of its points (as every report's) and
    the y axis the headline's unit from its key (e2e_s: s). Mutations caught: the title without the
    source (a newcomer's report: only the legend said "(sim)"); "SI units" instead of the unit."""
    import harness.sweep_summary as S

    seen = {}
    real = S.draw
    monkeypatch.setattr(S, "draw", lambda *a: seen.update(args=a) or real(*a))
    S.write_summary(tmp_path, _runs())
    *_, ylabel, title = seen["args"]
    assert title == f"sweep {tmp_path.name} (simulated)"
    assert ylabel == "end-to-end latency (e2e_s, s)"
    mixed = _runs().assign(simulated=[True] * 8 + [False])
    S.write_summary(tmp_path, mixed)
    assert seen["args"][-1] == f"sweep {tmp_path.name} (simulated and measured: each value labelled)"
    assert S.unit_of("precise_goodput_tok_s") == "precise_goodput_tok_s, tok/s" and S.unit_of("speedup") == "speedup"


def test_a_figure_interrupted_while_written_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    """Ctrl-C during a sweep's report left a 124-byte png (QA): figures, markdown and verdicts.csv are
    written whole or not at all. Mutation caught: savefig straight into the file (the old png
    truncated to what was written before the interrupt)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from harness.report import save_figure

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    before = {p.name: p.read_bytes() for p in save_figure(fig, tmp_path, "f").values()}
    real = Figure.savefig

    def interrupted(self, fname, *a, **k):
        if hasattr(fname, "write"):
            fname.write(b"\x89PNG partial")
        else:
            open(fname, "wb").write(b"\x89PNG partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", interrupted)
    fig2, ax2 = plt.subplots()
    with pytest.raises(KeyboardInterrupt):
        save_figure(fig2, tmp_path, "f")
    monkeypatch.setattr(Figure, "savefig", real)
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.data.csv", "f.pdf", "f.png"]  # no temp file left


def test_every_saved_figure_has_the_numbers_it_draws_beside_it(tmp_path):
    """save_figure writes ``<name>.data.csv``: one row per point drawn (lines, bars with their bottom,
    scatter points), its axes' labels and the category name under a bar; error-bar caps left out.
    Mutations caught: the CSV not written; bar heights taken from y (the bottom) instead of the
    height; error-bar caps kept as lines (2 extra rows per point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from harness.report import save_figure

    fig, (a, b) = plt.subplots(1, 2)
    a.plot([4, 16], [2.5, 7.0], label="lbs")
    a.errorbar([4, 16], [1.0, 3.0], yerr=[0.1, 0.2], label="layerwise", capsize=2)
    a.set_xlabel("beams")
    a.set_ylabel("latency (s)")
    b.bar([0, 1], [3.0, 5.0], bottom=[1.0, 0.0], label="decode")
    b.set_xticks([0, 1], ["opt-6.7b", "llama-2-7b"])
    b.scatter([0.5], [9.0], label="paper")
    paths = save_figure(fig, tmp_path, "fig")
    assert paths["csv"] == tmp_path / "fig.data.csv"
    df = pd.read_csv(paths["csv"])
    lines = df[df.kind == "line"]
    assert lines[["series", "x", "y"]].values.tolist() == [
        ["lbs", 4, 2.5],
        ["lbs", 16, 7.0],
        ["layerwise", 4, 1.0],
        ["layerwise", 16, 3.0],
    ]
    assert set(lines.xlabel) == {"beams"} and set(lines.ylabel) == {"latency (s)"}
    bars = df[df.kind == "bar"]
    assert bars[["series", "x", "x_label", "y", "bottom"]].values.tolist() == [
        ["decode", 0, "opt-6.7b", 3.0, 1.0],
        ["decode", 1, "llama-2-7b", 5.0, 0.0],
    ]
    assert df[df.kind == "scatter"][["axes", "series", "x", "y"]].values.tolist() == [[1, "paper", 0.5, 9.0]]
