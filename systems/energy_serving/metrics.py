"""Serving metrics shared by the simulator and the real engine: TTFT/TBT percentiles, SLO
attainment, energy, decision time and the predictor's error (BEAM Tab. 1).

Definitions: TTFT = first token time - arrival; TBT = gap between consecutive tokens of a request.
TTFT attainment = share of requests with TTFT <= SLO (unfinished requests miss); TBT attainment =
share of requests whose mean TBT (TPOT) <= SLO (requests with one output token meet it);
``slo_tbt_token_attainment`` = share of all token gaps <= SLO.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from systems.energy_serving.driver import Columns


def _pct(x: np.ndarray, q: float) -> Optional[float]:
    return _pcts(x, (q,))[0]


def _pcts(x: np.ndarray, qs) -> list:
    """Percentiles ``qs`` of the finite values of ``x`` (None each when there is none), from one
    filtered copy and one partition (the same values as one ``np.percentile`` call per q)."""
    x = x[np.isfinite(x)]
    return [float(v) for v in np.percentile(x, list(qs))] if len(x) else [None] * len(qs)


def _given(col: np.ndarray) -> np.ndarray:
    """Where a column holds a value (not NaN; not None in a column of objects)."""
    if col.dtype == object:
        return np.array([v is not None and v == v for v in col.tolist()], dtype=bool)
    return ~np.isnan(col.astype(float))


def prediction_error(req: Columns, dec: Columns, gaps: np.ndarray, gap_times: np.ndarray) -> Dict[str, Any]:
    """MAPE (%) of the controller's predictions against what happened.

    TTFT: decisions at a request's arrival predict its TTFT. TBT: S2 decisions (no TTFT predicted)
    predict the TBT of the tokens emitted until the next decision (their mean gap).
    """
    out: Dict[str, Any] = {"pred_ttft_mape_pct": None, "pred_tbt_mape_pct": None}
    if not len(dec["time_s"]):
        return out
    trigger, has_ttft = dec["trigger"], _given(dec["pred_ttft_s"])
    a = (trigger == "arrival") & has_ttft & (dec["request"] >= 0)
    if a.any():
        actual = req["ttft_s"][dec["request"][a].astype(int)]
        pred = dec["pred_ttft_s"][a].astype(float)
        ok = np.isfinite(actual) & (actual > 0)
        if ok.any():
            out["pred_ttft_mape_pct"] = float(100 * np.mean(np.abs(pred[ok] - actual[ok]) / actual[ok]))
    s2 = _given(dec["pred_tbt_s"]) & ~has_ttft & (trigger != "tick")
    if s2.any() and len(gaps):
        if (gap_times[1:] >= gap_times[:-1]).all():  # the driver emits them in time order
            gt, gv = gap_times, gaps
        else:
            order = np.argsort(gap_times, kind="stable")
            gt, gv = gap_times[order], gaps[order]
        t = dec["time_s"]
        s2_t = t[s2]
        idx = np.searchsorted(t, s2_t, side="right")
        t_next = np.append(t, np.inf)[idx]
        lo = np.searchsorted(gt, s2_t, side="left")
        hi = np.searchsorted(gt, t_next, side="left")
        cs = np.concatenate([[0.0], np.cumsum(gv)])
        n = hi - lo
        ok = n > 0
        if ok.any():
            mean = (cs[hi[ok]] - cs[lo[ok]]) / n[ok]
            out["pred_tbt_mape_pct"] = float(
                100 * np.mean(np.abs(dec["pred_tbt_s"][s2].astype(float)[ok] - mean) / mean)
            )
    return out


VLLM_PERCENTILES = (99,)  # vllm bench serve's default --metric-percentiles


def vllm_bench_metrics(
    req: Dict[str, np.ndarray], itls: np.ndarray, duration_s: float, slo_ttft_s: float, slo_tpot_s: float
) -> Dict[str, Any]:
    """The result keys of ``vllm bench serve`` (``vllm/benchmarks/serve.py``, ``calculate_metrics``),
    in its units (milliseconds, per second), computed from our per-request arrays, so that a serving
    run compares with a vLLM benchmark number for number. Per completed request: TTFT; E2EL (finish
    minus arrival); TPOT = (E2EL - TTFT) / (output tokens - 1) for requests of more than one output
    token; ITL: every gap between two tokens of a request (pooled: our "TBT" percentiles are these).
    ``request_goodput``: completed requests per second that meet every SLO jointly (TTFT <= slo_ttft,
    TPOT <= slo_tpot; a one-token request has no TPOT and passes it, as vLLM counts it).
    Means, medians, standard deviations (population, numpy's) and the p99 of each; 0 when empty, as
    vLLM writes them. ``duration`` is the run's makespan (s)."""
    done = np.isfinite(req["finish_s"].astype(float))
    ttft = req["ttft_s"].astype(float)[done]
    e2el = (req["finish_s"].astype(float) - req["arrival_s"].astype(float))[done]
    out = req["generated"].astype(float)[done]
    many = out > 1
    tpot = np.where(many, (e2el - ttft) / np.maximum(out - 1, 1), 0.0)
    good = (ttft <= slo_ttft_s) & (tpot <= slo_tpot_s)
    dur = float(duration_s)
    total_in = int(req["input_len"][done].sum())
    total_out = int(out.sum())
    m: Dict[str, Any] = {
        "duration": dur,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": done.sum() / dur if dur > 0 else None,
        "request_goodput": good.sum() / dur if dur > 0 else None,
        "output_throughput": total_out / dur if dur > 0 else None,
        "total_token_throughput": (total_in + total_out) / dur if dur > 0 else None,
    }
    for name, x in (("ttft", ttft), ("tpot", tpot[many]), ("itl", np.asarray(itls, float)), ("e2el", e2el)):
        x = x if len(x) else np.zeros(1)
        m[f"mean_{name}_ms"] = float(np.mean(x)) * 1e3
        m[f"median_{name}_ms"] = float(np.median(x)) * 1e3
        m[f"std_{name}_ms"] = float(np.std(x)) * 1e3
        for p in VLLM_PERCENTILES:
            m[f"p{p}_{name}_ms"] = float(np.percentile(x, p)) * 1e3
    return m


def summarize(res, slo_ttft: float, slo_tbt: float) -> Dict[str, Any]:
    """Summary scalars (SI units) of a :class:`systems.energy_serving.driver.ServeResult`, the same on
    every backend. ``energy_j`` None = not measured (kept None, never 0). Knob means (clock, chunk,
    microbatches) are time-means over the 1-s bins before the makespan; stage utilisation = the
    iterations' stage time over the makespan."""
    req, gaps, dec, its = res.requests, res.gaps, res.decisions, res.iterations
    energy_j, makespan_s = res.energy_j, res.makespan_s
    # the decision log holds every controller call; a hook that returned no decision (vanilla's, Window-
    # DVFS at an arrival) is no decision: not counted, and its time is not a decision time
    made = _given(dec["chunk"])
    dec_us = dec["decision_us"][made].astype(float)
    n_req, n_dec, n_its = len(req["arrival_s"]), int(made.sum()), len(its["time_s"])
    ttft = req["ttft_s"].astype(float)
    tbt_mean = req["tbt_mean_s"].astype(float)
    done = np.isfinite(req["finish_s"].astype(float))
    out_tok = int(req["generated"].sum())
    one_token = req["output_len"] <= 1
    # a request meets the TBT SLO if it finished with mean TBT <= SLO (one-token requests have no TBT)
    tbt_ok = one_token | (done & (np.nan_to_num(tbt_mean, nan=np.inf) <= slo_tbt))
    tl = res.timeline
    busy = tl["time_s"] < makespan_s
    s: Dict[str, Any] = {
        "requests": int(n_req),
        "completed": int(done.sum()),
        "makespan_s": float(makespan_s),
        "output_tokens": out_tok,
        "throughput_tok_s": out_tok / makespan_s if makespan_s > 0 else None,
        **dict(zip(("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"), _pcts(ttft, (50, 90, 99)))),
        **dict(zip(("tbt_p50_s", "tbt_p90_s", "tbt_p99_s"), _pcts(gaps, (50, 90, 99)))),
        "tpot_p90_s": _pct(tbt_mean, 90),
        "slo_ttft_s": slo_ttft,
        "slo_tbt_s": slo_tbt,
        "slos": f"TTFT {slo_ttft:g} s, TBT {1e3 * slo_tbt:g} ms",
        "slo_ttft_attainment": float(np.mean(np.nan_to_num(ttft, nan=np.inf) <= slo_ttft)) if n_req else None,
        "slo_tbt_attainment": float(np.mean(tbt_ok)) if n_req else None,
        "slo_tbt_token_attainment": float(np.mean(gaps <= slo_tbt)) if len(gaps) else None,
        "energy_j": energy_j,
        "energy_per_token_j": (energy_j / out_tok) if (energy_j is not None and out_tok) else None,
        "avg_power_w": (energy_j / makespan_s) if (energy_j is not None and makespan_s > 0) else None,
        "energy_unavailable_reason": res.energy_reason or None,
        "decisions": int(n_dec),
        "decision_us_p50": _pct(dec_us, 50) if n_dec else None,
        "decision_us_p99": _pct(dec_us, 99) if n_dec else None,
        "iterations": int(n_its),
        "iteration_latency_p50_s": _pct(its["latency_s"].astype(float), 50) if n_its else None,
        "stage_utilization": float(its["latency_s"].sum()) / makespan_s if makespan_s > 0 else None,
        "preemptions": int(res.preemptions),
        "mean_clock_mhz": float(np.nanmean(tl["clock_mhz"][busy])) if busy.any() else None,
        "mean_chunk": float(np.nanmean(tl["chunk"][busy])) if busy.any() else None,
        "mean_microbatches": float(np.nanmean(tl["microbatches"][busy])) if busy.any() else None,
    }
    s.update(prediction_error(req, dec, gaps, res.gap_times))
    return s
