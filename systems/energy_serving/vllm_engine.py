"""Real engine: vLLM (V1, in-process stepping) as an executor of the serving driver.

The driver (:mod:`systems.energy_serving.driver`) calls the controllers and accounts requests, exactly as
on the simulator; :class:`VllmExecutor` adds requests at their arrival (wall clock), applies each
decision between steps and reports every step as an :class:`systems.energy_serving.protocol.Iteration`
(tokens scheduled per request with their context, read from a tap on the V1 scheduler; tokens
emitted; requests finished or preempted; step time). Chunk size is set on the scheduler
(``vllm_cpu.md`` §6: ``scheduler.max_num_scheduled_tokens`` and
``scheduler_config.max_num_batched_tokens``; the engine starts at the largest budget because it can
only be lowered). vLLM's budget counts decode tokens too, so it is chunk + running decodes.

Clocks: requested through :class:`systems.energy_serving.actuator.DvfsActuator` (records only unless
``system.dvfs.actuate=true`` on a user's own NVIDIA GPU, where the table is then measured at every
10th clock with locked clocks and NVML energy windows). On CPU there is no clock: the controller's
table holds latencies measured on this machine (decode batches and prefill chunks, sampled like
the simulator's profiling pass) scaled over the hardware profile's clock menu by its latency
model, energies from its power model -- so the clock decisions are what BEAM would request on
that GPU, recorded and never applied. Energy is measured with NVML windows when available, else
recorded as unavailable (None, with the reason). The engine is ``pp`` pipeline stages of ``tp``
ranks (:func:`real_parallelism`: 1 x 1 unless the user sets them; above 1, one vLLM worker process
per rank). Under PP, S2's microbatch count is the number of batches vLLM keeps in flight and every
batch is one Iteration (:class:`VllmServer`); with one stage, one batch at a time (m recorded
only). Timing: the harness fixes torch's thread count (``backend.threads``) and records the load;
the thread count vLLM ran with is recorded (``vllm_torch_threads``), and the engine is warmed up
before serving (excluded, ``harness.family.WARMUP_KEY``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np
import pandas as pd

from harness.errors import ConfigError, RunOOM
from harness.family import WARMUP_KEY
from harness.logs import say
from harness.machine import set_threads
from harness.meters import EnergyMeter
from harness.model_facts import CAUSAL_LM as ARCH  # architecture class per model type
from harness.model_facts import check_cpu_model, check_weights, hf_config_dict, weight_bytes
from systems.common.gpu_model import StageModel, kv_bytes_per_rank
from systems.common.vllm_version import check_vllm_version, installed_vllm_version
from systems.energy_serving.actuator import DvfsActuator
from systems.energy_serving.build import (
    build_table,
    kv_budget_bytes,
    kv_capacity,
    parallelism,
    profile_context,
    requests_for,
    table_grid,
)
from systems.energy_serving.profiler import clock_scaled, decode_batch_max, device_measure, sample_points
from systems.energy_serving.protocol import Decision, ExecutorTotals, Iteration, iteration_shape


def engine_gpu_indices(tp: int, pp: int, cpu: bool) -> Optional[List[int]]:
    """The CUDA devices the engine's ranks run on, whose NVML energy the job's record sums: vLLM's
    multiprocessing executor puts rank r (tp x pp ranks) on ``cuda:r`` of the job's visible devices
    (``CUDA_VISIBLE_DEVICES``, mapped to NVML by UUID in :mod:`harness.gpus`), so GPUs the job sees but
    the engine does not use are not counted. None on a CPU (no NVML counter: the meter is unavailable)."""
    return None if cpu else list(range(int(tp) * int(pp)))


def validate_real(cfg, backend) -> None:
    """Checks for the real vLLM path (before any work)."""
    m = cfg.model
    if m.hf_model_type not in ARCH:
        raise ConfigError(
            f"model.hf_model_type={m.hf_model_type!r} is not allowed for backend=vllm: one of {', '.join(ARCH)}"
        )
    check_weights(m)
    if backend.device == "cpu":
        check_cpu_model(m, "vLLM")
    check_parallelism(cfg, backend)
    if cfg.system.dvfs.actuate and backend.device != "cuda":
        raise ConfigError("system.dvfs.actuate=true is not allowed without an NVIDIA GPU")
    warn = check_vllm_version(installed_vllm_version())
    if warn:
        say(warn, warning=True)


def real_parallelism(cfg) -> Tuple[int, int, dict]:
    """(tp, pp, the settings they came from) the real path runs: what the user set -- ``tp``/``pp``,
    or a literal ``system.tp``/``system.pp``/``system.parallel`` ("TPxPP", which wins, as in
    :func:`systems.energy_serving.build.parallelism`) -- else 1 x 1. A system's paper default
    (``${first:${tp},2}``: 2 x 4 A100s) is the simulator's and not used here. The settings: {"tp":
    "system.parallel='2x1'", ...}, the words a message names the value by."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg.system, resolve=False)

    def literal(v) -> bool:
        return v is not None and v != "" and not (isinstance(v, str) and v.startswith("${"))

    if literal(raw.get("parallel")):
        tp, pp = parallelism(cfg)
        said = f"system.parallel={str(raw['parallel'])!r}"
        return tp, pp, {"tp": said, "pp": said}
    out, said = [], {}
    for k in ("tp", "pp"):
        top, own = cfg.get(k), raw.get(k)
        v, name = (top, k) if top is not None else (own, f"system.{k}") if literal(own) else (1, k)
        out.append(int(v))
        said[k] = f"{name}={v}"
    return out[0], out[1], said


# vLLM-CPU's worker threads per rank (VLLM_CPU_OMP_THREADS_BIND: "0|1" = rank 0 on core 0, rank 1 on
# core 1); its default, "auto", binds one rank per NUMA node and refuses two on one node
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_rank_bind(tp: int, threads: int = 1) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``tp`` ranks (tp x pp of them: vLLM numbers a rank
    pp_rank x tp + tp_rank): the user's own (not ``auto``), else
    ``threads`` of this process's allowed cores per rank (``backend.threads``, as one device has;
    0 = all of them split into ``tp`` equal groups): "0|1"."""
    own = os.environ.get(CPU_BIND_ENV, "auto")
    if own != "auto":
        return own
    cores = sorted(os.sched_getaffinity(0))
    per = int(threads) or len(cores) // tp
    return "|".join(",".join(str(c) for c in cores[r * per : (r + 1) * per]) for r in range(tp))


def check_parallelism(cfg, backend) -> None:
    """The real path runs tensor and pipeline parallelism (vLLM's ``tensor_parallel_size`` and
    ``pipeline_parallel_size``: one worker process per rank, tp x pp ranks); a setting it could not
    run (more ranks than cores on a CPU, or than GPUs on CUDA) exits 2 naming what it would need, so
    a record never says a parallelism that did not run (issue 41)."""
    tp, pp, said = real_parallelism(cfg)
    ranks = tp * pp
    if ranks == 1:
        return
    name = (
        said["tp"] if pp == 1 else said["pp"] if tp == 1 or said["tp"] == said["pp"] else f"{said['tp']} {said['pp']}"
    )
    if backend.device == "cpu":
        cores = len(os.sched_getaffinity(0))
        bind = os.environ.get(CPU_BIND_ENV, "auto")
        per = int(cfg.backend.get("threads", 1)) or 1
        if bind == "auto" and ranks * per > cores:
            raise ConfigError(
                f"{name} is not allowed for backend=vllm on this CPU: vLLM-CPU runs one worker per rank "
                f"(tp x pp = {ranks}), each on its own backend.threads={per} cores, and this process may use "
                f"{cores} (tp x pp x backend.threads <= {cores})"
            )
        if bind not in ("auto", "nobind") and len(bind.split("|")) != ranks:
            raise ConfigError(
                f"{name} is not allowed for backend=vllm with {CPU_BIND_ENV}={bind!r}: it names "
                f"{len(bind.split('|'))} ranks' cores ('|' between ranks); give tp x pp = {ranks}, or unset it"
            )
    else:
        import torch

        n = torch.cuda.device_count()
        if ranks > n:
            raise ConfigError(
                f"{name} is not allowed for backend=vllm here: it needs tp x pp = {ranks} GPUs (one per rank), "
                f"this job sees {n} (CUDA_VISIBLE_DEVICES)"
            )


def pp_receive_buffers(worker) -> bool:
    """vLLM-CPU's PP patch (run in every worker by ``collective_rpc`` after the engine is built):
    allocate a later pipeline stage's receive buffer (``model_runner.intermediate_tensors``, its
    ``max_num_tokens`` rows), which vLLM allocates only in a dummy forward pass
    (``gpu_model_runner._dummy_run``) that vLLM-CPU 0.32 never runs with ``enforce_eager``
    (``cpu_model_runner.warming_up_model`` returns at ``CompilationMode.NONE``); without it the
    first step fails in ``sync_and_gather_intermediate_tensors`` (``assert self.intermediate_tensors
    is not None``). A GPU's runner allocates it when vLLM profiles memory. True where it allocated."""
    from vllm.distributed.parallel_state import get_pp_group

    r = worker.model_runner
    if get_pp_group().is_first_rank or r.intermediate_tensors is not None:
        return False
    r.intermediate_tensors = r.model.make_empty_intermediate_tensors(
        batch_size=r.max_num_tokens, dtype=r.model_config.dtype, device=r.device
    )
    return True


def decode_quota(free: int, slots: int, decodes: int, m: int) -> int:
    """Decodes a new microbatch takes under S2's microbatch count ``m``: of the ``free`` decodes
    (prefill done, no token in flight; ``decodes`` = D with those in flight), at most BEAM's
    b = ceil(D/m) (Eq. 2's microbatch) and at most an even split of the free ones over the
    ``slots`` microbatches not in flight, ceil(free / slots) (slots < 1 counts as 1). In a
    decode-only state the batches then settle to the simulator's slot sizes (sim.SimExecutor: each
    decode joins the emptiest of m slots, so they differ by at most one: 4 over 3 -> 2, 1, 1), from
    any split the batches in flight had (4 over 2 from 3 + 1: 1, 2, 2, ...)."""
    b = -(-int(decodes) // max(1, int(m)))
    return min(int(free), b, -(-int(free) // max(1, int(slots))))


def _decodes_first(per, decoding) -> Tuple[list, int]:
    """A schedule's [(request id, tokens, computed before)] (ids as vLLM's strings) with the decodes
    (ids in ``decoding``) first, as ``Iteration`` lists them, and their count (``n_decodes``)."""
    sched = [(int(k), n, c) for k, n, c in per]
    decodes = [x for x in sched if x[0] in decoding]
    return decodes + [x for x in sched if x[0] not in decoding], len(decodes)


def _torch_threads(worker) -> int:
    """A vLLM worker's torch thread count (run in each worker by ``collective_rpc``)."""
    import torch

    return torch.get_num_threads()


def write_model_dir(model, path: Path) -> Path:
    """A HF config.json for ``model`` (random weights: vLLM ``load_format='dummy'``)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config_dict(model), indent=1))
    return path


class VllmServer:
    """An in-process vLLM V1 engine with run-time chunk-size control and a scheduler tap.

    Args: model_dir, dtype, max_chunk (the init token budget = the largest chunk ever used),
    max_num_seqs, kv_cache_bytes, max_model_len, seed, threads (torch's thread count, set before
    vLLM binds it; 0 = torch's default: harness.machine.set_threads), cpu (the device is this CPU:
    probes time a step by the engine thread's CPU
    time, which a shared machine's other processes do not inflate; on a GPU, by wall time), tp
    (vLLM's ``tensor_parallel_size``: above 1, one worker process per rank (``mp`` executor, the
    engine core and its scheduler still in this process), each on its own cores on a CPU
    (:func:`cpu_rank_bind`); probes then time by wall time, as the model runs in the workers),
    pp (vLLM's ``pipeline_parallel_size``: tp x pp worker processes; on a CPU with
    :func:`pp_receive_buffers` applied after the build). ``step_log``: per schedule (budget, total
    scheduled, [(external id, tokens, tokens already computed before them)], [preempted external ids]).

    Under PP (pp > 1) a step is vLLM's ``EngineCore.step_with_batch_queue``: it schedules a new
    batch (a microbatch) and returns no tokens while fewer than ``batch_queue_size`` batches are in
    flight, else waits for the oldest and returns its tokens. S2's microbatch count m
    (:meth:`set_microbatches`) is applied there, a patch of vLLM's engine core: ``batch_queue_size``
    = m before each step (the queue itself unbounded; with more than m in flight after m was
    lowered, a step waits for the oldest and schedules none), and each new batch takes
    :func:`decode_quota` of the free decodes (the rest skipped for that schedule through vLLM's own
    per-request gate ``next_decode_eligible_step``) plus ``chunk`` prefill tokens (the token budget
    = chunk + its decodes). ``done``: batches whose tokens came back (time, schedule time, step_log
    entry, external ids of its decodes), from a tap on ``scheduler.update_from_output``.
    """

    def __init__(
        self,
        model_dir: Path,
        dtype: str,
        max_chunk: int,
        max_num_seqs: int,
        kv_cache_bytes: int,
        max_model_len: int,
        seed: int = 0,
        threads: int = 1,
        cpu: bool = True,
        tp: int = 1,
        pp: int = 1,
    ):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before importing vllm (in-process worker)
        import torch

        set_threads(threads)  # vLLM makes later calls no-ops
        import vllm
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        check_vllm_version(vllm.__version__)  # the release the tap below is written against
        n_ranks = tp * pp
        ranks = {}
        if n_ranks > 1:
            ranks = dict(tensor_parallel_size=tp, pipeline_parallel_size=pp, distributed_executor_backend="mp")
        args = EngineArgs(
            model=str(model_dir),
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=True,
            kv_cache_memory_bytes=int(kv_cache_bytes),
            max_num_batched_tokens=max_chunk,
            max_num_seqs=max_num_seqs,
            enable_chunked_prefill=True,
            enable_prefix_caching=False,
            block_size=32,
            seed=seed,
            **ranks,
        )
        bind = os.environ.get(CPU_BIND_ENV)
        if cpu and n_ranks > 1:
            os.environ[CPU_BIND_ENV] = cpu_rank_bind(n_ranks, threads)  # read by the workers as they start
        try:
            self.engine = LLMEngine.from_engine_args(args)
        finally:
            if bind is None:
                os.environ.pop(CPU_BIND_ENV, None)
            else:
                os.environ[CPU_BIND_ENV] = bind
        self.max_chunk, self.max_num_seqs, self.tp, self.pp = max_chunk, max_num_seqs, tp, pp
        self.thread_clock = cpu and n_ranks == 1  # the model runs in this thread
        self.probe_clock = time.thread_time if self.thread_clock else time.perf_counter
        self.threads = min(self.engine.collective_rpc(_torch_threads)) if n_ranks > 1 else torch.get_num_threads()
        self.core = self.engine.engine_core.engine_core
        self.sched = self.core.scheduler
        self.step_log: List[tuple] = []
        self.chunk: Optional[int] = None  # pp > 1, serving: a batch's prefill tokens (None: probes set the budget)
        self.m = 1  # pp > 1: the microbatch count
        self.batches: dict = {}  # pp > 1: id(scheduler output) -> (time scheduled, step_log entry, decode ids)
        self.done: List[tuple] = []
        self.max_in_flight = 0  # pp > 1: the most non-empty batches seen in flight at once
        if pp > 1:
            from collections import deque

            if self.core.batch_queue is None:
                raise RuntimeError(f"vLLM built pipeline_parallel_size={pp} without its batch queue")
            if cpu:
                got = self.engine.collective_rpc(pp_receive_buffers)
                if sum(got) != tp * (pp - 1):  # every rank of every later stage
                    raise RuntimeError(f"PP receive buffers allocated on {sum(got)} ranks, want {tp * (pp - 1)}")
            self.core.batch_queue = deque()  # unbounded: batch_queue_size (= m, set per step) bounds it
            self.set_microbatches(pp)
        orig, reqs = self.sched.schedule, self.sched.requests

        def tapped(*a, **k):
            held, decs = self._hold_decodes() if pp > 1 else ([], ())
            try:
                so = orig(*a, **k)
            finally:
                for r, v in held:
                    r.next_decode_eligible_step = v
            per = [
                (rid.rsplit("-", 1)[0], n, reqs[rid].num_computed_tokens - n)  # computed: already advanced
                for rid, n in so.num_scheduled_tokens.items()
            ]
            pre = [rid.rsplit("-", 1)[0] for rid in (so.preempted_req_ids or ())]
            entry = (self.sched.max_num_scheduled_tokens, so.total_num_scheduled_tokens, per, pre)
            self.step_log.append(entry)
            if pp > 1:
                self.batches[id(so)] = (time.perf_counter(), entry, {d.rsplit("-", 1)[0] for d in decs})
                self.max_in_flight = max(self.max_in_flight, self._in_flight())
            return so

        self.sched.schedule = tapped
        if pp > 1:
            update = self.sched.update_from_output

            def returned(so, out):
                res = update(so, out)
                b = self.batches.pop(id(so), None)
                if b is not None:
                    self.done.append((time.perf_counter(), *b))
                return res

            self.sched.update_from_output = returned

    def _in_flight(self) -> int:
        """Non-empty batches scheduled whose tokens have not come back (pp > 1)."""
        return sum(1 for b in self.batches.values() if b[1][1] > 0)

    def set_microbatches(self, m: int) -> int:
        """S2's microbatch count (pp > 1; see the class docstring): at most ``m`` >= 1 batches in
        flight from the next step on. Returns what was set."""
        self.m = max(1, int(m))
        return self.m

    def _hold_decodes(self) -> Tuple[list, list]:
        """Before a schedule under PP: the free decodes (running, prefill done, no token in flight)
        beyond :func:`decode_quota` of the microbatches not in flight are held back for this
        schedule (vLLM skips a running request while ``current_step < next_decode_eligible_step``;
        ``schedule`` counts the step first), and the token budget is set to chunk + the decodes it
        takes. Returns ([(request, its old gate)] to restore, internal ids of every decode)."""
        decs = [r for r in self.sched.running if r.num_output_tokens > 0 and not r.is_prefill_chunk]
        free = [r for r in decs if r.num_tokens_with_spec + r.num_output_placeholders > r.num_computed_tokens]
        q = decode_quota(len(free), self.m - self._in_flight(), len(decs), self.m)
        gate = self.sched.current_step + 2
        held = [(r, r.next_decode_eligible_step) for r in free[q:]]
        for r, _ in held:
            r.next_decode_eligible_step = gate
        if self.chunk is not None:
            self.set_budget(self.chunk + q)
        return held, [r.request_id for r in decs]

    def set_budget(self, n: int) -> int:
        """Set the per-step token budget (clamped to [1, init budget]); returns what was set."""
        n = int(max(1, min(n, self.max_chunk)))
        self.sched.max_num_scheduled_tokens = n
        self.sched.scheduler_config.max_num_batched_tokens = n
        return n

    def add(self, rid: str, prompt: List[int], max_tokens: int) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = SamplingParams(
            max_tokens=int(max_tokens),
            temperature=0.0,
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        self.engine.add_request(rid, {"prompt_token_ids": prompt}, sp)

    def step(self):
        """One engine step (under PP: schedule a batch, or wait for the oldest; see the class docstring)."""
        if self.pp == 1:
            return self.engine.step()
        core = self.core
        n = len(core.batch_queue)
        if n < self.m:
            core.batch_queue_size = self.m
            return self.engine.step()
        core.batch_queue_size = n + 1  # m was lowered: wait for the oldest batch, schedule none
        self.sched.has_requests = lambda: False
        try:
            return self.engine.step()
        finally:
            del self.sched.has_requests

    def busy(self) -> bool:
        return self.engine.has_unfinished_requests()

    def close(self) -> None:
        try:
            self.engine.engine_core.shutdown()
        except Exception:
            pass

    # -- probes: the iterations a profiling pass measures (same batches as profiler.sim_measure) ----
    def _timed_steps(self, want) -> List[float]:
        """Step until idle; the durations (s, ``probe_clock``) of steps whose schedule ``want(per)``
        accepts."""
        ts = []
        while self.busy():
            t0 = self.probe_clock()
            self.step()
            dt = self.probe_clock() - t0
            if self.step_log and want(self.step_log[-1][2]):
                ts.append(dt)
        return ts

    def probe_prefill(self, n: int, rng: np.random.Generator, vocab: int, reps: int = 3) -> List[float]:
        """Times (s) of ``reps`` steps that each prefill one fresh ``n``-token prompt (after a warm-up)."""
        self.set_budget(self.max_chunk)
        ts = []
        for r in range(reps + 1):
            self.add(f"probe-p{n}-{r}", rng.integers(10, vocab - 1, n).tolist(), 1)
            t = self._timed_steps(lambda per: len(per) == 1 and per[0][1] == n)
            ts += t if r else []
        self.step_log.clear()
        return ts

    def probe_decode(self, n: int, ctx: int, rng: np.random.Generator, vocab: int, reps: int = 3) -> List[float]:
        """Times (s) of ``reps`` decode steps of ``n`` sequences reading about ``ctx`` KV tokens each
        (after a warm-up step)."""
        self.set_budget(self.max_chunk)
        fill = -(-n * ctx // self.max_chunk) + reps + 3  # steps until all are decoding, and reps
        for i in range(n):
            self.add(f"probe-d{n}-{i}", rng.integers(10, vocab - 1, max(ctx - 1, 1)).tolist(), fill)
        ts = self._timed_steps(lambda per: len(per) == n and all(t == 1 for _, t, _ in per))
        self.step_log.clear()
        return ts[1 : reps + 1]

    def probe_mixed(self, b: int, ctx: int, n: int, rng: np.random.Generator, vocab: int, reps: int = 3) -> List[float]:
        """Times (s) of ``reps`` steps holding ``b`` decodes (about ``ctx`` KV tokens each) and one
        fresh ``n``-token prefill chunk (after a warm-up)."""
        fill = -(-b * ctx // self.max_chunk) + 2 * (reps + 1) + 3
        for i in range(b):
            self.add(f"probe-m{b}-{i}", rng.integers(10, vocab - 1, max(ctx - 1, 1)).tolist(), fill)
        self.set_budget(self.max_chunk)
        while any(t > 1 for _, t, _ in (self.step_log[-1][2] if self.step_log else [(0, 2, 0)])):
            self.step()  # until only decodes run
        ts = []
        for r in range(reps + 1):
            self.add(f"probe-mp{n}-{r}", rng.integers(10, vocab - 1, n).tolist(), 1)
            self.set_budget(b + n)
            t0 = self.probe_clock()
            self.step()
            dt = self.probe_clock() - t0
            per = self.step_log[-1][2]
            if r and len(per) == b + 1 and sum(t for _, t, _ in per) == b + n:
                ts.append(dt)
        self.set_budget(self.max_chunk)
        while self.busy():
            self.step()
        self.step_log.clear()
        return ts


def profile_latency(
    server: VllmServer, points: List[int], vocab: int, ctx: float, max_decodes: int, reps: int = 3
) -> Tuple[dict, List[int]]:
    """Measured iteration latency (s, median of ``reps``) at each token count: a decode batch of n
    sequences with ``ctx`` context each for n <= max_decodes (``profiler.decode_batch_max``), one
    n-token prefill above (profiler.sim_measure's rule). Returns (latency by n, the n <= max_decodes
    measured as a prefill because vLLM never ran their n decodes in one step, e.g. KV blocks for the
    probe's extra decoded tokens: an empty probe would make the whole table NaN)."""
    rng = np.random.default_rng(1)
    out, as_prefill = {}, []
    for n in points:
        ts = server.probe_decode(n, int(ctx), rng, vocab, reps) if n <= max_decodes else []
        if not ts:
            if n <= max_decodes:
                as_prefill.append(n)
            ts = server.probe_prefill(n, rng, vocab, reps)
        out[n] = float(np.median(ts))
    return out, as_prefill


class VllmExecutor:
    """vLLM as an executor (see the module docstring). ``now``: wall seconds since construction;
    ``cpu``: each Iteration also gets this thread's CPU time (where the model runs in it)."""

    def __init__(self, server: VllmServer, prompts: List[List[int]], actuator, meter, cpu: bool = True):
        self.server, self.prompts, self.act, self.meter, self.cpu = server, prompts, actuator, meter, cpu
        self.chunk, self.clock = server.max_chunk, None
        self.pre: List[int] = []  # pp > 1: preempted since the last report
        server.step_log.clear()
        server.done.clear()
        server.max_in_flight = 0
        self.clock_log: List[tuple] = []
        self.decoding: set = set()
        self.seen: set = set()
        self.preemptions = 0
        self.meter.begin_window("serve")
        self.start = time.perf_counter()
        self.now = 0.0

    def add(self, rid: int, input_len: int, output_len: int, now: float) -> None:
        self.server.add(str(rid), self.prompts[rid], output_len)

    def apply(self, d: Decision, now: float) -> None:
        self.chunk = int(d.chunk)
        if self.server.pp > 1:
            self.server.chunk = self.chunk
            self.server.set_microbatches(d.microbatches)
        if d.clock_mhz != self.clock:
            self.clock = float(d.clock_mhz)
            self.act.request(self.clock, now)
            self.clock_log.append((now, self.clock))

    def busy(self) -> bool:
        return self.server.busy()

    def advance(self, until: float) -> Optional[Iteration]:
        self.now = time.perf_counter() - self.start
        if self.now >= until:
            return None
        if not self.server.busy():
            time.sleep(until - self.now)
            self.now = time.perf_counter() - self.start
            return None
        if self.server.pp > 1:
            return self._advance_batches(until)
        budget = self.server.set_budget(self.chunk + len(self.decoding))
        c0, t0 = time.thread_time(), time.perf_counter()
        outs = self.server.step()
        t1, cpu = time.perf_counter(), time.thread_time() - c0
        self.now = t1 - self.start
        _, _, per, pre = self.server.step_log[-1] if self.server.step_log else (0, 0, [], [])
        self.server.step_log.clear()
        preempted = [int(k) for k in pre]
        for r in preempted:
            self.decoding.discard(r)
        was_decoding = set(self.decoding)
        self.preemptions += len(preempted)
        emitted, finished = self._outputs(outs)
        sched, n_dec = _decodes_first(per, was_decoding)
        return Iteration(
            self.now,
            t1 - t0,
            None,
            sched,
            emitted,
            finished,
            preempted,
            budget,
            self.clock or 0.0,
            cpu if self.cpu else None,
            iteration_shape(sched),
            n_dec,
        )

    def _outputs(self, outs) -> Tuple[list, list]:
        """(emitted, finished) request ids of a step's outputs (the decoding set kept)."""
        emitted, finished = [], []
        for o in outs:
            r = int(o.request_id)
            emitted += [r] * len(o.outputs[0].token_ids)
            self.decoding.add(r)
            if o.finished:
                finished.append(r)
                self.decoding.discard(r)
        return emitted, finished

    def _advance_batches(self, until: float) -> Optional[Iteration]:
        """Under PP: step until a non-empty batch's tokens come back (one Iteration per batch, from
        its schedule to its tokens: ``latency_s`` is its whole time in flight, every stage and the
        waits between them, as vLLM does not report a stage's time) or until ``until`` (None)."""
        server = self.server
        while True:
            outs = server.step()
            t1 = time.perf_counter()
            self.now = t1 - self.start
            for _, _, _, pre in server.step_log:  # preempted as batches were scheduled
                self.pre += [int(k) for k in pre]
                self.decoding.difference_update(int(k) for k in pre)
                self.preemptions += len(pre)
            server.step_log.clear()
            emitted, finished = self._outputs(outs)
            if server.done:
                t_done, t_sched, (budget, total, per, _), decs = server.done.pop(0)
                if total > 0:
                    sched, n_dec = _decodes_first(per, {int(d) for d in decs})
                    pre, self.pre = self.pre, []
                    return Iteration(
                        t_done - self.start,
                        t_done - t_sched,
                        None,
                        sched,
                        emitted,
                        finished,
                        pre,
                        budget,
                        self.clock or 0.0,
                        None,
                        iteration_shape(sched),
                        n_dec,
                    )
            if self.now >= until or not server.busy():
                return None

    def close(self, now: float) -> ExecutorTotals:
        m = self.meter.end_window("serve")
        self.now = max(now, time.perf_counter() - self.start)
        return ExecutorTotals(m.energy_j, m.reason, {}, list(self.clock_log), self.preemptions)


class VllmServing:
    """The real backend of :func:`systems.energy_serving.runner.run`: one vLLM engine (its scheduler
    in this process), ``p`` pipeline stages of ``g`` TP ranks, the controller's table measured on it
    (at locked clocks on the user's own GPU, else its latency with the clock model; under PP each
    probe is one batch through all ``p`` stages, run one at a time, and a stage's latency is taken
    as 1/p of it, as vLLM does not report a stage's time), clocks applied only with
    ``system.dvfs.actuate=true``."""

    def __init__(self, cfg, ctx):
        self.cfg, self.ctx = cfg, ctx
        self.cpu = ctx.backend.device == "cpu"
        self.g, self.p = real_parallelism(cfg)[:2]  # TP ranks per stage and stages, as the user set them (else 1)
        self.progress_label = f"{cfg.system.name} (wall s)"
        self.name = "vLLM"
        self.server = self.act = None

    def requests(self):
        return requests_for(self.cfg.workload)

    def start(self, req) -> None:
        """The KV budget and the engine. Raises RunOOM when the budget holds less than vLLM's
        max_model_len (the profiling pass's longest prefill, or the longest request)."""
        s, m = self.cfg.system, self.cfg.model
        self.n_max, self.chunks = table_grid(s)
        max_len = int(req.input_len.max() + req.output_len.max() + 8)
        self.budget = kv_budget_bytes(self.cfg, weight_bytes(m) / (self.g * self.p), real_cpu=self.cpu)  # per rank
        self.kv_cap = kv_capacity(self.budget, kv_bytes_per_rank(m, self.g, self.p), req)
        mdir = write_model_dir(m, self.ctx.outdir / "model")
        t_init = time.perf_counter()
        model_len = max(max_len, self.n_max + 8)
        short = (
            f"the profiling pass prefills up to {self.n_max} tokens (the largest chunk candidate + max_num_seqs) "
            f"as one sequence, so vLLM's max_model_len is {model_len} tokens"
        )
        if self.kv_cap < model_len:
            raise RunOOM(
                f"KV budget {self.budget / 2**20:.1f} MiB holds {self.kv_cap:.0f} tokens < {model_len}: {short}; raise "
                f"kv_budget or lower system.chunk_candidates/max_num_seqs"
            )
        try:
            self.server = VllmServer(
                mdir,
                m.dtype,
                self.n_max,
                int(s.max_num_seqs),
                self.budget,
                model_len,
                int(self.cfg.seed or 0),
                int(self.cfg.backend.get("threads", 1)),
                self.cpu,
                self.g,
                self.p,
            )
        except ValueError as e:  # vLLM's own check of max_model_len against its KV blocks
            if "max seq len" not in str(e) and "maximum model length" not in str(e):
                raise
            raise RunOOM(f"vLLM: {str(e).splitlines()[0]} ({short}; raise kv_budget)") from None
        self.init_s = time.perf_counter() - t_init

    def profile_table(self, req):
        """The controller's table, measured on this engine (its points and time kept for the summary)."""
        s, w, m = self.cfg.system, self.cfg.workload, self.cfg.model
        server = self.server
        stage = StageModel(m, self.cfg.hardware, self.g, self.p)
        server.set_microbatches(1)  # under PP: one batch at a time, each probe's time its own
        self.act = act = DvfsActuator(actuate=bool(s.dvfs.actuate), gpu_indices=s.dvfs.gpu_indices)
        self.meter = meter = EnergyMeter(gpu_indices=engine_gpu_indices(self.g, self.p, self.cpu))
        small_max, ctx_tok = int(s.profile_small_max), profile_context(w)
        self.points = pts = sample_points(int(s.profile_tile), small_max, self.chunks, self.n_max)
        t_prof = time.perf_counter()
        if act.available:
            # the user's GPU: latency and energy measured at every 10th clock (locked through NVML)

            rng = np.random.default_rng(1)
            clocks = stage.clocks(int(s.freq_step_mhz))[::-1][::10][::-1]
            measure = device_measure(
                lambda n: [t / self.p for t in server.probe_prefill(n, rng, m.vocab_size, 1)],
                act,
                meter,
                clocks,
                gpus=act.num_gpus,
            )
            self.measured, self.as_prefill = {}, []
        else:
            self.measured, self.as_prefill = profile_latency(
                server,
                pts,
                m.vocab_size,
                ctx_tok,
                decode_batch_max(small_max, int(s.max_num_seqs), ctx_tok, self.kv_cap),
            )
            n_s, lat_s = np.array(pts), np.array([self.measured[n] for n in pts]) / self.p  # one stage
            measure = clock_scaled(lambda n: np.interp(n, n_s, lat_s), stage)
        table = build_table(measure, stage, s)
        self.profile_s = time.perf_counter() - t_prof
        return table

    def said(self, note: str) -> None: ...  # the note is in the record's message

    def executor(self, req):
        """The prompts (random tokens of the requests' lengths), a warm-up decode probe (excluded,
        ``WARMUP_KEY``), and the executor that serves them."""
        s, w, m = self.cfg.system, self.cfg.workload, self.cfg.model
        rng = np.random.default_rng(int(w.seed))
        prompts = [rng.integers(10, m.vocab_size - 1, int(n)).tolist() for n in req.input_len]
        t_warm = time.perf_counter()
        self.server.probe_decode(min(4, int(s.max_num_seqs)), 64, rng, m.vocab_size, reps=2)  # warm-up, excluded
        self.warmup_s = time.perf_counter() - t_warm
        return VllmExecutor(self.server, prompts, self.act, self.meter, self.server.thread_clock)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.act is not None:
            self.act.close()

    @property
    def clocks_applied(self) -> bool:
        return bool(self.act.actuate and self.act.available)

    def summary(self, res, table) -> dict:
        act, server = self.act, self.server
        return {
            "engine_init_s": self.init_s,
            "profile_s": self.profile_s,
            "warmup": "one decode probe, excluded",
            "vllm_torch_threads": server.threads,
            "vllm_kv_cache_bytes": server.engine.vllm_config.cache_config.kv_cache_memory_bytes,
            "distinct_budgets": len(np.unique(res.iterations["budget"])),
            "vllm_tp": server.engine.vllm_config.parallel_config.tensor_parallel_size,
            "vllm_pp": server.engine.vllm_config.parallel_config.pipeline_parallel_size,
            "max_batches_in_flight": server.max_in_flight if server.pp > 1 else 1,
            # under PP an iteration's latency_s is its batch's whole time in flight, not a stage's
            # (vLLM does not report one): their sum over the makespan is no stage utilisation
            **({"stage_utilization": None} if server.pp > 1 else {}),
            "clocks_actuated": self.clocks_applied,
            "clock_requests": len(act.log),
            "profile_points": len(self.points),
            "profile_latency_s": {str(k): v for k, v in self.measured.items()},
            "profile_decodes_as_prefill": self.as_prefill,
            "profile_source": "device (locked clocks)" if act.available else "measured latency x clock model",
            WARMUP_KEY: self.warmup_s,
        }

    def energy_note(self, res) -> str:
        return res.energy_reason if res.energy_j is None else ""

    def tables(self) -> dict:
        return {"clock_requests": pd.DataFrame(self.act.log, columns=["time_s", "clock_mhz", "applied", "error"])}
