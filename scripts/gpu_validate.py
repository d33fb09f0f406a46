"""GPU validation of the LBS family and calibration of the simulator (issue: real-GPU check).

    python scripts/gpu_validate.py --out DIR                 # on a CUDA GPU: OPT-6.7B, fp16, random weights
    python scripts/gpu_validate.py --out DIR --tiny          # anywhere (CPU): tiny model, same pipeline

1. ceilings: pinned host<->device copy bandwidth for 16 MiB - 1 GiB each way, a large fp16 GEMM
   (CPU: fp32), streaming memory bandwidth, layer launch cost -> ceilings.json, copy_bw.csv and a
   measured hardware profile (datasheet values kept beside the measured ones);
2. the LBS family on the real engine: in_gpu (unbudgeted upper bound), layerwise, lbs and its
   ablations, 7 GiB KV budget (the paper's 24 GB card), prompt 128, beams 16/32/64, step 32/128;
3. the same configurations on the simulated backend with the measured profile, and the error.
Nothing about the GPU is changed: clocks, power limits and modes are only read.
Results: results.csv, groups_bw.csv, ceilings.json, copy_bw.csv, <hw>-measured.yaml, runs.tar.gz.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1 << 20


def copy_sweep(device: str, sizes_mib) -> list:
    """Pinned host<->device copy bandwidth (B/s) for each size, median of 5 after 2 warm-ups."""
    import torch
    from harness.calibrate import _timeit
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for mib in sizes_mib:
        n = mib * MiB
        host = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
        dev = torch.empty(n, dtype=torch.uint8, device=device)
        for direction, fn in (("h2d", lambda: dev.copy_(host, non_blocking=cuda)),
                              ("d2h", lambda: host.copy_(dev, non_blocking=cuda))):
            t = _timeit(fn, sync)
            rows.append({"direction": direction, "bytes": n, "seconds": t, "bw_Bps": n / t, "pinned": cuda})
        del host, dev
    return rows


def compose(overrides):
    from hydra import compose as hcompose, initialize_config_dir
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return hcompose("config", overrides=overrides)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU (tests the pipeline)")
    ap.add_argument("--gen-len", type=int, default=512)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new runs after this")
    a = ap.parse_args()
    t_start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from harness.calibrate import measure, write_profile
    from harness.config import register_configs, register_resolvers
    from harness.run import run
    import pandas as pd
    from omegaconf import OmegaConf
    register_resolvers()
    register_configs()
    import torch
    device = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
    hw = "h200" if device == "cuda" else "cpu"
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        print(f"device: {name}; clocks, power limit and modes are read only", flush=True)

    # 1. ceilings
    ceil = measure(device, quick=a.tiny)
    sizes = [16, 64, 256, 1024] if not a.tiny else [16, 64]
    bw = copy_sweep(device, sizes)
    pd.DataFrame(bw).to_csv(out / "copy_bw.csv", index=False)
    ceil["h2d_bw"] = max(r["bw_Bps"] for r in bw if r["direction"] == "h2d")
    ceil["d2h_bw"] = max(r["bw_Bps"] for r in bw if r["direction"] == "d2h")
    ceil["date"] = time.strftime("%Y-%m-%d")
    (out / "ceilings.json").write_text(json.dumps(ceil, indent=2, default=str))
    base = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "hardware" / f"{hw}.yaml"))
    write_profile(base, ceil, out / f"{hw}-measured.yaml")
    print(f"ceilings: {json.dumps({k: ceil[k] for k in ('peak_flops', 'mem_bw', 'h2d_bw', 'd2h_bw', 'launch_overhead_s')})}", flush=True)
    measured_hw = [f"hardware.{k}={ceil[k]}" for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw", "launch_overhead_s")]
    measured_hw += ["hardware.flops_efficiency=1.0", "hardware.mem_efficiency=1.0"]

    # 2 + 3. the LBS family, real then simulated
    if a.tiny:
        model, kv, beams_list, gen, prompt = "tiny-opt", "1MiB", (4, 8), 48, 16
        steps = (16,)
    else:
        model, kv, beams_list, gen, prompt = "opt-6.7b", "7GiB", (16, 32, 64), a.gen_len, 128
        steps = (32, 128)
    configs = []
    for beams in beams_list:
        configs.append(("in_gpu", beams, steps[0]))
        configs.append(("layerwise", beams, steps[0]))
        for st in steps:
            configs.append(("lbs", beams, st))
        configs += [("lbs_intertoken", beams, steps[0]), ("lbs_interbeam", beams, steps[0])]
    if device == "cuda":       # transformers' offloaded DynamicCache (CUDA streams only), the HF reference point
        configs.append(("hf_offload", beams_list[0], steps[0]))   # gen_len capped at 128: it moves all KV per token
    configs.sort(key=lambda c: (c[1], c[0] == "layerwise"))       # cheap first; layer-wise 64 last
    rows = []
    for system, beams, step in configs:
        name = f"{system}-b{beams}-s{step}"
        common = [f"system={system}", f"model={model}", f"beams={beams}", f"step={step}",
                  f"gen_len={min(gen, 128) if system == 'hf_offload' else gen}", f"prompt_len={prompt}", "tracking=none", "progress=false", "seed=0"]
        if model != "tiny-opt":
            common.append("model.dtype=float16")
        budget = [] if system == "in_gpu" else [f"kv_budget={kv}"]
        row = {"config": name, "system": system, "beams": beams, "step": step, "model": model}
        if time.time() - t_start > a.budget_s:
            row["status"] = "skipped (time budget)"
            rows.append(row)
            continue
        buf = io.StringIO()
        with redirect_stdout(buf):
            real = run(compose(common + budget + ["backend=torch", f"backend.device={device}", "system.record_tree=true",
                                                  f"hardware={hw}", "hardware.kv_budget=null",
                                                  f"output_dir={out / 'runs' / ('real-' + name)}"]))
            replay = [f"system.replay_tree={out / 'runs' / ('real-' + name)}"] if real["status"] == "ok" else []
            if system == "hf_offload":
                sim = {"status": "n/a (no simulator model of transformers' cache)", "summary": {}}
            else:
                sim = run(compose(common + budget + replay + ["backend=sim", f"hardware={hw}", "hardware.kv_budget=null",
                                                     *measured_hw, f"output_dir={out / 'runs' / ('sim-' + name)}"]))
        rs, ss = real.get("summary", {}), sim.get("summary", {})
        row.update(status=real["status"], sim_status=sim["status"], real_s=rs.get("e2e_s"), sim_s=ss.get("e2e_s"),
                   io_share_real=rs.get("io_share"), io_share_sim=ss.get("io_share"),
                   h2d_real=rs.get("h2d_bytes"), h2d_sim=ss.get("h2d_bytes"),
                   d2h_real=rs.get("d2h_bytes"), d2h_sim=ss.get("d2h_bytes"),
                   peak_kv_real=rs.get("peak_device_kv_bytes"), energy_j=rs.get("energy_j"),
                   message=real.get("message", ""))
        if row["real_s"] and row["sim_s"]:
            row["time_err"] = (row["sim_s"] - row["real_s"]) / row["real_s"]
        print(f"{name}: {row.get('status')} real {row.get('real_s')} s, sim {row.get('sim_s')} s, "
              f"io {row.get('io_share_real')}", flush=True)
        rows.append(row)
        pd.DataFrame(rows).to_csv(out / "results.csv", index=False)
    df = pd.DataFrame(rows)
    lw = df[df.system == "layerwise"].set_index("beams")["real_s"]
    df["speedup_vs_layerwise"] = [lw.get(b) / s if s and lw.get(b) else None for b, s in zip(df.beams, df.real_s)]
    df.to_csv(out / "results.csv", index=False)

    # achieved host->device bandwidth during LBS group loads (real engine's group table)
    gb = []
    for p in sorted((out / "runs").glob("real-lbs*/groups.parquet")):
        g = pd.read_parquet(p)
        if {"load_span_bytes", "load_s"} <= set(g.columns) and g.load_s.sum() > 0:
            nb, sec = float(g.load_span_bytes.sum()), float(g.load_s.sum())
            gb.append({"run": p.parent.name, "bytes": int(nb), "seconds": sec, "achieved_Bps": nb / sec,
                       "fraction_of_pinned_peak": nb / sec / ceil["h2d_bw"],
                       "median_group_bytes": float(g.load_span_bytes.median())})
    pd.DataFrame(gb).to_csv(out / "groups_bw.csv", index=False)
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tf:
        tf.add(out / "runs", arcname="runs")
    print(df.to_string(index=False), flush=True)
    print(f"total {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
