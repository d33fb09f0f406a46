"""Measure this machine and write a hardware profile with the measured numbers and their date.

    python -m harness.calibrate hardware=cpu            # -> conf/hardware/cpu-calibrated.yaml
    python -m harness.calibrate hardware=h200 out=PATH  # on a CUDA machine: pinned copies, fp16 GEMM

Measures (median of repeats): GEMM throughput (FLOP/s; fp32 on CPU, fp16 on CUDA), memory
bandwidth as a decode step sees it (a 4-row matmul against a weight matrix larger than the caches;
the plain streaming-read bandwidth is recorded beside it as ``stream_bw``), copy bandwidth between the two KV pools in each direction (CPU: between
two host buffers; CUDA: pinned host <-> device), and the fixed cost of one decoder-layer launch
(a transformers LLaMA layer at batch 1, one token, hidden 64: time that does not scale with work).
The profile keeps the base profile's datasheet values under ``datasheet`` and says, per field,
that it was measured and when. Nothing is actuated or changed on the device.
"""
from __future__ import annotations

import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent


def _timeit(fn, sync, repeats=5, warmup=2) -> float:
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure(device: str = "cpu", quick: bool = False) -> dict:
    """Return measured ceilings: peak_flops, mem_bw, h2d_bw, d2h_bw (per s) and launch_overhead_s."""
    import torch
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dt = torch.float16 if cuda else torch.float32
    n = (8192 if cuda else 1024) // (2 if quick else 1)
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    t = _timeit(lambda: a @ b, sync)
    flops = 2 * n ** 3 / t
    size = (1 << 30 if cuda else 256 << 20) >> (2 if quick else 0)
    x = torch.empty(size // 4, dtype=torch.float32, device=device).fill_(1.0)
    stream_bw = size / _timeit(lambda: x.sum(), sync)
    # decode-shaped matmul (4 rows x a weight matrix far larger than the caches): the bandwidth a
    # decode step actually gets when it reads weights and KV. This is the roofline's memory ceiling.
    k = (8192 if cuda else 4096) // (2 if quick else 1)
    w = torch.randn(k, k, device=device, dtype=dt)
    v = torch.randn(4, k, device=device, dtype=dt)
    mem_bw = w.numel() * w.element_size() / _timeit(lambda: v @ w, sync)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    h2d = size / _timeit(lambda: dev.copy_(host, non_blocking=cuda), sync)
    d2h = size / _timeit(lambda: host.copy_(dev, non_blocking=cuda), sync)
    launch = _layer_launch_overhead(device, dt, sync)
    return {"peak_flops": flops, "mem_bw": mem_bw, "stream_bw": stream_bw, "h2d_bw": h2d, "d2h_bw": d2h,
            "launch_overhead_s": launch, "gemm_n": n, "copy_bytes": size, "device": device,
            "torch": str(torch.__version__), "threads": torch.get_num_threads()}


def _layer_launch_overhead(device, dtype, sync) -> float:
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                      num_hidden_layers=1, vocab_size=128)
    cfg._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(cfg, 0).to(device=device, dtype=dtype).eval()
    rope = LlamaRotaryEmbedding(cfg).to(device)
    h = torch.randn(1, 1, 64, device=device, dtype=dtype)
    pos = torch.zeros(1, 1, dtype=torch.long, device=device)
    pe = rope(h, pos)
    with torch.inference_mode():
        reps = 200
        return _timeit(lambda: [layer(h, position_embeddings=pe) for _ in range(reps)], sync) / reps


def write_profile(base: dict, measured: dict, out: Path) -> Path:
    """Base profile (datasheet) + measured ceilings -> a new YAML profile named ``<base>-calibrated``."""
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    prof = {k: v for k, v in base.items() if k not in ("defaults",)}
    name = f"{base['name']}-calibrated"
    prof["name"] = name
    prof["description"] = f"{base.get('description', '')} -- ceilings measured by harness.calibrate on {date}"
    prof["measured"] = {"date": date, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in measured.items()}}
    prof["datasheet"] = {k: base.get(k) for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw", "launch_overhead_s")}
    sources = dict(base.get("sources", {}))
    for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw", "launch_overhead_s"):
        prof[k] = float(measured[k])
        sources[k] = f"measured by python -m harness.calibrate on {date} (datasheet value under datasheet:)"
    prof["sources"] = sources
    if base.get("kind") == "cpu":          # measured ceilings are achieved rates already
        prof["flops_efficiency"] = prof["mem_efficiency"] = 1.0
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "# Generated by harness.calibrate; measured numbers replace the base profile's, which are kept under datasheet:\n"
    text += yaml.safe_dump({"defaults": ["_hardware_schema", "_self_"], **prof}, sort_keys=False)
    out.write_text(text)
    return out


def main(argv=None) -> int:
    args = dict(a.split("=", 1) for a in (argv if argv is not None else sys.argv[1:]))
    hw = args.get("hardware", "cpu")
    src = ROOT / "conf" / "hardware" / f"{hw}.yaml"
    if not src.exists():
        options = sorted(p.stem for p in src.parent.glob("*.yaml"))
        print(f"error: hardware={hw!r} is not a profile; options: {', '.join(options)}", file=sys.stderr)
        return 2
    base = OmegaConf.to_container(OmegaConf.load(src))   # OmegaConf's YAML reads 1.0e9 as a float
    device = "cpu" if base.get("kind") == "cpu" else "cuda"
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print(f"error: hardware={hw} is a GPU profile but no CUDA GPU is available", file=sys.stderr)
            return 2
    m = measure(device, quick=args.get("quick", "false") == "true")
    out = Path(args.get("out", ROOT / "conf" / "hardware" / f"{hw}-calibrated.yaml"))
    write_profile(base, m, out)
    labels = {"peak_flops": "GEMM FLOP/s", "mem_bw": "decode-GEMV B/s", "h2d_bw": "pool copy B/s",
              "d2h_bw": "pool copy B/s"}
    for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw"):
        print(f"{k:11s} {m[k] / 1e9:10.2f} G   {labels[k]:16s} (datasheet {base.get(k, 0) / 1e9:.2f})")
    print(f"{'stream_bw':11s} {m['stream_bw'] / 1e9:10.2f} G   streaming read B/s (recorded, not used: decode "
          f"matmuls see mem_bw)")
    print(f"{'launch_overhead_s':18s} {m['launch_overhead_s'] * 1e6:10.1f} us per decoder layer")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
