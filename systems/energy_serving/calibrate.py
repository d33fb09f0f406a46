"""Measure vLLM-CPU's iteration latency for a tiny model and write it as a profile the simulator
can be charged with (``system.latency_profile=PATH``).

    python -m systems.energy_serving.calibrate model=tiny-llama [out=PATH] [threads=1] [reps=3] [rounds=3]

Measures (vLLM in-process, random weights, torch threads fixed, a warm-up round excluded, then
``rounds`` interleaved rounds of ``reps`` steps per point; a step's time is the engine thread's
CPU time, a point's latency the median of its steps, see :func:`measure`): prefill chunks of n
fresh tokens, decode batches of b sequences at three contexts, and mixed steps (b decodes + one
chunk) -- the iterations a serving run is made of. Fits

    latency_s = base_s + per_token_s * n + per_kv_token_s * ctx + per_pair_s * pairs + per_seq_s * seqs

(n new tokens, ctx KV tokens read, causal query-key pairs, sequences in the batch:
:func:`systems.energy_serving.protocol.iteration_shape`) by least squares on relative error, non-negative
coefficients, refitted once without samples more than 25 % off (steps slowed by other processes).
The profile records the samples, the fit's error, the date, torch's thread count and the machine's
load before and after. Bad input (an unknown model, one too large for vLLM on CPU) exits 2 before any
work.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List

import numpy as np
import yaml

from harness.errors import ConfigError
from systems.energy_serving.protocol import iteration_shape

ROOT = Path(__file__).resolve().parents[2]
TERMS = ("base_s", "per_token_s", "per_kv_token_s", "per_pair_s", "per_seq_s")
PREFILL = (16, 64, 128, 256, 512)
DECODE_BATCH = (1, 4, 16, 32, 64)
DECODE_CTX = (64, 256, 768)
MIXED = ((4, 32), (4, 128), (16, 32), (16, 128), (16, 512), (32, 128))  # (decodes, chunk)
MIXED_CTX = 256


def features(n, ctx, pairs, seqs) -> np.ndarray:
    """The fit's regressors, in the order of TERMS."""
    return np.array([1.0, n, ctx, pairs, seqs], float)


@dataclass
class MeasuredCost:
    """An :class:`systems.energy_serving.protocol.IterationCost` from a measured profile: latency only
    (no power model), and the clock does not change it (vLLM-CPU has none to set)."""

    coef: np.ndarray
    has_energy = False
    follows_clock = False

    def step1(self, n, f, ctx_tokens=0.0, attn_pairs=0.0, seqs=1):
        return float(features(n, ctx_tokens, attn_pairs, seqs) @ self.coef), 0.0

    def idle1(self, f):
        return 0.0


@dataclass
class LatencyProfile:
    """A profile written by this module: model name, coefficients (TERMS, seconds), fit error (%)."""

    model: str
    coefficients: Dict[str, float]
    fit_mape_pct: float

    def cost(self) -> MeasuredCost:
        return MeasuredCost(np.array([self.coefficients[t] for t in TERMS], float))


def load_profile(path) -> LatencyProfile:
    """Read a profile. Raises ConfigError naming the path when it is missing or not a profile."""
    from harness.inputs import read_text

    p = Path(path)
    if not p.exists():
        raise ConfigError(
            f"system.latency_profile={str(path)!r} is not allowed: no such file (write one with "
            f"python -m systems.energy_serving.calibrate model=<a tiny-* model>)"
        )
    text = read_text(p, "system.latency_profile", "a profile of systems.energy_serving.calibrate", 1 << 20)
    try:
        d = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        d = None
    if not isinstance(d, dict) or set(TERMS) - set(d.get("coefficients", {})) or "model" not in d:
        raise ConfigError(
            f"system.latency_profile={str(path)!r} is not allowed: not a profile of "
            f"systems.energy_serving.calibrate (needs model and coefficients {', '.join(TERMS)})"
        )
    return LatencyProfile(d["model"], {t: float(d["coefficients"][t]) for t in TERMS}, float(d["fit"]["mape_pct"]))


OUTLIER = 0.25  # a sample this far (relative) from the first fit is excluded from the second


def _nnls_rel(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error (active set: the most negative term is dropped
    until none is)."""
    A, b = X / y[:, None], np.ones(len(y))
    keep = list(range(X.shape[1]))
    while True:
        c, *_ = np.linalg.lstsq(A[:, keep], b, rcond=None)
        if (c >= 0).all():
            break
        keep.pop(int(np.argmin(c)))
    coef = np.zeros(X.shape[1])
    coef[keep] = c
    return coef


def fit(samples: List[dict]) -> Dict[str, float]:
    """Coefficients by TERMS: a non-negative fit on relative error, refitted without the samples
    more than OUTLIER off the first fit (a step slowed by another process on a shared machine);
    those samples get ``outlier: true``."""
    X = np.array([features(s["tokens"], s["ctx_tokens"], s["attn_pairs"], s["seqs"]) for s in samples])
    y = np.array([s["latency_s"] for s in samples])
    ok = np.abs(X @ _nnls_rel(X, y) - y) / y <= OUTLIER
    for s, o in zip(samples, ok):
        s["outlier"] = not bool(o)
    return dict(zip(TERMS, map(float, _nnls_rel(X[ok], y[ok]))))


def grid():
    """The calibration points: (kind, batch as (request, tokens, context) items, probe arguments)."""
    pts = [("prefill", [(0, n, 0)], ("prefill", n)) for n in PREFILL]
    pts += [
        ("decode", [(i, 1, ctx - 1) for i in range(b)], ("decode", b, ctx)) for ctx in DECODE_CTX for b in DECODE_BATCH
    ]
    pts += [
        ("mixed", [(i, 1, MIXED_CTX - 1) for i in range(b)] + [(b, n, 0)], ("mixed", b, MIXED_CTX, n)) for b, n in MIXED
    ]
    return pts


def measure(server, vocab: int, reps: int, rounds: int) -> List[dict]:
    """The calibration grid on ``server`` (a :class:`systems.energy_serving.vllm_engine.VllmServer`): one
    warm-up round (excluded), then ``rounds`` rounds over the whole grid, ``reps`` steps per point
    and round (rounds interleave the points, so a change of the machine's load does not become a
    slope over the grid). A step is timed by the engine thread's CPU time (vLLM in-process with one
    torch thread runs a step in this thread: CPU time equals wall time on an idle machine, and other
    processes on a shared one delay the wall time but not the CPU time); a point's latency is the
    median of its steps, ``spread_pct`` (max - min) / median."""
    rng = np.random.default_rng(0)
    probes = {
        "prefill": lambda n: server.probe_prefill(n, rng, vocab, reps),
        "decode": lambda b, ctx: server.probe_decode(b, ctx, rng, vocab, reps),
        "mixed": lambda b, ctx, n: server.probe_mixed(b, ctx, n, rng, vocab, reps),
    }
    pts = grid()
    times: List[List[float]] = [[] for _ in pts]
    for k in range(rounds + 1):
        for i, (_, _, (kind, *a)) in enumerate(pts):
            t = probes[kind](*a)
            if k:
                times[i] += t
    out = []
    for (kind, sched, _), t in zip(pts, times):
        if not t:
            continue
        n, ctx, pairs, seqs = iteration_shape(sched)
        q = float(np.median(t))
        out.append(
            {
                "kind": kind,
                "tokens": int(n),
                "ctx_tokens": float(ctx),
                "attn_pairs": float(pairs),
                "seqs": int(seqs),
                "latency_s": q,
                "steps": len(t),
                "spread_pct": round(100 * (max(t) - min(t)) / q, 1),
            }
        )
    return out


def calibrate(model, out: Path, threads: int = 1, reps: int = 3, rounds: int = 3) -> dict:
    """Measure, fit and write the profile for ``model`` (a model config). Raises ConfigError for a
    model too large for vLLM on CPU (before any work)."""
    from harness.model_facts import check_cpu_model
    from systems.energy_serving.vllm_engine import VllmServer, write_model_dir

    check_cpu_model(model, "vLLM")
    load0 = os.getloadavg()
    engine = {
        "max_num_batched_tokens": 1024,
        "max_num_seqs": max(DECODE_BATCH),
        "kv_cache_bytes": 256 << 20,
        "max_model_len": 2048,
        "block_size": 32,
        "enforce_eager": True,
    }
    server = VllmServer(
        write_model_dir(model, out.parent / f"model_{model.name}"),
        model.dtype,
        max_chunk=engine["max_num_batched_tokens"],
        max_num_seqs=engine["max_num_seqs"],
        kv_cache_bytes=engine["kv_cache_bytes"],
        max_model_len=engine["max_model_len"],
        threads=threads,
    )
    try:
        samples = measure(server, int(model.vocab_size), reps, rounds)
    finally:
        server.close()
    coef = fit(samples)
    used = [s for s in samples if not s["outlier"]]
    pred = np.array(
        [
            features(s["tokens"], s["ctx_tokens"], s["attn_pairs"], s["seqs"]) @ np.array(list(coef.values()))
            for s in used
        ]
    )
    y = np.array([s["latency_s"] for s in used])
    err = np.abs(pred - y) / y
    import vllm

    prof = {
        "model": model.name,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "vllm": vllm.__version__,
        "engine": engine,
        "torch_threads": server.threads,
        "reps": reps,
        "rounds": rounds,
        "warmup": "one round over the grid, excluded",
        "statistic": "median over a point's steps of the engine thread's CPU time per step",
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "latency_model": "latency_s = base_s + per_token_s*n + per_kv_token_s*ctx + per_pair_s*pairs + per_seq_s*seqs",
        "coefficients": coef,
        "fit": {
            "mape_pct": round(100 * float(err.mean()), 2),
            "max_pct": round(100 * float(err.max()), 2),
            "points": len(used),
            "outliers_excluded": len(samples) - len(used),
        },
        "samples": samples,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        "# Generated by python -m systems.energy_serving.calibrate: measured vLLM-CPU iteration latency\n"
        + yaml.safe_dump(prof, sort_keys=False)
    )
    return prof


def main(argv=None) -> int:
    from harness.cli import tool_args

    args = tool_args(
        list(argv if argv is not None else sys.argv[1:]), __doc__, ("model", "out", "threads", "reps", "rounds")
    )
    name = args.get("model", "tiny-llama")
    from harness.cli import check_group_options, check_tool_values

    try:
        check_group_options([f"model={name}"], ROOT / "conf")
        check_tool_values(args, ints=("threads", "reps", "rounds"), files=("out",))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from systems.energy_serving.power_fit import load_conf

    model = load_conf("model", name)
    out = Path(args.get("out", ROOT / "results" / "sweeps" / "serving_fidelity" / f"profile_{name}.yaml"))
    t0 = time.perf_counter()
    try:
        prof = calibrate(model, out, int(args.get("threads", 1)), int(args.get("reps", 3)), int(args.get("rounds", 3)))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c = prof["coefficients"]
    print(
        f"{name}: base {1e3 * c['base_s']:.2f} ms + {1e6 * c['per_token_s']:.1f} us/token + "
        f"{1e9 * c['per_kv_token_s']:.0f} ns/KV token + {1e9 * c['per_pair_s']:.0f} ns/pair + "
        f"{1e6 * c['per_seq_s']:.0f} us/sequence; fit MAPE {prof['fit']['mape_pct']} % (max {prof['fit']['max_pct']} %) "
        f"over {prof['fit']['points']} points ({prof['fit']['outliers_excluded']} excluded); {prof['torch_threads']} thread(s), load {prof['load_before']} -> "
        f"{prof['load_after']}; {time.perf_counter() - t0:.0f} s"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
