"""What the real serving path (backend=vllm) runs in parallel (issue 41): tensor parallelism as the
user sets it (vLLM's tensor_parallel_size, one worker process per rank), one pipeline stage; a
setting it would not run exits 2 before any work naming what it would need, on a CPU and on a
(faked) CUDA device alike; records say the tp/pp that ran."""

import os

import pandas as pd
import pytest

from harness.backend import Backend
from harness.errors import ConfigError
from systems.energy_serving import vllm_engine
from systems.energy_serving.vllm_engine import cpu_rank_bind, kv_bytes_per_rank, real_parallelism, validate_real

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
CPU = Backend("vllm", "cpu", False, "this CPU")
CUDA = Backend("vllm", "cuda", False, "faked")


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.delenv(vllm_engine.CPU_BIND_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})


@pytest.fixture
def cuda_gpus(monkeypatch):
    """A faked CUDA machine with n GPUs (torch.cuda.device_count, what check_parallelism reads)."""
    import torch

    def make(n):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return make


@pytest.mark.parametrize(
    "over,tp,pp,said",
    [
        ((), 1, 1, "tp=1"),
        (("system=beam",), 1, 1, "tp=1"),  # the paper's 2 x 4 A100s is the simulator's default
        (("tp=2",), 2, 1, "tp=2"),
        (("system=beam", "tp=2"), 2, 1, "tp=2"),
        (("system.tp=2",), 2, 1, "system.tp=2"),
        (("system.parallel=2x1",), 2, 1, "system.parallel='2x1'"),
        (("system.parallel=1x2", "tp=4"), 1, 2, "system.parallel='1x2'"),  # parallel wins, as on the simulator
        (("pp=2",), 1, 2, "tp=1"),
    ],
)
def test_the_parallelism_the_real_path_runs_is_what_the_user_set(compose_cfg, over, tp, pp, said):
    cfg = compose_cfg(*SMALL[1:], *(() if any(o.startswith("system=") for o in over) else SMALL[:1]), *over)
    got = real_parallelism(cfg)
    assert got[:2] == (tp, pp) and got[2]["tp"] == said


@pytest.mark.parametrize("over", [("pp=2",), ("system.pp=4",), ("system.parallel=2x4",), ("system.parallel=1x2",)])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_pipeline_parallelism_is_refused_on_every_device(compose_cfg, over, device, two_cores, cuda_gpus):
    """PP is not run by the real path (one pipeline stage): refused before any work, naming the
    setting and what it would need (the batch queue per microbatch, S2's count). Mutation caught:
    check_parallelism without the pp check (it ran on one stage and recorded pp=1)."""
    cuda_gpus(8)
    with pytest.raises(ConfigError, match=r"is not allowed for backend=vllm: the real path runs one pipeline stage"):
        validate_real(compose_cfg(*SMALL, *over), CPU if device == "cpu" else CUDA)


def test_pp_refused_through_the_command_line_checks(compose_cfg, two_cores):
    from harness.run import validate_config

    with pytest.raises(ConfigError, match=r"system.pp=4 \(pp=4\) is not allowed for backend=vllm"):
        validate_config(compose_cfg(*SMALL, "system.pp=4"))


def test_tensor_parallelism_needs_a_core_per_rank_on_a_cpu(compose_cfg, monkeypatch, two_cores):
    """Mutation caught: no core count check (vLLM then fails as the workers start: an error record)."""
    validate_real(compose_cfg(*SMALL, "tp=2"), CPU)
    with pytest.raises(ConfigError, match=r"tp=4 is not allowed for backend=vllm on this CPU: .* may use 2"):
        validate_real(compose_cfg(*SMALL, "tp=4", "model.num_heads=8"), CPU)
    with pytest.raises(ConfigError, match=r"backend.threads=2 cores, .* \(tp x backend.threads <= 2\)"):
        validate_real(compose_cfg(*SMALL, "tp=2", "backend.threads=2"), CPU)
    validate_real(compose_cfg(*SMALL, "tp=2", "backend.threads=0"), CPU)  # 0: the cores split
    monkeypatch.setenv(vllm_engine.CPU_BIND_ENV, "0|1|0|1")
    with pytest.raises(ConfigError, match=r"VLLM_CPU_OMP_THREADS_BIND='0\|1\|0\|1': it names 4 ranks"):
        validate_real(compose_cfg(*SMALL, "tp=2"), CPU)


def test_tensor_parallelism_needs_a_gpu_per_rank_on_cuda(compose_cfg, cuda_gpus):
    """On a faked CUDA device with one GPU, tp=2 exits 2 naming the GPUs it needs; with two it
    passes. Mutation caught: no GPU count check."""
    cuda_gpus(1)
    with pytest.raises(ConfigError, match=r"system.parallel='2x1' is not allowed .* it needs 2 GPUs .* sees 1"):
        validate_real(compose_cfg(*SMALL, "system.parallel=2x1"), CUDA)
    validate_real(compose_cfg(*SMALL), CUDA)  # one GPU: fine
    cuda_gpus(2)
    validate_real(compose_cfg(*SMALL, "system.parallel=2x1"), CUDA)


def test_each_rank_gets_its_own_cores(monkeypatch):
    monkeypatch.delenv(vllm_engine.CPU_BIND_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert cpu_rank_bind(2) == "0|1"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6, 7, 8})
    assert cpu_rank_bind(2) == "4|5"  # backend.threads=1 per rank, as one device has
    assert cpu_rank_bind(2, threads=2) == "4,5|6,7"
    assert cpu_rank_bind(2, threads=0) == "4,5|6,7"  # 0: the cores split
    monkeypatch.setenv(vllm_engine.CPU_BIND_ENV, "1|0")
    assert cpu_rank_bind(2) == "1|0"  # the user's own


def test_kv_bytes_per_rank_split_heads_or_replicate_them():
    from omegaconf import OmegaConf

    from harness.model_facts import kv_bytes_per_token

    m = OmegaConf.create({"num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "dtype": "float32"})
    full = kv_bytes_per_token(m)
    assert [kv_bytes_per_rank(m, tp) for tp in (1, 2, 4)] == [full, full / 2, full / 2]


needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="tp=2 on vLLM-CPU needs 2 cores")


@pytest.mark.vllm
@needs_two_cores
def test_tp2_serves_on_vllm_cpu_and_the_record_says_so(compose_cfg, tmp_path, monkeypatch):
    """BEAM with tp=2 on vLLM-CPU: two worker processes (one per core), the chunk size applied
    between steps, every request served and accounted, and the record says tp=2 pp=1 (the table's
    energy model for two GPUs; iteration times by wall clock, no engine-thread CPU time). Mutation
    caught: tensor_parallel_size not given to vLLM (one in-process worker)."""
    from harness.run import run
    from systems.energy_serving.vllm_engine import VllmServer, _torch_threads

    ranks, close = [], VllmServer.close

    def spy(self):
        ranks.append(
            (self.engine.vllm_config.parallel_config.tensor_parallel_size, self.engine.collective_rpc(_torch_threads))
        )
        close(self)

    monkeypatch.setattr(VllmServer, "close", spy)
    out = tmp_path / "tp2"
    rec = run(
        compose_cfg(
            *SMALL[1:],
            "system=beam",
            "tp=2",
            "system.profile_tile=32",
            "system.profile_small_max=64",
            "workload.slo_ttft_s=5",
            "workload.slo_tbt_s=0.5",
            "kv_budget=24MiB",
            output_dir=out,
        )
    )
    assert rec["status"] == "ok", rec["message"]
    s = rec["summary"]
    assert (s["tp"], s["pp"], s["gpus"]) == (2, 1, 2)
    assert s["completed"] == s["requests"] > 0
    assert s["kv_budget_bytes"] == s["vllm_kv_cache_bytes"] == 24 << 20  # per rank
    assert s["vllm_torch_threads"] == 1  # per rank: backend.threads
    its = pd.read_parquet(out / "iterations.parquet")
    assert (its.tokens <= its.budget).all() and (its.budget <= 128 + 16).all() and its.cpu_s.isna().all()
    r = pd.read_parquet(out / "requests.parquet")
    assert (r.generated == 8).all() and its.prefill_tokens.sum() == r.input_len.sum()
    dec = pd.read_parquet(out / "decisions.parquet")
    assert (dec.trigger == "arrival").sum() == s["requests"] and (dec.microbatches == 1).all()
    assert os.environ.get(vllm_engine.CPU_BIND_ENV) is None  # set for the workers only
    assert len(ranks) == 1 and ranks[0][0] == 2 and len(ranks[0][1]) == 2  # two workers served it
