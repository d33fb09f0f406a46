"""Sweep reports of the FastTTS family: each ``report_*(sweep_dir, runs, cfg)`` writes a markdown
table and a figure (PNG + PDF) with our numbers beside the paper's (``results/reference/fasttts.csv``,
never used to compute ours).

Every value of ours is labelled by its own record: value and ratio columns end in " (sim)" or
" (measured)", a ratio is taken only between records of one label, a sweep mixing both shows both
sets of columns, and titles say "(simulated)", "(measured)" or "(simulated and measured)".

``runs``: one row per job (harness.report.gather_runs): status, system, simulated, summary.*, config.*;
:func:`tidy` is the one place summary values are read.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import numpy as np
import pandas as pd

from harness.report import load_reference, save_figure, write_markdown

PAIRS = {("qwen2.5-math-1.5b", "skywork-prm-1.5b"): "1.5B+1.5B",
         ("qwen2.5-math-1.5b", "math-shepherd-7b"): "1.5B+7B",
         ("qwen2.5-math-7b", "skywork-prm-1.5b"): "7B+1.5B"}


def tidy(runs: pd.DataFrame) -> pd.DataFrame:
    """Successful runs with columns pair, dataset, n, system, R, search, hardware, kv_budget,
    goodput, latency, gen_latency, ver_latency, simulated."""
    if runs is None or not len(runs):
        return pd.DataFrame()
    df = runs[runs["status"] == "ok"].copy()
    if not len(df):
        return df
    g = lambda c, d=None: df[c] if c in df else d
    out = pd.DataFrame({
        "pair": [PAIRS.get((m, v), f"{m}+{v}") for m, v in zip(g("config.model.name"), g("config.verifier.name"))],
        "dataset": g("config.workload.name"), "n": g("config.workload.n").astype(int),
        "system": df["system"], "R": g("config.system.spec_truncation_ratio"),
        "search": g("config.system.search"), "hardware": g("config.hardware.name"),
        "kv_budget": g("config.system.kv_budget", "").astype(str) if "config.system.kv_budget" in df else "",
        "goodput": g("summary.goodput_tok_s"), "latency": g("summary.latency_s"),
        "gen_latency": g("summary.gen_latency_s"), "ver_latency": g("summary.ver_latency_s"),
        "simulated": df["simulated"],
    })
    return out.reset_index(drop=True)


def _blank_nan(t: pd.DataFrame) -> pd.DataFrame:
    """The table for markdown: missing values (no paper number there) as empty cells, not 'nan'."""
    return t.astype(object).where(t.notna(), None)


def _problems(runs: pd.DataFrame) -> str:
    """' (first K problems per point)' when the sweep ran ``workload.num_problems=K``, else ''."""
    col = "config.workload.num_problems"
    if runs is None or col not in runs:
        return ""
    k = pd.to_numeric(runs[col], errors="coerce").dropna().unique()
    if not len(k):
        return ""
    return f" (workload.num_problems={', '.join(str(int(x)) for x in sorted(k))}: first problem(s) only)"


def _ref(figure: str) -> pd.DataFrame:
    ref = load_reference("fasttts", figure)
    parsed = ref["config"].str.split(";").apply(lambda kv: dict(x.split("=", 1) for x in kv if "=" in x))
    return pd.concat([ref, pd.DataFrame(list(parsed))], axis=1)


def _paper(ref: pd.DataFrame, metric: str, **keys) -> Optional[float]:
    m = ref["metric"] == metric
    for k, v in keys.items():
        if k not in ref:
            return None
        m &= ref[k].astype(str) == str(v)
    return float(ref[m]["value"].iloc[0]) if m.any() else None


def label(simulated: bool) -> str:
    """Column / legend suffix of a value by its record: " (sim)" or " (measured)"."""
    return " (sim)" if simulated else " (measured)"


def _labels(df: pd.DataFrame) -> List[str]:
    return [label(bool(x)) for x in sorted(df["simulated"].astype(bool).unique(), reverse=True)] if len(df) else []


def _title_label(df: pd.DataFrame) -> str:
    kinds = {bool(x) for x in df["simulated"]} if len(df) else set()
    return {frozenset({True}): " (simulated)", frozenset({False}): " (measured)"}.get(
        frozenset(kinds), " (simulated and measured)" if kinds else "")


def _gains(df: pd.DataFrame, keys: List[str], variants: List[str], base: str = "vllm_tts", col: str = "goodput"):
    """One row per ``keys`` group; for each label of its records (simulated / measured): the base
    value ``{base}{label}``, each variant's ``{v}{label}`` and, where that label has a base, the
    ratio ``{v}/base{label}``: never a ratio across labels."""
    rows = []
    for k, grp in df.groupby(keys, dropna=False):
        row = dict(zip(keys, k if isinstance(k, tuple) else (k,)))
        for sim, g in grp.groupby("simulated"):
            lab = label(bool(sim))
            b = g[g["system"] == base][col]
            if len(b):
                row[f"{base}{lab}"] = float(b.iloc[0])
            for v in variants:
                x = g[g["system"] == v][col]
                if len(x):
                    row[f"{v}{lab}"] = float(x.iloc[0])
                    if len(b):
                        row[f"{v}/base{lab}"] = float(x.iloc[0]) / float(b.iloc[0]) if float(b.iloc[0]) > 0 else np.nan
        if len(row) > len(keys):
            rows.append(row)
    return pd.DataFrame(rows)


def _ratio_cols(t: pd.DataFrame, v: str) -> List[str]:
    """The ``{v}/base{label}`` columns present, simulated first."""
    return [c for c in (f"{v}/base{label(True)}", f"{v}/base{label(False)}") if c in t]


def _gain_notes(t: pd.DataFrame, v: str) -> str:
    """'Ours (sim): mean gain 1.50x (range 1.20-1.80x) over 4 points; ...' for each label present."""
    out = []
    for c in _ratio_cols(t, v):
        g = t[c].dropna()
        out.append(f"Ours{c[len(v) + len('/base'):]}: mean gain {g.mean():.2f}x (range {g.min():.2f}-{g.max():.2f}x) "
                   f"over {len(g)} points")
    return "; ".join(out)


def _add_gain_pct(t: pd.DataFrame, variants: List[str], paper) -> None:
    """``{v} gain %{label}`` = 100 (ratio - 1) for each ratio column, and the paper's ``{v} paper %``."""
    for v in variants:
        for c in _ratio_cols(t, v):
            t[f"{v} gain %{c[len(v) + len('/base'):]}"] = 100 * (t[c] - 1)
        if _ratio_cols(t, v):
            t[f"{v} paper %"] = [paper(r, v) for r in t.itertuples()]


def _grid_plot(df, keys, xcol, ycol, ref_fn, title, sweep_dir, name, logy=True):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = list(df.groupby(keys, dropna=False))
    if not groups:
        return
    cols = min(3, len(groups))
    rws = int(np.ceil(len(groups) / cols))
    fig, axes = plt.subplots(rws, cols, figsize=(4.2 * cols, 3.2 * rws), squeeze=False, layout="constrained")
    any_paper = False
    for ax, (k, grp) in zip(axes.flat, groups):
        k = k if isinstance(k, tuple) else (k,)
        for (sysname, sim), s in grp.groupby(["system", "simulated"]):
            s = s.sort_values(xcol)
            ax.plot(s[xcol], s[ycol], marker="o" if sim else "s", label=f"{sysname}{label(bool(sim))}")
            pts = [(x, ref_fn(dict(zip(keys, k)), sysname, x)) for x in sorted(s[xcol].unique())]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                any_paper = True
                ax.scatter(*zip(*pts), marker="x", s=60, label=f"{sysname} (paper)")
        ax.set_title(" ".join(str(x) for x in k), fontsize=9)
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xcol)
        ax.set_ylabel(ycol)
        ax.legend(fontsize=6)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    fig.suptitle(title + _title_label(df) + ("; x = paper" if any_paper else ""), fontsize=10)
    save_figure(fig, sweep_dir, name)


def report_goodput(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 12: goodput vs n per pair and dataset; headline gain vs the paper's 2.2x (1.2-5.4x)."""
    df = tidy(runs)
    ref = _ref("fig12")
    t = _gains(df, ["pair", "dataset", "n"], ["fasttts"])
    if len(t):
        t["paper base"] = [_paper(ref, "goodput_tok_s", pair=r.pair, dataset=r.dataset, n=r.n, system="vllm_tts")
                           for r in t.itertuples()]
        t["paper fasttts"] = [_paper(ref, "goodput_tok_s", pair=r.pair, dataset=r.dataset, n=r.n, system="fasttts")
                              for r in t.itertuples()]
        t["paper gain"] = t["paper fasttts"] / t["paper base"]
        notes = _gain_notes(t, "fasttts") + "; paper: 2.2x (1.2-5.4x)."
    else:
        notes = "no successful runs"
    write_markdown(_blank_nan(t), Path(sweep_dir) / "fig12_goodput.md",
                   "FastTTS Fig. 12: precise goodput (tok/s)" + _title_label(df) + _problems(runs), notes)
    _grid_plot(df, ["pair", "dataset"], "n", "goodput",
               lambda k, s, n: _paper(ref, "goodput_tok_s", pair=k["pair"], dataset=k["dataset"], n=n, system=s),
               "Precise goodput (tok/s)" + _problems(runs), sweep_dir, "fig12_goodput")
    return t


def report_latency(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 13: completion latency (generator + verifier) and its reduction vs the paper's 38-68 %."""
    df = tidy(runs)
    ref = _ref("fig13")
    parts = []
    for col in ("latency", "gen_latency", "ver_latency"):
        g = _gains(df, ["pair", "dataset", "n"], ["fasttts"], col=col)
        for c in _ratio_cols(g, "fasttts"):
            parts.append(g.set_index(["pair", "dataset", "n"])[c].rename(f"{col} reduction %{c[len('fasttts/base'):]}")
                         .map(lambda r: 100 * (1 - r)))
    t = _gains(df, ["pair", "dataset", "n"], ["fasttts"], col="latency")
    if parts:
        t = t.merge(pd.concat(parts, axis=1).reset_index(), on=["pair", "dataset", "n"])
        notes = "; ".join(f"Ours{c[len('latency reduction %'):]}: completion-latency reduction {t[c].min():.0f}.."
                          f"{t[c].max():.0f} % (mean {t[c].mean():.0f} %)" for c in t if c.startswith("latency reduction %"))
        notes += "; paper: 38..68 %; verifier 75..85 %, generator 36..66 %."
    else:
        notes = "no successful runs"
    write_markdown(_blank_nan(t), Path(sweep_dir) / "fig13_latency.md", "FastTTS Fig. 13: completion latency (s)" + _title_label(df) + _problems(runs), notes)
    _grid_plot(df, ["pair", "dataset"], "n", "latency",
               lambda k, s, n: _paper(ref, "latency_s", pair=k["pair"], dataset=k["dataset"], n=n, system=s),
               "Completion latency (s/problem)" + _problems(runs), sweep_dir, "fig13_latency")
    return t


def report_ablation(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 16: cumulative goodput gain (%) of P, P+M, P+M+S over the baseline."""
    df = tidy(runs)
    ref = _ref("fig16")
    variants = ["fasttts_p", "fasttts_pm", "fasttts"]
    t = _gains(df, ["pair", "n"], variants)
    _add_gain_pct(t, variants, lambda r, v: _paper(ref, "goodput_gain_pct", pair=r.pair, n=r.n, system=v))
    write_markdown(_blank_nan(t), Path(sweep_dir) / "fig16_ablation.md",
                   "FastTTS Fig. 16: cumulative goodput gain (%)" + _title_label(df) + _problems(runs),
                   "P = prefix-aware scheduling, M = memory allocation, S = speculative beam extension.")
    df2 = df.merge(df[df.system == "vllm_tts"][["pair", "n", "simulated", "goodput"]].rename(columns={"goodput": "base"}),
                   on=["pair", "n", "simulated"])
    df2["gain_pct"] = 100 * (df2["goodput"] / df2["base"] - 1)
    _grid_plot(df2[df2.system != "vllm_tts"], ["pair"], "n", "gain_pct",
               lambda k, s, n: _paper(ref, "goodput_gain_pct", pair=k["pair"], n=n, system=s),
               "Cumulative goodput gain over the baseline (%)" + _problems(runs), sweep_dir, "fig16_ablation", logy=False)
    return t


def report_r_sweep(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 17-right: goodput of the baseline and FastTTS at R = 0.0 / 0.85."""
    df = tidy(runs)
    ref = _ref("fig17")
    df = df[(df.system == "fasttts") | (df.R.astype(float) == 0.85)].copy()
    df.loc[df.system == "fasttts", "system"] = "fasttts;R=" + df.loc[df.system == "fasttts", "R"].astype(float).map(
        lambda r: f"{r:g}" if r != 0 else "0.0")
    t = _gains(df, ["pair", "dataset", "n"], ["fasttts;R=0.0", "fasttts;R=0.85"])
    write_markdown(_blank_nan(t), Path(sweep_dir) / "fig17_r_sweep.md",
                   "FastTTS Fig. 17-right: goodput vs R (tok/s)" + _title_label(df) + _problems(runs))
    _grid_plot(df, ["pair", "dataset"], "n", "goodput",
               lambda k, s, n: _paper(ref, "goodput_tok_s", dataset=k["dataset"], n=n, system=s),
               "Goodput vs truncation ratio R" + _problems(runs), sweep_dir, "fig17_r_sweep")
    return t


def report_memory(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 18-right: goodput gain of P and M+P against the KV budget."""
    df = tidy(runs)
    ref = _ref("fig18")
    t = _gains(df, ["pair", "kv_budget", "n"], ["fasttts_p", "fasttts_pm"])
    _add_gain_pct(t, ["fasttts_p", "fasttts_pm"],
                  lambda r, v: _paper(ref, "goodput_gain_pct", kv_budget=r.kv_budget, system=v))
    write_markdown(_blank_nan(t), Path(sweep_dir) / "fig18_memory.md",
                   "FastTTS Fig. 18-right: gain vs KV budget (%)" + _title_label(df) + _problems(runs))
    return t


def report_methods(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 11: goodput gain per search algorithm (paper: 1.2-3.9x)."""
    df = tidy(runs)
    t = _gains(df, ["search", "n"], ["fasttts"])
    notes = _gain_notes(t, "fasttts") + "; paper 1.2-3.9x." if len(t) else ""
    write_markdown(_blank_nan(t), Path(sweep_dir) / "fig11_methods.md",
                   "FastTTS Fig. 11: goodput per search method" + _title_label(df) + _problems(runs), notes)
    _grid_plot(df, ["search"], "n", "goodput", lambda k, s, n: None, "Goodput per search algorithm" + _problems(runs),
               sweep_dir, "fig11_methods")
    return t


def report_gpus(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 15: goodput on the RTX 3070 Ti (offload) and RTX 4070 Ti (paper gain 1.4-1.6x)."""
    df = tidy(runs)
    ref = _ref("fig15")
    t = _gains(df, ["hardware", "n"], ["fasttts"])
    if len(t):
        t["paper base"] = [_paper(ref, "goodput_tok_s", hardware=r.hardware, n=r.n, system="vllm_tts") for r in t.itertuples()]
        t["paper fasttts"] = [_paper(ref, "goodput_tok_s", hardware=r.hardware, n=r.n, system="fasttts") for r in t.itertuples()]
    write_markdown(_blank_nan(t), Path(sweep_dir) / "fig15_gpus.md",
                   "FastTTS Fig. 15: other GPUs (tok/s)" + _title_label(df) + _problems(runs))
    _grid_plot(df, ["hardware"], "n", "goodput",
               lambda k, s, n: _paper(ref, "goodput_tok_s", hardware=k["hardware"], n=n, system=s),
               "Goodput on other GPUs" + _problems(runs), sweep_dir, "fig15_gpus")
    return t
