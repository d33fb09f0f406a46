"""Serving family runner (BEAM paper): vanilla, Window-DVFS, BEAM and its ablations.

Both backends run one :class:`systems.energy_serving.driver.Driver` (events, controller calls, decision
log, request accounting); they differ only in the executor and in where the controller's table is
profiled -- on the backend the controller runs on, never from the simulator's cost model:

* simulated: :class:`systems.energy_serving.sim.SimExecutor`, charged by the hardware profile's
  StageModel (or, with ``system.latency_profile``, by iteration latencies measured on vLLM-CPU:
  :mod:`systems.energy_serving.calibrate`; clock decisions are then recorded, not applied, as there);
  the table is a profiling pass through the same iteration cost seen with ``system.profile_error``.
* real: :mod:`systems.energy_serving.vllm_engine` (vLLM in-process stepping, measured table).

KV budget (:mod:`systems.energy_serving.build`): weights that do not fit, or a budget (set or derived) too
small for the longest request, are a recorded oom (a sweep over budgets records each); a budget
that is not a size is bad input.
"""

from __future__ import annotations

import math

import numpy as np

from harness.config import MAX_STEPS, check_number, check_steps
from harness.errors import ConfigError, RunOOM, bad
from harness.family import RunResult
from harness.model_facts import configured_kv_budget
from systems.common.gpu_model import POWER_KEYS, StageModel
from systems.common.profile_error import ProfileError, check_profile_error
from systems.energy_serving.build import (
    build_table,
    cache_dir,
    clock_note,
    controller_for,
    display_rows,
    kv_budget_bytes,
    kv_capacity,
    parallelism,
    profile_context,
    requests_for,
    serve,
    serving_horizon_s,
    slo_check,
    stop_time,
    table_grid,
    window_profile,
)
from systems.energy_serving.calibrate import load_profile
from systems.energy_serving.config import TRACE_FORMATS, WORKLOAD_KINDS
from systems.energy_serving.controllers import CONTROLLERS
from systems.energy_serving.driver import Driver
from systems.energy_serving.metrics import summarize, vllm_bench_metrics
from systems.energy_serving.profiler import (
    clock_scaled,
    decode_batch_max,
    sim_measure,
    table_error,
    with_error,
)
from systems.energy_serving.sim import SimExecutor
from workloads.data import resolve
from workloads.serving import MAX_REQUESTS, TraceError, servegen_plan

# A serving run's memory, measured on this CPU (2026-12-05; simulated vanilla runs of llama-3.1-8b,
# 12 k and 120 k requests of 64 output tokens, 120 k of 256: peak RSS 146 MB, 885 MB, 3,074 MB): per
# request ~0.7 KB and per output token ~95 B (the per-request arrays and tables, the per-token gaps,
# timeline and iterations), beside ~150 MB for the process.
SERVING_BYTES_PER_REQUEST = 700
SERVING_BYTES_PER_OUTPUT_TOKEN = 95


def check_serving_memory(
    requests: float,
    mean_output_len: float,
    field: str,
    value,
    hint: str = "shorten workload.duration_s or lower the rate",
) -> None:
    """Exit 2 (ConfigError naming ``field``) when a run of ``requests`` expected requests of
    ``mean_output_len`` output tokens would need more than this machine's available memory
    (:func:`harness.machine.check_fits_memory`; not checked where it is unknown): ``rate=1000
    workload.duration_s=10000`` was accepted and held 1.8 GB, unfinished, after 120 s."""
    from harness.machine import check_fits_memory

    check_fits_memory(
        requests * (SERVING_BYTES_PER_REQUEST + SERVING_BYTES_PER_OUTPUT_TOKEN * mean_output_len),
        field,
        value,
        f"{requests:,.0f} expected requests of {mean_output_len:g} output tokens",
        f"measured: {SERVING_BYTES_PER_REQUEST} B per request + {SERVING_BYTES_PER_OUTPUT_TOKEN} B per output token",
        hint,
    )


def check_trace_memory(w, requests: float, mean_output_len: float, lower: str) -> None:
    """:func:`check_serving_memory` of a trace or ServeGen workload: ``requests`` (expected, at most
    ``workload.max_requests``) of ``mean_output_len`` output tokens, named ``workload.duration_s``
    (a 24-hour ServeGen segment: ~204,000 requests of ~173 output tokens, ~3.4 GiB)."""
    if w.max_requests is not None:
        requests = min(requests, int(w.max_requests))
    check_serving_memory(
        requests,
        mean_output_len,
        "workload.duration_s",
        w.duration_s,
        f"shorten workload.duration_s, {lower} or set workload.max_requests",
    )


TIMELINE_BIN_S = 1.0  # the driver's timeline bins (s): driver.Driver._timeline


def validate(cfg) -> None:
    """Raise ConfigError before any work for a bad workload, system or hardware combination."""
    w, s, hw = cfg.workload, cfg.system, cfg.hardware
    if w.get("kind") not in WORKLOAD_KINDS:
        raise bad(
            "workload",
            w.get("name"),
            f"a serving workload (kind one of {', '.join(WORKLOAD_KINDS)}): "
            "poisson, burst, ramp, ablation, azure_code, azure_conv, mooncake, servegen",
        )
    if s.controller not in CONTROLLERS:
        raise bad("system.controller", s.controller, f"one of {', '.join(CONTROLLERS)}")
    for fld in ("duration_s", "slo_ttft_s", "slo_tbt_s", "time_scale"):
        check_number(f"workload.{fld}", w[fld], "a number")
    check_number("system.window_s", s.window_s, "a Window-DVFS period in s")  # <= 0 never ticked (-5 hung)
    horizon = serving_horizon_s(w)
    horizon_text = "the serving horizon (workload.duration_s + max(120 s, duration_s / 2) to drain)"
    if horizon > MAX_STEPS * TIMELINE_BIN_S:  # the result's timeline: a row per second served, built in a loop
        raise bad(
            "workload.duration_s",
            w.duration_s,
            f"a duration whose serving horizon, duration_s + max(120 s, duration_s / 2) to drain, is at most "
            f"{MAX_STEPS * TIMELINE_BIN_S:,.0f} s (the result's timeline has a row per {TIMELINE_BIN_S:g} s "
            f"served, at most {MAX_STEPS:,}; asked for: {horizon:,.10g} s)",
        )
    if s.controller == "window_dvfs":  # the driver ticks every window_s up to the stop time (1e-300 s hung)
        check_steps("system.window_s", s.window_s, horizon, horizon_text, "a Window-DVFS period", "s")
    check_number("system.max_num_seqs", s.max_num_seqs, "a batch cap in sequences")  # 0 served nothing, status ok
    if w.kind in ("poisson", "burst", "ramp"):
        check_number("workload.rate", w.rate, "a request rate in req/s")
    if w.kind in ("burst", "ramp"):
        check_number("workload.rate_high", w.rate_high, "a request rate in req/s")
    if w.kind in ("poisson", "burst", "ramp"):  # the whole stream is drawn at the peak rate, then thinned
        peak_field = "rate" if w.kind == "poisson" or float(w.rate) >= float(w.rate_high) else "rate_high"
        peak = float(w[peak_field])
        expected = peak * float(w.duration_s)
        if expected > MAX_REQUESTS:
            raise bad(
                f"workload.{peak_field}",
                w[peak_field],
                f"a rate giving at most {MAX_REQUESTS:,} requests in a run (asked for: {peak:g} req/s x "
                f"workload.duration_s={float(w.duration_s):g} s = {expected:,.0f} expected requests)",
            )
        check_serving_memory(expected, float(w.output_len), f"workload.{peak_field}", w[peak_field])
    if w.kind == "burst":  # an empty or inverted window would be a plain Poisson stream
        check_number("workload.burst_start_s", w.burst_start_s, "a time in s", ">= 0")
        if not float(w.burst_start_s) < float(w.burst_end_s):
            raise bad(
                "workload.burst_end_s",
                w.burst_end_s,
                f"a time after workload.burst_start_s={w.burst_start_s} s (the burst is [burst_start_s, burst_end_s))",
            )
        if not float(w.burst_start_s) < float(w.duration_s):
            raise bad(
                "workload.burst_start_s",
                w.burst_start_s,
                f"a time before the run's end, workload.duration_s={w.duration_s} s",
            )
    check_number(
        "workload.len_jitter",
        w.len_jitter,
        "a fraction of input_len/output_len",
        "in [0, 1]",
        "lengths uniform within +-len_jitter of the means",
    )  # 2 was clipped at 1 token silently
    if w.max_requests is not None:  # 0 was "no requests in [0, 60) s: widen workload.duration_s"
        check_number("workload.max_requests", w.max_requests, "a request count", "> 0", "null = every request")
    if w.kind == "trace" and w.format not in TRACE_FORMATS:
        raise bad("workload.format", w.format, f"one of {', '.join(TRACE_FORMATS)}")
    if w.input_len < 1 or w.output_len < 1:
        raise bad("workload.input_len/output_len", (w.input_len, w.output_len), "token counts >= 1")
    if w.max_input_len < 1:  # 0 and -1 would truncate every prompt to nothing
        raise bad("workload.max_input_len", w.max_input_len, "a token count >= 1 (longer prompts are truncated to it)")
    seed = w.get("seed")  # -1 was numpy's "expected non-negative integer" traceback
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise bad("workload.seed", seed, "an integer >= 0")
    if w.kind == "servegen":  # -5 ran unscaled silently
        check_number(
            "workload.target_tokens_per_s",
            w.target_tokens_per_s,
            "an input+output token rate in tokens/s",
            ">= 0",
            "0 = the trace's own rates, unscaled",
        )
    tp, pp = parallelism(cfg)
    if tp < 1 or pp < 1:
        raise bad("tp/pp", (tp, pp), "integers >= 1")
    if tp * pp > int(hw.num_gpus):
        raise ConfigError(
            f"tp x pp = {tp} x {pp} = {tp * pp} GPUs is not allowed: hardware "
            f"{hw.name!r} has {hw.num_gpus} GPUs (choose tp x pp <= {hw.num_gpus})"
        )
    if cfg.model.num_heads % tp:  # vLLM's attention asserts it when the engine starts
        raise bad(
            "tp", tp, f"a divisor of the model's {cfg.model.num_heads} attention heads (each GPU gets heads / tp)"
        )
    if cfg.model.num_kv_heads % tp and tp % cfg.model.num_kv_heads:
        raise bad("tp", tp, f"a divisor or multiple of the model's {cfg.model.num_kv_heads} KV heads")
    if pp > cfg.model.num_layers:
        raise bad("pp", pp, f"<= the model's {cfg.model.num_layers} layers")
    chunks = list(s.chunk_candidates)
    if not chunks or min(chunks) < 1 or s.default_chunk < 1:
        raise bad("system.chunk_candidates/default_chunk", (chunks, s.default_chunk), "token counts >= 1")
    if any(m < 1 for m in s.microbatch_candidates):
        raise bad("system.microbatch_candidates", list(s.microbatch_candidates), "integers >= 1")
    for fld, what in (
        ("profile_tile", "the profiler's sampling step"),  # 0 crashed mid-run (range step 0)
        ("profile_small_max", "the end of the profiler's small region"),
    ):  # <= 0: IndexError mid-run
        if s[fld] < 1:
            raise bad(f"system.{fld}", s[fld], f"a token count >= 1 ({what})")
    # the profiler samples every profile_tile tokens up to profile_small_max (1e12 / 1 ate the memory)
    check_steps(
        "system.profile_tile",
        s.profile_tile,
        s.profile_small_max,
        "system.profile_small_max",
        "a sampling step",
        "tokens",
    )
    check_number("system.dvfs.delay_s", s.dvfs.delay_s, "a clock actuation delay in s", ">= 0")  # -1 was run
    check_profile_error(s.profile_error)
    if hw.kind == "gpu":
        if not (0 < hw.clock_min_mhz < hw.clock_max_mhz):
            raise bad(
                "hardware.clock_min_mhz/clock_max_mhz", (hw.clock_min_mhz, hw.clock_max_mhz), "0 < min < max (MHz)"
            )
        if s.freq_step_mhz < 1 or s.freq_step_mhz % hw.clock_step_mhz:
            raise bad(
                "system.freq_step_mhz",
                s.freq_step_mhz,
                f"a positive multiple of the profile's {hw.clock_step_mhz} MHz clock step",
            )
        fc = s.get("fixed_clock_mhz")
        if fc is not None and not (hw.clock_min_mhz <= fc <= hw.clock_max_mhz):
            raise bad(
                "system.fixed_clock_mhz",
                fc,
                f"a clock in [{hw.clock_min_mhz}, {hw.clock_max_mhz}] MHz (hardware {hw.name})",
            )
    if s.get("latency_profile"):
        prof = load_profile(s.latency_profile)
        if prof.model != cfg.model.name:
            raise bad(
                "system.latency_profile",
                s.latency_profile,
                f"a profile of model={cfg.model.name} (this one was measured with {prof.model})",
            )
        if (tp, pp) != (1, 1):
            raise bad("tp/pp", (tp, pp), "tp=1 pp=1 with system.latency_profile (it was measured on one device)")
    try:
        if w.kind == "servegen":  # its size is known before the draw: the windows' rates x the target's scale
            plan = servegen_plan(resolve(w.path), w.start_s, w.duration_s, float(w.target_tokens_per_s))
            check_trace_memory(w, plan.expected, plan.mean_output_tokens, "lower workload.target_tokens_per_s")
        req = requests_for(w, cache_dir(cfg))
    except TraceError as e:
        raise ConfigError(f"workload {w.name!r}: {e}") from None
    if w.kind == "trace":  # a trace's requests in the slice are known once it is read (the file bounds them)
        check_trace_memory(
            w, len(req), float(np.mean(req.output_len)) if len(req) else 0.0, "lower workload.time_scale"
        )
    if len(req) == 0:
        raise ConfigError(
            f"workload {w.name!r}: no requests in [{w.start_s}, {w.start_s + w.duration_s}) s "
            f"(allowed: a slice with at least one request; widen workload.duration_s or move "
            f"workload.start_s)"
        )
    configured_kv_budget(s)  # a size, or ConfigError; whether it holds the requests is the run's (oom)


def ignored_settings(cfg, overrides) -> list:
    """Warnings (harness.run, single runs) for settings given on the command line that this run does
    not use: ``system.parallel`` ("TPxPP", :func:`~systems.energy_serving.build.parallelism`) wins over
    ``tp``/``pp`` and ``system.tp``/``system.pp``; a value equal to the one used is not warned of."""
    if not cfg.system.get("parallel"):
        return []
    used = dict(zip(("tp", "pp"), parallelism(cfg)))
    out = []
    for o in overrides or ():
        name, eq, value = o.lstrip("+~").partition("=")
        key = name.removeprefix("system.")
        if eq and name in ("tp", "pp", "system.tp", "system.pp") and value.strip() != str(used[key]):
            out.append(
                f"{name}={value} has no effect: system.parallel={cfg.system.parallel} is set too and wins "
                f"(tp={used['tp']}, pp={used['pp']}; drop one of the two)"
            )
    return out


def validate_backend(cfg, backend) -> None:
    if backend.simulated:
        missing = [k for k in POWER_KEYS if k not in cfg.hardware.power]
        if cfg.hardware.kind != "gpu" or missing:
            raise ConfigError(
                f"hardware={cfg.hardware.name!r} is not allowed for the simulated serving backend: "
                f"it needs a GPU profile with a power model (hardware.power lacks {missing}); "
                f"use a100-80gb or h100"
            )
        return
    from systems.energy_serving.vllm_engine import validate_real

    validate_real(cfg, backend)


def sim_profile(cfg, stage, cost, kv_tokens: float = math.inf):
    """The profiling pass on the simulated backend: iterations charged by ``cost`` (the executor's
    ground truth), seen with ``system.profile_error``; decode batches up to
    :func:`~systems.energy_serving.profiler.decode_batch_max` (``kv_tokens``: KV tokens per stage). Returns
    (table, truth measure)."""
    s = cfg.system
    ctx_tok = profile_context(cfg.workload)
    truth = sim_measure(
        cost,
        ctx_tok,
        int(s.profile_small_max),
        decode_batch_max(int(s.profile_small_max), int(s.max_num_seqs), ctx_tok, kv_tokens),
    )
    if not cost.follows_clock:  # a measured CPU profile: the clock menu comes from the hardware model
        at_fmax = truth
        truth = clock_scaled(lambda n: at_fmax(n, stage.f_max)[0], stage)
    err = ProfileError(float(s.profile_error.bias), float(s.profile_error.noise))
    rng = np.random.default_rng([int(cfg.get("seed") or 0), 0x7AB1E])
    clocks = stage.clocks(int(s.freq_step_mhz))
    return build_table(with_error(truth, err, rng), stage, s, err.apply(stage.idle_power(clocks), rng)), truth


def run(cfg, ctx) -> RunResult:
    """One recipe on either backend (a :class:`SimServing` or a
    :class:`systems.energy_serving.vllm_engine.VllmServing`): the request stream; the backend started
    with its KV budget (a recorded oom when the weights or the longest request do not fit); the
    controller's table profiled on that backend; the controller (with Window-DVFS's load profile);
    the driver serving the stream on the backend's executor; the summary, the backend's own keys and
    the tables."""
    s, w = cfg.system, cfg.workload
    if ctx.backend.simulated:
        backend = SimServing(cfg, ctx)
    else:
        from systems.energy_serving.vllm_engine import VllmServing

        backend = VllmServing(cfg, ctx)
    req = backend.requests()
    try:
        backend.start(req)
        table = backend.profile_table(req)
        ctl = controller_for(cfg, table, p=backend.p, g=backend.g)
        if s.controller == "window_dvfs":
            ctl.load_profile = window_profile(cfg, table, req, backend.kv_cap, backend.p, backend.g)
        note = slo_check(table, backend.p, w)
        backend.said(note)
        res = serve(Driver(ctl, req, t_stop=stop_time(req, w)), backend.executor(req), ctx, backend.progress_label)
    finally:
        backend.close()
    summ = summarize(res, float(w.slo_ttft_s), float(w.slo_tbt_s))
    summ.update(
        gpus=backend.p * backend.g,
        tp=backend.g,
        pp=backend.p,
        kv_budget_bytes=backend.budget,
        **backend.summary(res, table),
        slo_infeasible=bool(note),
        workload_note=req.note,
        executor=backend.name,
    )
    applied = backend.clocks_applied
    msg = "; ".join(x for x in (note, backend.energy_note(res), clock_note(applied, summ)) if x)
    return RunResult(
        status="ok",
        message=msg,
        summary=summ,
        display=display_rows(applied),
        # vllm bench serve's result keys and units (ms), for a comparison number for number
        extra={"vllm_bench": vllm_bench_metrics(res.requests, res.gaps, res.makespan_s, w.slo_ttft_s, w.slo_tbt_s)},
        tables={
            "requests": res.requests,
            "decisions": res.decisions,
            "iterations": res.iterations,
            "timeline": res.timeline,
            **backend.tables(),
        },
    )


class SimServing:
    """The simulated backend of :func:`run`: a :class:`systems.energy_serving.sim.SimExecutor` charged
    by the hardware profile's StageModel (or a measured vLLM-CPU latency profile), the controller's
    table a profiling pass through that same cost with ``system.profile_error``."""

    def __init__(self, cfg, ctx):
        self.cfg, self.ctx = cfg, ctx
        self.g, self.p = parallelism(cfg)
        self.stage = StageModel(cfg.model, cfg.hardware, self.g, self.p)
        self.progress_label = f"{cfg.system.name} (simulated s)"
        latency_profile = cfg.system.get("latency_profile")
        self.name = "simulator (measured vLLM-CPU latency profile)" if latency_profile else "simulator"
        if latency_profile:
            self.cost = load_profile(latency_profile).cost()
        else:
            self.cost = self.stage
        self.clocks_applied = self.cost.follows_clock

    def requests(self):
        return requests_for(self.cfg.workload, cache_dir(self.cfg))

    def start(self, req) -> None:
        """The KV budget and capacity. Raises RunOOM if the weights, or the longest request's KV, do not fit."""
        hw, stage = self.cfg.hardware, self.stage
        self.budget = kv_budget_bytes(self.cfg, stage.weight_bytes_gpu)
        if self.budget <= 0:
            raise RunOOM(
                f"{self.cfg.model.name} weights need {stage.weight_bytes_gpu / 2**30:.1f} GiB per GPU at "
                f"tp={self.g} pp={self.p}; {hw.name} has {hw.memory_bytes / 2**30:.1f} GiB with a reserve of "
                f"{(hw.memory_bytes - stage.weight_bytes_gpu - self.budget) / 2**30:.1f} GiB"
            )
        self.kv_cap = kv_capacity(self.budget, stage.kv_bytes_token_gpu, req)

    def profile_table(self, req):
        self.table, self.truth = sim_profile(self.cfg, self.stage, self.cost, self.kv_cap)
        return self.table

    def said(self, note: str) -> None:
        if note:
            print(f"note: {note}")

    def executor(self, req):
        s = self.cfg.system
        return SimExecutor(
            self.cost,
            self.p,
            self.g,
            delay_s=float(s.dvfs.delay_s),
            max_num_seqs=int(s.max_num_seqs),
            kv_capacity_tokens=self.kv_cap,
        )

    def close(self) -> None: ...

    def summary(self, res, table) -> dict:
        s = self.cfg.system
        n_max, _ = table_grid(s)
        return dict(
            kv_capacity_tokens=self.kv_cap,
            profile_error_bias=float(s.profile_error.bias),
            profile_error_noise=float(s.profile_error.noise),
            **{f"table_{k}": v for k, v in table_error(table, self.truth, range(1, n_max + 1, 13)).items()},
            table_samples=len(table.samples),
            table_cells=int(table.L.size),
        )

    def energy_note(self, res) -> str:
        return ""

    def tables(self) -> dict:
        return {}
