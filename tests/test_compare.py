"""harness.compare: two runs or sweeps side by side, jobs matched by overrides minus paths (then by
config hash), every summary key judged by harness/verdict.py's rule with A as the reference; exit 0
all the same, 1 something differs or is on one side only, 2 bad input (one line, no traceback)."""

import json

import pandas as pd
import pytest

from harness import compare as C
from harness.records import config_hash


def _record(d, overrides, summary, simulated=True, status="ok", chash=None):
    d.mkdir(parents=True, exist_ok=True)
    rec = {
        "overrides": overrides,
        "config_hash": chash or "h-" + "-".join(sorted(overrides)),
        "backend": {"simulated": simulated},
        "status": status,
        "summary": summary,
    }
    (d / "run.json").write_text(json.dumps(rec))
    return d


def _sweep(root, name, jobs, simulated=True):
    """jobs: {swept overrides (tuple): summary}; each job's command line also names its own paths."""
    for ovr, summary in jobs.items():
        paths = [f"results_dir={root}", f"sweep_name={name}", "tracking=none"]
        _record(root / name / ",".join(ovr), [*ovr, *paths], summary, simulated, chash="h" + ",".join(ovr))
    return root / name


def _run(capsys, *argv):
    rc = C.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_same_sweeps_in_other_folders_match_and_exit_0(tmp_path, capsys):
    """Jobs of two sweeps run into other folders pair up by their overrides minus the paths; values
    within tolerance exit 0, with B - A and (B - A)/|A| in the table.
    Mutation caught: match_key keeping the bookkeeping keys (results_dir=..., sweep_name=...): nothing
    matches, exit 2."""
    jobs_a = {("system=lbs", "beams=4"): {"e2e_s": 100.0, "steps": 60}, ("system=lbs", "beams=8"): {"e2e_s": 50.0}}
    jobs_b = {("beams=4", "system=lbs"): {"e2e_s": 110.0, "steps": 60}, ("beams=8", "system=lbs"): {"e2e_s": 50.0}}
    a, b = _sweep(tmp_path / "ra", "a", jobs_a), _sweep(tmp_path / "rb", "b", jobs_b)
    csv = tmp_path / "out" / "cmp.csv"
    rc, out, err = _run(capsys, a, b, "--csv", csv)
    assert (rc, err) == (0, "")
    t = pd.read_csv(csv)
    row = t[(t["job"] == "beams=4 system=lbs") & (t["metric"] == "e2e_s")].iloc[0]
    assert (row["a"], row["b"], row["delta"], round(row["rel_delta"], 6), row["same"]) == (
        "100.0",
        "110.0",
        10.0,
        0.1,
        True,
    )
    assert sorted(set(t["job"])) == ["beams=4 system=lbs", "beams=8 system=lbs"]
    assert "2 job(s) matched, 0 only in A, 0 only in B; 5 of 5 values the same within tolerance, 0 differ" in out
    assert "+10.00 %" in out and "both SIMULATED" in out


def test_tolerance_is_the_verdict_rule_with_a_as_reference(tmp_path, capsys):
    """B = 117 against A = 100 differs (17 % of A); 114 is the same; the row says NO and exit is 1.
    Mutation caught: the rule judged relative to B (verdict(A, B): 17/117 = 14.5 %, "same")."""
    a = _record(tmp_path / "a", ["beams=4"], {"e2e_s": 100.0, "tok_s": 10.0})
    b = _record(tmp_path / "b", ["beams=4"], {"e2e_s": 117.0, "tok_s": 11.4})
    csv = tmp_path / "c.csv"
    rc, out, _ = _run(capsys, a, b, "--csv", csv)
    t = pd.read_csv(csv).set_index("metric")
    assert rc == 1
    assert bool(t.loc["e2e_s", "same"]) is False and bool(t.loc["tok_s", "same"]) is True
    assert t.loc["e2e_s", "rel_delta"] == pytest.approx(0.17)
    assert "2 of 3 values the same within tolerance, 1 differ" in out


def test_an_attainment_is_judged_in_percentage_points(tmp_path):
    """An SLO attainment of 0.95 against 0.93 is the same (2 pp), against 0.91 not (4 pp), though
    0.91 is within 15 % of 0.95. Mutation caught: the ``*_attainment`` branch dropped (relative rule)."""
    assert C.same_value("slo_ttft_attainment", 0.95, 0.93) is True
    assert C.same_value("slo_ttft_attainment", 0.95, 0.91) is False
    assert C.same_value("e2e_s", 0.95, 0.91) is True
    assert C.same_value("energy_source", "model at 2,520 MHz", "model at 1,980 MHz") is False
    assert C.same_value("other_s", 0.0, 0.0) is True and C.same_value("x", None, 1.0) is False


def test_a_simulated_job_against_a_measured_one_exits_2_in_one_line(tmp_path, capsys):
    """Mixed sources are refused: a 15 % agreement of the simulator with a real engine is fidelity,
    not the same result. Mutation caught: check_sources not called (exit 0, "same")."""
    a = _record(tmp_path / "a", ["beams=4"], {"e2e_s": 100.0}, simulated=True)
    b = _record(tmp_path / "b", ["beams=4"], {"e2e_s": 100.0}, simulated=False)
    rc, out, err = _run(capsys, a, b)
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("error: 'beams=4' is simulated in A")
    assert "and measured in B" in err and "Traceback" not in err


@pytest.mark.parametrize("case", ["missing", "empty", "duplicate", "nomatch", "badjson"])
def test_bad_input_exits_2_in_one_line(tmp_path, capsys, case):
    """A missing folder, a folder with no record, one side with two jobs of one match key, no job in
    common, an unreadable run.json: exit 2, one line. Mutation caught: the duplicate check dropped
    (a dict keeps the last job silently, exit 0)."""
    good = _record(tmp_path / "good" / "j", ["beams=4"], {"e2e_s": 1.0}).parent
    other = tmp_path / "other"
    if case == "empty":
        other.mkdir()
    elif case == "duplicate":
        _record(other / "x1", ["beams=4", "results_dir=/x"], {"e2e_s": 1.0})
        _record(other / "x2", ["beams=4", "results_dir=/y"], {"e2e_s": 1.0})
    elif case == "nomatch":
        _record(other / "j", ["beams=8"], {"e2e_s": 1.0})
    elif case == "badjson":
        (other / "j").mkdir(parents=True)
        (other / "j" / "run.json").write_text("{not json")
        other = other / "j"
    rc, out, err = _run(capsys, good, other)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ")
    expect = {
        "missing": "no such folder",
        "empty": "no record",
        "duplicate": "B holds two jobs with the overrides 'beams=4'",
        "nomatch": "no job of A (1) matches one of B (1)",
        "badjson": "not a readable record",
    }[case]
    assert expect in err


def test_jobs_on_one_side_are_listed_and_exit_1(tmp_path, capsys):
    """A job only in A and one only in B are named with their folders; the rest still compared.
    Mutation caught: the exit status ignoring jobs on one side only (exit 0)."""
    a = _sweep(tmp_path, "a", {("beams=4",): {"e2e_s": 1.0}, ("beams=8",): {"e2e_s": 2.0}})
    b = _sweep(tmp_path, "b", {("beams=4",): {"e2e_s": 1.0}, ("beams=16",): {"e2e_s": 3.0}})
    rc, out, _ = _run(capsys, a, b)
    assert rc == 1
    assert f"only in A: the job ({a / 'beams=8'})" in out and f"only in B: the job ({b / 'beams=16'})" in out
    assert "1 job(s) matched, 1 only in A, 1 only in B; 2 of 2 values the same" in out


def test_a_key_on_one_side_and_a_status_that_differs(tmp_path):
    """A summary key recorded by one side only, and ok against oom, differ. Mutation caught: the
    status row left out (ok vs oom compared as the same)."""
    a = _record(tmp_path / "a", ["beams=4"], {"e2e_s": 1.0, "old": 1})
    b = _record(tmp_path / "b", ["beams=4"], {"e2e_s": 1.0}, status="oom")
    ja, _ = C.load_jobs(a)
    jb, _ = C.load_jobs(b)
    t = C.compare(*C.match(ja, jb, single=True)).set_index("metric")
    assert list(t.index) == ["status", "e2e_s", "old"]
    assert t.loc["old", "note"] == "only in A" and not t.loc["old", "same"]
    assert not t.loc["status", "same"] and t.loc["e2e_s", "same"]


def test_ignore_and_config_hash_pair_jobs_whose_overrides_differ(tmp_path):
    """--ignore hardware pairs an A100 sweep's jobs with an H100 one's; a job whose overrides differ
    but whose config hash is the same (beams=4 given or left at its default) pairs by hash.
    Mutation caught: the config-hash pass dropped (the job listed on each side)."""
    a = _sweep(tmp_path, "a", {("hardware=a100", "beams=8"): {"e2e_s": 1.0}})
    b = _sweep(tmp_path, "b", {("hardware=h100", "beams=8"): {"e2e_s": 1.0}})
    pairs, only_a, only_b = C.match(C.load_jobs(a, ["hardware"])[0], C.load_jobs(b, ["hardware"])[0], False)
    assert [(x.key, y.key) for x, y in pairs] == [("beams=8", "beams=8")] and not only_a and not only_b
    _record(tmp_path / "c" / "j", ["beams=4"], {"e2e_s": 1.0}, chash="same")
    _record(tmp_path / "d" / "j", [], {"e2e_s": 1.0}, chash="same")
    pairs, only_a, only_b = C.match(C.load_jobs(tmp_path / "c")[0], C.load_jobs(tmp_path / "d")[0], False)
    assert [(x.key, y.key) for x, y in pairs] == [("beams=4", "")] and not only_a and not only_b


def test_a_sweep_with_only_its_runs_parquet(tmp_path, capsys):
    """A sweep folder holding runs.parquet alone (the job folders not copied) is read from it, its
    text-written cells ("None") read back as missing. Mutation caught: the runs.parquet branch
    dropped (exit 2, no record)."""
    a = _sweep(tmp_path, "a", {("beams=4",): {"e2e_s": 2.0, "why": None}})
    b = tmp_path / "b"
    b.mkdir()
    pd.DataFrame(
        [
            {
                "status": "ok",
                "simulated": True,
                "config_hash": "x",
                "overrides": f"beams=4 results_dir={tmp_path} sweep_name=b",
                "summary.e2e_s": 2.1,
                "summary.why": "None",
            }
        ]
    ).to_parquet(b / "runs.parquet")
    rc, out, err = _run(capsys, a, b)
    assert (rc, err) == (0, "")
    assert "1 job(s) matched, 0 only in A, 0 only in B; 3 of 3 values the same" in out


def test_bookkeeping_keys_are_those_the_config_hash_leaves_out():
    """Every key left out of the match is one records.config_hash leaves out, and a real setting is
    not. Mutation caught: a setting (seed) added to BOOKKEEPING: two seeds would pair as one job."""
    base = {"beams": 4, "seed": 0}
    for k in C.BOOKKEEPING:
        assert config_hash({**base, k: "x"}) == config_hash(base), k
    assert config_hash({**base, "seed": 1}) != config_hash(base)
    assert C.match_key(["seed=1", "+tracking.mode=x", "hydra.launcher.n_jobs=2", "beams=4"]) == "beams=4 seed=1"
