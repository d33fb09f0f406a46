"""Every report table written as <name>.md is also written as <name>.tex (booktabs), holding the same
cells: read back (LaTeX escapes undone), the .tex gives the .md's header and rows, cell for cell, for
a plain table, for a table of a report run once per repeat (cells mean ± half width), and for every
table of a real paper experiment's report."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.report import gather_runs, run_report, write_markdown

ROOT = Path(__file__).resolve().parent.parent
# tabulate's LaTeX escapes, undone longest first
_UNESCAPE = [
    (r"\textbackslash{}", "\\"),
    (r"\textasciitilde{}", "~"),
    (r"\ensuremath{<}", "<"),
    (r"\ensuremath{>}", ">"),
    (r"\^{}", "^"),
    (r"\&", "&"),
    (r"\%", "%"),
    (r"\$", "$"),
    (r"\#", "#"),
    (r"\_", "_"),
    (r"\{", "{"),
    (r"\}", "}"),
]


def md_cells(text: str):
    """Header and rows of the markdown (pipe) table in ``text``."""
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    rows = [r for r in rows if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", r)]  # the alignment line
    return [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]


def tex_cells(text: str):
    """Header and rows of the booktabs tabular in ``text``, LaTeX escapes undone."""
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if not ln.endswith(r"\\"):
            continue
        cells = re.split(r"(?<!\\)&", ln[:-2])
        row = []
        for c in cells:
            c = c.strip()
            for esc, ch in _UNESCAPE:
                c = c.replace(esc, ch)
            row.append(c)
        out.append(row)
    return out


def test_a_table_with_latex_special_characters_reads_back_cell_for_cell(tmp_path):
    """Numbers in the markdown's format (,.4g), text with & % _ $ # escaped, a missing value; title
    and notes as comments. Mutation caught: pandas' to_latex for the .tex (its own number format:
    1234567.891 as 1234567.891000, not 1.235e+06)."""
    df = pd.DataFrame(
        {
            "system_name": ["lbs & co", "in_gpu 50%", "$x #1"],
            "e2e_s": [1234567.891, 0.000123456, np.nan],
            "speedup": ["2.31x", "1.5 ± 0.2", "n/a"],
            "beams": [4, 16, 64],
        }
    )
    md = write_markdown(df, tmp_path / "t.md", title="Fig. 9 (simulated)", notes="one row\nper job")
    tex = (tmp_path / "t.tex").read_text()
    assert tex_cells(tex) == md_cells(md.read_text())
    assert tex_cells(tex)[1] == ["lbs & co", "1.235e+06", "2.31x", "4"]
    assert tex.startswith("% Fig. 9 (simulated)\n% needs \\usepackage{booktabs}\n\\begin{tabular}{lrlr}\n")
    assert tex.endswith("\\end{tabular}\n% one row\n% per job\n")
    assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex


def _fake_job(d: Path, system: str, values):
    """A job record with one repeat per value of summary.t (what harness.run writes)."""
    d.mkdir(parents=True)
    reps = [
        {"repeat": i, "seed": i, "dir": "." if i == 0 else f"repeat-{i}", "status": "ok", "summary": {"t": v}}
        for i, v in enumerate(values)
    ]
    rec = {
        "status": "ok",
        "system": system,
        "backend": {"simulated": True},
        "config": {"repeats": len(values)},
        "summary": {"t": float(np.mean(values))},
        "repeat_runs": reps,
    }
    (d / "run.json").write_text(json.dumps(rec))


def _ratio_report(sweep_dir, runs, cfg):
    t = runs.set_index("system")["summary.t"]
    tab = pd.DataFrame({"system": ["b_1"], "speedup": [t["a"] / t["b"]], "paper": [2.0]})
    write_markdown(tab, Path(sweep_dir) / "r.md", title="ratio")


def test_a_report_run_per_repeat_writes_the_intervals_in_both_files(tmp_path):
    """With repeats the .md's cells are mean ± half width over the repeats; the .tex holds the
    same. Mutation caught: the .tex written from the table write_markdown was given (the last,
    mean-summary pass: 2.8 without ±) instead of the combined one."""
    _fake_job(tmp_path / "a", "a", [2.0, 4.0, 8.0])
    _fake_job(tmp_path / "b", "b", [1.0, 2.0, 2.0])
    run_report(_ratio_report, tmp_path, gather_runs(tmp_path), None)
    md, tex = (tmp_path / "r.md").read_text(), (tmp_path / "r.tex").read_text()
    assert tex_cells(tex) == md_cells(md)
    assert tex_cells(tex)[1][0] == "b_1" and tex_cells(tex)[1][1].startswith("2.667 ± ")
    assert "% Mean over 3 repeats" in tex


def test_every_table_of_a_paper_report_has_its_tex_twin(tmp_path):
    """A real experiment (LBS Fig. 4, 5 simulated jobs, ~4 s): each .md has a .tex with the same
    cells, the paper numbers' table in the notes included. Mutation caught: the notes' tables left
    as comments (the .tex without the verdicts)."""
    p = subprocess.run(
        [sys.executable, "run.py", "-m", "experiment=lbs_fig4", f"results_dir={tmp_path}", "tracking=none"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    mds = sorted((tmp_path / "sweeps" / "lbs_fig4").glob("*.md"))
    assert [m.name for m in mds] == ["fig4.md"]
    for m in mds:
        cells = md_cells(m.read_text())
        assert len(cells) == 11 and tex_cells(m.with_suffix(".tex").read_text()) == cells  # 1 + 5 jobs, 1 + 4 verdicts
        assert cells[6] == ["paper number", "ours", "paper", "verdict", "ours is", "note"]


@pytest.mark.parametrize("empty", [pd.DataFrame(), pd.DataFrame(columns=["a", "b"])])
def test_an_empty_table_says_so_in_both(tmp_path, empty):
    write_markdown(empty, tmp_path / "e.md", title="none")
    assert "(no rows)" in (tmp_path / "e.md").read_text()
    assert (tmp_path / "e.tex").read_text() == "% none\n% needs \\usepackage{booktabs}\n% (no rows)\n"
