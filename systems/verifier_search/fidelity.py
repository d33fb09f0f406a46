"""The TTS simulator's error against vLLM-CPU, in one command.

    python -m systems.verifier_search.fidelity [recalibrate=true] [repeats=3] [problems=4] [n=16] [threads=1]
                                   [workload=aime24] [results_dir=DIR] [out=DIR]

1. Calibrate this CPU (``systems.verifier_search.calibrate``: generator decode and verifier prefill costs of
   tiny-qwen2 / tiny-prm) into ``conf/hardware/cpu-tts-calibrated.yaml`` (``recalibrate=false``
   keeps an existing one).
2. With torch fixed to ``threads`` threads and one warm-up run excluded, run ``vllm_tts`` and
   ``fasttts`` on vLLM-CPU for seeds 0..repeats-1 (``system.record_tokens=true``), each followed by
   the simulator on the same profile, problems and seed, replaying the real run's tokens
   (``system.replay_tokens``) so both search the same tree; the memory plan (M) of both is made
   from the same measured profile.
3. Compare per iteration (generator + verifier latency), per run (completion latency, goodput,
   prefix-cache hit rates of generator and verifier) and write ``fidelity.md`` (per run and the
   mean with a 95 % interval over the repeats) and ``fidelity.png``/``.pdf`` to ``out`` (default
   ``<results>/sweeps/tts_fidelity``, results = ``results_dir``, else $TTC_RESULTS_DIR, else the
   repository's ``results/``, as run.py's).

Every real timing is measured on a shared machine: the load average before and after each run is
in the table. Goals (issue 11): per-iteration latency MAPE <= 15 %, hit rates within 3 points.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ("vllm_tts", "fasttts")
PROFILE = "cpu-tts-calibrated"
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_ci(values: Sequence[float]) -> str:
    """'mean ± half-width of the 95 % t-interval' over repeats ('mean' for one value)."""
    v = [float(x) for x in values if x is not None and not math.isnan(float(x))]
    if not v:
        return ""
    m = statistics.mean(v)
    if len(v) < 2:
        return f"{m:.3g}"
    h = T95.get(len(v) - 1, 1.96) * statistics.stdev(v) / math.sqrt(len(v))
    return f"{m:.3g} ± {h:.2g}"


def _timing(run_dir: Path, gen: str, ver: str):
    """(per-iteration seconds, completion latency s/problem, goodput tok/s) of a run with its times
    read from iteration columns ``gen`` + ``ver``: the formulas of ``metrics.summarize`` (FastTTS
    AE goodput: a path completes at the cumulative time of its completing iteration, before that
    iteration's verifier call unless the run's ``system.completion_stamp`` is after_verifier)."""
    import json

    import pandas as pd

    it = pd.read_parquet(run_dir / "iterations.parquet")
    comp = pd.read_parquet(run_dir / "completions.parquet")
    rec = run_dir / "run.json"
    system = json.loads(rec.read_text()).get("config", {}).get("system", {}) if rec.is_file() else {}
    it["t"] = it[gen].fillna(0.0) + it[ver].fillna(0.0)
    it["cum"] = it.groupby("problem")["t"].cumsum()
    if system.get("completion_stamp", "before_verifier") == "before_verifier":  # artifact.py
        it["cum"] -= it[ver].fillna(0.0)
    done = comp.merge(
        it[["problem", "iteration", "cum"]],
        left_on=["problem", "completed_iteration"],
        right_on=["problem", "iteration"],
    )
    per = done.groupby("problem").agg(tokens=("tokens", "mean"), time=("cum", "mean"))
    return (
        it.set_index(["problem", "iteration"])["t"],
        float(it.groupby("problem")["t"].sum().mean()),
        float(per.tokens.sum() / per.time.sum()),
    )


def compare(real_dir: Path, sim_dir: Path) -> Dict[str, float]:
    """Sim-vs-real errors of one pair of runs (see module docstring): errors in % (sim / real - 1),
    hit rates in %. Real times are the engines' process CPU seconds (``*_cpu_s``: one thread, the
    time on an uncontended core) and, as ``wall_*``, their wall seconds. ``same_decisions``: share
    of iterations whose survivors are the same paths in both runs."""
    import json

    import numpy as np
    import pandas as pd

    sim_it, sim_lat, sim_gp = _timing(sim_dir, "gen_time_s", "ver_time_s")
    out = {}
    for tag, gen, ver in (("", "gen_cpu_s", "ver_cpu_s"), ("wall_", "gen_time_s", "ver_time_s")):
        real_it, lat, gp = _timing(real_dir, gen, ver)
        both = pd.concat([real_it.rename("real"), sim_it.rename("sim")], axis=1, join="inner")
        both = both[both.real > 0]
        out.update(
            {
                f"{tag}iter_mape": float(100 * np.mean(np.abs(both.sim / both.real - 1))),
                f"{tag}latency_real": lat,
                f"{tag}latency_err": 100 * (sim_lat / lat - 1),
                f"{tag}goodput_real": gp,
                f"{tag}goodput_err": 100 * (sim_gp / gp - 1),
            }
        )
    ir, is_ = (pd.read_parquet(d / "iterations.parquet") for d in (real_dir, sim_dir))
    m = ir.merge(is_, on=["problem", "iteration"], suffixes=("_real", "_sim"))
    gen = m[m.gen_cpu_s_real > 0]
    ver = m[m.ver_cpu_s_real > 0]
    rs, ss = (json.loads((d / "run.json").read_text())["summary"] for d in (real_dir, sim_dir))
    out.update(
        iterations=len(m),
        latency_sim=sim_lat,
        goodput_sim=sim_gp,
        gen_mape=float(100 * np.mean(np.abs(gen.gen_time_s_sim / gen.gen_cpu_s_real - 1))),
        ver_mape=float(100 * np.mean(np.abs(ver.ver_time_s_sim / ver.ver_cpu_s_real - 1))),
        gen_hit_real=100 * rs["gen_prefix_hit_rate"],
        gen_hit_sim=100 * ss["gen_prefix_hit_rate"],
        ver_hit_real=100 * rs["ver_prefix_hit_rate"],
        ver_hit_sim=100 * ss["ver_prefix_hit_rate"],
        same_decisions=float(100 * np.mean(m.selected_keys_real == m.selected_keys_sim)),
    )
    return out


def report(rows: List[dict], out: Path, meta: dict) -> Path:
    """Write ``fidelity.md`` and the figure from the per-run comparison rows."""
    import pandas as pd

    from harness.report import write_markdown

    df = pd.DataFrame(rows)
    df["gen_hit_diff"] = df.gen_hit_sim - df.gen_hit_real
    df["ver_hit_diff"] = df.ver_hit_sim - df.ver_hit_real
    summary = []
    for system, g in df.groupby("system", sort=False):
        summary.append(
            {
                "system": system,
                "repeats": len(g),
                **{
                    k: mean_ci(g[k])
                    for k in (
                        "iter_mape",
                        "gen_mape",
                        "ver_mape",
                        "latency_err",
                        "goodput_err",
                        "gen_hit_real",
                        "gen_hit_diff",
                        "ver_hit_real",
                        "ver_hit_diff",
                        "same_decisions",
                        "wall_iter_mape",
                        "load_before",
                    )
                },
            }
        )
    notes = (
        f"Measured on vLLM-CPU ({meta['threads']} thread(s), warm-up run excluded) vs simulated with the profile "
        f"{meta['profile']} measured on this CPU (process CPU time, like the runs' own); the simulator replays each "
        f"real run's generated tokens. Real times are the engines' process CPU seconds (one thread: the time on "
        f"an uncontended core); wall_iter_mape compares the wall-clock times instead, which on this shared "
        f"machine swing with other users' load (load_before: 1-min load average before each real run). Errors "
        f"in % (sim / real - 1; MAPE over iterations), hit rates in %, *_diff in points (sim - real). Goals: "
        f"per-iteration latency MAPE <= 15 %, hit rates within 3 points. Mean ± 95 % interval over "
        f"{meta['repeats']} repeats (seeds)."
    )
    path = write_markdown(pd.DataFrame(summary), out / "fidelity.md", "TTS simulator vs vLLM-CPU (summary)", notes)
    with path.open("a") as f:
        f.write("\n## Per run\n\n" + df.to_markdown(index=False, floatfmt=".3g") + "\n")
    _figure(df, out)
    return path


def _figure(df, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from harness.report import save_figure

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    lo, hi = float("inf"), 0.0
    for system, g in df.groupby("system", sort=False):
        its = []
        for row in g.itertuples():
            ir, is_ = (pd.read_parquet(Path(d) / "iterations.parquet") for d in (row.real_dir, row.sim_dir))
            its.append(ir.merge(is_, on=["problem", "iteration"], suffixes=("_real", "_sim")))
        m = pd.concat(its)
        x, y = m.gen_cpu_s_real.fillna(0) + m.ver_cpu_s_real.fillna(0), m.gen_time_s_sim + m.ver_time_s_sim
        keep = (x > 0) & (y > 0)
        a.scatter(x[keep], y[keep], s=8, label=system)
        lo, hi = min(lo, x[keep].min(), y[keep].min()), max(hi, x[keep].max(), y[keep].max())
    lim = (0.8 * lo, 1.25 * hi)
    a.plot(lim, lim, "k--", lw=0.8)
    a.set(xlim=lim, ylim=lim)
    a.set(
        xscale="log",
        yscale="log",
        xlabel="measured (vLLM-CPU, CPU s)",
        ylabel="simulated s",
        title="per-iteration latency",
    )
    a.legend(fontsize=8)
    keys = [("gen_hit_real", "gen_hit_sim"), ("ver_hit_real", "ver_hit_sim")]
    labels, real, sim = [], [], []
    for system, g in df.groupby("system", sort=False):
        for (kr, ks), eng in zip(keys, ("generator", "verifier")):
            labels.append(f"{system}\n{eng}")
            real.append(g[kr].mean())
            sim.append(g[ks].mean())
    x = range(len(labels))
    b.bar([i - 0.2 for i in x], real, 0.4, label="measured")
    b.bar([i + 0.2 for i in x], sim, 0.4, label="simulated")
    b.set_xticks(list(x), labels, fontsize=7)
    b.set(ylabel="prefix-cache hit rate (%)", title="prefix-cache hit rates", ylim=(0, 100))
    b.legend(fontsize=8)
    fig.suptitle("TTS simulator vs vLLM-CPU (tiny models, measured vs simulated)", fontsize=10)
    save_figure(fig, out, "fidelity")


def _compose(overrides: List[str]):
    from systems.verifier_search.calibrate import compose

    return compose(["tracking=none", "progress=false", f"hardware={PROFILE}", *overrides])


# the arguments main takes (harness.reproduce --real passes results_dir=)
KEYS = ("recalibrate", "repeats", "problems", "n", "threads", "workload", "out", "results_dir")


def out_dir(args: Dict[str, str]) -> Path:
    """Where the study writes without ``out=``: ``<results>/sweeps/tts_fidelity`` (harness.config's
    results rule: ``results_dir=``, else $TTC_RESULTS_DIR, else the repository's results/)."""
    from harness.config import results_dir_of

    return (
        results_dir_of([f"results_dir={args['results_dir']}"] if args.get("results_dir") else [])
        / "sweeps"
        / "tts_fidelity"
    )


def main(argv=None) -> int:
    from harness.cli import check_tool_values, tool_args
    from harness.errors import ConfigError

    args = tool_args(list(sys.argv[1:] if argv is None else argv), __doc__, KEYS)
    try:  # before minutes of calibration
        check_tool_values(
            args, ints=("repeats", "problems", "n", "threads"), flags=("recalibrate",), groups=("workload",)
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args["out"]) if args.get("out") else out_dir(args)
    repeats, threads = int(args.get("repeats", 3)), int(args.get("threads", 1))
    common = [
        f"workload={args.get('workload', 'aime24')}",
        f"n={args.get('n', 16)}",
        f"workload.num_problems={args.get('problems', 4)}",
    ]
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    torch.set_num_threads(threads)  # before any engine: vLLM-CPU makes it a no-op after
    from harness.run import run
    from systems.verifier_search import calibrate

    if args.get("recalibrate", "true") != "false" or not (ROOT / "conf" / "hardware" / f"{PROFILE}.yaml").exists():
        calibrate.main([f"name={PROFILE}", f"threads={threads}"])
    run(
        _compose(
            [
                "system=fasttts",
                "backend=vllm",
                "n=8",
                "workload.num_problems=1",
                "workload.num_iterations=2",
                "resume=false",
                f"output_dir={out / 'warmup'}",
            ]
        )
    )  # warm-up, excluded
    rows = []
    for seed in range(repeats):
        for system in SYSTEMS:
            real_dir, sim_dir = out / system / f"seed{seed}" / "real", out / system / f"seed{seed}" / "sim"
            base = [f"system={system}", f"seed={seed}", *common]
            load_before = calibrate.loadavg()
            rec = run(_compose([*base, "backend=vllm", "system.record_tokens=true", f"output_dir={real_dir}"]))
            load_after = calibrate.loadavg()
            sim = run(_compose([*base, "backend=sim", f"system.replay_tokens={real_dir}", f"output_dir={sim_dir}"]))
            if rec["status"] != "ok" or sim["status"] != "ok":
                print(
                    f"{system} seed {seed}: real {rec['status']}, sim {sim['status']}: {rec.get('message')} "
                    f"{sim.get('message')}",
                    file=sys.stderr,
                )
                return 1
            row = compare(real_dir, sim_dir)
            row.update(
                system=system,
                seed=seed,
                load_before=load_before,
                load_after=load_after,
                real_dir=str(real_dir),
                sim_dir=str(sim_dir),
            )
            rows.append(row)
    path = report(rows, out, {"threads": threads, "profile": PROFILE, "repeats": repeats})
    print(path.read_text().split("\n## Per run")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
