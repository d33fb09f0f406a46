"""Report of ``experiment=fasttts_offload``, a cross-paper study (LBS x FastTTS, not a paper figure:
no paper numbers, no verdicts): goodput and completion latency of FastTTS when the generator's KV
overflows its share, with LBS scheduling (``fasttts_lbs``), vLLM's wait-and-recompute (``fasttts``),
the offload extension (``fasttts_offload``), and the vLLM baseline (``vllm_tts``), against n.

Writes ``fasttts_offload.md`` (one row per n: goodput tok/s and completion latency s per problem of
each system, ratios to the baseline in x, and what the overflow modes did: LBS groups per generator
call and GB moved over PCIe, whether M chose the offload extension) and ``fasttts_offload.png/.pdf``.
Every value is labelled by its own record (simulated here).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.report import save_figure, sim_label, write_markdown
from systems.tts.report import N_AXIS, _blank_nan, _gains, _title, tidy

SYSTEMS = ["vllm_tts", "fasttts", "fasttts_offload", "fasttts_lbs"]
KEYS = ["pair", "dataset", "kv_budget", "n"]


def _mode_columns(runs: pd.DataFrame, t: pd.DataFrame) -> pd.DataFrame:
    """Per n: LBS groups per generator call and GB moved each way (fasttts_lbs), and whether M chose
    the offload extension (fasttts_offload), from the runs' summaries."""
    ok = runs[runs["status"] == "ok"]

    def col(system: str, c: str) -> pd.Series:
        rows = ok[ok["system"] == system]
        return rows.set_index(rows["config.workload.n"].astype(int))[c] if c in rows else pd.Series(dtype=float)
    n = t["n"].astype(int)
    t["lbs groups per call"] = n.map(col("fasttts_lbs", "summary.lbs_groups_per_call"))
    t["lbs host->device (GB)"] = n.map(col("fasttts_lbs", "summary.lbs_h2d_bytes")) / 1e9
    t["lbs device->host (GB)"] = n.map(col("fasttts_lbs", "summary.lbs_d2h_bytes")) / 1e9
    t["offload chosen by M"] = n.map(col("fasttts_offload", "summary.offload"))
    return t


def report_offload(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Table + figure of the study (module docstring); returns the table."""
    df = tidy(runs)
    others = SYSTEMS[1:]
    g = _gains(df, KEYS, others)
    lat = _gains(df, KEYS, others, col="latency")
    if len(g):
        g = g.rename(columns={c: f"goodput {c}" for c in g if c not in KEYS})
        lat = lat.rename(columns={c: f"latency {c}" for c in lat if c not in KEYS})
        t = _mode_columns(runs, g.merge(lat, on=KEYS, how="outer").sort_values("n").reset_index(drop=True))
    else:
        t = g
    notes = ("A cross-paper study, not a paper figure: no paper numbers, no verdicts. goodput: precise goodput "
             "(tok/s); latency: completion latency (s per problem: generator + verifier); x/base: ratio to "
             "vllm_tts (x; latency below 1 = faster). kv_budget: KV bytes of both engines on the device. "
             "fasttts_lbs: the generator's steps in LBS groups with host-held KV (systems/tts/lbs_overflow.py); "
             "fasttts: vLLM's wait-and-recompute; fasttts_offload: the offload extension where M's plan "
             "predicts it faster (offload chosen by M). GB = 1e9 bytes.")
    write_markdown(_blank_nan(t), Path(sweep_dir) / "fasttts_offload.md",
                   _title("FastTTS with an overflowing generator KV: goodput (tok/s) and completion latency "
                          "(s per problem)", df, runs), notes)
    _plot(df, _title("FastTTS, generator KV overflowing", df, runs), sweep_dir)
    return t


def _plot(df: pd.DataFrame, title: str, sweep_dir: Path) -> None:
    """Two panels against n: goodput (tok/s) and completion latency (s per problem), a line per system."""
    if not len(df):
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    for ax, col, ylabel in zip(axes, ("goodput", "latency"),
                               ("precise goodput (tok/s)", "completion latency (s per problem)")):
        for (name, sim), s in df.groupby(["system", "simulated"]):
            s = s.sort_values("n")
            ax.plot(s["n"], s[col], marker="o" if sim else "s", label=f"{name}{sim_label(bool(sim))}")
        xs = sorted(df["n"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel(N_AXIS)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    budgets = ", ".join(sorted({str(b) for b in df["kv_budget"]}))
    fig.suptitle(f"{title}; KV budget {budgets} (both engines)", fontsize=10)
    save_figure(fig, sweep_dir, "fasttts_offload")
