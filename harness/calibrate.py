"""Measure this machine and write a hardware profile with the measured numbers and their date.

    python -m harness.calibrate hardware=cpu            # -> conf/hardware/cpu-calibrated.yaml (threads=1)
    python -m harness.calibrate hardware=h200 out=PATH  # on a CUDA machine: pinned copies, fp16 GEMM
    python -m harness.calibrate hardware=cpu gemv_bytes=64MiB   # mem_bw at a model's weight bytes

A profile is used as ``hardware=<name>`` from ``conf/hardware/<name>.yaml`` (the default ``out``;
one written elsewhere: copy it there; its ``name`` is its file's stem). ``quick=true``: a check of
the tool, not a calibration (an eighth of the matrices, fewer windows, 0.2 s of warm-up).

Measures (the fastest of several timing windows: a ceiling): GEMM throughput (FLOP/s; fp32 on CPU, fp16 on CUDA), memory
bandwidth as a decode step sees it (4-row matmuls ``v @ W`` against a 512 MiB weight matrix, far larger than
the caches, several per timed window so that one launch and one synchronisation per window are
negligible; the plain streaming-read bandwidth is recorded beside it as ``stream_bw``; and the same
weight read by ``x @ W.t()`` of 1 to 64 rows, ``mem_bw_by_rows``: a decode launch of that many beams), copy
bandwidth between the two KV pools in each direction (CPU: between two host buffers; CUDA: pinned
host <-> device), the cost of one kernel launch (``kernel_launch_s``: many tiny ops per window),
and the fixed cost of one decoder-layer launch (a transformers LLaMA layer at batch 1, one token,
hidden 64: time that does not scale with work). The profile keeps the base profile's datasheet
values under ``datasheet`` and says, per field, that it was measured and when; its efficiencies
are 1.0 (measured ceilings are achieved rates already, on a CPU or a GPU). Nothing is actuated or
changed on the device. A second of GEMMs (0.2 s with ``quick``) runs first (an idle CPU core starts slow). Times use the real engine's basis on the device
(``harness.meters.time_basis``: wall on CUDA, this thread's CPU time on a CPU) and one torch thread.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import yaml
from omegaconf import OmegaConf

from harness.meters import time_basis
from harness.units import size_setting

ROOT = Path(__file__).resolve().parent.parent


def _timeit(fn, sync, repeats=5, warmup=2, per_window=1, clock=time.perf_counter) -> float:
    """Seconds of one ``fn()`` call in the fastest of ``repeats`` timing windows of ``per_window``
    calls between two synchronisations (one launch and one sync per window are spread over
    ``per_window`` calls; the fastest window is the one least disturbed by other jobs: a ceiling).
    ``clock``: ``time.perf_counter`` (wall) or ``time.thread_time`` (CPU time of this thread: the
    real engine's basis on a CPU device, ``harness.meters.time_basis``)."""
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(per_window):
            fn()
        sync()
        ts.append((clock() - t0) / per_window)
    return min(ts)


GEMV_BYTES = 512 << 20  # decode-bandwidth weight matrix: beyond any cache


def _weight_read_bw(device: str, dtype, nbytes: int, per_window: int, sync, rows, transposed: bool) -> dict:
    """``{r: bytes/s}``: the weight bytes per second of a matmul of ``r`` rows (each of ``rows``) against
    one square weight of ``nbytes`` (``x @ W``, or ``x @ W.t()`` when ``transposed``), timed over
    windows of ``per_window`` matmuls."""
    import torch

    k = int((nbytes / torch.empty((), dtype=dtype).element_size()) ** 0.5)
    w = torch.randn(k, k, device=device, dtype=dtype)
    wt = w.t() if transposed else w
    clock = time_basis(device)[0]
    out = {}
    for r in rows:
        x = torch.randn(r, k, device=device, dtype=dtype)
        out[r] = w.numel() * w.element_size() / _timeit(lambda: x @ wt, sync, per_window=per_window, clock=clock)
    return out


def gemv_bandwidth(device: str, dtype, nbytes: int, per_window: int, sync) -> float:
    """Bytes/s of a decode-shaped matmul (4 rows x a square weight matrix of ``nbytes``), timed over
    windows of ``per_window`` matmuls: the memory ceiling of the roofline."""
    return _weight_read_bw(device, dtype, nbytes, per_window, sync, (4,), transposed=False)[4]


DECODE_ROWS = (1, 2, 4, 8, 16, 32, 64)  # the batch rows (beams of one launch) of mem_bw_by_rows


def decode_bandwidth_by_rows(device: str, dtype, nbytes: int, per_window: int, sync, rows=DECODE_ROWS) -> dict:
    """``{rows: bytes/s}``: the weight bytes per second of ``x @ W.t()`` (``F.linear``'s layout, as
    every projection and the LM head of the engine's decode computes it) for ``x`` of each count of
    ``rows`` against a square weight ``W`` of ``nbytes``. A decode matmul of few rows is neither the
    roofline's memory ceiling nor its GEMM peak: on a CPU, a BLAS streams the weight once per small
    block of rows (one thread, 63 MiB, 2026-12-05: 28 GB/s at 1-2 rows, 14 at 4, 9 at 8); the
    simulator interpolates this table (``hardware.mem_bw_by_rows``; ``systems.kv_offload.sim``)."""
    return _weight_read_bw(device, dtype, nbytes, per_window, sync, rows, transposed=True)


def _busy(device: str, dtype, seconds: float = 1.0) -> None:
    """GEMMs for ``seconds`` of wall time before measuring: a CPU core that was idle runs slower for
    its first moments (frequency scaling; a first calibration measured half the bandwidth of the next)."""
    import torch

    a = torch.randn(512, 512, device=device, dtype=dtype)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ a


def kernel_launch_seconds(device: str, sync, per_window: int = 1000) -> float:
    """Seconds per launch of a one-element op, many per window (launch and dispatch cost)."""
    import torch

    x = torch.zeros(1, device=device)
    return _timeit(lambda: x.add_(1.0), sync, per_window=per_window, clock=time_basis(device)[0])


def measure(device: str = "cpu", quick: bool = False, threads: int = 1, gemv_bytes: Optional[int] = None) -> dict:
    """Return measured ceilings: peak_flops, mem_bw, h2d_bw, d2h_bw (per s), launch_overhead_s and
    kernel_launch_s, measured with ``threads`` torch CPU threads (the real engine's default, 1:
    ``backend.threads``; restored afterwards). ``gemv_bytes``: the weight matrix of the decode-GEMV
    bandwidth (``mem_bw``); default :data:`GEMV_BYTES`, far larger than any cache (a GPU's HBM
    regime); a model's weight bytes measure the bandwidth its decode sees, caches included (on a CPU,
    a tiny model's weights are partly cache-resident)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _measure(device, quick, gemv_bytes)
    finally:
        torch.set_num_threads(before)


def _measure(device: str, quick: bool, gemv_bytes: Optional[int] = None) -> dict:
    import torch

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dt = torch.float16 if cuda else torch.float32
    n = (8192 if cuda else 1024) // (2 if quick else 1)
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    clock = time_basis(device)[0]
    _busy(device, dt, 0.2 if quick else 1.0)
    t = _timeit(lambda: a @ b, sync, clock=clock)
    flops = 2 * n**3 / t
    size = (1 << 30 if cuda else 256 << 20) >> (2 if quick else 0)
    x = torch.empty(size // 4, dtype=torch.float32, device=device).fill_(1.0)
    stream_bw = size / _timeit(lambda: x.sum(), sync, clock=clock)
    # decode-shaped matmuls (4 rows x a weight matrix far larger than the caches): the bandwidth a
    # decode step actually gets when it reads weights and KV. This is the roofline's memory ceiling.
    gemv_bytes = gemv_bytes or GEMV_BYTES >> (3 if quick else 0)
    gemv_window = 50 if cuda else 4
    mem_bw = gemv_bandwidth(device, dt, gemv_bytes, gemv_window, sync)
    by_rows = decode_bandwidth_by_rows(device, dt, gemv_bytes, gemv_window, sync)
    launch_kernel = kernel_launch_seconds(device, sync, per_window=1000 if not quick else 200)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    h2d = size / _timeit(lambda: dev.copy_(host, non_blocking=cuda), sync, clock=clock)
    d2h = size / _timeit(lambda: host.copy_(dev, non_blocking=cuda), sync, clock=clock)
    launch = _layer_launch_overhead(device, dt, sync)
    return {
        "time_basis": time_basis(device)[1],
        "peak_flops": flops,
        "mem_bw": mem_bw,
        "mem_bw_by_rows": by_rows,
        "stream_bw": stream_bw,
        "h2d_bw": h2d,
        "d2h_bw": d2h,
        "launch_overhead_s": launch,
        "kernel_launch_s": launch_kernel,
        "gemm_n": n,
        "gemv_bytes": gemv_bytes,
        "gemv_per_window": gemv_window,
        "copy_bytes": size,
        "device": device,
        "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
    }


def _layer_launch_overhead(device, dtype, sync) -> float:
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=1,
        vocab_size=128,
    )
    cfg._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(cfg, 0).to(device=device, dtype=dtype).eval()
    rope = LlamaRotaryEmbedding(cfg).to(device)
    h = torch.randn(1, 1, 64, device=device, dtype=dtype)
    pos = torch.zeros(1, 1, dtype=torch.long, device=device)
    pe = rope(h, pos)
    with torch.inference_mode():
        reps = 200
        return (
            _timeit(lambda: [layer(h, position_embeddings=pe) for _ in range(reps)], sync, clock=time_basis(device)[0])
            / reps
        )


def write_profile(base: dict, measured: dict, out: Path) -> Path:
    """Base profile (datasheet) + measured ceilings -> a new YAML profile named ``<base>-calibrated``."""
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    prof = {k: v for k, v in base.items() if k not in ("defaults",)}
    name = out.stem  # hardware=<name> selects conf/hardware/<name>.yaml
    prof["name"] = name
    prof["description"] = f"{base.get('description', '')} -- ceilings measured by harness.calibrate on {date}"
    prof["measured"] = {
        "date": date,
        **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in measured.items() if k != "mem_bw_by_rows"},
    }
    prof["datasheet"] = {k: base.get(k) for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw", "launch_overhead_s")}
    sources = dict(base.get("sources", {}))
    for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw", "launch_overhead_s"):
        prof[k] = float(measured[k])
        sources[k] = f"measured by python -m harness.calibrate on {date} (datasheet value under datasheet:)"
    if "gemv_bytes" in measured:
        sources["mem_bw"] += f": 4-row v @ W on {measured['gemv_bytes'] / 2**20:.0f} MiB"
    if measured.get("mem_bw_by_rows"):
        # keys as text: what a command-line override names (hardware.mem_bw_by_rows.4=...)
        prof["mem_bw_by_rows"] = {str(int(r)): float(v) for r, v in measured["mem_bw_by_rows"].items()}
        sources["mem_bw_by_rows.*"] = (
            f"measured by python -m harness.calibrate on {date}: weight bytes/s of x @ W.t() with x of that many "
            f"rows on {measured.get('gemv_bytes', 0) / 2**20:.0f} MiB; the LBS simulator reads a launch's weights "
            f"at its beams' rate (interpolated in seconds per byte; outside the rows, the first or last rate), "
            f"mem_bw then only for KV and sampling"
        )
    prof["sources"] = sources
    # measured ceilings are achieved rates already: discounting them again would count twice
    prof["flops_efficiency"] = prof["mem_efficiency"] = 1.0
    for k in ("flops_efficiency", "mem_efficiency"):
        sources[k] = "1.0: the ceilings above are measured (achieved) rates"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "# Generated by harness.calibrate; measured numbers replace the base profile's, which are kept under datasheet:\n"
    text += yaml.safe_dump({"defaults": ["_hardware_schema", "_self_"], **prof}, sort_keys=False)
    out.write_text(text)
    return out


def main(argv=None) -> int:
    from harness.cli import tool_args

    args = tool_args(
        list(argv if argv is not None else sys.argv[1:]), __doc__, ("hardware", "out", "quick", "threads", "gemv_bytes")
    )
    hw = args.get("hardware", "cpu")
    src = ROOT / "conf" / "hardware" / f"{hw}.yaml"
    from harness.cli import check_group_options, check_tool_values
    from harness.errors import ConfigError

    try:
        check_group_options([f"hardware={hw}"], ROOT / "conf")
        check_tool_values(args, ints=("threads",), flags=("quick",), files=("out",))
        gemv = size_setting(args["gemv_bytes"], "gemv_bytes") if "gemv_bytes" in args else None
        if gemv is not None and not 1 << 20 <= gemv <= 1 << 34:
            raise ConfigError(f"gemv_bytes={args['gemv_bytes']!r} is not allowed: a size from 1MiB to 16GiB")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    base = OmegaConf.to_container(OmegaConf.load(src))  # OmegaConf's YAML reads 1.0e9 as a float
    device = "cpu" if base.get("kind") == "cpu" else "cuda"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(f"error: hardware={hw} is a GPU profile but no CUDA GPU is available", file=sys.stderr)
            return 2
    m = measure(
        device, quick=args.get("quick", "false") == "true", threads=int(args.get("threads", 1)), gemv_bytes=gemv
    )
    out = Path(args.get("out", ROOT / "conf" / "hardware" / f"{hw}-calibrated.yaml"))
    write_profile(base, m, out)
    labels = {
        "peak_flops": "GEMM FLOP/s",
        "mem_bw": "decode-GEMV B/s",
        "h2d_bw": "pool copy B/s",
        "d2h_bw": "pool copy B/s",
    }
    for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw"):
        where = (
            f", {m['gemv_per_window']} per timed window on {m['gemv_bytes'] / 2**20:.0f} MiB" if k == "mem_bw" else ""
        )
        print(f"{k:11s} {m[k] / 1e9:10.2f} G   {labels[k]:16s} (datasheet {base.get(k, 0) / 1e9:.2f}{where})")
    print(
        f"{'stream_bw':11s} {m['stream_bw'] / 1e9:10.2f} G   streaming read B/s (recorded, not used: decode "
        f"matmuls see mem_bw)"
    )
    if m.get("mem_bw_by_rows"):
        rows = "  ".join(f"{r}: {v / 1e9:.1f}" for r, v in m["mem_bw_by_rows"].items())
        print(f"{'mem_bw_by_rows':18s} {rows} (rows: GB/s of x @ W.t())")
    print(f"{'launch_overhead_s':18s} {m['launch_overhead_s'] * 1e6:10.1f} us per decoder layer")
    print(f"{'kernel_launch_s':18s} {m['kernel_launch_s'] * 1e6:10.1f} us per kernel launch")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
