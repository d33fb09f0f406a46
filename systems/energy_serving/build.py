"""What a serving run is built from, on either backend: the request stream, the KV budget, the
controller's table grid and the controller, Window-DVFS's load profile, and the printed rows.
(Shared by :mod:`systems.energy_serving.runner` and :mod:`systems.energy_serving.vllm_engine`; imports neither.)

KV budget (one meaning, harness/model_facts.py): ``kv_budget`` = KV bytes per device; default
memory - weights on the device - the hardware's reserve (vLLM on CPU: ``system.cpu_kv_budget``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np

from harness.errors import RunOOM, bad
from harness.model_facts import kv_budget_bytes as shared_kv_budget
from harness.model_facts import kv_reserve_bytes
from systems.energy_serving.controllers import Controller, make_controller
from systems.energy_serving.driver import Driver
from systems.energy_serving.profiler import TableCost
from systems.energy_serving.profiler import build_table as _build
from systems.energy_serving.sim import SimExecutor
from workloads.serving import Requests, build_requests

_REQ_CACHE: Dict[str, Any] = {}


def cache_dir(cfg) -> Path:
    """Where serving runs keep what they compute once and reuse: ``results_dir``/cache."""
    return Path(cfg.get("results_dir", "results")) / "cache"


def requests_for(w, cache: Optional[Path] = None):
    """The workload's request stream (cached per resolved workload config: ``seed: ${seed}`` is
    resolved, so jobs of a sweep sharing a worker process get their own seed's stream). With
    ``cache`` (a folder), a trace's stream is also stored there and read back by later runs while
    the config, the trace files' contents (sha256) and the loaders' source stay the same; a cache
    file that cannot be read is computed again."""
    from omegaconf import OmegaConf

    import workloads.data

    key = OmegaConf.to_yaml(w, resolve=True)
    if w.kind in ("trace", "servegen"):  # the files' contents too: an edit is another stream
        key += repr(sorted(workloads.data.data_files(w).items()))
    if key not in _REQ_CACHE:
        _REQ_CACHE.clear()
        stored = cache is not None and w.kind in ("trace", "servegen")
        _REQ_CACHE[key] = _stored_requests(key, w, cache) if stored else build_requests(w)
    return _REQ_CACHE[key]


def _stored_requests(key: str, w, cache: Path):
    """:func:`workloads.serving.build_requests` through a file in ``cache`` (see :func:`requests_for`)."""
    import hashlib
    import os

    import workloads.data
    import workloads.serving

    h = hashlib.sha1(key.encode())
    for module in (workloads.serving, workloads.data):
        h.update(Path(module.__file__).read_bytes())
    for f, sha in sorted(workloads.data.data_files(w).items()):  # by content: an edit is a new stream
        h.update(f"{f}:{sha}".encode())
    path = cache / f"requests_{h.hexdigest()[:16]}.npz"
    z = _load_npz(path)
    if z is not None:
        return workloads.serving.Requests(z["arrival_s"], z["input_len"], z["output_len"], str(z["note"]))
    req = workloads.serving.build_requests(w)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(
            f, arrival_s=req.arrival_s, input_len=req.input_len, output_len=req.output_len, note=np.array(req.note)
        )
    os.replace(tmp, path)  # a job running beside reads the whole file or none
    return req


def _load_npz(path: Path) -> Optional[dict]:
    """The arrays of a cache file, or None when there is none or it cannot be read (truncated,
    corrupted, another format): the caller computes it again and replaces it, with a warning."""
    import zipfile

    if not path.exists():
        return None
    try:
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        from harness.logs import say

        say(f"the cache file {path} could not be read ({type(e).__name__}: {e}); computed again", warning=True)
        return None


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


def kv_budget_bytes(cfg, weight_bytes_device: float, real_cpu: bool = False) -> int:
    """KV bytes per device (harness.model_facts.kv_budget_bytes): ``kv_budget``; else on vLLM-CPU
    ``system.cpu_kv_budget``; else memory - weights on the device - the hardware's reserve (<= 0:
    the weights do not fit)."""
    hw = cfg.hardware
    return shared_kv_budget(cfg.system, hw.memory_bytes, weight_bytes_device, kv_reserve_bytes(hw), on_cpu=real_cpu)


def kv_capacity(budget_bytes: float, kv_bytes_token_device: float, req) -> float:
    """KV tokens that fit per device. Raises RunOOM (a recorded result) when the longest request's
    prompt + output does not fit."""
    cap = budget_bytes / kv_bytes_token_device
    longest = int((req.input_len + req.output_len).max())
    if cap < longest:
        raise RunOOM(
            f"KV budget {budget_bytes / 2**20:.1f} MiB per device holds {cap:.0f} tokens < the longest "
            f"request's {longest} tokens ({longest * kv_bytes_token_device / 2**20:.1f} MiB)"
        )
    return cap


def table_grid(s):
    """(token counts up to n_max, chunk sizes) the table covers: the largest chunk plus a full batch
    of decodes."""
    chunks = sorted({int(c) for c in list(s.chunk_candidates) + [s.default_chunk]})
    return max(chunks) + int(s.max_num_seqs), chunks


def profile_context(w) -> float:
    """Context tokens per decode the profiling pass assumes: the workload's mean mid-request
    context (servegen: 512, its lengths vary widely)."""
    return float(w.input_len + w.output_len / 2) if w.kind != "servegen" else 512.0


def build_table(measure, stage, s, idle_w=None):
    """The controller's table: ``measure`` sampled sparsely (tile-quantised) over the clock menu."""
    clocks = stage.clocks(int(s.freq_step_mhz))
    n_max, chunks = table_grid(s)
    return _build(
        measure,
        clocks,
        stage.idle_power(clocks) if idle_w is None else idle_w,
        n_max,
        int(s.profile_tile),
        int(s.profile_small_max),
        chunks,
    )


def controller_for(cfg, table, p: Optional[int] = None, g: Optional[int] = None):
    """The configured controller on ``table`` for ``p`` stages of ``g`` GPUs (default: the run's
    pp and tp). One stage has one microbatch (vLLM has no virtual engines without PP).
    ``system.fixed_clock_mhz``: the start clock, snapped to the table's menu."""
    s, w = cfg.system, cfg.workload
    tp, pp = parallelism(cfg)
    p, g = (pp if p is None else p), (tp if g is None else g)
    mbs = [1] if p == 1 else list(s.microbatch_candidates)
    ctl = make_controller(
        s.controller,
        table,
        p,
        g,
        float(w.slo_ttft_s),
        float(w.slo_tbt_s),
        int(s.default_chunk),
        list(s.chunk_candidates),
        mbs,
        bool(s.search_chunk),
        bool(s.search_microbatch),
        float(s.window_s),
    )
    if s.controller == "beam" and not s.search_freq:
        ctl.set_clocks(np.array([len(table.clocks) - 1]))
    fc = s.get("fixed_clock_mhz")
    if fc is not None:
        ctl.fixed_clock_mhz = float(table.clocks[int(np.argmin(np.abs(table.clocks - fc)))])
    return ctl


def window_profile(cfg, table, req, kv_cap: float, p: int, g: int) -> dict:
    """Window-DVFS's offline load profile, simulated from the controller's own table (every backend;
    cached under results/cache/).

    For prompt-token loads from 0.25x to 4x the workload's mean and every 10th clock of the menu,
    simulate 40 s of Poisson arrivals (lengths resampled from the workload) at a fixed clock with
    the default chunk and m = p on a :class:`systems.energy_serving.profiler.TableCost`, and record P90
    TTFT and P90 per-request mean TBT (s).
    """
    import hashlib
    import json as _json

    s = cfg.system
    mean_rate = float(req.input_len.sum()) / max(float(req.arrival_s[-1]), 1.0)
    loads = mean_rate * np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0])
    ci = np.arange(len(table.clocks) - 1, -1, -10)[::-1]
    digest = hashlib.sha1(
        np.ascontiguousarray(table.L).tobytes()
        + np.ascontiguousarray(table.E).tobytes()
        + np.ascontiguousarray(table.idle_w).tobytes()
    ).hexdigest()
    key = _json.dumps(
        [
            "v3-table",
            digest,
            list(map(float, loads / mean_rate)),
            p,
            g,
            int(s.default_chunk),
            int(s.max_num_seqs),
            round(mean_rate, 1),
            int(req.input_len.sum()),
            int(req.output_len.sum()),
            float(min(kv_cap, 1e18)),
            list(map(float, table.clocks[ci])),
        ]
    )
    path = cache_dir(cfg) / f"window_profile_{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz"
    z = _load_npz(path)
    if z is not None:
        return z
    rng = np.random.default_rng(0)
    cost = TableCost(table)
    ttft = np.full((len(loads), len(ci)), np.inf)
    tbt = np.full_like(ttft, np.inf)
    for i, load in enumerate(loads):
        lam = load / float(req.input_len.mean())
        n = max(int(rng.poisson(lam * 40.0)), 1)
        idx = rng.integers(0, len(req), n)
        sub = Requests(np.sort(rng.uniform(0, 40.0, n)), req.input_len[idx], req.output_len[idx])
        for j, c in enumerate(ci):
            ctl = Controller(
                table=table,
                p=p,
                g=g,
                slo_ttft=1.0,
                slo_tbt=1.0,
                default_chunk=int(s.default_chunk),
                fixed_clock_mhz=float(table.clocks[c]),
            )
            ex = SimExecutor(cost, p, g, max_num_seqs=int(s.max_num_seqs), kv_capacity_tokens=kv_cap)
            r = Driver(ctl, sub, t_stop=float(sub.arrival_s[-1]) + 30.0).run(ex).requests
            with np.errstate(invalid="ignore"):  # a percentile between two misses (inf) is inf
                ttft[i, j] = float(np.percentile(np.nan_to_num(r["ttft_s"], nan=np.inf), 90))
            tb = r["tbt_mean_s"][~np.isnan(r["tbt_mean_s"])]
            tbt[i, j] = float(np.percentile(tb, 90)) if len(tb) else 0.0
    prof = {"loads": loads, "clocks": table.clocks[ci], "ttft_p90": ttft, "tbt_p90": tbt}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **prof)
    return prof


def slo_check(table, p: int, w) -> str:
    """A note when an SLO is tighter than any configuration can meet (run goes on at max clock)."""
    notes = []
    fastest = p * float(table.L[1, -1])
    if w.slo_tbt_s < fastest:
        notes.append(
            f"SLO TBT {w.slo_tbt_s:g} s < the fastest possible {fastest:.4g} s (1 token, max clock, "
            f"{p} stages): every token misses"
        )
    if w.slo_ttft_s < fastest:
        notes.append(f"SLO TTFT {w.slo_ttft_s:g} s < the fastest possible {fastest:.4g} s: every request misses")
    return "; ".join(notes)


CLOCK_NOT_APPLIED = (
    "predictor MAPE: BEAM predicts latencies at the clock it chooses (its table scales latency with "
    "the hardware profile's clock model), but here clocks are recorded and never applied, so steps "
    "run at the device's own speed and the predictions are too long by that scaling"
)


def clock_note(applied: bool, summary) -> str:
    """:data:`CLOCK_NOT_APPLIED` for a run whose clocks were not applied and whose controller made
    latency predictions (BEAM; vanilla and Window-DVFS predict nothing, so the note does not concern
    them); else ''. One rule for the simulator and vLLM."""
    predicted = any(summary.get(k) is not None for k in ("pred_ttft_mape_pct", "pred_tbt_mape_pct"))
    return CLOCK_NOT_APPLIED if predicted and not applied else ""


# BEAM reports attainment as the share of requests meeting each SLO (its evaluation section); a request
# meets the TBT SLO by its mean token gap, so single gaps (TBT P90/P99) may exceed the SLO at 100 %
TBT_ATTAINMENT_LABEL = "SLO attainment TBT (requests whose mean TBT <= SLO)"


def display_rows(clock_applied: bool = True):
    """The printed rows (label, summary key, format). ``clock_applied`` False (a CPU, a GPU without
    actuation, a measured latency profile): the predictor rows say the clock was not applied
    (:data:`CLOCK_NOT_APPLIED` goes into the run's message)."""
    pred = "" if clock_applied else " (clock recorded, not applied: see the note)"

    def pct(v):
        return f"{100 * v:.1f} %"

    def ms(v):
        return f"{1e3 * v:.1f} ms"

    def num(v):
        return f"{v:,.4g}"

    return [  # the first row is the headline (a sweep's line and summary)
        ("energy / output token", "energy_per_token_j", lambda v: f"{v:.3f} J"),
        ("requests (completed)", "completed", lambda v: f"{v:,}"),
        ("SLOs", "slos", str),
        ("GPUs (tp x pp)", "gpus", lambda v: f"{v:,}"),
        ("energy (all GPUs)", "energy_j", lambda v: f"{v / 1e3:,.1f} kJ"),
        ("average power (all GPUs)", "avg_power_w", lambda v: f"{v:,.0f} W"),
        ("TTFT P50", "ttft_p50_s", ms),
        ("TTFT P90", "ttft_p90_s", ms),
        ("TTFT P99", "ttft_p99_s", ms),
        ("TBT P50", "tbt_p50_s", ms),
        ("TBT P90", "tbt_p90_s", ms),
        ("TBT P99", "tbt_p99_s", ms),
        ("SLO attainment TTFT", "slo_ttft_attainment", pct),
        (TBT_ATTAINMENT_LABEL, "slo_tbt_attainment", pct),
        ("  share of all token gaps <= TBT SLO", "slo_tbt_token_attainment", pct),
        ("mean SM clock chosen (set on a GPU only with actuate=true)", "mean_clock_mhz", lambda v: f"{v:,.0f} MHz"),
        ("mean chunk size (chunked-prefill tokens, while busy)", "mean_chunk", num),
        ("mean microbatches", "mean_microbatches", num),
        ("KV preemptions", "preemptions", lambda v: f"{v:,}"),
        ("decisions", "decisions", lambda v: f"{v:,}"),
        # the controller's own wall-clock time on this machine, measured in every run (simulated too)
        ("decision time P50 (measured, wall-clock here)", "decision_us_p50", lambda v: f"{v:.1f} us"),
        ("decision time P99 (measured, wall-clock here)", "decision_us_p99", lambda v: f"{v:.1f} us"),
        ("predictor MAPE TTFT" + pred, "pred_ttft_mape_pct", lambda v: f"{v:.1f} %"),
        ("predictor MAPE TBT" + pred, "pred_tbt_mape_pct", lambda v: f"{v:.1f} %"),
        ("table latency MAPE vs the executor's cost", "table_latency_mape_pct", lambda v: f"{v:.2f} %"),
        ("throughput", "throughput_tok_s", lambda v: f"{v:,.0f} tok/s"),
        ("stage utilisation", "stage_utilization", pct),
    ]


def drain_s(w) -> float:
    """Serving time allowed after the last arrival (s): half the workload's duration, at least 120 s."""
    return max(120.0, 0.5 * float(w.duration_s))


def stop_time(req, w) -> float:
    """When serving stops (s), on every backend: after the last arrival, :func:`drain_s` to drain;
    requests unfinished then miss their SLOs."""
    return float(req.arrival_s[-1]) + drain_s(w)


def serving_horizon_s(w) -> float:
    """The latest :func:`stop_time` of a workload (s): every arrival lies in [0, duration_s), so
    duration_s + :func:`drain_s`. Validation bounds the loops over serving time with it (the
    Window-DVFS ticks, the 1-s timeline bins) before the requests are drawn."""
    return float(w.duration_s) + drain_s(w)


def serve(driver, ex, ctx, desc: str):
    """Run ``driver`` on ``ex`` with a progress bar over serving seconds (none with progress=false).
    The bar is any object with tqdm's ``update`` (the harness's bar that draws nothing has no more)."""
    if not ctx.show_progress:
        return driver.run(ex)
    total = driver.t_stop if math.isfinite(driver.t_stop) else float(driver.arr[-1])
    with ctx.progress(int(math.ceil(total)), desc) as bar:
        shown = 0

        def progress(t):  # the driver calls it once per serving second reached
            nonlocal shown
            bar.update(int(t) - shown)
            shown = int(t)

        return driver.run(ex, progress=progress)
