"""Serving summaries computed in fewer passes give the values of the plain computation."""
import numpy as np

from systems.serving.metrics import _pcts, prediction_error


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
    dec = {"time_s": t, "trigger": np.array(["arrival", "finish", "decode"])[rng.integers(0, 3, n_dec)],
           "request": rng.integers(0, 10, n_dec), "pred_ttft_s": np.where(rng.uniform(size=n_dec) < 0.5, 0.3, np.nan),
           "pred_tbt_s": rng.uniform(0.02, 0.1, n_dec)}
    req = {"ttft_s": rng.uniform(0.1, 1.0, 10)}
    gap_times = np.sort(rng.uniform(0, 100, n_gaps))
    gaps = rng.exponential(0.05, n_gaps)
    want = prediction_error(req, dec, gaps, gap_times)
    assert want["pred_tbt_mape_pct"] is not None and want["pred_ttft_mape_pct"] is not None
    perm = rng.permutation(n_gaps)
    assert prediction_error(req, dec, gaps[perm], gap_times[perm]) == want
