"""Controllers see a profile, never the simulator's truth: the table comes from a profiling pass
through the simulator's iteration cost, seen with ``system.profile_error`` (bias and noise)."""

import numpy as np
import pytest

from harness.run import run
from systems.common.gpu_model import StageModel
from systems.energy_serving.power_fit import profile_scatter
from systems.energy_serving.runner import sim_profile


@pytest.fixture
def a100(compose_cfg):
    def make(*ov):
        cfg = compose_cfg("system=beam", "workload=ablation", *ov)
        return cfg, StageModel(cfg.model, cfg.hardware, 2, 4)

    return make


def _at_samples(table, truth):
    n = np.array(table.samples)
    lat, en = truth(n[:, None], table.clocks[None, :])
    return table.L[n], lat, table.E[n], en


def test_bias_scales_every_measured_number(a100):
    """bias = +0.2, no noise: every sampled latency, energy and idle power is 1.2x the executor's
    cost. Mutations caught: the bias not applied (to latency, or energy), the table read from the
    truth directly."""
    cfg, st = a100("system.profile_error.bias=0.2", "system.profile_error.noise=0")
    table, truth = sim_profile(cfg, st, st)
    L, lat, E, en = _at_samples(table, truth)
    assert np.allclose(L, 1.2 * lat, rtol=1e-12) and np.allclose(E, 1.2 * en, rtol=1e-12)
    assert np.allclose(table.idle_w, 1.2 * st.idle_power(table.clocks))
    exact, _ = sim_profile(*a100("system.profile_error.noise=0"), st)
    L0, lat0, _, _ = _at_samples(exact, truth)
    assert np.allclose(L0, lat0, rtol=1e-12)


def test_noise_scatters_samples_at_the_configured_level(a100):
    """noise = 0.05: sampled energies (never smoothed, unlike latency) scatter about the truth with
    a relative std near 5 %, reproducibly per seed. Mutation caught: noise not applied."""
    cfg, st = a100("system.profile_error.noise=0.05")
    table, truth = sim_profile(cfg, st, st)
    _, _, E, en = _at_samples(table, truth)
    rel = E / en - 1
    assert 0.04 < rel.std() < 0.06 and abs(rel.mean()) < 0.01
    again, _ = sim_profile(cfg, st, st)
    assert np.array_equal(again.E, table.E)


@pytest.mark.parametrize(
    "profiles,rows,time_pct,energy_pct",
    [
        ("fixture", 608, 0.77, 1.34),  # GPT-3's profile alone
        pytest.param("full", 1216, 0.8, 1.4, marks=pytest.mark.full_data("gpu_power/")),
    ],
)
def test_the_default_noise_rests_on_measured_scatter(compose_cfg, request, profiles, rows, time_pct, energy_pct):
    """The default (2 %) is at least the scatter of one measured A100 profile point about a smooth
    curve over the clock (Perseus: 0.8 % time, 1.4 % energy) and at most twice it."""
    from tests.conftest import FIXTURE_DATA

    data = FIXTURE_DATA if profiles == "fixture" else request.getfixturevalue("full_data")
    sc = profile_scatter(data / "gpu_power")
    assert sc["n_rows"] == rows
    assert sc["time_scatter_pct"] == pytest.approx(time_pct, abs=0.05)
    assert sc["energy_scatter_pct"] == pytest.approx(energy_pct, abs=0.05)
    noise = 100 * compose_cfg("system=beam").system.profile_error.noise
    worst = max(sc["time_scatter_pct"], sc["energy_scatter_pct"])
    assert worst <= noise <= 2 * worst


def test_beam_predicts_with_the_erroneous_table(compose_cfg, tmp_path):
    """The controller plans with what it was told: with a table 20 % too fast (bias -0.2) BEAM's
    predicted TBTs are ~0.8x those of an exact table and its TTFT predictions fall short of what
    happens; 20 % too slow, the reverse. (Its clocks do not simply follow the bias: a too-fast table
    congests the queue, which then forces high clocks.) Mutation caught: the error applied to the
    truth measure but not to the table the controller plans with."""
    import pandas as pd

    tbt, ttft_err = {}, {}
    for bias in (-0.2, 0.0, 0.2):
        out = tmp_path / str(bias)
        rec = run(
            compose_cfg(
                "system=beam",
                "workload=ablation",
                "workload.duration_s=20",
                "system.profile_error.noise=0",
                f"system.profile_error.bias={bias}",
                output_dir=out,
            )
        )
        assert rec["summary"]["profile_error_bias"] == bias
        d, r = pd.read_parquet(out / "decisions.parquet"), pd.read_parquet(out / "requests.parquet")
        tbt[bias] = d[d.pred_tbt_s.notna() & d.pred_ttft_s.isna()].pred_tbt_s.median()
        a = d[(d.trigger == "arrival") & d.pred_ttft_s.notna()]
        actual = r.ttft_s.to_numpy()[a.request.astype(int)]
        ttft_err[bias] = float(np.median((a.pred_ttft_s.to_numpy() - actual) / actual))
    assert tbt[-0.2] / tbt[0.0] < 0.9 and tbt[0.2] / tbt[0.0] > 1.1
    assert ttft_err[-0.2] < -0.1 and ttft_err[-0.2] < ttft_err[0.0] < ttft_err[0.2]


def test_decode_batch_max_is_the_smallest_cap():
    """The largest decode batch a profiling pass measures: the small region, max_num_seqs, and the
    sequences of ctx tokens the KV holds (mutations caught: the KV term dropped, ctx ignored)."""
    from systems.energy_serving.profiler import decode_batch_max

    assert decode_batch_max(256, 128, 512.0) == 128
    assert decode_batch_max(256, 512, 512.0) == 256
    assert decode_batch_max(256, 512, 512.0, kv_tokens=100 * 512 + 511) == 100
    assert decode_batch_max(256, 512, 1000.0, kv_tokens=50_000) == 50
    assert decode_batch_max(256, 512, 512.0, kv_tokens=100) == 0


def test_profile_measures_decodes_only_where_they_fit_in_kv(a100):
    """A KV capacity below small_max decodes of the profile's context: the sampled points past what
    fits are charged as one n-token prefill (as vLLM's profile measures them), those below as decodes
    (mutation caught: sim_profile ignoring kv_tokens)."""
    from systems.energy_serving.build import profile_context
    from systems.energy_serving.protocol import iteration_shape

    cfg, st = a100("system.profile_error.noise=0")
    ctx = profile_context(cfg.workload)
    fit = 40
    _, truth = sim_profile(cfg, st, st, kv_tokens=fit * ctx)
    _, free = sim_profile(cfg, st, st)
    f = st.f_max

    def cost(batch):
        sh = iteration_shape(batch)
        return st.step1(sh[0], f, sh[1], sh[2], sh[3])[0]

    n = 64
    assert truth(np.array([n]), f)[0][0] == pytest.approx(cost([(0, n, 0)]), rel=1e-12)
    assert free(np.array([n]), f)[0][0] == pytest.approx(cost([(i, 1, ctx - 1) for i in range(n)]), rel=1e-12)
    assert truth(np.array([fit]), f)[0][0] == pytest.approx(free(np.array([fit]), f)[0][0], rel=1e-12)


def test_simulated_run_profiles_with_its_kv_capacity(compose_cfg, tmp_path, monkeypatch):
    """The simulated backend (runner.SimServing) hands the profiling pass the KV tokens per stage it serves with (mutation caught: the
    profile built without them)."""
    import systems.energy_serving.runner as runner

    seen, orig = [], runner.sim_profile
    monkeypatch.setattr(
        runner, "sim_profile", lambda cfg, stage, cost, *a: seen.append(a) or orig(cfg, stage, cost, *a)
    )
    rec = run(compose_cfg("system=beam", "workload=ablation", "workload.duration_s=5", output_dir=tmp_path / "r"))
    assert seen == [(rec["summary"]["kv_capacity_tokens"],)]


@pytest.mark.parametrize(
    "over,says",
    [
        ("system.window_s=-5", "system.window_s=-5.0 is not allowed: a Window-DVFS period in s > 0"),
        ("system.window_s=0", "system.window_s=0.0 is not allowed"),
        ("system.max_num_seqs=0", "system.max_num_seqs=0 is not allowed"),
    ],
)
def test_a_period_or_batch_cap_that_is_not_positive_is_bad_input(compose_cfg, over, says):
    """system.window_s=-5 hung the Window-DVFS run forever, =0 never ticked (a fixed clock), and
    max_num_seqs=0 served none of the requests with status ok (QA). Mutation caught: either check dropped."""
    from harness.errors import ConfigError
    from harness.run import validate_config

    with pytest.raises(ConfigError, match=says):
        validate_config(compose_cfg("system=window_dvfs", "workload=poisson", over))


@pytest.mark.parametrize(
    "over,says",
    [
        (
            ("workload=burst", "workload.burst_start_s=5", "workload.burst_end_s=1"),
            r"workload.burst_end_s=1.0 is not allowed: a time after workload.burst_start_s=5.0 s",
        ),
        (
            ("workload=burst", "workload.burst_start_s=5", "workload.burst_end_s=5"),
            r"workload.burst_end_s=5.0 is not allowed",
        ),
        (
            ("workload=burst", "workload.burst_start_s=150", "workload.burst_end_s=200"),
            r"workload.burst_start_s=150.0 is not allowed: a time before the run's end, workload.duration_s=150.0 s",
        ),
        (
            ("workload=poisson", "workload.len_jitter=2"),
            r"workload.len_jitter=2.0 is not allowed: a fraction of input_len/output_len in \[0, 1\]",
        ),
        (
            ("workload=poisson", "workload.max_requests=0"),
            r"workload.max_requests=0 is not allowed: a request count > 0",
        ),
    ],
)
def test_a_burst_window_jitter_or_request_cap_that_means_nothing_is_bad_input(compose_cfg, over, says):
    """An inverted burst window ran a plain Poisson stream with status ok, len_jitter=2 was clipped at one
    token silently, and max_requests=0 was blamed on duration_s (QA). Mutations caught: ``<`` as ``<=``
    for the window, the start-before-end check dropped, the jitter check dropped, the cap check dropped."""
    from harness.errors import ConfigError
    from harness.run import validate_config

    with pytest.raises(ConfigError, match=says):
        validate_config(compose_cfg("system=vanilla", *over))
