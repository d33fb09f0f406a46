"""Report of ``experiment=fasttts_offload``, a cross-paper study (LBS x FastTTS, not a paper figure:
no paper numbers, no verdicts): goodput and completion latency when the generator's KV overflows its
share, against n. Systems: the vLLM baseline (``vllm_tts``) and its search with LBS scheduling
(``vllm_tts_lbs``, the same paths), FastTTS with vLLM's wait-and-recompute (``fasttts``), with its
offload (``fasttts_offload``: the artifact's sleep mode, or the §4.3.2 KV swap) and with LBS scheduling (``fasttts_lbs``).

Writes ``fasttts_offload.md``: one row per n and system with precise goodput (tok/s), completion
latency (s per problem; generator and verifier shares), both as ratios to ``vllm_tts`` at that n (x;
only between records of one source), the generator's prefix-cache hit rate, and what the overflow
handling did: LBS groups per generator call, GB moved host->device and device->host, I/O stall (s
per run, copies not hidden behind compute), whether M chose the offload extension. And
``fasttts_offload.png/.pdf``: goodput and completion latency against n. Every row says its source
(simulated or measured) in the ``values`` column; titles say it too.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.report import save_figure, sim_label, write_markdown
from systems.verifier_search.report import N_AXIS, _blank_nan, _title, tidy

SYSTEMS = ["vllm_tts", "vllm_tts_lbs", "fasttts", "fasttts_offload", "fasttts_lbs"]
BASE = "vllm_tts"
# summary field -> column (the overflow handling of each run)
MODE = {
    "summary.gen_prefix_hit_rate": "generator prefix-cache hit rate (%)",
    "summary.lbs_groups_per_call": "LBS groups per generator call",
    "summary.lbs_h2d_bytes": "host->device (GB)",
    "summary.lbs_d2h_bytes": "device->host (GB)",
    "summary.lbs_io_stall_s": "I/O stall (s)",
    "summary.offload": "offload on (sleep: by the config; swap: chosen by M)",
}


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (kv_budget, n, system, source) of the successful runs (module docstring)."""
    df = tidy(runs)
    if not len(df):
        return df
    ok = runs[runs["status"] == "ok"].reset_index(drop=True)
    for field, col in MODE.items():
        df[col] = ok[field] if field in ok else None
    df["generator prefix-cache hit rate (%)"] = 100 * df["generator prefix-cache hit rate (%)"].astype(float)
    for col in ("host->device (GB)", "device->host (GB)"):
        df[col] = df[col].astype(float) / 1e9
    df["values"] = ["simulated" if s else "measured" for s in df["simulated"]]
    base = df[df["system"] == BASE].set_index(["kv_budget", "n", "simulated"])
    key = list(zip(df["kv_budget"], df["n"], df["simulated"]))
    for col in ("goodput", "latency"):
        ref = pd.Series([base[col].get(k) if k in base.index else None for k in key], dtype=float)
        df[f"{col} / {BASE} (x)"] = df[col] / ref
    df["order"] = df["system"].map({s: i for i, s in enumerate(SYSTEMS)}).fillna(len(SYSTEMS))
    df = df.sort_values(["kv_budget", "n", "order"]).rename(
        columns={
            "goodput": "goodput (tok/s)",
            "latency": "completion latency (s)",
            "gen_latency": "generator (s)",
            "ver_latency": "verifier (s)",
        }
    )
    cols = [
        "pair",
        "dataset",
        "kv_budget",
        "n",
        "system",
        "values",
        "goodput (tok/s)",
        f"goodput / {BASE} (x)",
        "completion latency (s)",
        f"latency / {BASE} (x)",
        "generator (s)",
        "verifier (s)",
        *MODE.values(),
    ]
    return df[cols].reset_index(drop=True)


def report_offload(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Table + figure of the study (module docstring); returns the table."""
    df = tidy(runs)
    t = table(runs)
    notes = (
        "A cross-paper study, not a paper figure: no paper numbers, no verdicts. Goodput: precise goodput "
        "(tok/s); completion latency: search time per problem (s), generator + verifier; ratios to vllm_tts "
        "at the same n and source (x; latency below 1 = faster). kv_budget: KV bytes of both engines on the "
        "device. *_lbs: the generator's steps in LBS groups with host-held KV (systems/verifier_search/lbs_overflow.py; "
        "vllm_tts_lbs searches exactly as vllm_tts); fasttts: vLLM's wait-and-recompute; fasttts_offload: "
        "the offload extension where M's plan predicts it faster. Bytes and I/O stall: whole run "
        "(GB = 1e9 bytes); the prefix-cache hit rate counts blocks loaded from the host as hits."
    )
    write_markdown(
        _blank_nan(t),
        Path(sweep_dir) / "fasttts_offload.md",
        _title("FastTTS with an overflowing generator KV: goodput and completion latency", df, runs),
        notes,
    )
    _plot(df, _title("FastTTS, generator KV overflowing", df, runs), sweep_dir)
    return t


def _plot(df: pd.DataFrame, title: str, sweep_dir: Path) -> None:
    """Two panels against n: goodput (tok/s) and completion latency (s per problem), a line per system."""
    if not len(df):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    order = {s: i for i, s in enumerate(SYSTEMS)}
    groups = sorted(df.groupby(["system", "simulated"]), key=lambda kv: order.get(kv[0][0], len(SYSTEMS)))
    for ax, col, ylabel in zip(
        axes, ("goodput", "latency"), ("precise goodput (tok/s)", "completion latency (s per problem)")
    ):
        for i, ((name, sim), s) in enumerate(groups):  # earlier lines wider: coinciding ones stay visible
            s = s.sort_values("n")
            ax.plot(
                s["n"],
                s[col],
                marker="o" if sim else "s",
                linestyle="--" if name.endswith("_lbs") else "-",
                linewidth=1.2 + 0.7 * (len(groups) - 1 - i),
                markersize=4 + (len(groups) - 1 - i),
                label=f"{name}{sim_label(bool(sim))}",
            )
        xs = sorted(df["n"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(N_AXIS)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    budgets = ", ".join(sorted({str(b) for b in df["kv_budget"]}))
    fig.suptitle(f"{title}; KV budget {budgets} (both engines)", fontsize=10)
    save_figure(fig, sweep_dir, "fasttts_offload")
