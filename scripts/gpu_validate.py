"""GPU validation of the LBS family and calibration of the simulator, in one device call.

    python scripts/gpu_validate.py --out DIR                # on a CUDA GPU: OPT-6.7B fp16, random weights
    python scripts/gpu_validate.py --out DIR --tiny         # CPU dry run: tiny model, the same code paths

1. ceilings: GEMM, decode-GEMV and streaming bandwidth, kernel and layer launch cost
   (``harness.calibrate.measure``), pinned host<->device copy bandwidth 16 MiB - 1 GiB each way
   -> ceilings.json, copy_bw.csv and a measured hardware profile (datasheet values kept beside);
2. estimates: every configuration first runs on the simulated backend with the measured ceilings;
   ``estimate_s = MARGIN * simulated + FIXED_S`` is printed for all of them before any real run
   (and whether the configuration offloads at all);
3. the real engine, cheapest first: in_gpu (unbudgeted upper bound), layerwise, lbs and ablations
   at 16 / 32 / 64 beams with 1.5 / 3 / 7 GiB of KV budget (so every budgeted run offloads),
   transformers' offloaded cache (hf_offload) at 16 beams; each simulated again replaying the real
   run's beam tree, and the error; a configuration whose estimate exceeds the time left is skipped;
4. ordering: one short layer-wise search with the stream operations recorded on the device, checked
   for loads that could overtake the write-back they read (``systems.kv_offload.streams``).

Hard deadline (``--deadline-s`` > 0, default 500 s from the start): checked before each real
configuration and inside runs, between steps (``system.deadline``; a run cut there is recorded as
``timeout``); the ceilings and the estimates are measured whatever the deadline. Exit 1 when no
real run was made (every configuration skipped, or a failure): a wasted device call says so.
The default work folder (a new temporary one) is removed once packed; a ``--work`` given is kept.
Runs write under ``--work`` (default: a fresh temporary folder, outside ``--out``); a ``finally``
packs the results into ``--out`` whatever happens, and ``results.csv`` is copied there after every
configuration (a kill that skips the ``finally`` still returns what ran). Without CUDA the script
exits 2 unless ``--tiny``. Nothing about the GPU is changed: clocks, power limits and modes are only
read.
Results in --out, at most ``MAX_OUT_FILES`` flat files (what one device call returns; the shell
wrapper adds log.txt and gpu_state.txt): results.csv, summary.json, ceilings.json (also inside the
archive), outputs.tar.gz (every flat file: estimates.csv, groups_bw.csv, copy_bw.csv,
<hw>-measured.yaml, ordering.json and the three above) and runs.tar.gz (the run folders).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import shutil
import signal
import sys
import tarfile
import tempfile
import time
import traceback
from contextlib import redirect_stdout
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
TINY_MODEL = [
    "model.hidden_size=64",
    "model.num_heads=4",
    "model.head_dim=16",
    "model.num_kv_heads=4",
    "model.intermediate_size=128",
    "model.vocab_size=1000",
    "model.hf_config.word_embed_proj_dim=64",
]
MARGIN, FIXED_S = 3.0, 2.0  # estimate = MARGIN x simulated + FIXED_S (Python, sampling, set-up)
FLAT_FILES = (
    "results.csv",
    "estimates.csv",
    "groups_bw.csv",
    "ceilings.json",
    "copy_bw.csv",
    "ordering.json",
    "summary.json",
)
LOOSE_FILES = ("results.csv", "summary.json", "ceilings.json")  # also outside the archive, to read at once
MAX_OUT_FILES = 8  # a device call returns at most 8 files (shared/.../device/README.md)
CEILING_KEYS = ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw", "launch_overhead_s")  # what the simulator takes


def measured_hw_of(ceil: dict) -> list:
    """Hardware overrides that make the simulator use measured ceilings (efficiencies 1.0: a measured
    rate is an achieved rate)."""
    return [f"hardware.{k}={ceil[k]}" for k in CEILING_KEYS] + [
        "hardware.flops_efficiency=1.0",
        "hardware.mem_efficiency=1.0",
    ]


def speedups_vs_layerwise(rows) -> list:
    """Per row (dicts with system, beams, gen_len and a time under ``seconds``): layer-wise's time at
    the same beams and length over the row's, or None without such a layer-wise row or time."""
    lw = {(r["beams"], r["gen_len"]): r["seconds"] for r in rows if r["system"] == "layerwise" and r["seconds"]}
    return [
        lw[(r["beams"], r["gen_len"])] / r["seconds"] if r["seconds"] and (r["beams"], r["gen_len"]) in lw else None
        for r in rows
    ]


def finish_status(summary: dict, rows: list) -> None:
    """A finished call that made no real run says so in its status (and exits 1: ``exit_code``)."""
    if summary["status"] == "finished" and not any("wall_s" in r for r in rows):
        summary["status"] = "finished: no real run was made"


def copy_sweep(device: str, sizes_mib) -> list:
    """Pinned host<->device copy bandwidth (B/s) for each size, fastest of 5 windows after 2 warm-ups."""
    import torch

    from harness.calibrate import _timeit

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for mib in sizes_mib:
        n = mib * MiB
        host = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
        dev = torch.empty(n, dtype=torch.uint8, device=device)
        for direction, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
            t = _timeit(lambda dst=dst, src=src: dst.copy_(src, non_blocking=cuda), sync)
            rows.append({"direction": direction, "bytes": n, "seconds": t, "bw_Bps": n / t, "pinned": cuda})
        del host, dev, dst, src
    return rows


GROUPS = ("system", "model", "hardware", "backend", "tracking", "workload", "verifier")
_COMPOSED: dict = {}


def compose(overrides):
    """Hydra's composition of the config-group choices (once per set of groups), plain values
    merged onto a copy (as ``harness.compose`` does for sweeps): ~1 s saved per run on a CPU."""
    import copy

    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    groups = tuple(o for o in overrides if o.split("=", 1)[0] in GROUPS)
    if groups not in _COMPOSED:
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            _COMPOSED[groups] = hcompose("config", overrides=list(groups))
    cfg = copy.deepcopy(_COMPOSED[groups])
    cfg.merge_with_dotlist([o for o in overrides if o.split("=", 1)[0] not in GROUPS])
    return cfg


def setting(tiny: bool, gen_len: int) -> dict:
    """Model, lengths and configurations: (system, beams, step, kv budget or None, gen_len). Each
    budget is about 45 % of its beams' full KV (OPT-6.7B, gen 256: 16 beams 3 GiB, 32 beams 6 GiB,
    64 beams 12 GiB against 1.5 / 3 / 7 GiB), so every budgeted run offloads; 7 GiB is the paper's."""
    if tiny:  # tiny-opt narrowed (KV 512 B per layer-token) with a small vocabulary
        s = dict(model="tiny-opt", prompt=16, hw="cpu", dtype=None, extra=TINY_MODEL)
        budgets, gen, steps = {4: "128KiB", 8: "256KiB", 16: "512KiB"}, 32, (16, 32)
    else:
        s = dict(model="opt-6.7b", prompt=128, hw="h200", dtype="float16", extra=[])
        budgets, gen, steps = {16: "1536MiB", 32: "3GiB", 64: "7GiB"}, gen_len, (32, 128)
    small, mid, big = sorted(budgets)
    cfgs = [("in_gpu", big, steps[0], None, gen)]
    for b in (small, mid, big):
        cfgs += [
            ("lbs", b, steps[0], budgets[b], gen),
            ("lbs_intertoken", b, steps[0], budgets[b], gen),
            ("layerwise", b, steps[0], budgets[b], gen),
        ]
    cfgs += [
        ("lbs", big, steps[1], budgets[big], gen),
        ("lbs_interbeam", big, steps[0], budgets[big], gen),
        ("hf_offload", small, steps[0], None, min(gen, 128)),
    ]  # moves all KV per token both ways
    s["configs"] = cfgs
    # second tier, after the ordering check and only with time left: the paper's 64-beam pair at twice
    # the generation length (Fig.9 runs 1-8 K tokens), 7 GiB of KV against ~20 GiB needed
    long_gen = 2 * gen
    s["long_configs"] = [
        ("lbs", big, steps[0], budgets[big], long_gen),
        ("layerwise", big, steps[0], budgets[big], long_gen),
    ]
    return s


def config_name(cfg) -> str:
    system, beams, step, _, gen = cfg
    return f"{system}-b{beams}-s{step}-g{gen}"


def common_overrides(s: dict, system: str, beams: int, step: int, gen: int) -> list:
    out = [
        f"system={system}",
        f"model={s['model']}",
        f"beams={beams}",
        f"step={step}",
        f"gen_len={gen}",
        f"prompt_len={s['prompt']}",
        "tracking=none",
        "progress=false",
        "seed=0",
        f"hardware={s['hw']}",
        "resume=false",
        *s["extra"],
    ]
    return out + ([f"model.dtype={s['dtype']}"] if s["dtype"] else [])


def quiet_run(overrides):
    """harness.run.run on a composed config, its table kept out of the log; exceptions recorded."""
    from harness.run import run

    buf = io.StringIO()
    try:
        with redirect_stdout(buf):
            return run(compose(overrides))
    except Exception as e:  # a configuration the harness refuses (e.g. hf_offload without CUDA)
        return {"status": "refused", "message": f"{type(e).__name__}: {e}".splitlines()[0], "summary": {}}


def estimate(s: dict, cfg, measured_hw: list, work: Path) -> dict:
    system, beams, step, kv, gen = cfg
    name = config_name(cfg)
    if system == "hf_offload":  # no simulator model of transformers' cache: its own rough bound
        return {"config": name, "sim_s": None, "offloads": True, "estimate_s": 30.0 if s["hw"] != "cpu" else 5.0}
    budget = [f"kv_budget={kv}"] if kv else []
    rec = quiet_run(
        common_overrides(s, system, beams, step, gen)
        + budget
        + ["backend=sim", *measured_hw, f"output_dir={work / 'estimates' / name}"]
    )
    sm = rec.get("summary", {})
    sim_s = sm.get("e2e_s")
    return {
        "config": name,
        "sim_status": rec["status"],
        "sim_s": sim_s,
        "sim_message": rec.get("message", ""),
        "offloads": bool(sm.get("h2d_bytes")),
        "estimate_s": MARGIN * sim_s + FIXED_S if sim_s else FIXED_S,
    }


class SetupBroken(RuntimeError):
    """No configuration could even be simulated: the environment (packages, configs) is broken, so
    the real runs would fail the same way; stop before spending the device window on them."""


def cpu_seconds() -> float:
    """CPU seconds of this process so far (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def host_probe(n: int = 200_000) -> float:
    """Seconds of a fixed pure-Python loop (``n`` integer additions; the median of 3): the host CPU's
    speed for the Python that drives the engine. On the lent H200 the same step took 0.42 s to 4.1 s
    from one run to the next with the GPU idle (docs/results/kv_offload.md, "On a real GPU"); recorded before and
    after every real run, it tells a slow host from a slow engine."""
    times = []
    for _ in range(3):
        t0, x = time.perf_counter(), 0
        for i in range(n):
            x += i
        times.append(time.perf_counter() - t0)
    return sorted(times)[1]


def real_and_replay(
    s: dict, cfg, device: str, measured_hw: list, deadline: float, work: Path, tag: str = "", probe=None
) -> dict:
    """One configuration on the real engine, then on the simulator replaying its beam tree; the row
    of results.csv. ``tag`` suffixes the run folders (repeats of one configuration); ``probe``: a
    context manager around the real run only (``scripts/gpu_repeat.py``'s samplers)."""
    system, beams, step, kv, gen = cfg
    name = config_name(cfg) + tag
    budget = [f"kv_budget={kv}"] if kv else []
    common = common_overrides(s, system, beams, step, gen)
    probe_before = host_probe()
    t0, cpu0 = time.time(), cpu_seconds()
    with probe if probe is not None else contextlib.nullcontext():
        real = quiet_run(
            common
            + budget
            + [
                "backend=torch",
                f"backend.device={device}",
                "system.record_tree=true",
                f"system.deadline={deadline}",
                f"output_dir={work / 'runs' / ('real-' + name)}",
            ]
        )
    wall, cpu = time.time() - t0, cpu_seconds() - cpu0
    probe_after = host_probe()
    sim = {"status": "n/a", "summary": {}}
    if system != "hf_offload" and real["status"] == "ok":
        sim = quiet_run(
            common
            + budget
            + [
                f"system.replay_tree={work / 'runs' / ('real-' + name)}",
                "backend=sim",
                *measured_hw,
                f"output_dir={work / 'runs' / ('sim-' + name)}",
            ]
        )
    rs, ss = real.get("summary", {}), sim.get("summary", {})
    row = {
        "config": name,
        "system": system,
        "beams": beams,
        "step": step,
        "kv_budget": kv,
        "gen_len": gen,
        "status": real["status"],
        "sim_status": sim["status"],
        "wall_s": wall,
        "cpu_s": cpu,
        "host_probe_before_s": probe_before,
        "host_probe_after_s": probe_after,
        "real_s": rs.get("e2e_s"),
        "sim_s": ss.get("e2e_s"),
        "compute_real": rs.get("compute_s"),
        "compute_sim": ss.get("compute_s"),
        "io_stall_real": rs.get("io_stall_s"),
        "io_stall_sim": ss.get("io_stall_s"),
        "io_share_real": rs.get("io_share"),
        "io_share_sim": ss.get("io_share"),
        "h2d_real": rs.get("h2d_bytes"),
        "h2d_sim": ss.get("h2d_bytes"),
        "d2h_real": rs.get("d2h_bytes"),
        "d2h_sim": ss.get("d2h_bytes"),
        "peak_kv_real": rs.get("peak_device_kv_bytes"),
        "peak_physical": rs.get("peak_device_physical_bytes"),
        "cuda_max_allocated": rs.get("cuda_max_memory_allocated_bytes"),
        "steps_done": rs.get("steps_done"),
        "energy_j": rs.get("energy_j"),
        "energy_sim_j": ss.get("energy_j"),
        "avg_power_w": rs.get("avg_power_w"),
        "message": real.get("message", ""),
        "sim_message": sim.get("message", ""),
    }
    if row["real_s"] and row["sim_s"]:
        row["time_err"] = (row["sim_s"] - row["real_s"]) / row["real_s"]
    return row


def ordering_check(s: dict, device: str) -> dict:
    """A short layer-wise search on the device with the stream operations recorded and checked."""
    import torch
    from omegaconf import OmegaConf

    from systems.kv_offload.plan import make_scheduler
    from systems.kv_offload.streams import CudaStreams, HostStreams, ordering_violations, writes_and_reads
    from systems.kv_offload.torch_engine import TorchExecutor
    from systems.kv_offload.tree import BeamTree, initial_beams, select_and_expand

    mcfg = OmegaConf.load(ROOT / "conf" / "model" / f"{s['model']}.yaml")
    mcfg.pop("defaults")
    mcfg.merge_with_dotlist([o.removeprefix("model.") for o in s["extra"]])
    if s["dtype"]:
        mcfg.dtype = s["dtype"]
    beams, prompt, step, gen = (8, 16, 4, 12) if s["hw"] == "cpu" else (16, 128, 8, 24)
    kv = (
        beams
        * (prompt + gen)
        * 2
        * mcfg.num_kv_heads
        * mcfg.head_dim
        * torch.empty((), dtype=getattr(torch, mcfg.dtype)).element_size()
    )
    budget = kv * mcfg.num_layers // 4 + 1  # about a quarter of the layers resident, shrinking
    streams = CudaStreams(torch.device(device), record=True) if device == "cuda" else HostStreams(record=True)
    ex = TorchExecutor(mcfg, device, budget, scheduler="layerwise", streams=streams, max_len=prompt + gen)
    sched = make_scheduler("layerwise", ex.geom, budget, prompt_len=prompt, gen_len=gen)
    tree = BeamTree(prompt)
    ex.prefill(tree, list(range(prompt)), offload=False)
    live = initial_beams(tree, beams, 0)
    for i in range(gen // step):
        plan = sched.plan(i, tree, live, step)
        o = ex.execute_step(plan, tree, live)
        for k, b in enumerate(live):
            b.cum_logprob += float(o.logprob_delta[k])
            tree.segments[b.leaf].length = step
        if i + 1 < gen // step:
            new = select_and_expand(tree, live, beams // 2, 2)
            ex.expand(plan, tree, live, new)
            live = new
    ex.close()
    bad = ordering_violations(streams.log)
    writes, loads = writes_and_reads(streams.log)
    return {"device": device, "writes": writes, "loads": loads, "violations": bad[:20], "ok": not bad}


def measure_ceilings(device: str, tiny: bool, work: Path, hw: str) -> dict:
    """Measured ceilings (``harness.calibrate.measure`` with one thread, and the pinned copy sweep's
    fastest each way) -> ``ceilings.json``, ``copy_bw.csv`` and ``<hw>-measured.yaml`` in ``work``."""
    import pandas as pd
    from omegaconf import OmegaConf

    from harness.calibrate import measure, write_profile

    ceil = measure(device, quick=tiny, threads=1)
    bw = copy_sweep(device, [16, 64] if tiny else [16, 64, 256, 1024])
    pd.DataFrame(bw).to_csv(work / "copy_bw.csv", index=False)
    ceil["h2d_bw"] = max(r["bw_Bps"] for r in bw if r["direction"] == "h2d")
    ceil["d2h_bw"] = max(r["bw_Bps"] for r in bw if r["direction"] == "d2h")
    ceil["date"] = time.strftime("%Y-%m-%d")
    (work / "ceilings.json").write_text(json.dumps(ceil, indent=2, default=str))
    base = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "hardware" / f"{hw}.yaml"))
    write_profile(base, ceil, work / f"{hw}-measured.yaml")
    return ceil


def pack(work: Path, out: Path, extra=(), loose=LOOSE_FILES) -> None:
    """The results into ``out`` as few flat files (a device call returns at most ``MAX_OUT_FILES``):
    ``loose`` as they are, every flat file (``FLAT_FILES`` and ``extra``) in ``outputs.tar.gz``, the
    run folders in ``runs.tar.gz``."""
    out.mkdir(parents=True, exist_ok=True)
    flat = [f for f in [*FLAT_FILES, *extra] + [p.name for p in work.glob("*-measured.yaml")] if (work / f).exists()]
    for f in loose:
        if (work / f).exists():
            shutil.copy2(work / f, out / f)
    with tarfile.open(out / "outputs.tar.gz", "w:gz") as tf:
        for f in flat:
            tf.add(work / f, arcname=f)
    if (work / "runs").exists():
        with tarfile.open(out / "runs.tar.gz", "w:gz") as tf:
            tf.add(work / "runs", arcname="runs")


def check_deadline(a) -> Optional[int]:
    """2 (with the message) unless ``--deadline-s`` > 0; None when it is."""
    if not a.deadline_s > 0:
        print(f"error: --deadline-s {a.deadline_s} is not allowed: seconds > 0 from the start", file=sys.stderr)
        return 2
    return None


def open_call(a, prefix: str):
    """(start, deadline, out, work) of a device call's script: the hard deadline ``--deadline-s``
    from now; ``--out`` and ``--work`` (default: a new temporary folder) created."""
    t_start = time.time()
    out = Path(a.out)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    return t_start, t_start + a.deadline_s, out, work


def close_work(a, work: Path) -> None:
    """Remove the work folder once its runs are packed, when it is the default temporary one."""
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


def no_cuda() -> int:
    print("error: no CUDA GPU is visible; this script measures a GPU (use --tiny for the CPU dry run)", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="flat result files (returned by the device call)")
    ap.add_argument("--work", default=None, help="run folders (default: a new temporary folder)")
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU (dry run of every code path)")
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--deadline-s", type=float, default=500.0, help="hard deadline, seconds from the start")
    a = ap.parse_args(argv)
    if check_deadline(a):
        return 2
    t_start, deadline, out, work = open_call(a, "gpu_validate_")
    import torch

    if not a.tiny and not torch.cuda.is_available():
        return no_cuda()
    import pandas as pd

    from harness.config import register_configs, register_resolvers

    register_resolvers()
    register_configs()
    device = "cpu" if a.tiny else "cuda"
    s = setting(a.tiny, a.gen_len)
    import transformers

    summary = {
        "device": device,
        "deadline_s": a.deadline_s,
        "started_at": t_start,
        "work": str(work),
        "status": "started",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }
    rows, est, ceil = [], [], {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM still packs the outputs
    try:
        if device == "cuda":
            summary["gpu"] = torch.cuda.get_device_name(0)
            print(f"device: {summary['gpu']}; clocks, power limit and modes are read only", flush=True)
        # 1. ceilings
        ceil = measure_ceilings(device, a.tiny, work, s["hw"])
        print(f"ceilings: {json.dumps({k: ceil[k] for k in CEILING_KEYS + ('kernel_launch_s',)})}", flush=True)
        measured_hw = measured_hw_of(ceil)
        # 2. estimates first, for every configuration
        allc = s["configs"] + s["long_configs"]
        est = [estimate(s, c, measured_hw, work) for c in allc]
        pd.DataFrame(est).to_csv(work / "estimates.csv", index=False)
        print("estimates (s):", flush=True)
        for e in est:
            print(f"  {e['config']:28s} {e['estimate_s']:8.1f}  offloads={e['offloads']}", flush=True)
        print(
            f"  total {sum(e['estimate_s'] for e in est):.0f} s; time left {deadline - time.time():.0f} s", flush=True
        )
        failed = [e for e in est if e["sim_s"] is None and not e["config"].startswith("hf_offload")]
        for e in failed:
            print(f"  {e['config']}: not simulated ({e['sim_status']}): {e['sim_message']}", flush=True)
        if failed and len(failed) == len([e for e in est if not e["config"].startswith("hf_offload")]):
            raise SetupBroken(
                f"no configuration could be simulated ({failed[0]['sim_message']}); "
                f"the real runs would fail the same way"
            )

        def run_tier(idx):  # cheapest first; skipped when the estimate exceeds what is left
            for i in sorted(idx, key=lambda i: est[i]["estimate_s"]):
                cfg, e = allc[i], est[i]
                left = deadline - time.time()
                if e["estimate_s"] > left:
                    rows.append(
                        {
                            "config": e["config"],
                            "system": cfg[0],
                            "beams": cfg[1],
                            "step": cfg[2],
                            "kv_budget": cfg[3],
                            "gen_len": cfg[4],
                            "status": f"skipped (estimate {e['estimate_s']:.0f} s > {left:.0f} s left)",
                        }
                    )
                else:
                    row = real_and_replay(s, cfg, device, measured_hw, deadline, work)
                    row.update(estimate_s=e["estimate_s"], within_estimate=row["wall_s"] <= e["estimate_s"])
                    rows.append(row)
                r = rows[-1]
                print(
                    f"{r['config']}: {r['status']} real {r.get('real_s')} s (wall {r.get('wall_s')}, estimate "
                    f"{e['estimate_s']:.1f}), sim {r.get('sim_s')}, io {r.get('io_share_real')}",
                    flush=True,
                )
                pd.DataFrame(rows).to_csv(work / "results.csv", index=False)
                shutil.copy2(work / "results.csv", out / "results.csv")  # returned even if killed later

        # 3. the real engine, cheapest first
        n_main = len(s["configs"])
        run_tier(range(n_main))
        # 4. ordering of write-backs and loads, recorded on the device
        if time.time() < deadline:
            try:
                order_res = ordering_check(s, device)
            except Exception as e:  # recorded; the longer generations still run
                traceback.print_exc()
                order_res = {"device": device, "ok": None, "error": f"{type(e).__name__}: {e}"}
            (work / "ordering.json").write_text(json.dumps(order_res, indent=2))
            print(
                f"ordering: {order_res.get('writes')} write-backs, {order_res.get('loads')} loads, "
                f"violations {len(order_res.get('violations', []))} {order_res.get('error', '')}",
                flush=True,
            )
        # 5. longer generations, with whatever time is left
        run_tier(range(n_main, len(allc)))
        summary["status"] = "finished"
    except BaseException as e:  # recorded, and the outputs are still packed
        summary["status"] = f"failed: {type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        df = pd.DataFrame(rows)
        if len(df) and "real_s" in df:  # against layer-wise at the same beams and length
            df["speedup_vs_layerwise"] = speedups_vs_layerwise(
                [dict(r, seconds=None if pd.isna(r.get("real_s")) else r["real_s"]) for r in df.to_dict("records")]
            )
        df.to_csv(work / "results.csv", index=False)
        groups_bw(work, ceil.get("h2d_bw"))
        finish_status(summary, rows)
        summary.update(
            total_s=time.time() - t_start,
            configs=len(s["configs"]) + len(s["long_configs"]),
            runs=len(rows),
            statuses=df.status.value_counts().to_dict() if len(df) else {},
        )
        (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        pack(work, out)
        close_work(a, work)
        if len(df):
            print(
                df.drop(columns=[c for c in ("message", "sim_message") if c in df]).to_string(index=False), flush=True
            )
        print(f"total {time.time() - t_start:.0f} s; outputs in {out}", flush=True)
    return exit_code(summary)


def exit_code(summary: dict) -> int:
    """0 when the script finished with at least one real run made; else 1 (the summary's status
    says why: a failure, or ``finished: no real run was made``)."""
    return 0 if summary["status"] == "finished" else 1


def groups_bw(work: Path, pinned_peak) -> None:
    """Achieved host->device bandwidth of LBS group loads (the real engine's group tables)."""
    import pandas as pd

    gb = []
    for p in sorted((work / "runs").glob("real-lbs*/groups.parquet")):
        g = pd.read_parquet(p)
        if {"load_span_bytes", "load_s"} <= set(g.columns) and g.load_s.sum() > 0:
            nb, sec = float(g.load_span_bytes.sum()), float(g.load_s.sum())
            gb.append(
                {
                    "run": p.parent.name,
                    "bytes": int(nb),
                    "seconds": sec,
                    "achieved_Bps": nb / sec,
                    "fraction_of_pinned_peak": nb / sec / pinned_peak if pinned_peak else None,
                    "median_group_bytes": float(g.load_span_bytes.median()),
                }
            )
    pd.DataFrame(gb).to_csv(work / "groups_bw.csv", index=False)


if __name__ == "__main__":
    sys.exit(main())
