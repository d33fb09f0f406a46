"""The LBS-family engine at the GPU's speed, measured in one device call (issue 37).

    python scripts/gpu_engine.py --out DIR              # on a CUDA GPU: OPT-6.7B fp16, random weights
    python scripts/gpu_engine.py --out DIR --tiny       # CPU dry run: tiny model, the same code paths

Device call (prepared, not yet run): ``bash scripts/gpu_wheels.sh`` once here, then the command
``SCRIPT=gpu_engine DEADLINE_S=420 bash scripts/gpu_validate.sh`` with carry [".whl"] and timeout_s
480 (the wrapper adds log.txt and gpu_state.txt, read-only GPU state before and after). Its CPU dry
run: ``SCRIPT=gpu_engine TINY=1 OUT=/tmp/ge bash scripts/gpu_validate.sh`` (a test).

1. decode: one decode step of 64 beams at context 256 (the prompt 128 tokens, then 128 decoded):
   the memory-bandwidth limit (weights + KV bytes over the measured device bandwidth), the lean
   arithmetic's whole step as one CUDA graph, and the engine's ``in_gpu`` step per token through each
   decode path (transformers, lean eager, piecewise CUDA graphs: ``system.decode_path``), with its
   host CPU seconds and NVML energy per token; rounds of each, the first discarded (a fresh machine's
   host ran slow for its first minute);
2. search: in_gpu / layerwise / lbs at 64 beams, 256 and 512 tokens, 7 GiB of KV, two rounds after a
   discarded one, each replayed on the simulator with the measured ceilings (time error per run,
   bytes equal); the achieved bandwidth of LBS group loads;
3. reproducibility: in_gpu twice in this process and once in another process, LBS against in_gpu,
   and both again in batch-invariant mode: per selection step, how many kept beams two runs have in
   common (``beam_size`` each step when their trees are identical; beam width 2); then each of in_gpu
   and LBS teacher-forced on the other's tree (``systems.kv_offload.divergence``): the largest
   log-probability difference, token flips and the margin of every flipped selection.

Hard deadline ``--deadline-s`` (default 420 s): checked before each measurement; what is measured
is written at once (``decode.csv``, ``results.csv``, ``repro.json``, ``summary.json``) and packed
into ``--out`` by a ``finally``. Nothing about the GPU is changed: clocks, power limits and modes
are only read. Without CUDA the script exits 2 unless ``--tiny``.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_validate as gv  # noqa: E402  (composition, quiet runs, run + replay, ceilings, packing)

PATHS = ("transformers", "lean", "piecewise")
# teacher-forced reruns (system, run name, the tree it is forced on, batch-invariant): each scheduler's
# tree scored by the other, and LBS scored against in_gpu in batch-invariant mode
FORCED = (
    ("lbs", "lbs-forced-on-first", "first", False),
    ("in_gpu", "first-forced-on-lbs", "lbs", False),
    ("lbs", "lbs-invariant-forced-on-invariant", "invariant", True),
)


def setting(tiny: bool) -> dict:
    """Model, shapes and the search configurations (system, beams, step, kv budget, gen_len)."""
    if tiny:
        s = dict(model="tiny-opt", prompt=16, hw="cpu", dtype=None, extra=gv.TINY_MODEL, beams=8, ctx=32, tokens=8)
        s["configs"] = [(x, 8, 8, "256KiB" if x != "in_gpu" else None, 16) for x in ("in_gpu", "layerwise", "lbs")]
        s["repro"] = dict(beams=8, step=8, gen=24, kv="256KiB")
        s["rounds"] = 2
        return s
    s = dict(model="opt-6.7b", prompt=128, hw="h200", dtype="float16", extra=[], beams=64, ctx=256, tokens=32)
    s["configs"] = [
        (sys_, 64, 32, "7GiB" if sys_ != "in_gpu" else None, gen)
        for gen in (256, 512)
        for sys_ in ("in_gpu", "layerwise", "lbs")
    ]
    s["repro"] = dict(beams=64, step=32, gen=128, kv="7GiB")
    s["rounds"] = 3  # the first discarded
    return s


def model_cfg(s: dict):
    cfg = gv.compose(gv.common_overrides(s, "in_gpu", s["beams"], s["tokens"], s["tokens"]))
    return cfg.model


def device_bandwidth(device: str) -> float:
    """Device memory bandwidth, B/s: bytes read + written by a large device-to-device copy (fastest of
    5 after 2 warm-ups)."""
    import torch

    from harness.calibrate import _timeit

    n = (1 << 30) if device == "cuda" else (64 << 20)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t = _timeit(lambda: b.copy_(a), sync)
    return 2 * n / t


def decode_rows(s: dict, device: str, deadline: float) -> list:
    """Section 1: ms per decoded token of each way to decode, rounds after a discarded first."""
    import torch

    from harness.meters import EnergyMeter
    from systems.kv_offload.cache import DenseKV, GroupCache
    from systems.kv_offload.model import shared_model
    from systems.kv_offload.plan import make_scheduler
    from systems.kv_offload.torch_engine import TorchExecutor
    from systems.kv_offload.tree import BeamTree, initial_beams

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    mcfg = model_cfg(s)
    built = shared_model(mcfg, torch.device(device), 0, None)
    model, geom = built
    B, ctx, T, P = s["beams"], s["ctx"], s["tokens"], s["ctx"] - s["tokens"]
    meter = EnergyMeter([0]) if cuda else None
    rows = []
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = B * ctx * geom.kv_token
    bw = device_bandwidth(device)
    rows.append(
        {
            "what": "limit",
            "discarded": False,
            "ms_per_token": 1e3 * (weights + kv) / bw,
            "bytes": weights + kv,
            "mem_bw": bw,
        }
    )

    def timed(name, fn, tokens):
        for r in range(s["rounds"]):
            if time.time() > deadline:
                return
            if meter is not None and meter.available:
                meter.begin_window(name)
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            e = meter.end_window(name, sync=sync).energy_j if meter is not None and meter.available else None
            rows.append(
                {
                    "what": name,
                    "round": r,
                    "discarded": r == 0 and s["rounds"] > 1,
                    "ms_per_token": 1e3 * wall / tokens,
                    "host_cpu_ms_per_token": 1e3 * cpu / tokens,
                    "energy_j_per_token": e / tokens if e is not None else None,
                }
            )
            print(f"  {name:32s} round {r}: {1e3 * wall / tokens:8.3f} ms/token", flush=True)

    # the lean arithmetic's whole step as one CUDA graph at a fixed length (eager on a CPU)
    timed("whole step, one CUDA graph" if cuda else "whole step, eager", whole_step(model, geom, B, ctx, T), T)
    # the engine's in_gpu decode of T tokens (sampling included) after a P-token prompt, per decode path
    prompt = list(range(1, P + 1))
    for path in PATHS:
        if time.time() > deadline:
            break
        ex = TorchExecutor(mcfg, device, None, seed=0, model=built, decode_path=path, max_beams=B, max_len=ctx)
        ex.warmup(prompt, B)
        tree = BeamTree(P)
        ex.prefill(tree, prompt, offload=False)
        live = initial_beams(tree, B, 0)
        ex.execute_step(
            make_scheduler("in_gpu", ex.geom, None, prompt_len=P, gen_len=T).plan(0, tree, live, T), tree, live
        )
        uids = [b.uid for b in live]
        logp = ex.parent_logp(live)

        def decode(ex=ex, uids=uids, logp=logp):  # the same T positions again: the step's decode loop
            ex.decode(GroupCache(DenseKV(ex.res.tensor), geom.num_layers, P), uids, logp, P, T)

        timed(f"engine in_gpu, {ex.decode_path}", decode, T)
        ex.close()
    return rows


def whole_step(model, geom, B: int, ctx: int, T: int):
    """A function decoding ``T`` tokens of ``B`` beams at context ``ctx`` (each token at the same
    position): the lean arithmetic's step captured whole as one CUDA graph on CUDA (the plain decoder's
    best case, no copies between layers), eager on a CPU. Its buffers live in the function's closure."""
    import torch

    from systems.kv_offload.cache import DenseKV, GroupCache
    from systems.kv_offload.decoder import lean_decoder

    lean = lean_decoder(model)
    device = model.lm_head.weight.device
    shape = (geom.num_layers, 2, B, geom.num_kv_heads, ctx + 1, geom.head_dim)
    buf = torch.zeros(shape, dtype=model.lm_head.weight.dtype, device=device)
    ids = torch.zeros(B, dtype=torch.long, device=device)
    cache = GroupCache(DenseKV(buf), geom.num_layers, ctx)

    @torch.no_grad()
    def eager():
        for _ in range(T):
            cache.set_length(ctx)
            lean(ids, cache)

    if device.type != "cuda":
        return eager
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager()
    torch.cuda.current_stream().wait_stream(side)
    cache.set_length(ctx)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        lean(ids, cache)

    def replay():
        for _ in range(T):
            graph.replay()

    replay.buffers = (buf, ids, cache)  # alive as long as the graph that reads them
    return replay


def kept_overlap(a: Path, b: Path) -> list:
    """Per step, how many of run ``a``'s kept beams run ``b`` kept too (beam_tree.json of each)."""
    ka = json.loads((a / "beam_tree.json").read_text())["steps"]
    kb = json.loads((b / "beam_tree.json").read_text())["steps"]
    return [len(set(x["kept"]) & set(y["kept"])) for x, y in zip(ka, kb)]


def repro_overrides(s: dict, system: str, device: str, out: Path, *extra) -> list:
    r = s["repro"]
    kv = [f"kv_budget={r['kv']}"] if system != "in_gpu" else []
    return (
        gv.common_overrides(s, system, r["beams"], r["step"], r["gen"])
        + kv
        + ["backend=torch", f"backend.device={device}", "system.record_tree=true", f"output_dir={out}", *extra]
    )


def reproducibility(s: dict, device: str, work: Path, deadline: float) -> dict:
    """Section 3: trees of repeated runs against the first (kept beams in common per step)."""
    runs = work / "runs" / "repro"
    plan = [
        ("in_gpu", "first", []),
        ("in_gpu", "again", []),
        ("lbs", "lbs", []),
        ("in_gpu", "invariant", ["system.decode_path=piecewise", "system.batch_invariant=true"]),
        ("lbs", "lbs-invariant", ["system.decode_path=piecewise", "system.batch_invariant=true"]),
    ]
    status, seconds = {}, {}
    for system, name, extra in plan:
        if time.time() > deadline:
            status[name] = "skipped: deadline"
            continue
        rec = gv.quiet_run(repro_overrides(s, system, device, runs / name, *extra))
        status[name] = rec["status"] if rec["status"] != "ok" else rec["summary"].get("decode_path")
        seconds[name] = rec["summary"].get("e2e_s")
    # teacher forcing: each scheduler's tree scored by the other (systems/kv_offload/divergence.py)
    invariant = ["system.decode_path=piecewise", "system.batch_invariant=true"]
    for system, name, tree, extra in FORCED:
        if time.time() > deadline or not (runs / tree / "beam_tree.json").exists():
            status[name] = "skipped: deadline" if time.time() > deadline else f"skipped: no {tree} tree"
            continue
        forced = ["system.teacher_force=true", f"system.replay_tree={runs / tree}", *(invariant if extra else [])]
        rec = gv.quiet_run(repro_overrides(s, system, device, runs / name, *forced))
        status[name] = rec["status"] if rec["status"] != "ok" else rec["summary"].get("decode_path")
    # another process, same configuration as "first"
    if time.time() < deadline:
        child = subprocess.run(
            [sys.executable, __file__, "--child", str(runs / "process"), "--device", device]
            + (["--tiny"] if device == "cpu" else []),
            capture_output=True,
            text=True,
            timeout=max(10, deadline - time.time()),
        )
        status["process"] = "ok" if child.returncode == 0 else f"failed: {child.stderr[-300:]}"
    out = {"status": status, "beam_size": s["repro"]["beams"] // 2, "e2e_s": seconds, "kept_in_common": {}}
    for a, b in (("first", "invariant"), ("lbs", "lbs-invariant")):  # the batch-invariant mode's cost
        if seconds.get(a) and seconds.get(b):
            out[f"{b} / {a} time"] = seconds[b] / seconds[a]
    for a, b in (
        ("first", "again"),
        ("first", "process"),
        ("first", "lbs"),
        ("invariant", "lbs-invariant"),
        ("first", "invariant"),
    ):
        if (runs / a / "beam_tree.json").exists() and (runs / b / "beam_tree.json").exists():
            common = kept_overlap(runs / a, runs / b)
            out["kept_in_common"][f"{a} vs {b}"] = common
            print(f"  kept beams in common, {a} vs {b}: {common}", flush=True)
    from systems.kv_offload import divergence

    out["teacher_forced"] = {}
    for _, b, a, _ in FORCED:
        if (runs / a / "beam_tree.json").exists() and (runs / b / "beam_tree.json").exists():
            d = divergence.compare(divergence.load(runs / a), divergence.load(runs / b))
            out["teacher_forced"][b] = d
            print(
                f"  {b}: largest log-prob difference "
                f"{d['max_abs_cum_logprob_diff']:.3g}, {d['token_flips']} token flips, "
                f"{d['selection_flips']} selection flips",
                flush=True,
            )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="flat result files (returned by the device call)")
    ap.add_argument("--work", default=None, help="run folders (default: a new temporary folder)")
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU (dry run of every code path)")
    ap.add_argument("--deadline-s", type=float, default=420.0, help="hard deadline, seconds from the start")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # the reproducibility check's 2nd process
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    from harness.config import register_configs, register_resolvers

    register_resolvers()
    register_configs()
    if a.child:
        rec = gv.quiet_run(repro_overrides(setting(a.tiny), "in_gpu", a.device, Path(a.child)))
        return 0 if rec["status"] == "ok" else 1
    if not a.out:
        ap.error("--out is required")
    if gv.check_deadline(a):
        return 2
    import torch

    if not a.tiny and not torch.cuda.is_available():
        return gv.no_cuda()
    t_start, deadline, out, work = gv.open_call(a, "gpu_engine_")
    device = "cpu" if a.tiny else "cuda"
    s = setting(a.tiny)
    summary = {"device": device, "deadline_s": a.deadline_s, "status": "started", "torch": torch.__version__}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import pandas as pd

    rows: list = []
    try:
        if device == "cuda":
            summary["gpu"] = torch.cuda.get_device_name(0)
            print(f"device: {summary['gpu']}; clocks, power limit and modes are read only", flush=True)
        torch.set_num_threads(1)
        print("1. decode step", flush=True)
        dec = decode_rows(s, device, deadline)
        pd.DataFrame(dec).to_csv(work / "decode.csv", index=False)
        summary["decode"] = decode_summary(dec)
        print("2. search", flush=True)
        ceil = gv.measure_ceilings(device, a.tiny, work, s["hw"])
        measured_hw = gv.measured_hw_of(ceil)
        for r in range(s["rounds"]):
            for cfg in s["configs"]:
                if time.time() > deadline:
                    break
                row = gv.real_and_replay(s, cfg, device, measured_hw, deadline, work, tag=f"-r{r}")
                row.update({"round": r, "discarded": r == 0 and s["rounds"] > 1})
                rows.append(row)
                print(f"  {row['config']:28s} real {row['real_s']} s  sim {row['sim_s']} s", flush=True)
                pd.DataFrame(rows).to_csv(work / "results.csv", index=False)
        gv.groups_bw(work, ceil.get("h2d_bw"))
        summary["search"] = search_summary(rows)
        print("3. reproducibility", flush=True)
        summary["reproducibility"] = reproducibility(s, device, work, deadline)
        summary["status"] = "finished"
    except BaseException as e:  # packed whatever happened
        summary["status"] = f"failed: {type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        summary["wall_s"] = time.time() - t_start
        (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        (work / "repro.json").write_text(json.dumps(summary.get("reproducibility", {}), indent=2))
        gv.pack(work, out, extra=("decode.csv", "repro.json"), loose=("results.csv", "summary.json", "decode.csv"))
        gv.close_work(a, work)
    print(json.dumps({k: summary[k] for k in ("status", "wall_s")}, default=str))
    return 0 if summary["status"] == "finished" else 1


def decode_summary(rows: list) -> dict:
    """Median ms per token of the kept rounds per way to decode, and each over the limit."""
    limit = next(r["ms_per_token"] for r in rows if r["what"] == "limit")
    out = {"limit_ms": limit}
    for what in dict.fromkeys(r["what"] for r in rows if r["what"] != "limit"):
        kept = [r for r in rows if r["what"] == what and not r["discarded"]]
        if kept:
            ms = statistics.median(r["ms_per_token"] for r in kept)
            out[what] = {
                "ms_per_token": ms,
                "over_limit": ms / limit,
                "host_cpu_ms_per_token": statistics.median(r["host_cpu_ms_per_token"] for r in kept),
            }
    return out


def search_summary(rows: list) -> dict:
    """Per configuration, the median real and simulated seconds of the kept rounds and the time error;
    LBS over layer-wise from those medians."""
    kept = [r for r in rows if not r["discarded"] and r.get("real_s")]
    out = {}
    for cfg in dict.fromkeys(r["config"].rsplit("-r", 1)[0] for r in kept):
        rs = [r for r in kept if r["config"].rsplit("-r", 1)[0] == cfg]
        real = statistics.median(r["real_s"] for r in rs)
        sims = [r["sim_s"] for r in rs if r.get("sim_s")]
        sim = statistics.median(sims) if sims else None
        out[cfg] = {
            "real_s": real,
            "sim_s": sim,
            "time_err": (sim - real) / real if sim else None,
            "bytes_equal": all(r["h2d_real"] == r["h2d_sim"] and r["d2h_real"] == r["d2h_sim"] for r in rs),
        }
    for r in kept:
        if r["system"] == "lbs":
            lw = out.get(r["config"].rsplit("-r", 1)[0].replace("lbs-", "layerwise-", 1))
            if lw:
                out[f"lbs over layerwise, gen {r['gen_len']}"] = (
                    lw["real_s"] / out[r["config"].rsplit("-r", 1)[0]]["real_s"]
                )
    return out


if __name__ == "__main__":
    sys.exit(main())
