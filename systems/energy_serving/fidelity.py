"""The serving simulator's error against vLLM-CPU, in one command.

    python -m systems.energy_serving.fidelity [recalibrate=false] [results_dir=DIR] [any run.py override ...]

1. ``python -m systems.energy_serving.calibrate model=tiny-llama``: vLLM-CPU's iteration latency measured
   and fitted into a profile (``<results>/sweeps/serving_fidelity/profile_tiny-llama.yaml``; kept
   with ``recalibrate=false`` when it exists).
2. ``run.py -m experiment=beam_fidelity backend=vllm``: the trace slices served by vLLM (measured).
3. ``run.py -m experiment=beam_fidelity_sim``: the same slices, policies and seeds on the simulator
   charged by that profile (simulated).
4. :func:`report`: per (policy, workload, seed) pair, the per-iteration latency error (every
   iteration vLLM ran, replayed through the profile) and the sim-vs-real error of TTFT and TBT
   P50/P90/P99, throughput and completed requests; over the seeds, mean and range. Writes
   ``fidelity.md`` and ``fidelity.png`` in the sweep folder.

Goals: per-iteration latency MAPE <= 10 %, TTFT/TBT P50 and P90 within 15 %; the report says
whether each is met.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
METRICS = [
    ("ttft_p50_s", "TTFT P50"),
    ("ttft_p90_s", "TTFT P90"),
    ("ttft_p99_s", "TTFT P99"),
    ("tbt_p50_s", "TBT P50"),
    ("tbt_p90_s", "TBT P90"),
    ("tbt_p99_s", "TBT P99"),
    ("throughput_tok_s", "throughput"),
    ("completed", "completed"),
]
GOAL_ITER_MAPE, GOAL_LATENCY = 10.0, 15.0


def iteration_mape(its: pd.DataFrame, cost, column: str = "latency_s") -> float:
    """MAPE (%) of ``cost`` (an IterationCost) against measured iterations (rows of an
    ``iterations`` table: tokens, ctx_tokens, attn_pairs, seqs and the measured ``column``)."""
    pred = np.array([cost.step1(r.tokens, 0.0, r.ctx_tokens, r.attn_pairs, r.seqs)[0] for r in its.itertuples()])
    meas = its[column].to_numpy(float)
    return float(100 * np.mean(np.abs(pred - meas) / meas))


def _pair_rows(runs: pd.DataFrame, cost) -> pd.DataFrame:
    """One row per (system, workload, seed) run on both backends: the per-iteration MAPE against
    the steps' wall time and (on CPU) their CPU time, the share of wall time spent waiting for a
    core, and each metric measured, simulated and their error (%) (one place that reads summaries)."""
    ok = runs[runs.status == "ok"]
    key = ["system", "config.workload.name", "config.seed"]
    real = ok[~ok.simulated.astype(bool)].set_index(key)
    sim = ok[ok.simulated.astype(bool)].set_index(key)
    rows = []
    for k in sorted(set(real.index) & set(sim.index)):
        r, s = real.loc[k], sim.loc[k]
        its = pd.read_parquet(Path(r.run_dir) / "iterations.parquet")
        cpu = its["cpu_s"].notna().all() and len(its)
        row = {
            "system": k[0],
            "workload": k[1],
            "seed": int(k[2]),
            "requests": int(r["summary.requests"]),
            "iterations (measured)": int(r["summary.iterations"]),
            "iteration MAPE % (CPU time)": iteration_mape(its, cost, "cpu_s") if cpu else np.nan,
            "iteration MAPE % (wall)": iteration_mape(its, cost),
            "waiting for a core %": float(100 * (1 - its.cpu_s.sum() / its.latency_s.sum())) if cpu else np.nan,
        }
        for m, name in METRICS:
            a, b = float(r[f"summary.{m}"]), float(s[f"summary.{m}"])
            row[f"{name} (measured)"], row[f"{name} (simulated)"] = a, b
            row[f"{name} err %"] = 100 * (b / a - 1) if a else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per (system, workload): mean over seeds, and the range, of each error."""
    plain = ["iteration MAPE % (CPU time)", "iteration MAPE % (wall)", "waiting for a core %"]
    cols = plain + [f"{name} err %" for _, name in METRICS]
    out = []
    for (sysname, wl), g in pairs.groupby(["system", "workload"]):
        row = {"system": sysname, "workload": wl, "seeds": len(g), "requests": int(g.requests.sum())}
        for c in cols:
            f = ".1f" if c in plain else "+.1f"
            row[c] = f"{g[c].mean():{f}} [{g[c].min():{f}}, {g[c].max():{f}}]"
        out.append(row)
    return pd.DataFrame(out)


def _goals(pairs: pd.DataFrame) -> str:
    lines = []
    for col in ("iteration MAPE % (CPU time)", "iteration MAPE % (wall)"):
        it = pairs[col].mean()
        lines.append(
            f"- per-iteration latency MAPE against the steps' {col.split('(')[1][:-1]} {it:.1f} % "
            f"(goal <= {GOAL_ITER_MAPE:g} %): {'met' if it <= GOAL_ITER_MAPE else 'NOT met'}"
        )
    lat = {name: pairs[f"{name} err %"].abs().mean() for name in ("TTFT P50", "TTFT P90", "TBT P50", "TBT P90")}
    lines += [
        f"- {n}: mean |error| {v:.1f} % (goal within {GOAL_LATENCY:g} %): {'met' if v <= GOAL_LATENCY else 'NOT met'}"
        for n, v in lat.items()
    ]
    return "\n".join(lines)


def report(sweep_dir: Path, profile_path: Path, load: str = "") -> pd.DataFrame:
    """Write ``fidelity.md`` / ``fidelity.png`` for the sweep's measured and simulated runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import yaml

    from harness.report import gather_runs, save_figure, write_markdown
    from systems.energy_serving.calibrate import load_profile

    prof = load_profile(profile_path)
    meta = yaml.safe_load(Path(profile_path).read_text())
    runs = gather_runs(sweep_dir)
    pairs = _pair_rows(runs, prof.cost())
    if pairs.empty:
        raise ValueError(f"{sweep_dir}: no pair of measured and simulated runs to compare")
    slos = f"SLOs TTFT {runs['summary.slo_ttft_s'].iloc[0]:g} s, TBT {1e3 * runs['summary.slo_tbt_s'].iloc[0]:g} ms"
    summ = _summary(pairs)
    fit = meta.get("fit", {})
    notes = (
        f"Values: measured = vLLM-CPU {meta.get('vllm', '?')} in-process, {meta.get('torch_threads', '?')} torch "
        f"thread(s), one device; simulated = our simulator charged by the profile fitted to vLLM-CPU "
        f"({Path(profile_path).name}: fit MAPE {fit.get('mape_pct', '?')} % over {fit.get('points', '?')} "
        f"calibration points, measured {meta.get('date', '?')}, load {meta.get('load_before', '?')} -> "
        f"{meta.get('load_after', '?')}). Errors: "
        f"simulated / measured - 1, mean over seeds [min, max]; iteration MAPE replays every iteration vLLM "
        f"ran (its batch: tokens, KV tokens, pairs, sequences) through the profile and compares with the "
        f"step's CPU time (the engine's own cost, what the profile measures) and its wall time (what "
        f"TTFT and TBT are made of); 'waiting for a core' = the share of the steps' wall time the engine "
        f"thread was not running (other processes on this shared machine). {load}\n\n"
        f"Goals:\n{_goals(pairs)}\n\nPer run pair:\n\n" + pairs.round(4).to_markdown(index=False, floatfmt=".4g")
    )
    write_markdown(
        summ,
        Path(sweep_dir) / "fidelity.md",
        title=f"Serving simulator vs vLLM-CPU ({MODEL}; measured and simulated; {slos})",
        notes=notes,
    )
    fig, ax = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    cost = prof.cost()
    for (sysname, wl), g in runs[(runs.status == "ok") & ~runs.simulated.astype(bool)].groupby(
        ["system", "config.workload.name"]
    ):
        its = pd.concat([pd.read_parquet(Path(d) / "iterations.parquet") for d in g.run_dir])
        pred = [cost.step1(r.tokens, 0.0, r.ctx_tokens, r.attn_pairs, r.seqs)[0] for r in its.itertuples()]
        meas = its.cpu_s if its.cpu_s.notna().all() else its.latency_s
        ax[0].loglog(1e3 * meas, 1e3 * np.array(pred), ".", ms=3, alpha=0.5, label=f"{sysname}, {wl}")
    lim = ax[0].get_xlim()
    ax[0].plot(lim, lim, "k-", lw=0.8)
    ax[0].set(
        xlabel="measured iteration (ms, vLLM-CPU, engine thread CPU time)",
        ylabel="simulated (ms, profile)",
        title="per iteration",
    )
    ax[0].legend(fontsize=7)
    names = ["iteration MAPE % (CPU time)", "iteration MAPE % (wall)"] + [f"{n} err %" for _, n in METRICS]
    groups = list(pairs.groupby(["system", "workload"]))
    w = 0.8 / max(len(groups), 1)
    for i, ((sysname, wl), g) in enumerate(groups):
        mean = np.array([g[c].mean() for c in names])
        lo, hi = mean - np.array([g[c].min() for c in names]), np.array([g[c].max() for c in names]) - mean
        ax[1].bar(np.arange(len(names)) + i * w, mean, w, yerr=[lo, hi], capsize=2, label=f"{sysname}, {wl}")
    ax[1].axhspan(-GOAL_LATENCY, GOAL_LATENCY, color="0.92", zorder=0)
    ax[1].axhline(0, color="k", lw=0.6)
    ax[1].set_xticks(
        np.arange(len(names)) + 0.4 - w / 2,
        [n.replace(" err %", "").replace("iteration MAPE % ", "iter. MAPE ") for n in names],
        rotation=30,
        fontsize=8,
    )
    ax[1].set(ylabel="simulated vs measured (%)", title="mean over seeds, bars = range")
    ax[1].legend(fontsize=7)
    fig.suptitle(f"Serving simulator vs vLLM-CPU ({MODEL}; measured and simulated; {slos})", fontsize=10)
    save_figure(fig, sweep_dir, "fidelity")
    return summ


def main(argv=None) -> int:
    from harness.cli import tool_args

    args = list(sys.argv[1:] if argv is None else argv)
    tool_args(args, __doc__)  # --help; key=value only (the rest goes to run.py)
    opts = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("recalibrate=")}
    recal = opts.get("recalibrate", "true") != "false"
    args = [a for a in args if not a.startswith("recalibrate=")]
    from harness.cli import check_tool_values
    from harness.config import results_dir_of
    from harness.errors import ConfigError
    from harness.reproduce import check_overrides

    try:  # before minutes of calibration: its own values, then run.py's arguments with its sweeps' jobs
        check_tool_values(opts, flags=("recalibrate",))
        check_overrides(
            [a for a in args if not a.startswith("results_dir=")],
            False,
            ["beam_fidelity", "beam_fidelity_sim"],
            results_dir_of(args),
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sweep = results_dir_of(args) / "sweeps" / "serving_fidelity"  # where run.py's jobs below write
    prof = sweep / f"profile_{MODEL}.yaml"
    load0 = os.getloadavg()
    if recal or not prof.exists():
        rc = subprocess.call(
            [sys.executable, "-m", "systems.energy_serving.calibrate", f"model={MODEL}", f"out={prof}"], cwd=ROOT
        )
        if rc:
            return rc
    for extra in (["experiment=beam_fidelity", "backend=vllm"], ["experiment=beam_fidelity_sim"]):
        rc = subprocess.call([sys.executable, "run.py", "-m", *extra, *args], cwd=ROOT)
        if rc:
            return rc
    load = (
        f"Machine load (1/5/15 min) {tuple(round(x, 2) for x in load0)} at the start, "
        f"{tuple(round(x, 2) for x in os.getloadavg())} at the end."
    )
    summ = report(sweep, prof, load)
    print(summ.to_string(index=False))
    print(f"wrote {sweep / 'fidelity.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
