"""Serving family runner (BEAM paper): vanilla, Window-DVFS, BEAM and its ablations.

Simulated backend: :class:`systems.serving.simulator.ServingSimulator` on the hardware profile's
latency/power model, with the controller's lookup table profiled from that model (sparse,
tile-quantised). Real backend: :mod:`systems.serving.vllm_engine` (vLLM in-process stepping).
"""
from __future__ import annotations

import math
from typing import Any, Dict

import numpy as np

from harness.errors import ConfigError, bad
from harness.errors import RunOOM
from harness.run import RunResult
from systems.serving.config import CONTROLLERS, TRACE_FORMATS, WORKLOAD_KINDS

_REQ_CACHE: Dict[str, Any] = {}


def requests_for(w):
    """The workload's request stream (cached per resolved workload config)."""
    from omegaconf import OmegaConf

    from workloads.serving import build_requests
    key = OmegaConf.to_yaml(w, resolve=True)      # resolved: the seed is an interpolation
    if key not in _REQ_CACHE:
        _REQ_CACHE.clear()
        _REQ_CACHE[key] = build_requests(w)
    return _REQ_CACHE[key]


def parallelism(cfg):
    """(tp, pp) the run uses: ``system.parallel`` ("TPxPP") if set, else system.tp / system.pp."""
    par = cfg.system.get("parallel") or ""
    if par:
        try:
            tp, pp = (int(x) for x in str(par).lower().split("x"))
        except ValueError:
            raise bad("system.parallel", par, "TPxPP with two integers, e.g. 2x4") from None
        return tp, pp
    return int(cfg.system.tp), int(cfg.system.pp)


def validate(cfg) -> None:
    """Raise ConfigError before any work for a bad workload, system or hardware combination."""
    from workloads.serving import TraceError
    w, s, hw = cfg.workload, cfg.system, cfg.hardware
    if w.get("kind") not in WORKLOAD_KINDS:
        raise bad("workload", w.get("name"), f"a serving workload (kind one of {', '.join(WORKLOAD_KINDS)}): "
                                             "poisson, burst, ramp, ablation, azure_code, azure_conv, mooncake, servegen")
    if s.controller not in CONTROLLERS:
        raise bad("system.controller", s.controller, f"one of {', '.join(CONTROLLERS)}")
    for fld in ("duration_s", "slo_ttft_s", "slo_tbt_s", "time_scale"):
        if not float(w[fld]) > 0:
            raise bad(f"workload.{fld}", w[fld], "a number > 0")
    if w.kind in ("poisson", "burst", "ramp") and not float(w.rate) > 0:
        raise bad("workload.rate", w.rate, "a request rate > 0 req/s")
    if w.kind in ("burst", "ramp") and not float(w.rate_high) > 0:
        raise bad("workload.rate_high", w.rate_high, "a request rate > 0 req/s")
    if w.kind == "trace" and w.format not in TRACE_FORMATS:
        raise bad("workload.format", w.format, f"one of {', '.join(TRACE_FORMATS)}")
    if w.input_len < 1 or w.output_len < 1:
        raise bad("workload.input_len/output_len", (w.input_len, w.output_len), "token counts >= 1")
    tp, pp = parallelism(cfg)
    if tp < 1 or pp < 1:
        raise bad("tp/pp", (tp, pp), "integers >= 1")
    if tp * pp > int(hw.num_gpus):
        raise ConfigError(f"tp x pp = {tp} x {pp} = {tp * pp} GPUs is not allowed: hardware "
                          f"{hw.name!r} has {hw.num_gpus} GPUs (choose tp x pp <= {hw.num_gpus})")
    if cfg.model.num_kv_heads % tp and tp % cfg.model.num_kv_heads:
        raise bad("tp", tp, f"a divisor or multiple of the model's {cfg.model.num_kv_heads} KV heads")
    if pp > cfg.model.num_layers:
        raise bad("pp", pp, f"<= the model's {cfg.model.num_layers} layers")
    chunks = list(s.chunk_candidates)
    if not chunks or min(chunks) < 1 or s.default_chunk < 1:
        raise bad("system.chunk_candidates/default_chunk", (chunks, s.default_chunk), "token counts >= 1")
    if any(m < 1 for m in s.microbatch_candidates):
        raise bad("system.microbatch_candidates", list(s.microbatch_candidates), "integers >= 1")
    if hw.kind == "gpu":
        if not (0 < hw.clock_min_mhz < hw.clock_max_mhz):
            raise bad("hardware.clock_min_mhz/clock_max_mhz", (hw.clock_min_mhz, hw.clock_max_mhz),
                      "0 < min < max (MHz)")
        if s.freq_step_mhz < 1 or s.freq_step_mhz % hw.clock_step_mhz:
            raise bad("system.freq_step_mhz", s.freq_step_mhz,
                      f"a positive multiple of the profile's {hw.clock_step_mhz} MHz clock step")
        fc = s.get("fixed_clock_mhz")
        if fc is not None and not (hw.clock_min_mhz <= fc <= hw.clock_max_mhz):
            raise bad("system.fixed_clock_mhz", fc, f"a clock in [{hw.clock_min_mhz}, {hw.clock_max_mhz}] MHz "
                                                    f"(hardware {hw.name})")
    try:
        req = requests_for(w)
    except TraceError as e:
        raise ConfigError(f"workload {w.name!r}: {e}") from None
    if len(req) == 0:
        raise ConfigError(f"workload {w.name!r}: no requests in [{w.start_s}, {w.start_s + w.duration_s}) s")


def validate_backend(cfg, backend) -> None:
    if backend.simulated:
        from systems.serving.gpu_model import POWER_KEYS
        missing = [k for k in POWER_KEYS if k not in cfg.hardware.power]
        if cfg.hardware.kind != "gpu" or missing:
            raise ConfigError(f"hardware={cfg.hardware.name!r} is not allowed for the simulated serving backend: "
                              f"it needs a GPU profile with a power model (hardware.power lacks {missing}); "
                              f"use a100-80gb or h100")
        return
    from systems.serving.vllm_engine import validate_real
    validate_real(cfg, backend)


def build_table(stage, s, w):
    """The controller's L/E table profiled from the stage model (sparse, tile-quantised)."""
    from systems.serving.profiler import build_table as _build, sim_measure
    clocks = stage.clocks(int(s.freq_step_mhz))
    n_max = int(max(list(s.chunk_candidates) + [s.default_chunk])) + int(s.max_num_seqs)
    measure = sim_measure(stage, ctx=float(w.input_len + w.output_len / 2) if w.kind != "servegen" else 512.0,
                          small_max=int(s.profile_small_max))
    table = _build(measure, clocks, stage.idle_power(clocks), n_max, int(s.profile_tile),
                   int(s.profile_small_max), list(s.chunk_candidates) + [s.default_chunk])
    return table, measure


def controller_for(cfg, table):
    from systems.serving.controllers import make_controller
    s, w = cfg.system, cfg.workload
    tp, pp = parallelism(cfg)
    ctl = make_controller(s.controller, table, pp, tp, float(w.slo_ttft_s), float(w.slo_tbt_s),
                          int(s.default_chunk), list(s.chunk_candidates), list(s.microbatch_candidates),
                          bool(s.search_chunk), bool(s.search_microbatch), float(s.window_s))
    if s.controller == "beam" and not s.search_freq:
        ctl.set_clocks(np.array([len(table.clocks) - 1]))
    fc = s.get("fixed_clock_mhz")
    if fc is not None:
        ctl.fixed_clock_mhz = float(table.clocks[int(np.argmin(np.abs(table.clocks - fc)))])
    return ctl


def window_profile(cfg, stage, table, req, kv_cap: float) -> dict:
    """Offline load profile for Window-DVFS on the simulator (cached under results/cache/).

    For prompt-token loads from 0.25x to 4x the workload's mean and every 10th clock of the menu,
    simulate 40 s of Poisson arrivals (lengths resampled from the workload) at a fixed clock with
    the default chunk and m = pp, and record P90 TTFT and P90 per-request mean TBT (s).
    """
    import hashlib
    import json as _json
    from pathlib import Path

    from systems.serving.controllers import Controller
    from systems.serving.simulator import ServingSimulator
    from workloads.serving import Requests
    s = cfg.system
    tp, pp = parallelism(cfg)
    mean_rate = float(req.input_len.sum()) / max(float(req.arrival_s[-1]), 1.0)
    loads = mean_rate * np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0])
    ci = np.arange(len(table.clocks) - 1, -1, -10)[::-1]
    key = _json.dumps(["v2-40s", list(map(float, loads / mean_rate)), cfg.model.name, cfg.hardware.name, tp, pp, int(s.default_chunk), int(s.max_num_seqs),
                       round(mean_rate, 1), int(req.input_len.sum()), int(req.output_len.sum()),
                       sorted(dict(cfg.hardware.power).items()), list(map(float, table.clocks[ci]))])
    path = Path(cfg.get("results_dir", "results")) / "cache" / f"window_profile_{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz"
    if path.exists():
        z = np.load(path)
        return {k: z[k] for k in z.files}
    rng = np.random.default_rng(0)
    ttft = np.full((len(loads), len(ci)), np.inf)
    tbt = np.full_like(ttft, np.inf)
    for i, load in enumerate(loads):
        lam = load / float(req.input_len.mean())
        n = max(int(rng.poisson(lam * 40.0)), 1)
        idx = rng.integers(0, len(req), n)
        sub = Requests(np.sort(rng.uniform(0, 40.0, n)), req.input_len[idx], req.output_len[idx])
        for j, c in enumerate(ci):
            ctl = Controller(table=table, p=pp, g=tp, slo_ttft=1.0, slo_tbt=1.0, default_chunk=int(s.default_chunk),
                             fixed_clock_mhz=float(table.clocks[c]))
            r = ServingSimulator(stage, ctl, sub, pp, tp, max_num_seqs=int(s.max_num_seqs),
                                 kv_capacity_tokens=kv_cap, drain_s=30.0).run().requests
            ttft[i, j] = float(np.nanpercentile(r.ttft_s.fillna(np.inf), 90))
            tb = r.tbt_mean_s.dropna()
            tbt[i, j] = float(np.percentile(tb, 90)) if len(tb) else 0.0
    prof = {"loads": loads, "clocks": table.clocks[ci], "ttft_p90": ttft, "tbt_p90": tbt}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **prof)
    return prof


def slo_check(table, p: int, w) -> str:
    """A note when an SLO is tighter than any configuration can meet (run goes on at max clock)."""
    notes = []
    tbt_min = p * float(table.L[1, -1])
    if w.slo_tbt_s < tbt_min:
        notes.append(f"SLO TBT {w.slo_tbt_s:g} s < the fastest possible {tbt_min:.4g} s (1 token, max clock, "
                     f"{p} stages): every token misses")
    ttft_min = p * float(table.L[1, -1])
    if w.slo_ttft_s < ttft_min:
        notes.append(f"SLO TTFT {w.slo_ttft_s:g} s < the fastest possible {ttft_min:.4g} s: every request misses")
    return "; ".join(notes)


def display_rows():
    def pct(v):
        return f"{100 * v:.1f} %"

    def ms(v):
        return f"{1e3 * v:.1f} ms"

    def num(v):
        return f"{v:,.4g}"
    return [
        ("requests (completed)", "completed", lambda v: f"{v:,}"),
        ("energy", "energy_j", lambda v: f"{v / 1e3:,.1f} kJ"),
        ("energy / output token", "energy_per_token_j", lambda v: f"{v:.3f} J"),
        ("average power", "avg_power_w", lambda v: f"{v:,.0f} W"),
        ("TTFT P50", "ttft_p50_s", ms),
        ("TTFT P90", "ttft_p90_s", ms),
        ("TTFT P99", "ttft_p99_s", ms),
        ("TBT P50", "tbt_p50_s", ms),
        ("TBT P90", "tbt_p90_s", ms),
        ("TBT P99", "tbt_p99_s", ms),
        ("SLO attainment TTFT", "slo_ttft_attainment", pct),
        ("SLO attainment TBT (per request)", "slo_tbt_attainment", pct),
        ("mean SM clock chosen (set on a GPU only with actuate=true)", "mean_clock_mhz", lambda v: f"{v:,.0f} MHz"),
        ("mean chunk size", "mean_chunk", num),
        ("mean microbatches", "mean_microbatches", num),
        ("decisions", "decisions", lambda v: f"{v:,}"),
        ("decision time P50", "decision_us_p50", lambda v: f"{v:.1f} us"),
        ("decision time P99", "decision_us_p99", lambda v: f"{v:.1f} us"),
        ("predictor MAPE TTFT", "pred_ttft_mape_pct", lambda v: f"{v:.1f} %"),
        ("predictor MAPE TBT", "pred_tbt_mape_pct", lambda v: f"{v:.1f} %"),
        ("LUT latency MAPE vs ground truth", "table_latency_mape_pct", lambda v: f"{v:.2f} %"),
        ("throughput", "throughput_tok_s", lambda v: f"{v:,.0f} tok/s"),
        ("stage utilisation", "stage_utilization", pct),
    ]


def run(cfg, ctx) -> RunResult:
    if not ctx.backend.simulated:
        from systems.serving.vllm_engine import run_real
        return run_real(cfg, ctx)
    return run_sim(cfg, ctx)


def run_sim(cfg, ctx) -> RunResult:
    """Simulate the system on the hardware profile. Raises RunOOM if the weights do not fit."""
    from systems.serving.gpu_model import StageModel
    from systems.serving.metrics import summarize
    from systems.serving.profiler import table_error
    from systems.serving.simulator import ServingSimulator
    s, w, hw = cfg.system, cfg.workload, cfg.hardware
    tp, pp = parallelism(cfg)
    stage = StageModel(cfg.model, hw, tp, pp)
    free = float(hw.memory_bytes) * 0.9 - stage.weight_bytes_gpu
    if free <= 0:
        raise RunOOM(f"{cfg.model.name} weights need {stage.weight_bytes_gpu / 2**30:.1f} GiB per GPU at "
                     f"tp={tp} pp={pp}; {hw.name} has {0.9 * hw.memory_bytes / 2**30:.1f} GiB usable")
    kv_cap = free / stage.kv_bytes_token_gpu
    table, measure = build_table(stage, s, w)
    ctl = controller_for(cfg, table)
    req = requests_for(w)
    if s.controller == "window_dvfs":
        ctl.load_profile = window_profile(cfg, stage, table, req, kv_cap)
    note = slo_check(table, pp, w)
    if note:
        print(f"note: {note}")
    sim = ServingSimulator(stage, ctl, req, pp, tp, delay_s=float(s.dvfs.delay_s),
                           max_num_seqs=int(s.max_num_seqs), kv_capacity_tokens=kv_cap,
                           drain_s=max(120.0, 0.5 * float(w.duration_s)))
    with ctx.progress(int(math.ceil(sim.t_stop)), f"{s.name} (simulated s)") as bar:
        res = sim.run(progress=bar)
    summ = summarize(res.requests, res.gaps, res.gap_times, res.decisions, res.energy_j, res.makespan_s,
                     float(w.slo_ttft_s), float(w.slo_tbt_s))
    tl = res.timeline
    busy = tl["time_s"] < res.makespan_s
    summ.update(
        mean_clock_mhz=float(tl.loc[busy, "clock_mhz"].mean()),
        mean_chunk=float(tl.loc[busy, "chunk"].mean()),
        mean_microbatches=float(tl.loc[busy, "microbatches"].mean()),
        iterations=res.iterations, stage_utilization=res.stage_busy_s / max(res.makespan_s, 1e-9), gpus=tp * pp, tp=tp, pp=pp,
        **{f"table_{k}": v for k, v in table_error(table, measure, range(1, table.n_max + 1, 7)).items()},
        table_samples=len(table.samples), table_cells=int(table.L.size),
        slo_infeasible=bool(note), workload_note=req.note,
    )
    msg = note
    return RunResult(status="ok", message=msg, summary=summ, display=display_rows(),
                     tables={"requests": res.requests, "decisions": res.decisions, "timeline": res.timeline})
