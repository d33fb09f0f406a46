"""harness.reproduce: REPRODUCTION.md counts and rows come from the sweeps' verdicts.csv files,
index.html shows every figure and table; a bad --only exits 2."""
from harness import reproduce as R
from harness import verdict as V


def _sweep(root, name, rows, png=True):
    d = root / "sweeps" / name
    V.write(d, rows)
    (d / "table.md").write_text("# t\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    if png:
        (d / "fig.png").write_bytes(b"\x89PNG\r\n")


def test_pages_from_verdicts(tmp_path):
    _sweep(tmp_path, "lbs_fig9", [V.Row("lbs", "fig9", "speedup OPT-6.7B", 3.39, "range", 9.72, ours=5.26, ours_hi=14.55,
                                        unit="x", source="fig9.png")])
    _sweep(tmp_path, "beam_fig7", [V.Row("beam", "fig7", "energy vs vanilla", 0.49, ours=0.496, unit="fraction"),
                                   V.Row("beam", "fig7", "TTFT attainment", 0.949, ours=None)], png=False)
    v = R.collect(tmp_path)
    assert list(v["sweep"]) == ["beam_fig7", "beam_fig7", "lbs_fig9"]      # by paper, then figure
    assert list(v["verdict"]) == ["reproduced", "no result", "partly"]
    md = R.write_reproduction(tmp_path, v).read_text()
    assert "**1 reproduced, 1 partly, 0 not reproduced, 1 no result** of 3 paper numbers." in md
    assert "| lbs | fig9 | speedup OPT-6.7B | 5.26-14.6 x | 3.39-9.72 x | partly | sim | [fig9.png](sweeps/lbs_fig9/fig9.png) |" in md
    page = R.write_index(tmp_path).read_text()
    assert "sweeps/lbs_fig9/fig.png" in page and "<table>" in page and "beam_fig7" in page


def test_bad_only_exits_2(capsys):
    assert R.main(["--only", "lbs_fig99", "--collect-only"]) == 2
    assert "not a paper experiment" in capsys.readouterr().err


def test_rows_in_natural_figure_order(tmp_path):
    for name, fig in (("lbs_fig10", "fig10"), ("lbs_3080ti", "3080ti"), ("lbs_fig4", "fig4")):
        _sweep(tmp_path, name, [V.Row("lbs", fig, "q", 1.0, ours=1.0)], png=False)
    assert list(R.collect(tmp_path)["figure"]) == ["3080ti", "fig4", "fig10"]
