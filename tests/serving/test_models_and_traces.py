"""GPU latency/power model (fit, energy valley), profiler table, and trace loaders on real files."""
import numpy as np
import pytest

from systems.serving.gpu_model import StageModel
from systems.serving.power_fit import fit_mem_beta, fit_perseus
from systems.serving.profiler import build_table, sample_points, sim_measure, table_error
from workloads.serving import TraceError, load_azure, load_mooncake, load_servegen


@pytest.fixture
def a100_70b(compose_cfg):
    cfg = compose_cfg("system=beam")
    return cfg, StageModel(cfg.model, cfg.hardware, 2, 4)


def test_power_fit_reproduces_the_profile(compose_cfg, shared_data):
    cfg = compose_cfg("system=beam")
    fit = fit_perseus(shared_data / "gpu_power")
    pw = cfg.hardware.power
    assert fit["n_rows"] == 1216
    assert fit["act_a_w"] == pytest.approx(pw.act_a_w, rel=0.01)
    assert fit["act_b_w"] == pytest.approx(pw.act_b_w, rel=0.01)
    assert fit["act_alpha"] == pytest.approx(pw.act_alpha, abs=0.05)
    assert fit["power_mape_pct"] < 5.0 and fit["time_mape_pct"] < 2.0
    h = compose_cfg("hardware=h100", "model=llama-3.1-8b", "system=beam")
    mb = fit_mem_beta(shared_data / "gpu_power", h.model, h.hardware)
    assert mb["n_configs"] == 11
    assert mb["mem_beta"] == pytest.approx(pw.mem_beta, abs=0.01)
    assert mb["power_mape_pct"] < 8.0


def test_energy_valley_exists_and_moves_with_batch(a100_70b):
    _, st = a100_70b
    cl = st.clocks(15)
    v16, v512 = st.energy_valley(16, cl), st.energy_valley(512, cl)
    assert cl[0] < v16 < cl[-1] and cl[0] < v512 < cl[-1]        # U-shaped: interior minimum
    assert v16 < v512 - 100                                        # memory-bound valley sits lower
    _, e = st.step(512, cl)
    assert e[0] > e.min() * 1.2 and e[-1] > e.min() * 1.2


def test_scalar_step_equals_vectorised(a100_70b):
    _, st = a100_70b
    for n, f, ctx in [(1, 1410.0, 500.0), (70, 630.0, 9000.0), (2048, 900.0, 2048.0)]:
        lv, ev = st.step(n, f, ctx, ctx)
        ls, es = st.step1(n, f, ctx, ctx)
        assert ls == pytest.approx(float(lv)) and es == pytest.approx(float(ev))


def test_latency_compute_part_scales_with_one_over_f(a100_70b):
    _, st = a100_70b
    t_sm1, t_mem1, _ = st.parts(2048, 1410.0)
    t_sm2, t_mem2, _ = st.parts(2048, 705.0)
    assert t_sm2 == pytest.approx(2 * t_sm1) and t_mem2 == pytest.approx(t_mem1)


def test_profiler_is_sparse_tile_quantised_and_accurate(a100_70b):
    cfg, st = a100_70b
    pts = sample_points(64, 512, [128, 256, 512, 1024, 2048], 2304)
    assert pts == [1, 64, 128, 192, 256, 320, 384, 448, 512, 1024, 2048, 2304]
    cl = st.clocks(15)
    measure = sim_measure(st, ctx=512.0, small_max=512)
    T = build_table(measure, cl, st.idle_power(cl), 2304, 64, 512, [128, 256, 512, 1024, 2048])
    assert T.L.shape == (2305, 81)
    assert np.all(np.diff(T.L[1:], axis=1) <= 1e-15)              # non-increasing in the clock
    # exact on tile ends, small error elsewhere
    L, _ = T.rows(np.array([256]))
    lat, _ = measure(np.array([[256]]), cl[None, :])
    assert np.allclose(L[0], lat[0])
    err = table_error(T, measure, range(1, 2305, 5))
    assert err["latency_mape_pct"] < 5.0


@pytest.mark.parametrize("name,rows,span,rate", [("code", 8819, 3436, 2.57), ("conv", 19366, 3502, 5.53)])
def test_azure_trace_as_its_readme_states(shared_data, name, rows, span, rate):
    r = load_azure(shared_data / "traces/azure_llm_2023" / f"AzureLLMInferenceTrace_{name}.csv")
    assert len(r) == rows
    assert r.span_s == pytest.approx(span, abs=1.0)
    assert r.mean_rate == pytest.approx(rate, abs=0.01)


@pytest.mark.parametrize("name,rows,span,rate,inp", [("conversation", 12031, 3537.0, 3.40, 12035),
                                                     ("synthetic", 3993, 1022.0, 3.91, 15325)])
def test_mooncake_trace_as_its_readme_states(shared_data, name, rows, span, rate, inp):
    r = load_mooncake(shared_data / "traces/mooncake" / f"{name}_trace.jsonl")
    assert len(r) == rows and r.span_s == pytest.approx(span, abs=1.0)
    assert r.mean_rate == pytest.approx(rate, abs=0.01)
    assert r.input_len.mean() == pytest.approx(inp, abs=1)


def test_servegen_segment_scaled_to_target_tokens(shared_data):
    r = load_servegen(shared_data / "traces/servegen/language/m-large", 68400, 3600, 1800.0,
                      np.random.default_rng(0))
    tok_rate = (r.input_len.sum() + r.output_len.sum()) / 3600
    assert 1800 * 0.7 < tok_rate < 1800 * 1.3                     # bursty: realised rate is near target
    assert r.arrival_s.min() >= 0 and r.arrival_s.max() < 3600
    assert np.all(np.diff(r.arrival_s) >= 0)


def test_malformed_and_missing_traces_name_the_line(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9800000,10,2\n"
                   "2023-11-16 18:17:04.0000000,ten,2\n")
    with pytest.raises(TraceError, match=r"t\.csv:3: token counts"):
        load_azure(bad)
    j = tmp_path / "m.jsonl"
    j.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 5}\n')
    with pytest.raises(TraceError, match=r"m\.jsonl:2:"):
        load_mooncake(j)
    with pytest.raises(TraceError, match="not found"):
        load_azure(tmp_path / "absent.csv")
