"""What the real serving path (backend=vllm) runs in parallel (issue 41): tensor and pipeline
parallelism as the user sets them (vLLM's tensor_parallel_size and pipeline_parallel_size, one
worker process per rank), S2's microbatch count applied to vLLM's batch queue under PP; a setting
it could not run exits 2 before any work naming what it would need, on a CPU and on a (faked) CUDA
device alike; records say the tp/pp that ran."""

import os

import pandas as pd
import pytest

from harness.backend import Backend
from harness.errors import ConfigError
from systems.common.gpu_model import kv_bytes_per_rank
from systems.energy_serving import vllm_engine
from systems.energy_serving.vllm_engine import cpu_rank_bind, real_parallelism, validate_real

from .test_vllm_real import SMALL  # the small real serving job, defined once

# BEAM on the small job: profiling tiles and SLOs small enough for a tiny model on a CPU
BEAM_SMALL = (
    *SMALL[1:],
    "system=beam",
    "system.profile_tile=32",
    "system.profile_small_max=64",
    "workload.slo_ttft_s=5",
    "workload.slo_tbt_s=0.5",
    "kv_budget=24MiB",
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


def test_pipeline_parallelism_needs_a_core_or_gpu_per_rank(compose_cfg, two_cores, cuda_gpus):
    """PP runs (tp x pp worker processes): pp=2 passes on 2 cores and on 2 GPUs; tp x pp ranks
    beyond the cores or GPUs exit 2 naming the setting and the count it needs. Mutation caught:
    the rank count taken as tp alone (pp=4 on 2 cores and system.parallel=2x2 on 2 GPUs pass)."""
    validate_real(compose_cfg(*SMALL, "pp=2"), CPU)
    with pytest.raises(ConfigError, match=r"system.pp=4 is not allowed for backend=vllm on this CPU: .*tp x pp = 4"):
        validate_real(compose_cfg(*SMALL, "system.pp=4"), CPU)
    cuda_gpus(2)
    validate_real(compose_cfg(*SMALL, "system.parallel=1x2"), CUDA)
    with pytest.raises(ConfigError, match=r"system.parallel='2x2' is not allowed .* needs tp x pp = 4 GPUs .* sees 2"):
        validate_real(compose_cfg(*SMALL, "system.parallel=2x2"), CUDA)


def test_pp_checked_through_the_command_line_checks(compose_cfg, two_cores):
    from harness.run import validate_config

    validate_config(compose_cfg(*SMALL, "pp=2"))
    with pytest.raises(ConfigError, match=r"system.pp=4 is not allowed for backend=vllm on this CPU"):
        validate_config(compose_cfg(*SMALL, "system.pp=4"))


def test_decode_quota_splits_free_decodes_over_free_microbatches():
    """(free, slots not in flight, D, m) -> decodes: BEAM's b = ceil(D/m) with nothing in flight;
    the simulator's balanced slots as batches fill (4 decodes over 3 microbatches: 2, then 1 of 2
    over 2, then 1 of 1); an unbalanced split in flight (3 + 1 over m = 2) rebalances to 2 + 2.
    Mutations caught: floor division (0 decodes for 1 over 2 microbatches); no ceil(D/m) cap (3
    free with one slot take 3)."""
    from systems.energy_serving.vllm_engine import decode_quota as q

    assert [q(4, 2, 4, 2), q(5, 2, 5, 2), q(4, 4, 4, 4), q(1, 2, 1, 2)] == [2, 3, 1, 1]
    assert [q(4, 3, 4, 3), q(2, 2, 4, 3), q(1, 1, 4, 3)] == [2, 1, 1]
    assert [q(1, 1, 4, 2), q(3, 1, 4, 2), q(2, 1, 4, 2)] == [1, 2, 2]  # 3 + 1 in flight -> 2 + 2
    assert q(3, 0, 3, 1) == 3  # m lowered below the batches in flight: one batch takes them


def test_tensor_parallelism_needs_a_core_per_rank_on_a_cpu(compose_cfg, monkeypatch, two_cores):
    """Mutation caught: no core count check (vLLM then fails as the workers start: an error record)."""
    validate_real(compose_cfg(*SMALL, "tp=2"), CPU)
    with pytest.raises(ConfigError, match=r"tp=4 is not allowed for backend=vllm on this CPU: .* may use 2"):
        validate_real(compose_cfg(*SMALL, "tp=4", "model.num_heads=8"), CPU)
    with pytest.raises(ConfigError, match=r"backend.threads=2 cores, .* \(tp x pp x backend.threads <= 2\)"):
        validate_real(compose_cfg(*SMALL, "tp=2", "backend.threads=2"), CPU)
    validate_real(compose_cfg(*SMALL, "tp=2", "backend.threads=0"), CPU)  # 0: the cores split
    monkeypatch.setenv(vllm_engine.CPU_BIND_ENV, "0|1|0|1")
    with pytest.raises(
        ConfigError, match=r"VLLM_CPU_OMP_THREADS_BIND='0\|1\|0\|1': it names 4 ranks.*give tp x pp = 2"
    ):
        validate_real(compose_cfg(*SMALL, "tp=2"), CPU)


def test_tensor_parallelism_needs_a_gpu_per_rank_on_cuda(compose_cfg, cuda_gpus):
    """On a faked CUDA device with one GPU, tp=2 exits 2 naming the GPUs it needs; with two it
    passes. Mutation caught: no GPU count check."""
    cuda_gpus(1)
    with pytest.raises(
        ConfigError, match=r"system.parallel='2x1' is not allowed .* it needs tp x pp = 2 GPUs .* sees 1"
    ):
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
    assert [kv_bytes_per_rank(m, 1, pp) for pp in (2, 4)] == [full / 2, full / 2]  # 1 of 2 layers; 4 stages: 1


def test_the_simulator_sizes_a_ranks_kv_as_the_real_engine(compose_cfg):
    """One rule for the KV a rank holds per token (``gpu_model.kv_bytes_per_rank``): the simulator's
    stage model charges what the real engine allocates, also where tp exceeds the KV heads (tiny-llama,
    2 KV heads, tp=4: each rank keeps one head) or pp does not divide the layers (pp=3: the largest
    stage's ceil). Mutation: the stage model's old kv_bytes_per_token / pp / tp fails this (512 vs
    1024 B at tp=4)."""
    from systems.common.gpu_model import StageModel

    cfg = compose_cfg("system=vanilla", "model=tiny-llama")
    m, hw = cfg.model, cfg.hardware
    for tp, pp in ((1, 1), (2, 1), (4, 1), (1, 3), (2, 2)):
        assert StageModel(m, hw, tp, pp).kv_bytes_token_gpu == kv_bytes_per_rank(m, tp, pp)
    assert StageModel(m, hw, 4, 1).kv_bytes_token_gpu == StageModel(m, hw, 2, 1).kv_bytes_token_gpu


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
            *BEAM_SMALL,
            "tp=2",
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


def _decode_batches(server, steps: int, m: int):
    """Set ``m`` and take ``steps`` engine steps; per schedule (decode-only batches), the number of
    decodes it took and the non-empty batches then in flight (itself included)."""
    server.set_microbatches(m)
    out, schedule = [], server.sched.schedule

    def flying(*a, **k):  # non-empty batches in flight as this one is scheduled (itself included)
        so = schedule(*a, **k)
        if so.num_scheduled_tokens and all(n == 1 for n in so.num_scheduled_tokens.values()):
            out.append((len(so.num_scheduled_tokens), sum(1 for b in server.batches.values() if b[1][1] > 0)))
        return so

    server.sched.schedule = flying
    try:
        for _ in range(steps):
            server.step()
    finally:
        server.sched.schedule = schedule
    server.step_log.clear()
    server.done.clear()
    return out


@pytest.mark.vllm
@needs_two_cores
def test_pp2_microbatch_count_is_the_batches_vllm_keeps_in_flight(tmp_path):
    """pp=2 on vLLM-CPU (two stage workers, one per core, the later stage's receive buffer
    allocated by pp_receive_buffers) with 4 requests in decode: S2's m = 2 gives two batches of 2
    decodes in flight (BEAM's b = ceil(4/2)); m = 4, after the batches in flight drain into the new
    split, four batches of 1; m = 1 (lowered below the 4 in flight: the step waits for the oldest
    and schedules none) one batch of 4, nothing else in flight. Mutations caught: no decode hold
    (m = 2 runs batches of 4 and empty ones), batch_queue_size not set from m (m = 4 keeps 2 in
    flight), no receive-buffer patch (the first step fails in the second stage's worker)."""
    from omegaconf import OmegaConf

    from systems.energy_serving.vllm_engine import VllmServer, write_model_dir

    m = OmegaConf.load(os.path.join(os.path.dirname(__file__), "..", "..", "conf", "model", "tiny-llama.yaml"))
    m.pop("defaults", None)
    server = VllmServer(write_model_dir(m, tmp_path / "model"), "float32", 64, 8, 16 << 20, 256, tp=1, pp=2)
    try:
        assert server.engine.vllm_config.parallel_config.pipeline_parallel_size == 2
        server.chunk = 64
        for i in range(4):
            server.add(str(i), list(range(10, 30 + i)), 40)
        two = _decode_batches(server, 12, 2)
        assert two[-6:] == [(2, 2)] * 6
        four = _decode_batches(server, 14, 4)
        assert four[-6:] == [(1, 4)] * 6
        one = _decode_batches(server, 8, 1)
        assert one[-4:] == [(4, 1)] * 4 and len(server.core.batch_queue) == 0
        while server.busy():
            server.step()
        assert server.max_in_flight == 4
    finally:
        server.close()


@pytest.mark.vllm
@needs_two_cores
def test_pp2_beam_serves_on_vllm_cpu_with_s2s_microbatches(compose_cfg, tmp_path):
    """BEAM with pp=2 on vLLM-CPU: two stage workers, every request served and accounted, one
    iteration per batch, the record says tp=1 pp=2 (and vLLM's own config says so), S1's decisions
    m = p = 2 and S2's (candidates [3]) m = 3, which the batch queue ran: 3 batches in flight at
    most, and no decode-only batch above ceil(D/3) for the D requests decoding. Mutations caught:
    pipeline_parallel_size not given to vLLM (vllm_pp 1), the decision's m not applied
    (VllmExecutor.apply without set_microbatches: at most 2 in flight)."""
    from harness.run import run

    out = tmp_path / "pp2"
    rec = run(
        compose_cfg(
            *BEAM_SMALL,
            "pp=2",
            "rate=8",
            "workload.output_len=16",
            "system.microbatch_candidates=[3]",
            output_dir=out,
        )
    )
    assert rec["status"] == "ok", rec["message"]
    s = rec["summary"]
    assert (s["tp"], s["pp"], s["gpus"], s["vllm_tp"], s["vllm_pp"]) == (1, 2, 2, 1, 2)
    assert s["completed"] == s["requests"] > 0
    its = pd.read_parquet(out / "iterations.parquet")
    r = pd.read_parquet(out / "requests.parquet")
    assert (r.generated == 16).all() and its.prefill_tokens.sum() == r.input_len.sum()
    assert its.decodes.sum() == r.generated.sum() - len(r)  # every token after the first in one batch
    dec = pd.read_parquet(out / "decisions.parquet")
    assert set(dec.microbatches.dropna()) == {2, 3}
    assert s["max_batches_in_flight"] == 3
    assert s["stage_utilization"] is None  # latency_s is a batch's time in flight, not a stage's


def test_energy_is_read_over_every_gpu_the_engines_ranks_run_on():
    """NVML energy over the engine's tp x pp ranks (cuda:0..tp*pp-1 of the job's visible devices),
    not one GPU nor every GPU the job sees. Mutation caught: the indices of the tp ranks alone
    (pipeline stages' GPUs left out). The meter's construction with them is read in profile_table,
    not run here (no GPU)."""
    from systems.energy_serving.vllm_engine import engine_gpu_indices

    assert engine_gpu_indices(2, 4, cpu=False) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert engine_gpu_indices(2, 1, cpu=False) == [0, 1]
    assert engine_gpu_indices(1, 2, cpu=False) == [0, 1]
    assert engine_gpu_indices(2, 2, cpu=True) is None
