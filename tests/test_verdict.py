"""harness.verdict: the one rule that says whether ours reproduces a paper number.

Mutations caught: tolerance relative to ours instead of the paper's value (asymmetric cases below);
a bound checked the wrong way round; a range compared by one end only."""
import pytest

from harness.verdict import Row, verdict


@pytest.mark.parametrize("ours,paper,kind,ours_hi,paper_hi,expected", [
    (1.0, 1.0, "=", None, None, "reproduced"),
    (1.15, 1.0, "=", None, None, "reproduced"),          # +15 % of the paper's value
    (0.86, 1.0, "=", None, None, "reproduced"),
    (1.16, 1.0, "=", None, None, "partly"),
    (0.5, 1.0, "=", None, None, "not reproduced"),
    (0.97, 0.86, "=", None, None, "reproduced"),         # Fig.11 layer-wise I/O share 97 % vs 86 %: 12.8 % off
    (0.06, 0.10, "=", None, None, "not reproduced"),     # Fig.11 LBS I/O share 6 % vs 10 %
    (0.564, 0.55, ">=", None, None, "reproduced"),       # Fig.4 KV share > 55 %
    (0.40, 0.55, ">=", None, None, "not reproduced"),
    (0.012, 0.02, "<=", None, None, "reproduced"),
    (5.26, 3.39, "range", 14.55, 9.72, "partly"),        # Fig.9 OPT-6.7B speedup range
    (3.5, 3.39, "range", 9.0, 9.72, "reproduced"),
    (20.0, 3.39, "range", 30.0, 9.72, "not reproduced"),
    (5.0, 3.39, "range", None, 9.72, "reproduced"),      # a point inside the paper's range
    (None, 1.0, "=", None, None, "no result"),
    (float("nan"), 1.0, "=", None, None, "no result"),
])
def test_verdict(ours, paper, kind, ours_hi, paper_hi, expected):
    assert verdict(ours, paper, kind, ours_hi, paper_hi) == expected


def test_bad_kind_and_missing_range_end():
    with pytest.raises(ValueError, match="kind"):
        verdict(1.0, 1.0, "~")
    with pytest.raises(ValueError, match="paper_hi"):
        verdict(1.0, 1.0, "range")


def test_row_computes_its_verdict():
    r = Row("lbs", "fig10", "inter-token volume, step 32", 0.037, ours=0.0379, unit="fraction")
    assert r.verdict == "reproduced"


def test_in_setting_keeps_the_papers_setting_and_says_what_is_missing():
    """harness.paper.in_setting: the rows at a paper number's setting (numbers, byte sizes, a device
    list agree); none left: the note names the paper's values and this sweep's, ordered as numbers and
    sizes in GiB (QA: 'beams=16,4', 'kv_budget=4294967296'). (Mutations caught: sorted as text; bytes
    shown raw; a size compared as text.)"""
    import pandas as pd

    from harness.paper import PaperNumber, in_setting
    n = PaperNumber("lbs", "fig7", "h2d_gib", (("beams", "64"), ("kv_budget", "7GiB"), ("hardware", "a,b")),
                    "=", 1.0, None, "GiB", "", "volume")
    setting = {"beams": "beams", "kv_budget": "kv_budget_bytes", "hardware": "hardware"}
    d = pd.DataFrame({"beams": [16, 4, 64], "kv_budget_bytes": [4 << 30, 4 << 30, 7 << 30], "hardware": ["b"] * 3})
    rows, why = in_setting(n, d, setting)
    assert list(rows.index) == [2] and why == ""
    rows, why = in_setting(n, d.iloc[:2], setting)
    assert rows.empty
    assert why == "no run at the paper's setting (beams=64, kv_budget=7GiB); this sweep has beams=4,16; kv_budget=4GiB"
