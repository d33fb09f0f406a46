"""The vLLM-CPU latency profile (fit, file, bad input) and the sim-vs-real fidelity report's
plumbing (pairing runs, replaying measured iterations through the profile)."""

import json
import shutil

import numpy as np
import pytest
import yaml

from harness.errors import ConfigError
from harness.report import gather_runs
from harness.run import run
from systems.energy_serving import calibrate, fidelity

COEF = {"base_s": 0.006, "per_token_s": 5e-5, "per_kv_token_s": 2e-7, "per_pair_s": 1e-8, "per_seq_s": 2e-4}


def write_profile(path, model="tiny-llama", coef=COEF):
    path.write_text(yaml.safe_dump({"model": model, "coefficients": coef, "fit": {"mape_pct": 0.0}}))
    return path


def test_fit_recovers_the_coefficients_and_drops_outliers():
    """Samples made from known coefficients (one slowed 3x, as by another process): the fit returns
    them and marks that sample. Mutations caught: no refit without outliers, a term's regressor
    dropped (per sequence)."""
    rng = np.random.default_rng(0)
    c = np.array([COEF[t] for t in calibrate.TERMS])
    samples = []
    for _ in range(30):
        n, ctx, seqs = int(rng.integers(1, 512)), float(rng.integers(1, 8000)), int(rng.integers(1, 64))
        pairs = float(rng.integers(n, n * n + 1))
        samples.append(
            {
                "tokens": n,
                "ctx_tokens": ctx,
                "attn_pairs": pairs,
                "seqs": seqs,
                "latency_s": float(calibrate.features(n, ctx, pairs, seqs) @ c),
            }
        )
    samples[3]["latency_s"] *= 3
    got = calibrate.fit(samples)
    assert [got[t] for t in calibrate.TERMS] == pytest.approx(list(c), rel=1e-6)
    assert [s["outlier"] for s in samples].count(True) == 1 and samples[3]["outlier"]


def test_profile_file_errors_name_the_path(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        calibrate.load_profile(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("model: x\n")
    with pytest.raises(ConfigError, match="not a profile"):
        calibrate.load_profile(tmp_path / "bad.yaml")


def test_calibration_refuses_bad_input_before_work(capsys):
    assert calibrate.main(["model=llama-3.3-70b"]) == 2
    assert "not allowed for vLLM on CPU: use a tiny-* model" in capsys.readouterr().err
    assert calibrate.main(["model=gpt-17"]) == 2
    assert "model='gpt-17' is not allowed: one of" in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides,match",
    [
        (("tp=1", "pp=1", "model=tiny-opt"), r"a profile of model=tiny-opt \(this one was measured with tiny-llama\)"),
        (("model=tiny-llama",), r"tp=1 pp=1 with system.latency_profile"),
    ],
)
def test_a_profile_for_another_setup_is_bad_input(compose_cfg, tmp_path, overrides, match):
    prof = write_profile(tmp_path / "p.yaml")
    cfg = compose_cfg(
        "system=beam", "workload=poisson", f"system.latency_profile={prof}", *overrides, output_dir=tmp_path / "x"
    )
    with pytest.raises(ConfigError, match=match):
        run(cfg)


FID = (
    "model=tiny-llama",
    "tp=1",
    "pp=1",
    "workload=poisson",
    "rate=2",
    "workload.duration_s=6",
    "workload.input_len=200",
    "workload.output_len=16",
    "system.default_chunk=256",
    "system.chunk_candidates=[64,128,256]",
    "system.max_num_seqs=32",
    "system.profile_tile=16",
    "system.profile_small_max=32",
    "kv_budget=64MiB",
    "workload.slo_tbt_s=0.1",
)


def test_the_simulator_charged_by_a_profile_and_the_report(compose_cfg, tmp_path):
    """The simulator charged by a latency profile: every iteration takes the profile's latency, no
        energy, clocks recorded only (the run's message says so: the predictor's error then holds the
    clock scaling). The report pairs a measured run with its simulated twin; here the
        "measured" one is that same run (marked measured), so every error is 0. Mutations caught: the
        replay dropping a term (sequences), the clock changing a profile's latency, the not-applied note
    dropped; the note on a vanilla / Window-DVFS record (no predictions).
    """
    prof = write_profile(tmp_path / "p.yaml")
    sweep = tmp_path / "sweep"
    rec = run(compose_cfg("system=beam", *FID, f"system.latency_profile={prof}", output_dir=sweep / "sim"))
    assert rec["status"] == "ok" and rec["summary"]["energy_j"] is None
    assert "profile" in rec["summary"]["executor"]
    assert "clocks are recorded and never applied" in rec["message"]  # why the predictor MAPE is large
    import pandas as pd

    its = pd.read_parquet(sweep / "sim" / "iterations.parquet")
    c = calibrate.load_profile(prof).cost()
    expect = [c.step1(r.tokens, 0.0, r.ctx_tokens, r.attn_pairs, r.seqs)[0] for r in its.itertuples()]
    assert its.latency_s.tolist() == pytest.approx(expect) and its.clock_mhz.nunique() > 1
    for system in ("vanilla", "window_dvfs"):  # no predictions: the note is not theirs (QA)
        other = run(
            compose_cfg(f"system={system}", *FID, f"system.latency_profile={prof}", output_dir=tmp_path / system)
        )
        assert other["summary"]["pred_ttft_mape_pct"] is None and "never applied" not in other["message"]
    from systems.energy_serving.build import clock_note

    assert clock_note(True, rec["summary"]) == ""  # applied clocks: the predictions hold
    shutil.copytree(sweep / "sim", sweep / "real")
    r = json.loads((sweep / "real" / "run.json").read_text())
    r["backend"]["simulated"] = False
    (sweep / "real" / "run.json").write_text(json.dumps(r))
    pairs = fidelity._pair_rows(gather_runs(sweep), c)
    assert len(pairs) == 1 and pairs["iteration MAPE % (wall)"].iloc[0] == pytest.approx(0.0, abs=1e-9)
    assert pairs["TTFT P90 err %"].iloc[0] == 0.0 and pairs["completed err %"].iloc[0] == 0.0
    fidelity.report(sweep, prof)
    md = (sweep / "fidelity.md").read_text()
    assert "measured and simulated; SLOs TTFT 1 s, TBT 100 ms" in md and "wall 0.0 %" in md
    assert (sweep / "fidelity.png").exists()
