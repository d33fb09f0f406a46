"""vllm bench serve's result keys from a serving run (issue 40): the metrics of a scripted set of
requests equal the values computed by hand with vLLM's definitions, and a run's record carries them
beside our own names (our TBT percentiles are vLLM's ITL)."""

import numpy as np
import pytest

from harness.run import run
from systems.energy_serving.metrics import vllm_bench_metrics


def test_vllm_metrics_of_a_scripted_trace_equal_the_hand_computed_values():
    """Request 0: arrives at 0 s, first token at 0.1 s, done at 0.5 s, 5 output tokens (TPOT 0.1 s);
    request 1: arrives at 1 s, first (and only) token after 0.3 s; request 2 never finished. Duration
    2 s; SLOs TTFT 0.2 s and TPOT 0.15 s: only request 0 meets both. (Mutations caught: an unfinished
    request counted; TPOT over all tokens instead of all but the first; the one-token request given
    a TPOT of 0 in the TPOT statistics; goodput with the SLOs checked one at a time.)"""
    req = {
        "arrival_s": np.array([0.0, 1.0, 2.0]),
        "ttft_s": np.array([0.1, 0.3, np.nan]),
        "finish_s": np.array([0.5, 1.3, np.inf]),
        "generated": np.array([5, 1, 0]),
        "input_len": np.array([10, 20, 40]),
    }
    m = vllm_bench_metrics(req, np.array([0.1, 0.1, 0.1, 0.1]), 2.0, 0.2, 0.15)
    assert m["duration"] == 2.0 and (m["total_input_tokens"], m["total_output_tokens"]) == (30, 6)
    assert (m["request_throughput"], m["request_goodput"]) == (1.0, 0.5)
    assert (m["output_throughput"], m["total_token_throughput"]) == (3.0, 18.0)
    assert [m[f"{s}_ttft_ms"] for s in ("mean", "median", "std", "p99")] == pytest.approx([200, 200, 100, 298])
    assert [m[f"{s}_tpot_ms"] for s in ("mean", "median", "std", "p99")] == pytest.approx([100, 100, 0, 100])
    assert [m[f"{s}_e2el_ms"] for s in ("mean", "median", "std", "p99")] == pytest.approx([400, 400, 100, 498])
    assert m["mean_itl_ms"] == pytest.approx(100) and m["std_itl_ms"] == pytest.approx(0)


def test_a_serving_record_carries_vllms_keys_beside_ours(compose_cfg, tmp_path):
    rec = run(
        compose_cfg(
            "system=vanilla",
            "workload=poisson",
            "model=llama-3.1-8b",
            "hardware=a100-80gb",
            "tp=1",
            "pp=1",
            "workload.duration_s=60",
            "backend=sim",
            output_dir=tmp_path / "job",
        )
    )
    v, s = rec["vllm_bench"], rec["summary"]
    assert v["p99_itl_ms"] == pytest.approx(1e3 * s["tbt_p99_s"])  # our TBT is vLLM's ITL
    assert v["total_output_tokens"] == s["output_tokens"] and v["duration"] == s["makespan_s"]
    assert 0 < v["request_goodput"] <= v["request_throughput"]
