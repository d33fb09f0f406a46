"""Simulator timelines: Window-DVFS lags a step burst by one window, BEAM reacts at the burst."""

import json

import pandas as pd
import pytest

from harness.run import run


def _run(compose_cfg, tmp_path, name, *ov):
    out = tmp_path / name
    cfg = compose_cfg(*ov, output_dir=out)
    rec = run(cfg)
    tabs = {k: pd.read_parquet(out / f"{k}.parquet") for k in ("decisions", "timeline", "requests")}
    return rec, tabs


BURST = (
    "workload=burst",
    "workload.rate=1.0",
    "workload.rate_high=20.0",
    "workload.burst_start_s=22.5",
    "workload.burst_end_s=40",
    "workload.duration_s=40",
    "workload.input_len=512",
    "workload.output_len=32",
    "workload.len_jitter=0",
)


def test_window_dvfs_lags_a_step_burst_by_one_window(compose_cfg, tmp_path):
    rec, t = _run(compose_cfg, tmp_path, "w", "system=window_dvfs", *BURST)
    assert rec["backend"]["simulated"] and rec["status"] == "ok"
    ticks = t["decisions"][t["decisions"].trigger == "tick"].set_index("time_s")["clock_mhz"]
    f_max = 1410.0
    assert ticks.loc[20.0] < 0.8 * f_max  # the window before the burst saw 1 req/s: low clock
    assert ticks.loc[25.0] >= ticks.loc[20.0] + 200  # the first tick after the burst onset raises it
    tl = t["timeline"].set_index("time_s")["clock_mhz"]
    # between the onset (22.5 s) and the tick (25 s) nothing changed: the lag is one window
    assert tl.loc[23.0] == pytest.approx(ticks.loc[20.0])
    assert tl.loc[24.0] == pytest.approx(ticks.loc[20.0])
    assert tl.loc[26.0] == pytest.approx(ticks.loc[25.0], rel=0.02)


def test_beam_raises_the_clock_within_the_burst(compose_cfg, tmp_path):
    _, t = _run(compose_cfg, tmp_path, "b", "system=beam", *BURST)
    d = t["decisions"]
    before = d[(d.time_s > 15) & (d.time_s < 22.4)].clock_mhz.dropna()
    during = d[(d.time_s >= 22.5) & (d.time_s < 24.0) & (d.trigger == "arrival")].clock_mhz.dropna()
    assert len(before) and len(during)
    assert during.max() > before.median() + 200  # reacts before Window-DVFS's next tick (25 s)


def test_vanilla_is_max_clock_default_chunk_and_pp_microbatches(compose_cfg, tmp_path):
    rec, t = _run(compose_cfg, tmp_path, "v", "system=vanilla", "workload=ablation", "workload.duration_s=20")
    tl = t["timeline"]
    assert (tl.clock_mhz.iloc[:-1] == 1410.0).all() and (tl.chunk == 2048).all() and (tl.microbatches == 4).all()
    s = rec["summary"]
    assert s["requests"] == len(t["requests"]) and s["completed"] == s["requests"]
    # energy bounds: between all 8 GPUs idle and all at the power limit for the whole run
    assert 8 * 60.0 * s["makespan_s"] < s["energy_j"] < 8 * 500.0 * s["makespan_s"]
    assert s["avg_power_w"] == pytest.approx(s["energy_j"] / s["makespan_s"])
    assert json.loads((tmp_path / "v" / "run.json").read_text())["backend"]["simulated"] is True


def test_slo_attainment_matches_the_request_table(compose_cfg, tmp_path):
    rec, t = _run(compose_cfg, tmp_path, "a", "system=beam", "workload=ablation", "workload.duration_s=20")
    r, s = t["requests"], rec["summary"]
    assert s["slo_ttft_attainment"] == pytest.approx((r.ttft_s <= s["slo_ttft_s"]).mean())
    assert s["slo_tbt_attainment"] == pytest.approx(((r.tbt_mean_s <= s["slo_tbt_s"]) | (r.output_len <= 1)).mean())
    # every request's first token is at least p stage-iterations after arrival
    assert (r.ttft_s > 0).all()
