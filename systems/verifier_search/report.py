"""Sweep reports of the FastTTS family: each ``report_*(sweep_dir, runs, cfg)`` writes a markdown
table, a figure (PNG + PDF) and ``verdicts.csv``, with our numbers beside the paper's
(``results/reference/fasttts.csv``, never used to compute ours).

Labels: every value of ours is labelled by its own record (``harness.report.sim_label``): value and
ratio columns end in " (sim)" or " (measured)", a ratio is taken only between records of one label,
titles say simulated, measured or both (``harness.report.title_label``). Units: titles and axes
name them (goodput in tok/s, latency in s per problem, gains in % over the baseline, ratios in x).

Verdicts (``harness.verdict``, the one rule): each paper number of the figure gets a verdict column
in the table where a row holds it, and one row of ``<sweep_dir>/verdicts.csv`` (``no result`` where
the sweep did not run its point). A paper gain in % (Fig. 16, 18) is judged as the goodput ratio
1 + gain / 100, so that the 15 % rule is relative to a ratio, not to a percentage near 0.

``runs``: one row per job (harness.report.gather_runs): status, system, simulated, summary.*, config.*;
:func:`tidy` is the one place summary values are read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import pandas as pd

from harness import verdict as vd
from harness.report import load_reference, save_figure, sim_label, title_label, write_markdown
from harness.units import parse_size

PAIRS = {
    ("qwen2.5-math-1.5b", "skywork-prm-1.5b"): "1.5B+1.5B",
    ("qwen2.5-math-1.5b", "math-shepherd-7b"): "1.5B+7B",
    ("qwen2.5-math-7b", "skywork-prm-1.5b"): "7B+1.5B",
}
LABELS = (sim_label(True), sim_label(False))  # " (sim)", " (measured)": simulated first
N_AXIS = "n (paths per problem, search budget)"
GOODPUT_AXIS = "precise goodput (tok/s)"


TIDY = [
    "pair",
    "dataset",
    "n",
    "system",
    "R",
    "search",
    "hardware",
    "kv_budget",
    "goodput",
    "latency",
    "gen_latency",
    "ver_latency",
    "simulated",
]


def tidy(runs: pd.DataFrame) -> pd.DataFrame:
    """Successful runs with the columns ``TIDY`` (none: no rows, the same columns)."""
    if runs is None or not len(runs) or not (runs["status"] == "ok").any():
        return pd.DataFrame(columns=TIDY)
    df = runs[runs["status"] == "ok"].copy()
    g = lambda c, d=None: df[c] if c in df else d
    out = pd.DataFrame(
        {
            "pair": [PAIRS.get((m, v), f"{m}+{v}") for m, v in zip(g("config.model.name"), g("config.verifier.name"))],
            "dataset": g("config.workload.name"),
            "n": g("config.workload.n").astype(int),
            "system": df["system"],
            "R": g("config.system.spec_truncation_ratio"),
            "search": g("config.system.search"),
            "hardware": g("config.hardware.name"),
            "kv_budget": g("config.system.kv_budget", "").astype(str) if "config.system.kv_budget" in df else "",
            "goodput": g("summary.precise_goodput_tok_s"),
            "latency": g("summary.latency_s"),
            "gen_latency": g("summary.gen_latency_s"),
            "ver_latency": g("summary.ver_latency_s"),
            "simulated": df["simulated"],
        }
    )
    return out.reset_index(drop=True)


def _blank_nan(t: pd.DataFrame) -> pd.DataFrame:
    """The table for markdown: missing values (no paper number there) as empty cells, not 'nan'."""
    return t.astype(object).where(t.notna(), None)


def _problems(runs: pd.DataFrame) -> str:
    """' (workload.num_problems=K: ...)' when the sweep ran ``workload.num_problems=K``, else ''."""
    col = "config.workload.num_problems"
    if runs is None or col not in runs:
        return ""
    k = pd.to_numeric(runs[col], errors="coerce").dropna().unique()
    if not len(k):
        return ""
    return f" (workload.num_problems={', '.join(str(int(x)) for x in sorted(k))}: first problem(s) only)"


def _title(text: str, df: pd.DataFrame, runs: pd.DataFrame) -> str:
    """``text`` with the source of the runs (every record's, failed ones too: an all-OOM sweep's
    title still says simulated) and the problem subset."""
    every = (
        runs["simulated"]
        if runs is not None and len(runs) and "simulated" in runs
        else df["simulated"]
        if len(df)
        else []
    )
    return title_label(text, every) + _problems(runs)


def _no_baseline(df: pd.DataFrame, keys: List[str]) -> str:
    """Why a report has no gain (and a gain figure none): '' when a vllm_tts run sits beside a
    variant at the same ``keys``, else a sentence naming what to add."""
    base = df[df.system == "vllm_tts"]
    if len(base) and len(df[df.system != "vllm_tts"].merge(base[keys].drop_duplicates(), on=keys)):
        return ""
    return (
        f"No gain: no vllm_tts run at the same {', '.join(keys)} as a FastTTS run in this sweep (gains are "
        f"over vllm_tts; add it to system=). "
    )


def _ref(figure: str) -> pd.DataFrame:
    """The paper's numbers of one figure, with each ``key=value`` of their config as a column."""
    ref = load_reference("fasttts", figure)
    parsed = ref["config"].str.split(";").apply(lambda kv: dict(x.split("=", 1) for x in kv if "=" in x))
    return pd.concat([ref, pd.DataFrame(list(parsed), index=ref.index)], axis=1)


def _paper(ref: pd.DataFrame, metric: str, **keys) -> Optional[float]:
    m = ref["metric"] == metric
    for k, v in keys.items():
        if k not in ref:
            return None
        m &= ref[k].astype(str) == str(v)
    return float(ref[m]["value"].iloc[0]) if m.any() else None


def _labels(t: pd.DataFrame, col: str) -> List[str]:
    """The labels whose ``{col}{label}`` column exists in ``t`` (simulated first)."""
    return [lab for lab in LABELS if f"{col}{lab}" in t]


def _gains(df: pd.DataFrame, keys: List[str], variants: List[str], base: str = "vllm_tts", col: str = "goodput"):
    """One row per ``keys`` group; for each label of its records (simulated / measured): the base
    value ``{base}{label}``, each variant's ``{v}{label}`` and, where that label has a base, the
    ratio ``{v}/base{label}``: never a ratio across labels."""
    rows = []
    for k, grp in df.groupby(keys, dropna=False):
        row = dict(zip(keys, k if isinstance(k, tuple) else (k,)))
        for sim, g in grp.groupby("simulated"):
            lab = sim_label(bool(sim))
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
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=keys)


def _gain_notes(t: pd.DataFrame, v: str) -> str:
    """'Ours (sim): mean gain 1.50x (range 1.20-1.80x) over 4 points; ...' for each label present."""
    out = []
    for lab in _labels(t, f"{v}/base"):
        g = t[f"{v}/base{lab}"].dropna()
        out.append(f"Ours{lab}: mean gain {g.mean():.2f}x (range {g.min():.2f}-{g.max():.2f}x) over {len(g)} points")
    return "; ".join(out)


def _add_gain_pct(t: pd.DataFrame, variants: List[str], paper: Callable) -> None:
    """``{v} gain %{label}`` = 100 (ratio - 1) for each ratio column, and the paper's ``{v} paper %``."""
    for v in variants:
        for lab in _labels(t, f"{v}/base"):
            t[f"{v} gain %{lab}"] = 100 * (t[f"{v}/base{lab}"] - 1)
        if _labels(t, f"{v}/base"):
            t[f"{v} paper %"] = [paper(r, v) for r in t.itertuples()]


# ------------------------------------------------------------------------------------- verdicts
def _judge(ours, paper, pct: bool = False, kind: str = "=", paper_hi=None) -> Optional[str]:
    """``harness.verdict.verdict`` of one number of ours against the paper's (None without a paper
    number); ``pct``: both are gains in %, judged as ratios 1 + gain / 100."""
    if paper is None or (isinstance(paper, float) and np.isnan(paper)):
        return None
    ours = None if ours is None or (isinstance(ours, float) and np.isnan(ours)) else float(ours)
    if pct:
        ours, paper = (None if ours is None else 1 + ours / 100), 1 + paper / 100
    return vd.verdict(ours, float(paper), kind, paper_hi=paper_hi)


def _verdict_cols(t: pd.DataFrame, ours: str, paper: str, name: str, pct: bool = False) -> None:
    """Add ``verdict {name}{label}`` to ``t`` for each label of ``{ours}{label}``: the paper's
    number in column ``paper`` against ours, row by row (empty where the paper has none)."""
    if paper not in t:
        return
    for lab in _labels(t, ours):
        t[f"verdict {name}{lab}"] = [_judge(o, p, pct) for o, p in zip(t[f"{ours}{lab}"], t[paper])]


def _lookup(t: pd.DataFrame, keys: Dict[str, str], col: str) -> Optional[float]:
    """The value of column ``col`` in the row of ``t`` whose key columns equal ``keys`` (as text)."""
    if not len(t) or col not in t:
        return None
    m = np.ones(len(t), bool)
    for k, v in keys.items():
        m &= t[k].astype(str).to_numpy() == str(v)
    vals = t.loc[m, col].dropna()
    return float(vals.iloc[0]) if len(vals) else None


def _sim_flags(t: pd.DataFrame, col: str) -> List[str]:
    """The labels to judge a column of ours under: those present, else the simulated one (no result)."""
    return _labels(t, col) or [LABELS[0]]


def _point_rows(
    ref: pd.DataFrame,
    metric: str,
    t: pd.DataFrame,
    keys: List[str],
    column: Callable,
    what: Callable,
    unit: str,
    source: str,
    pct: bool = False,
    note: str = "",
) -> List[vd.Row]:
    """One verdict row per paper number of ``ref``/``metric`` and label: ours = ``t``'s column
    ``column(ref_row) + label`` in the row with the paper number's ``keys`` (None: no result)."""
    out = []
    for _, r in ref[ref["metric"] == metric].iterrows():
        for lab in _sim_flags(t, column(r)):
            ours = _lookup(t, {k: r[k] for k in keys}, column(r) + lab)
            paper = float(r["value"])
            if pct:
                ours, paper = (None if ours is None else 1 + ours / 100), 1 + paper / 100
            missing = (
                "" if ours is not None else f"ours: no run at {', '.join(f'{k}={r[k]}' for k in keys)} in this sweep; "
            )  # the setting it needs
            out.append(
                vd.Row(
                    "fasttts",
                    str(r["figure"]),
                    what(r),
                    paper,
                    ours=ours,
                    unit=unit,
                    simulated=lab == LABELS[0],
                    source=source,
                    note=missing + note,
                )
            )
    return out


def _extreme_rows(
    ref: pd.DataFrame, stats: Dict[str, str], t: pd.DataFrame, col: str, what: str, unit: str, source: str
) -> List[vd.Row]:
    """Verdict rows for paper numbers that summarise a whole figure (``stats``: metric -> min | max |
    mean): the same statistic over ``t``'s column ``col{label}``."""
    out = []
    for metric, stat in stats.items():
        r = ref[ref["metric"] == metric]
        if not len(r):
            continue
        for lab in _sim_flags(t, col):
            vals = t[f"{col}{lab}"].dropna() if f"{col}{lab}" in t else pd.Series(dtype=float)
            ours = float(getattr(vals, stat)()) if len(vals) else None
            out.append(
                vd.Row(
                    "fasttts",
                    str(r["figure"].iloc[0]),
                    f"{stat} {what} over the sweep",
                    float(r["value"].iloc[0]),
                    ours=ours,
                    unit=unit,
                    simulated=lab == LABELS[0],
                    source=source,
                    note=str(r["note"].iloc[0]),
                )
            )
    return out


def _write_verdicts(sweep_dir: Path, rows: List[vd.Row]) -> str:
    """Write ``verdicts.csv``; returns a note counting the verdicts, for the table."""
    vd.write(sweep_dir, rows)
    counts = pd.Series([r.verdict for r in rows]).value_counts()
    return (
        "Verdicts (harness.verdict: within 15 % of a paper point; written to verdicts.csv): "
        + ", ".join(f"{counts.get(k, 0)} {k}" for k in vd.VERDICTS)
        + f" of {len(rows)} paper numbers."
    )


def _keys_text(r, keys: List[str]) -> str:
    return " ".join(f"{k}={r[k]}" if k == "n" else str(r[k]) for k in keys)


# ------------------------------------------------------------------------------------- figures
def _grid_plot(df, keys, xcol, ycol, ref_fn, title, ylabel, sweep_dir, name, logy=True, xlabel=N_AXIS):
    """One panel per ``keys`` group: ``ycol`` against ``xcol`` per system and label, the paper's
    numbers (``ref_fn(keys, system, x)``) as crosses in the system's colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(df.groupby(keys, dropna=False))
    if not groups:
        return
    cols = min(3, len(groups))
    rws = int(np.ceil(len(groups) / cols))
    fig, axes = plt.subplots(rws, cols, figsize=(4.2 * cols, 3.3 * rws), squeeze=False, layout="constrained")
    any_paper = False
    for ax, (k, grp) in zip(axes.flat, groups):
        k = k if isinstance(k, tuple) else (k,)
        for (sysname, sim), s in grp.groupby(["system", "simulated"]):
            s = s.sort_values(xcol)
            (line,) = ax.plot(s[xcol], s[ycol], marker="o" if sim else "s", label=f"{sysname}{sim_label(bool(sim))}")
            pts = [(x, ref_fn(dict(zip(keys, k)), sysname, x)) for x in sorted(s[xcol].unique())]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                any_paper = True
                ax.scatter(*zip(*pts), marker="x", s=60, color=line.get_color(), label=f"{sysname} (paper)")
        ax.set_title(" ".join(str(x) for x in k), fontsize=9)
        ax.set_xscale("log", base=2)
        xs = sorted(grp[xcol].unique())
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6)
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    fig.suptitle(title + ("; x = paper" if any_paper else ""), fontsize=10)
    save_figure(fig, sweep_dir, name)


# ------------------------------------------------------------------------------------- reports
def report_goodput(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 12: goodput vs n per pair and dataset; headline gain vs the paper's 2.2x (1.2-5.4x)."""
    df = tidy(runs)
    ref, head = _ref("fig12"), _ref("headline")
    keys = ["pair", "dataset", "n"]
    t = _gains(df, keys, ["fasttts"])
    notes = (
        _no_baseline(df, keys) + "; ".join(x for x in (_gain_notes(t, "fasttts"), "paper: 2.2x (1.2-5.4x).") if x)
        if len(t)
        else "no successful runs."
    )
    if len(t):
        for s in ("vllm_tts", "fasttts"):
            t[f"paper {s}"] = [
                _paper(ref, "goodput_tok_s", pair=r.pair, dataset=r.dataset, n=r.n, system=s) for r in t.itertuples()
            ]
            _verdict_cols(t, s, f"paper {s}", s)
        t["paper fasttts/base"] = t["paper fasttts"] / t["paper vllm_tts"]
    src = "fig12_goodput.png"
    rows = _point_rows(
        ref,
        "goodput_tok_s",
        t,
        keys,
        lambda r: r["system"],
        lambda r: f"goodput {r['system']} {_keys_text(r, keys)}",
        "tok/s",
        src,
        note=ref["note"].iloc[0],
    )
    rows += _extreme_rows(
        head,
        {"goodput_gain_mean": "mean", "goodput_gain_min": "min", "goodput_gain_max": "max"},
        t,
        "fasttts/base",
        "goodput gain of fasttts over vllm_tts",
        "x",
        src,
    )
    notes += "\n\n" + _write_verdicts(sweep_dir, rows)
    write_markdown(
        _blank_nan(t),
        Path(sweep_dir) / "fig12_goodput.md",
        _title("FastTTS Fig. 12: precise goodput (tok/s; fasttts/base in x)", df, runs),
        notes,
    )
    _grid_plot(
        df,
        ["pair", "dataset"],
        "n",
        "goodput",
        lambda k, s, n: _paper(ref, "goodput_tok_s", pair=k["pair"], dataset=k["dataset"], n=n, system=s),
        _title("Precise goodput", df, runs),
        GOODPUT_AXIS,
        sweep_dir,
        "fig12_goodput",
    )
    return t


def report_latency(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 13: completion latency (generator + verifier) and its reduction vs the paper's 38-68 %."""
    df = tidy(runs)
    ref, head = _ref("fig13"), _ref("headline")
    keys = ["pair", "dataset", "n"]
    t = _gains(df, keys, ["fasttts"], col="latency")
    t = t.drop(columns=[c for c in t if "/base" in c])  # the reductions below say it in %
    for col, what in (("latency", "completion"), ("gen_latency", "generator"), ("ver_latency", "verifier")):
        g = _gains(df, keys, ["fasttts"], col=col)
        for lab in _labels(g, "fasttts/base"):
            g[f"{what} latency reduction %{lab}"] = 100 * (1 - g[f"fasttts/base{lab}"])
        red = g[keys + [c for c in g if "reduction %" in c]]
        t = t.merge(red, on=keys, how="left") if len(t) else t
    if len(t):
        for s in ("vllm_tts", "fasttts"):
            t[f"paper {s}"] = [
                _paper(ref, "latency_s", pair=r.pair, dataset=r.dataset, n=r.n, system=s) for r in t.itertuples()
            ]
            _verdict_cols(t, s, f"paper {s}", s)
        notes = "; ".join(
            f"Ours{lab}: completion-latency reduction {t[c].min():.0f}..{t[c].max():.0f} % (mean {t[c].mean():.0f} %)"
            for lab in LABELS
            if (c := f"completion latency reduction %{lab}") in t
        )
        notes = _no_baseline(df, keys) + "; ".join(
            x for x in (notes, "paper: 38..68 %; verifier 75..85 %, generator 36..66 %.") if x
        )
    else:
        notes = "no successful runs."
    notes += (
        " Completion latency = a problem's generator + verifier time until its search ends (s per problem; "
        "not the mean path completion time of the goodput)."
    )
    src = "fig13_latency.png"
    rows = _point_rows(
        ref,
        "latency_s",
        t,
        keys,
        lambda r: r["system"],
        lambda r: f"completion latency {r['system']} {_keys_text(r, keys)}",
        "s",
        src,
        note=ref["note"].iloc[0],
    )
    for what, metrics, frame in (
        ("completion", ("latency_reduction_min", "latency_reduction_max"), head),
        ("verifier", ("ver_latency_reduction_min", "ver_latency_reduction_max"), ref),
        ("generator", ("gen_latency_reduction_min", "gen_latency_reduction_max"), ref),
    ):
        rows += _extreme_rows(
            frame,
            dict(zip(metrics, ("min", "max"))),
            t,
            f"{what} latency reduction %",
            f"{what}-latency reduction of fasttts",
            "%",
            src,
        )
    notes += "\n\n" + _write_verdicts(sweep_dir, rows)
    write_markdown(
        _blank_nan(t),
        Path(sweep_dir) / "fig13_latency.md",
        _title("FastTTS Fig. 13: completion latency (s per problem; reductions in %)", df, runs),
        notes,
    )
    _grid_plot(
        df,
        ["pair", "dataset"],
        "n",
        "latency",
        lambda k, s, n: _paper(ref, "latency_s", pair=k["pair"], dataset=k["dataset"], n=n, system=s),
        _title("Completion latency", df, runs),
        "completion latency (s per problem)",
        sweep_dir,
        "fig13_latency",
    )
    return t


def _gain_table(df: pd.DataFrame, keys: List[str], variants: List[str], paper: Callable) -> pd.DataFrame:
    """Goodput of the baseline and each variant (tok/s), each variant's gain % over the baseline
    beside the paper's, and the verdict of each gain (judged as a ratio)."""
    t = _gains(df, keys, variants)
    _add_gain_pct(t, variants, paper)
    for v in variants:
        _verdict_cols(t, f"{v} gain %", f"{v} paper %", f"{v} gain", pct=True)
    return t.drop(columns=[c for c in t if "/base" in c])


GAIN_NOTE = "goodput in tok/s, gains in % over vllm_tts; a gain's verdict compares the goodput ratios 1 + gain/100."


def _gain_rows(
    ref: pd.DataFrame, t: pd.DataFrame, keys: List[str], where: Callable, source: str, note: str = ""
) -> List[vd.Row]:
    """Verdict rows of the paper's gains in % (Fig. 16, 18), each judged as the ratio 1 + gain/100."""
    return _point_rows(
        ref,
        "goodput_gain_pct",
        t,
        keys,
        lambda r: f"{r['system']} gain %",
        lambda r: f"goodput ratio {r['system']}/vllm_tts {where(r)} (paper: gain %)",
        "x",
        source,
        pct=True,
        note=f"paper's gain g % judged as the ratio 1 + g/100; {note}{ref['note'].iloc[0]}",
    )


def report_ablation(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 16: cumulative goodput gain (%) of P, P+M, P+M+S over the baseline."""
    df = tidy(runs)
    ref = _ref("fig16")
    variants = ["fasttts_p", "fasttts_pm", "fasttts"]
    paper = lambda r, v: _paper(ref, "goodput_gain_pct", pair=r.pair, n=r.n, system=v)
    t = _gain_table(df, ["pair", "n"], variants, paper)
    rows = _gain_rows(ref, t, ["pair", "n"], lambda r: f"{r['pair']} n={r['n']}", "fig16_ablation.png")
    notes = (
        _no_baseline(df, ["pair", "n"]) + "P = prefix-aware scheduling, M = memory allocation, S = speculative "
        f"beam extension (cumulative); {GAIN_NOTE}\n\n{_write_verdicts(sweep_dir, rows)}"
    )
    write_markdown(
        _blank_nan(t),
        Path(sweep_dir) / "fig16_ablation.md",
        _title("FastTTS Fig. 16: cumulative goodput gain over the baseline (%)", df, runs),
        notes,
    )
    df2 = df.merge(
        df[df.system == "vllm_tts"][["pair", "n", "simulated", "goodput"]].rename(columns={"goodput": "base"}),
        on=["pair", "n", "simulated"],
    )
    df2["gain_pct"] = 100 * (df2["goodput"] / df2["base"] - 1)
    _grid_plot(
        df2[df2.system != "vllm_tts"],
        ["pair"],
        "n",
        "gain_pct",
        lambda k, s, n: _paper(ref, "goodput_gain_pct", pair=k["pair"], n=n, system=s),
        _title("Cumulative goodput gain over vllm_tts", df, runs),
        "goodput gain over vllm_tts (%)",
        sweep_dir,
        "fig16_ablation",
        logy=False,
    )
    return t


def _r_system(system: str, r) -> str:
    """Fig. 17's series: ``vllm_tts`` or ``fasttts;R=<R>`` (the paper's labels)."""
    if system != "fasttts":
        return system
    r = float(r)
    return f"fasttts;R={r:g}" if r != 0 else "fasttts;R=0.0"


def _paper17(ref: pd.DataFrame, pair: str, dataset: str, n, series: str) -> Optional[float]:
    system, _, r = series.partition(";R=")
    keys = dict(pair=pair, dataset=dataset, n=n, system=system)
    if r:
        keys["R"] = r
    m = ref["metric"] == "goodput_tok_s"
    for k, v in keys.items():
        m &= ref[k].astype(str) == str(v)
    if not r and "R" in ref:
        m &= ref["R"].isna()
    return float(ref[m]["value"].iloc[0]) if m.any() else None


def report_r_sweep(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 17-right: goodput of the baseline and FastTTS at R = 0.0 / 0.85."""
    df = tidy(runs)
    ref = _ref("fig17")
    keys = ["pair", "dataset", "n"]
    # the baseline does not speculate, so R does not change it: one run of it per setting (R=0.85's
    # where the sweep has it), whichever R values the sweep ran
    base = df[df.system != "fasttts"]
    base = base.assign(_r=base.R.astype(float)).sort_values("_r", ascending=False)
    base = base.drop_duplicates(keys + ["system", "simulated"]).drop(columns="_r")
    df = pd.concat([df[df.system == "fasttts"], base]).sort_index()
    df["system"] = [_r_system(s, r) for s, r in zip(df.system, df.R)]
    series = ["vllm_tts", "fasttts;R=0.0", "fasttts;R=0.85"]  # the paper's
    extra = sorted(set(df.system) - set(series))  # other R values run: shown, without a paper number
    t = _gains(df, keys, series[1:] + extra)
    for s in series if len(t) else []:
        t[f"paper {s}"] = [_paper17(ref, r.pair, r.dataset, r.n, s) for r in t.itertuples()]
        _verdict_cols(t, s, f"paper {s}", s)
    ref["series"] = [s if pd.isna(r) else f"{s};R={r}" for s, r in zip(ref["system"], ref["R"])]
    rows = _point_rows(
        ref,
        "goodput_tok_s",
        t,
        keys,
        lambda r: r["series"],
        lambda r: f"goodput {r['series']} {_keys_text(r, keys)}",
        "tok/s",
        "fig17_r_sweep.png",
        note=ref["note"].iloc[0],
    )
    notes = (
        (_no_baseline(df.assign(system=df.system.astype(str).str.split(";").str[0]), keys) if len(df) else "")
        + (
            f"Also run, without a paper number (the paper's Fig. 17 is at R = 0.0 and 0.85): {', '.join(extra)}. "
            if extra
            else ""
        )
        + "R = the share of speculative tokens a duplicate keeps (mean of N(R, 0.1)); goodput in tok/s, ratios "
        "over vllm_tts in x.\n\n" + _write_verdicts(sweep_dir, rows)
    )
    write_markdown(
        _blank_nan(t),
        Path(sweep_dir) / "fig17_r_sweep.md",
        _title("FastTTS Fig. 17-right: goodput vs truncation ratio R (tok/s)", df, runs),
        notes,
    )
    _grid_plot(
        df,
        ["pair", "dataset"],
        "n",
        "goodput",
        lambda k, s, n: _paper17(ref, k["pair"], k["dataset"], n, s),
        _title("Goodput vs truncation ratio R", df, runs),
        GOODPUT_AXIS,
        sweep_dir,
        "fig17_r_sweep",
    )
    return t


MEMORY_N = 128  # the beam count of the paper's Fig. 18-right (conf/experiment/fasttts_memory.yaml)


def report_memory(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 18-right: goodput gain of P and M+P against the KV budget (rows in budget order)."""
    df = tidy(runs)
    ref = _ref("fig18")
    variants = ["fasttts_p", "fasttts_pm"]
    paper = lambda r, v: (
        _paper(ref, "goodput_gain_pct", pair=r.pair, kv_budget=r.kv_budget, system=v) if int(r.n) == MEMORY_N else None
    )
    t = _gain_table(df, ["pair", "kv_budget", "n"], variants, paper)
    if len(t):
        t = t.sort_values(["pair", "kv_budget", "n"], key=lambda c: c.map(_bytes) if c.name == "kv_budget" else c)
        t = t.reset_index(drop=True)
    # the paper's Fig. 18 is at n=128 for its pair: only our row at that setting is judged
    rows = _gain_rows(
        ref.assign(n=MEMORY_N),
        t,
        ["pair", "kv_budget", "n"],
        lambda r: f"kv_budget={r['kv_budget']}",
        "fig18_memory.png",
        f"ours at n={MEMORY_N}; ",
    )
    notes = (
        _no_baseline(df, ["pair", "kv_budget", "n"])
        + "kv_budget: KV cache bytes on the device, shared by generator and verifier (GB = 1e9 bytes); "
        f"{GAIN_NOTE}\n\n{_write_verdicts(sweep_dir, rows)}"
    )
    write_markdown(
        _blank_nan(t),
        Path(sweep_dir) / "fig18_memory.md",
        _title("FastTTS Fig. 18-right: goodput gain over the baseline vs KV budget (%)", df, runs),
        notes,
    )
    _memory_plot(t, ref, _title("Goodput gain vs KV budget", df, runs), sweep_dir)
    return t


def _bytes(size) -> float:
    """A KV budget in bytes for ordering and axes; NaN when unset (the derived default)."""
    try:
        return float(parse_size(size))
    except (TypeError, ValueError):
        return float("nan")


def _memory_plot(t: pd.DataFrame, ref: pd.DataFrame, title: str, sweep_dir: Path) -> None:
    """Fig. 18-right: gain (%) of P and M+P against the KV budget (GB), the paper's as crosses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = t[t["kv_budget"].map(_bytes).notna()] if len(t) else t
    if not any(f"{v} gain %{lab}" in t for v in ("fasttts_p", "fasttts_pm") for lab in LABELS):
        return
    fig, ax = plt.subplots(figsize=(5, 3.4), layout="constrained")
    gb = t["kv_budget"].map(_bytes) / 1e9
    for v in ("fasttts_p", "fasttts_pm"):
        for lab in _labels(t, f"{v} gain %"):
            (line,) = ax.plot(gb, t[f"{v} gain %{lab}"], marker="o", label=f"{v}{lab}")
            ax.scatter(gb, t[f"{v} paper %"], marker="x", s=60, color=line.get_color(), label=f"{v} (paper)")
    ax.set_xscale("log")
    ax.set_xticks(sorted(gb.unique()), [f"{x:g}" for x in sorted(gb.unique())])
    ax.minorticks_off()
    ax.set_xlabel("KV budget (GB, both engines)")
    ax.set_ylabel("goodput gain over vllm_tts (%)")
    ax.legend(fontsize=7)
    fig.suptitle(title + "; x = paper", fontsize=10)
    save_figure(fig, sweep_dir, "fig18_memory")


def report_methods(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 11: goodput gain per search algorithm (paper: 1.2-3.9x across them)."""
    df = tidy(runs)
    ref = _ref("fig11")
    t = _gains(df, ["search", "n"], ["fasttts"])
    lo, hi = _paper(ref, "goodput_gain_min"), _paper(ref, "goodput_gain_max")
    for lab in _labels(t, "fasttts/base"):
        t[f"verdict vs paper {lo:g}-{hi:g}x{lab}"] = [
            _judge(x, lo, kind="range", paper_hi=hi) for x in t[f"fasttts/base{lab}"]
        ]
    rows = _extreme_rows(
        ref,
        {"goodput_gain_min": "min", "goodput_gain_max": "max"},
        t,
        "fasttts/base",
        "goodput gain of fasttts over vllm_tts across search methods",
        "x",
        "fig11_methods.png",
    )
    notes = (
        _no_baseline(df, ["search", "n"])
        + ((_gain_notes(t, "fasttts") + "; ") if _gain_notes(t, "fasttts") else "")
        + f"paper {lo:g}-{hi:g}x; goodput in tok/s, "
        f"fasttts/base in x. Two different questions: a row's verdict asks whether its gain lies inside the paper's "
        f"range; verdicts.csv asks whether our smallest and largest gain over the sweep are the paper's ends, which "
        f"only the full sweep (every method and n) can answer.\n\n{_write_verdicts(sweep_dir, rows)}"
    )
    write_markdown(
        _blank_nan(t),
        Path(sweep_dir) / "fig11_methods.md",
        _title("FastTTS Fig. 11: goodput per search method (tok/s; fasttts/base in x)", df, runs),
        notes,
    )
    _grid_plot(
        df,
        ["search"],
        "n",
        "goodput",
        lambda k, s, n: None,
        _title("Goodput per search algorithm", df, runs),
        GOODPUT_AXIS,
        sweep_dir,
        "fig11_methods",
    )
    return t


def report_gpus(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Fig. 15: goodput on the RTX 3070 Ti (offload) and RTX 4070 Ti (paper gain 1.4-1.6x)."""
    df = tidy(runs)
    ref = _ref("fig15")
    keys = ["hardware", "n"]
    t = _gains(df, keys, ["fasttts"])
    for s in ("vllm_tts", "fasttts") if len(t) else ():
        t[f"paper {s}"] = [_paper(ref, "goodput_tok_s", hardware=r.hardware, n=r.n, system=s) for r in t.itertuples()]
        _verdict_cols(t, s, f"paper {s}", s)
    src = "fig15_gpus.png"
    rows = _point_rows(
        ref,
        "goodput_tok_s",
        t,
        keys,
        lambda r: r["system"],
        lambda r: f"goodput {r['system']} {_keys_text(r, keys)}",
        "tok/s",
        src,
        note=ref["note"].iloc[0],
    )
    rows += _extreme_rows(
        ref,
        {"goodput_gain_min": "min", "goodput_gain_max": "max"},
        t,
        "fasttts/base",
        "goodput gain of fasttts over vllm_tts on the two GPUs",
        "x",
        src,
    )
    notes = (
        _no_baseline(df, keys)
        + ((_gain_notes(t, "fasttts") + "; ") if _gain_notes(t, "fasttts") else "")
        + "paper 1.4-1.6x; goodput in tok/s, "
        f"fasttts/base in x.\n\n{_write_verdicts(sweep_dir, rows)}"
    )
    write_markdown(
        _blank_nan(t),
        Path(sweep_dir) / "fig15_gpus.md",
        _title("FastTTS Fig. 15: goodput on other GPUs (tok/s; fasttts/base in x)", df, runs),
        notes,
    )
    _grid_plot(
        df,
        ["hardware"],
        "n",
        "goodput",
        lambda k, s, n: _paper(ref, "goodput_tok_s", hardware=k["hardware"], n=n, system=s),
        _title("Goodput on other GPUs", df, runs),
        GOODPUT_AXIS,
        sweep_dir,
        "fig15_gpus",
    )
    return t
