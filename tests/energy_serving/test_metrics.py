"""Serving summaries computed in fewer passes give the values of the plain computation."""

import numpy as np

from systems.energy_serving.metrics import _pcts, prediction_error


def test_percentiles_in_one_call_equal_one_call_each():
    """Mutation caught: the finite filter dropped (an inf moves P99, a NaN makes every value NaN)."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.exponential(0.05, 20001), [np.inf, np.nan, np.inf]])
    rng.shuffle(x)
    finite = x[np.isfinite(x)]
    want = [float(np.percentile(finite, q)) for q in (50, 90, 99)]
    assert [v.hex() for v in _pcts(x, (50, 90, 99))] == [v.hex() for v in want]
    assert _pcts(np.array([np.nan, np.inf]), (50, 99)) == [None, None]


def test_predicted_tbt_error_does_not_depend_on_the_order_gaps_arrive_in():
    """The TBT MAPE takes the token gaps in time order; gaps given in time order skip the sort.
    Mutation caught: gaps out of time order taken as they come (no sort)."""
    rng = np.random.default_rng(5)
    n_dec, n_gaps = 40, 3000
    t = np.sort(rng.uniform(0, 100, n_dec))
    dec = {
        "time_s": t,
        "trigger": np.array(["arrival", "finish", "decode"])[rng.integers(0, 3, n_dec)],
        "request": rng.integers(0, 10, n_dec),
        "pred_ttft_s": np.where(rng.uniform(size=n_dec) < 0.5, 0.3, np.nan),
        "pred_tbt_s": rng.uniform(0.02, 0.1, n_dec),
    }
    req = {"ttft_s": rng.uniform(0.1, 1.0, 10)}
    gap_times = np.sort(rng.uniform(0, 100, n_gaps))
    gaps = rng.exponential(0.05, n_gaps)
    want = prediction_error(req, dec, gaps, gap_times)
    assert want["pred_tbt_mape_pct"] is not None and want["pred_ttft_mape_pct"] is not None
    perm = rng.permutation(n_gaps)
    assert prediction_error(req, dec, gaps[perm], gap_times[perm]) == want


def test_decisions_count_only_hooks_that_decided(compose_cfg, tmp_path):
    """The decision log holds every controller call; vanilla's hooks and Window-DVFS's arrival hook
    decide nothing. ``summary.decisions`` counts the rows with a decision and the decision times are
    theirs only (vanilla: 0 decisions, no decision time; Window-DVFS: its ticks). (Mutations caught:
    every logged call counted (vanilla 4303 in the stored summaries); percentiles over every call.)"""
    import pandas as pd

    from harness.run import run
    from systems.energy_serving.metrics import _pct

    for system in ("vanilla", "window_dvfs"):
        rec = run(
            compose_cfg(f"system={system}", "workload=poisson", "workload.duration_s=20", output_dir=tmp_path / system)
        )
        dec = pd.read_parquet(tmp_path / system / "decisions.parquet")
        decided = dec[dec.chunk.notna()]
        s = rec["summary"]
        assert len(dec) > len(decided) and s["decisions"] == len(decided)
        if system == "vanilla":
            assert s["decisions"] == 0 and s["decision_us_p50"] is None
        else:
            assert set(decided.trigger) == {"tick"} and s["decisions"] > 0
            assert s["decision_us_p99"] == _pct(decided.decision_us.to_numpy(float), 99)


def test_measured_rows_of_a_simulated_run_say_measured():
    """The run table's value column says '(simulated)' for a simulated run; the decision times in it
    are wall-clock on this machine, so their rows say so (QA). Mutation caught: the label back."""
    from systems.energy_serving.build import display_rows

    labels = [label for label, key, _ in display_rows() if key.startswith("decision_us")]
    assert len(labels) == 2 and all("(measured, wall-clock here)" in x for x in labels)
