"""Real engine path: the serving controllers driving vLLM (V1, in-process stepping).

Requests are added at their arrival times (wall clock); the controller is called at the same events
as in the simulator (arrival, finish, entering decode-only, window ticks). Between steps the chunk
size is set on the V1 scheduler (``vllm_cpu.md`` §6: ``scheduler.max_num_scheduled_tokens`` and
``scheduler_config.max_num_batched_tokens``; the engine starts at the largest chunk because the
budget can only be lowered). vLLM's budget counts decode tokens too, so it is set to chunk + running
decodes. Every step's scheduled tokens are logged from the scheduler, which shows the chunk size
really changing.

Clocks: requested through :class:`systems.serving.actuator.DvfsActuator` (records only unless
``system.dvfs.actuate=true`` on a user's own NVIDIA GPU, where the table is then measured at every
10th clock with locked clocks and NVML energy windows). On CPU there is no clock: the controller's
table holds the latencies measured on this machine (a sparse, tile-quantised profile taken before
the run) scaled over the hardware profile's clock menu by its latency model, and energies from
its power model -- so the clock decisions are what BEAM would request on that GPU, and they are
recorded, never applied. Energy is measured with NVML windows when available, else recorded as
unavailable (None, with the reason). Pipeline microbatching is not available on one device (m = 1).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pandas as pd

from harness.errors import ConfigError
from harness.model_facts import CAUSAL_LM as ARCH   # architecture class per model type
from harness.run import RunResult

CPU_MAX_WEIGHT_BYTES = 2 << 30


def validate_real(cfg, backend) -> None:
    """Checks for the real vLLM path (before any work)."""
    from harness.model_facts import weight_bytes
    m = cfg.model
    if m.hf_model_type not in ARCH:
        raise ConfigError(f"model.hf_model_type={m.hf_model_type!r} is not allowed for backend=vllm: one of "
                          f"{', '.join(ARCH)}")
    if m.weights != "random" and not Path(m.weights).exists():
        raise ConfigError(f"model.weights={m.weights!r} is not allowed: 'random' or an existing checkpoint dir")
    if backend.device == "cpu":
        need = weight_bytes(m)
        if need > CPU_MAX_WEIGHT_BYTES:
            raise ConfigError(f"model={m.name!r} ({need / 2**30:.1f} GiB of weights) is not allowed for backend=vllm "
                              f"on CPU: use a tiny-* model (<= {CPU_MAX_WEIGHT_BYTES >> 30} GiB)")
        for k in ("tp", "pp"):
            v = cfg.get(k)
            if v is not None and int(v) != 1:
                raise ConfigError(f"{k}={v} is not allowed for backend=vllm on CPU: one device (tp=1, pp=1)")
    if cfg.system.dvfs.actuate and backend.device != "cuda":
        raise ConfigError("system.dvfs.actuate=true is not allowed without an NVIDIA GPU")


def write_model_dir(model, path: Path) -> Path:
    """A HF config.json for ``model`` (random weights: vLLM ``load_format='dummy'``)."""
    from harness.model_facts import hf_config_dict
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config_dict(model), indent=1))
    return path


class VllmServer:
    """An in-process vLLM V1 engine with run-time chunk-size control and a scheduler tap.

    Args: model_dir, dtype, max_chunk (the init token budget = the largest chunk ever used),
    max_num_seqs, kv_cache_bytes, max_model_len, seed.
    """

    def __init__(self, model_dir: Path, dtype: str, max_chunk: int, max_num_seqs: int, kv_cache_bytes: int,
                 max_model_len: int, seed: int = 0):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"     # before importing vllm (in-process worker)
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine
        args = EngineArgs(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype=dtype,
                          max_model_len=max_model_len, enforce_eager=True, kv_cache_memory_bytes=kv_cache_bytes,
                          max_num_batched_tokens=max_chunk, max_num_seqs=max_num_seqs,
                          enable_chunked_prefill=True, enable_prefix_caching=False, block_size=32, seed=seed)
        self.engine = LLMEngine.from_engine_args(args)
        self.max_chunk = max_chunk
        self.sched = self.engine.engine_core.engine_core.scheduler
        self.step_log: List[tuple] = []        # (budget, total scheduled, {external id: tokens})
        orig = self.sched.schedule

        def tapped(*a, **k):
            so = orig(*a, **k)
            per = {rid.rsplit("-", 1)[0]: n for rid, n in so.num_scheduled_tokens.items()}
            self.step_log.append((self.sched.max_num_scheduled_tokens, so.total_num_scheduled_tokens, per))
            return so
        self.sched.schedule = tapped

    def set_budget(self, n: int) -> int:
        """Set the per-step token budget (clamped to [1, init budget]); returns what was set."""
        n = int(max(1, min(n, self.max_chunk)))
        self.sched.max_num_scheduled_tokens = n
        self.sched.scheduler_config.max_num_batched_tokens = n
        return n

    def add(self, rid: str, prompt: List[int], max_tokens: int) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        sp = SamplingParams(max_tokens=int(max_tokens), temperature=0.0, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.DELTA)
        self.engine.add_request(rid, {"prompt_token_ids": prompt}, sp)

    def step(self):
        return self.engine.step()

    def busy(self) -> bool:
        return self.engine.has_unfinished_requests()

    def close(self) -> None:
        try:
            self.engine.engine_core.shutdown()
        except Exception:
            pass


def profile_latency(server: VllmServer, points: List[int], vocab: int, reps: int = 2) -> Dict[int, float]:
    """Measured step latency (s) of a prefill of n tokens, median of ``reps``, for each n in points."""
    rng = np.random.default_rng(1)
    out = {}
    for n in points:
        ts = []
        for r in range(reps):
            server.add(f"prof-{n}-{r}", rng.integers(10, vocab - 1, n).tolist(), 1)
            t0 = time.perf_counter()
            while server.busy():
                server.step()
            ts.append(time.perf_counter() - t0)
        out[n] = float(np.median(ts))
    server.step_log.clear()
    return out


def run_real(cfg, ctx) -> RunResult:
    """Serve the workload on vLLM with the configured controller; returns measured metrics."""
    from harness.meters import EnergyMeter
    from systems.serving.actuator import DvfsActuator
    from systems.serving.controllers import EngineState, WindowStats, make_controller
    from systems.serving.gpu_model import StageModel
    from systems.serving.metrics import summarize
    from systems.serving.profiler import build_table, sample_points
    from systems.serving.runner import display_rows, requests_for
    s, w, hw, m = cfg.system, cfg.workload, cfg.hardware, cfg.model
    req = requests_for(w)
    chunks = sorted({int(c) for c in list(s.chunk_candidates) + [s.default_chunk]})
    max_chunk = max(chunks) + int(s.max_num_seqs)
    max_len = int(req.input_len.max() + req.output_len.max() + 8)
    mdir = write_model_dir(m, ctx.outdir / "model")
    t_init = time.perf_counter()
    server = VllmServer(mdir, m.dtype, max_chunk, int(s.max_num_seqs), 256 << 20, max(max_len, max_chunk + 8),
                        int(cfg.seed or 0))
    init_s = time.perf_counter() - t_init
    try:
        stage = StageModel(m, hw, 1, 1)
        clocks = stage.clocks(int(s.freq_step_mhz))
        pts = sample_points(int(s.profile_tile), int(s.profile_small_max), chunks, max_chunk)
        act = DvfsActuator(actuate=bool(s.dvfs.actuate), gpu_indices=s.dvfs.gpu_indices)
        meter = EnergyMeter()
        rng = np.random.default_rng(1)

        def run_batch(n):
            server.add(f"prof-{n}-{rng.integers(1 << 30)}", rng.integers(10, m.vocab_size - 1, n).tolist(), 1)
            while server.busy():
                server.step()
        if act.available:
            # the user's GPU: latency and energy measured at every 10th clock (locked through NVML)
            from systems.serving.profiler import device_measure
            clocks = clocks[::-1][::10][::-1]
            measure = device_measure(run_batch, act, meter, clocks, gpus=act.num_gpus)
            meas = {}
        else:
            # CPU (or no actuation): latency measured at the current clock, scaled over the
            # hardware profile's clock menu by its model; energy from its power model
            meas = profile_latency(server, pts, m.vocab_size)
            n_s = np.array(pts)
            lat_meas = np.array([meas[n] for n in pts])

            def measure(n, f):
                n = np.asarray(n)
                lat_m, e_m = stage.step(n, f)
                lat_ref, _ = stage.step(n, stage.f_max)
                scale = np.interp(n, n_s, lat_meas) / lat_ref          # measured / model at f_max
                return lat_m * scale, e_m * scale
        table = build_table(measure, clocks, stage.idle_power(clocks), max_chunk, int(s.profile_tile),
                            int(s.profile_small_max), chunks)
        server.step_log.clear()
        ctl = make_controller(s.controller, table, 1, 1, float(w.slo_ttft_s), float(w.slo_tbt_s),
                              int(s.default_chunk), chunks, [1], bool(s.search_chunk), False, float(s.window_s))
        if s.controller == "beam" and not s.search_freq:
            ctl.set_clocks(np.array([len(clocks) - 1]))
        res = _serve(server, ctl, req, cfg, act, meter, ctx, EngineState, WindowStats)
    finally:
        server.close()
        if "act" in locals():
            act.close()
    reqdf, gaps, gap_t, dec, steps, energy, wall = res
    summ = summarize(reqdf, gaps, gap_t, dec, energy.energy_j, wall, float(w.slo_ttft_s), float(w.slo_tbt_s))
    budgets = steps["budget"].to_numpy()
    summ.update(engine_init_s=init_s, steps=int(len(steps)), distinct_budgets=int(len(np.unique(budgets))),
                mean_chunk=float(steps["chunk"].mean()) if len(steps) else None,
                mean_clock_mhz=float(dec["clock_mhz"].dropna().mean()) if dec["clock_mhz"].notna().any() else None,
                mean_microbatches=1.0, energy_unavailable_reason=energy.reason or None,
                clocks_actuated=bool(act.actuate and act.available), clock_requests=len(act.log),
                profile_points=len(pts), profile_latency_s={str(k): v for k, v in meas.items()},
                profile_source="device (locked clocks)" if act.actuate and not meas else "measured latency x model")
    msg = energy.reason if energy.energy_j is None else ""
    return RunResult(status="ok", message=msg, summary=summ, display=display_rows(),
                     tables={"requests": reqdf, "decisions": dec, "steps": steps,
                             "clock_requests": pd.DataFrame(act.log, columns=["time_s", "clock_mhz", "applied", "error"])})


def _serve(server, ctl, req, cfg, act, meter, ctx, EngineState, WindowStats):
    """The wall-clock serving loop. Returns (requests df, gaps, gap times, decisions, steps, energy, wall)."""
    w = cfg.workload
    N = len(req)
    rng = np.random.default_rng(int(w.seed))
    prompts = [rng.integers(10, cfg.model.vocab_size - 1, int(n)).tolist() for n in req.input_len]
    arr, inp, out = req.arrival_s.tolist(), req.input_len.tolist(), req.output_len.tolist()
    first, last, fin = [np.nan] * N, [np.nan] * N, [np.nan] * N
    gen, pref, gsum, gmax = [0] * N, [0] * N, [0.0] * N, [0.0] * N
    gaps, gap_t, dec_rows, step_rows = [], [], [], []
    waiting: List[int] = []
    n_dec = 0
    d0 = ctl.initial()
    chunk, clock = d0.chunk, d0.clock_mhz
    act.request(clock, 0.0)
    period = ctl.period_s
    next_tick = period if period else float("inf")
    win = {"arr": 0, "tok": 0, "lens": [], "d_int": 0.0, "t0": 0.0, "d_t": 0.0}

    def state(now):
        return EngineState(now, [(now - arr[r], inp[r] - pref[r]) for r in waiting[:64]], n_dec, chunk, 1, clock)

    def call(hook, now, trig, rid=-1, *a):
        nonlocal chunk, clock
        t0 = time.perf_counter_ns()
        d = hook(state(now), *a)
        us = (time.perf_counter_ns() - t0) / 1e3
        dec_rows.append((now, trig, rid, us, None if d is None else d.chunk, None if d is None else 1,
                         None if d is None else d.clock_mhz, None if d is None else d.feasible,
                         None if d is None else d.pred_ttft_s, None if d is None else d.pred_tbt_s,
                         None if d is None else d.pred_energy_j))
        if d is not None:
            chunk = int(d.chunk)
            if d.clock_mhz != clock:
                clock = float(d.clock_mhz)
                act.request(clock, now)

    meter.begin_window("serve")
    start = time.perf_counter()
    nxt = 0
    bar = ctx.progress(N, f"{cfg.system.name} (requests)")
    done = 0
    limit = float(w.duration_s) * 3 + 60
    while done < N:
        now = time.perf_counter() - start
        if now > limit:
            break
        while now >= next_tick:
            win["d_int"] += n_dec * (next_tick - win["d_t"])
            win["d_t"] = next_tick
            ws = WindowStats(win["arr"], win["tok"], win["d_int"] / period, period,
                             float(np.percentile(win["lens"], 90)) if win["lens"] else 0.0,
                             float(win["tok"]) / period)
            win.update(arr=0, tok=0, lens=[], d_int=0.0)
            call(ctl.on_tick, next_tick, "tick", -1, ws)
            next_tick += period
        while nxt < N and arr[nxt] <= now:
            server.add(str(nxt), prompts[nxt], out[nxt])
            waiting.append(nxt)
            win["arr"] += 1
            win["tok"] += inp[nxt]
            win["lens"].append(inp[nxt])
            call(ctl.on_arrival, now, "arrival", nxt)
            nxt += 1
        if not server.busy():
            if nxt < N:
                time.sleep(max(0.0, min(arr[nxt] - now, next_tick - now, 0.05)))
            continue
        budget = server.set_budget(chunk + n_dec)
        t0 = time.perf_counter()
        outs = server.step()
        t1 = time.perf_counter() - start
        if server.step_log:
            b, tot, per = server.step_log[-1]
            pf = sum(v for k, v in per.items() if k.isdigit() and pref[int(k)] < inp[int(k)])
            for k, v in per.items():
                if k.isdigit() and pref[int(k)] < inp[int(k)]:
                    pref[int(k)] = min(inp[int(k)], pref[int(k)] + v)
            step_rows.append((t1, t1 - (t0 - start), budget, chunk, tot, pf, n_dec))
        fin_n = entered = 0
        win["d_int"] += n_dec * (t1 - win["d_t"])
        win["d_t"] = t1
        for o in outs:
            r = int(o.request_id)
            k = len(o.outputs[0].token_ids)
            was_decode = gen[r] >= 1
            if gen[r] == 0 and k > 0:                  # first token: prefill done
                first[r] = last[r] = t1
                pref[r] = inp[r]
                if r in waiting:
                    waiting.remove(r)
                gen[r] = 1
                k -= 1
                if not o.finished:
                    n_dec += 1
                    entered += 1
            for _ in range(k):
                gap = t1 - last[r]
                gaps.append(gap)
                gap_t.append(t1)
                gsum[r] += gap
                gmax[r] = max(gmax[r], gap)
                last[r] = t1
                gen[r] += 1
            if o.finished:
                fin[r] = t1
                n_dec -= 1 if was_decode else 0
                fin_n += 1
                done += 1
                bar.update(1)
        if fin_n:
            call(ctl.on_finish, t1, "finish")
        elif entered and not waiting:
            call(ctl.on_decode_only, t1, "decode_only")
    wall = time.perf_counter() - start
    energy = meter.end_window("serve")
    bar.close()
    g = np.asarray(gen)
    reqdf = pd.DataFrame({"arrival_s": req.arrival_s, "input_len": req.input_len, "output_len": req.output_len,
                          "first_token_s": first, "finish_s": fin, "generated": g,
                          "ttft_s": np.asarray(first) - req.arrival_s,
                          "tbt_mean_s": np.where(g > 1, np.asarray(gsum) / np.maximum(g - 1, 1), np.nan),
                          "tbt_max_s": np.where(g > 1, gmax, np.nan)})
    dec = pd.DataFrame(dec_rows, columns=["time_s", "trigger", "request", "decision_us", "chunk", "microbatches",
                                          "clock_mhz", "feasible", "pred_ttft_s", "pred_tbt_s", "pred_energy_j"])
    steps = pd.DataFrame(step_rows, columns=["time_s", "step_s", "budget", "chunk", "scheduled_tokens",
                                             "prefill_tokens", "decodes"])
    return reqdf, np.asarray(gaps), np.asarray(gap_t), dec, steps, energy, wall
