"""Figures and tables of the LBS paper's evaluation, drawn from a sweep's records.

Each function has the signature ``report(sweep_dir, runs, cfg)`` (see harness/report.py) and is
named by an experiment file (``conf/experiment/lbs_*.yaml``). Paper values come from
``results/reference/lbs.csv`` (:mod:`systems.kv_offload.paper`) and are drawn beside ours (red, dashed
or hatched, labelled "paper"). Every report writes ``verdicts.csv`` (one row per paper number of
its figure and source of ours, harness/verdict.py's rule) and shows the same verdicts in its
markdown table. Shares are shown in %, times in s, volumes in GiB; one unit per column, named in
its header.

Every value of ours is labelled by its own record (``harness.report`` labels; tables also carry a
``source`` column per row); ratios (speedup, normalised volume, I/O time) are taken between records
of the same source only, so a sweep that mixes the simulated and the real backend shows both side
by side, never one divided by the other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness import verdict as V
from harness.report import label_values, read_table, save_figure, sim_label, source_of, title_label, write_markdown
from systems.kv_offload.paper import find, paper_numbers, verdict_rows, verdict_table

GiB = 2**30
SYSTEM_ORDER = ["in_gpu", "layerwise", "hf_offload", "lbs_intertoken", "lbs_interbeam", "lbs_prefetch", "lbs"]
SYSTEM_NAME = {
    "in_gpu": "in-GPU",
    "layerwise": "layer-wise",
    "hf_offload": "HF offloaded cache",
    "lbs_intertoken": "LBS inter-token",
    "lbs_interbeam": "LBS +inter-beam",
    "lbs_prefetch": "LBS +prefetch",
    "lbs": "LBS (full)",
}
# one marker per system, so that lines drawn on top of each other stay visible (in-GPU hollow, large)
MARKER = {
    "in_gpu": dict(marker="s", ms=10, mfc="none", zorder=3),
    "layerwise": dict(marker="o"),
    "hf_offload": dict(marker="P"),
    "lbs_intertoken": dict(marker="^"),
    "lbs_interbeam": dict(marker="v", ms=8),
    "lbs_prefetch": dict(marker="<"),
    "lbs": dict(marker="D", ms=4),
}
TIMES = ("e2e_s", "compute_s", "io_stall_s", "other_s")


def tidy(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per job with short column names; float residue of a subtraction (a time below 1 ns,
    a share below 1e-9) is 0."""
    df = pd.DataFrame(
        {
            "system": runs["system"],
            "model": runs["model"],
            "hardware": runs["hardware"],
            "status": runs["status"],
            "simulated": runs["simulated"].astype(bool),
            "beams": runs["config.workload.beams"].astype(int),
            "step": runs["config.workload.step"].astype(int),
            "seq": (runs["config.workload.prompt_len"].astype(int) + runs["config.workload.gen_len"].astype(int)),
        }
    )
    for k in TIMES + (
        "io_share",
        "h2d_bytes",
        "d2h_bytes",
        "eq3_layerwise_bytes",
        "eq5_lbs_bytes",
        "full_kv_bytes",
        "groups_per_step",
        "peak_device_kv_bytes",
        "kv_budget_bytes",
    ):
        col = f"summary.{k}"
        df[k] = pd.to_numeric(runs[col], errors="coerce") if col in runs else np.nan
    for k, eps in [(t, 1e-9) for t in TIMES] + [("io_share", 1e-9)]:
        df[k] = df[k].mask(df[k].abs() < eps, 0.0)
    df["source"] = [source_of(bool(x)) for x in df["simulated"]]
    # an in_gpu oom decided from the KV budget before any step ran (systems.kv_offload.runner)
    df["oom_predicted"] = runs["summary.oom_predicted"].eq(True) if "summary.oom_predicted" in runs else False
    df["weight_bytes"] = _weight_bytes(runs)  # each run's own model
    return df.sort_values(["model", "step", "beams"]).reset_index(drop=True)


def no_layerwise_note(df: pd.DataFrame, what: str = "every ratio") -> str:
    """'' when the runs hold a layer-wise job, else a note (for a report's markdown) that ``what``
    needs the layer-wise baseline of the same model, beams and step, and how to add it."""
    if (df.system == "layerwise").any():
        return ""
    return (
        f"No layer-wise run in this sweep, so no value for {what}: it takes the layer-wise run of the same "
        f"model, beams and step (add `layerwise` to `system=`).\n\n"
    )


def _name(system: str) -> str:
    return SYSTEM_NAME.get(system, system)


def _setting(df: pd.DataFrame) -> str:
    """Model(s) and hardware profile(s) of the runs behind a figure, for its title."""
    return f"{', '.join(sorted(df.model.dropna().unique()))} on {', '.join(sorted(df.hardware.dropna().unique()))}"


def _beam_axis(ax, beams) -> None:
    """Log-2 beams axis with the beam counts themselves as ticks (not 2^k)."""
    ticks = sorted({int(b) for b in beams})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.minorticks_off()
    ax.set_xlabel("beams")


def plain_log(ax, axis: str = "y", minor: bool = False) -> None:
    """A log scale on ``axis`` ('x', 'y' or 'xy') with plain tick labels (0.5, 10, 1,000; not 10^k);
    ``minor``: also label the minor ticks at 2x and 5x a power of ten (for a range of a decade or two)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:,g}")
    two_five = FuncFormatter(
        lambda v, _: f"{v:,g}" if v > 0 and round(v / 10 ** np.floor(np.log10(v)), 6) in (2, 5) else ""
    )
    for a in axis:
        getattr(ax, f"set_{a}scale")("log")
        getattr(ax, f"{a}axis").set_major_formatter(plain)
        getattr(ax, f"{a}axis").set_minor_formatter(two_five if minor else NullFormatter())


def _pct(x):
    return 100 * x


def _verdicts(sweep_dir: Path, figure: str, df: pd.DataFrame, ours, source_file: str) -> str:
    """Write ``verdicts.csv`` for ``figure`` and return its markdown table (for the report's notes)."""
    rows = verdict_rows(figure, df, ours, source_file)
    V.write(sweep_dir, rows)
    return verdict_table(rows)


def _span(d: pd.DataFrame, col: str, what: str):
    """(min, max, what) of a column of ours, or None when it has no value."""
    v = d[col].dropna()
    return (float(v.min()), float(v.max()), what) if len(v) else None


# --- Fig.9 and the RTX 3080 Ti: end-to-end speedup ---------------------------------------------------


def _speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Speedup of every system over layer-wise at the same (hardware, model, beams, step)."""
    keys = ["hardware", "model", "beams", "step", "source"]  # never a measured / simulated ratio
    base = df[df.system == "layerwise"].set_index(keys)["e2e_s"]
    out = df.copy()
    out["layerwise_s"] = [base.get(tuple(r[k] for k in keys), np.nan) for _, r in out.iterrows()]
    out["speedup"] = np.where(out.status == "ok", out["layerwise_s"] / out["e2e_s"], np.nan)
    offl = df[df.system == "layerwise"].set_index(keys)["h2d_bytes"].gt(0)
    out["offloads"] = [bool(offl.get(tuple(r[k] for k in keys), False)) for _, r in out.iterrows()]
    return out


def _fmt_speed(r) -> str:
    if r.status == "oom":  # a real engine's record that never ran says so; a simulated one is all predicted
        return "OOM (predicted)" if r.oom_predicted and not r.simulated else "OOM"
    if r.status != "ok":
        return r.status
    return "n/a" if pd.isna(r.speedup) else f"{r.speedup:.2f}x"


def _draw_paper_speedups(ax, nums, model: str, beams) -> None:
    """The paper's speedups for ``model``: its range as a band over the offloading beam counts, its
    largest speedup as a line (each with its value written in the panel), 'about 1x' at the beam
    counts where nothing offloads."""
    rng = find(nums, "speedup", model=model)
    if rng is not None and rng.kind == "range":
        xs = [b for b in sorted(beams) if b >= 16] or sorted(beams)
        ax.fill_between(
            [xs[0], xs[-1]],
            rng.value,
            rng.value_hi,
            color="tab:red",
            alpha=0.12,
            label="paper: LBS range (offloading beams, all steps)",
        )
        ax.annotate(
            f"paper {rng.value:g}-{rng.value_hi:g}x",
            (xs[-1], rng.value),
            xytext=(-2, 2),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color="tab:red",
        )
    top = find(nums, "speedup_max", model=model)
    if top is not None:
        ax.axhline(top.value, color="tab:red", ls="--", lw=1, label="paper: LBS's largest speedup")
        ax.annotate(
            f"paper: up to {top.value:g}x",
            (0.02, top.value),
            xycoords=("axes fraction", "data"),
            xytext=(0, 2),
            textcoords="offset points",
            fontsize=7,
            color="tab:red",
        )
    equal = [n for n in nums if n.metric == "speedup" and "beams" in n.cfg and int(n.cfg["beams"]) in set(beams)]
    if equal:
        xs = sorted(int(n.cfg["beams"]) for n in equal)
        ax.plot(
            xs,
            [n.value for n in equal],
            color="tab:red",
            lw=7,
            alpha=0.25,
            solid_capstyle="round",
            label=f"paper: all about {equal[0].value:g}x at {'-'.join(map(str, xs))} beams",
        )


def _note_oom(ax, d: pd.DataFrame, k: int, color, label: str) -> None:
    """OOM has no speedup: written in the panel (in the line's colour), never drawn as a point."""
    oom = sorted(int(b) for b in d[d.status == "oom"].beams)
    if oom:
        ax.annotate(
            f"{label}: OOM at {', '.join(map(str, oom))} beams",
            (0.02, 0.96 - 0.07 * k),
            xycoords="axes fraction",
            va="top",
            fontsize=7,
            color=color,
        )


def _speedup_report(
    sweep_dir: Path,
    runs: pd.DataFrame,
    figure: str,
    title: str,
    min_beams: int = 0,
    range_rule: str = "over the configurations where layer-wise offloads",
) -> pd.DataFrame:
    """Speedup figure, table and verdicts; ours for the paper's LBS range is taken over runs where
    layer-wise offloads and beams >= ``min_beams`` (``range_rule`` says which, and why). Returns the
    speedup table (one row per job)."""
    import matplotlib.pyplot as plt

    df = _speedups(tidy(runs))
    nums = paper_numbers(figure)
    models, steps = sorted(df.model.unique()), sorted(df.step.unique())
    systems = [s for s in SYSTEM_ORDER if s in set(df.system)]
    fig, axes = plt.subplots(
        len(models),
        len(steps),
        figsize=(3.6 * len(steps) + 2.6, 3.0 * len(models)),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for i, m in enumerate(models):
        for j, st in enumerate(steps):
            ax = axes[i][j]
            sub = df[(df.model == m) & (df.step == st)]
            k = 0
            for s, src in ((s, src) for s in systems for src in ("simulated", "measured")):
                d = sub[(sub.system == s) & (sub.source == src)].sort_values("beams")
                if d.empty:
                    continue
                label = f"{_name(s)}{sim_label(d.simulated)}"
                (line,) = ax.plot(
                    d.beams, d.speedup, ls="-" if src == "simulated" else "--", label=label, **MARKER.get(s, {})
                )
                if (d.status == "oom").any():
                    _note_oom(ax, d, k, line.get_color(), label)
                    k += 1
            _draw_paper_speedups(ax, nums, m, df.beams.unique())
            ax.set_ylim(bottom=0)
            _beam_axis(ax, df.beams)
            ax.set_title(f"{m}, step {st}", fontsize=9)
            if j == 0:
                ax.set_ylabel("speedup over layer-wise (x)")
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), loc="outside right center", fontsize=7)
    title = f"{title} - {', '.join(sorted(df.hardware.dropna().unique()))}"  # the profiles the runs used
    fig.suptitle(title_label(title, df.simulated))
    save_figure(fig, sweep_dir, figure)

    def ours(n, d):
        if n.metric == "speedup" and n.kind == "range" or n.metric == "speedup_max":
            d = d[
                (d.system == "lbs")
                & (d.model == n.cfg.get("model"))
                & (d.status == "ok")
                & d.offloads
                & (d.beams >= min_beams)
            ]
            if n.metric == "speedup_max":
                return (d.speedup.max(), None, f"the largest LBS speedup {range_rule}") if len(d) else None
            return _span(d, "speedup", f"LBS, min-max {range_rule}")
        if n.metric == "speedup":  # all methods about equal at these beams
            b = int(n.cfg["beams"])
            at = d[d.beams == b]
            return _span(
                at[(at.system != "layerwise") & (at.status == "ok")],
                "speedup",
                f"every system that fits, all models and steps, over layer-wise; {_offload_text(at, b)}",
            )
        return None

    table = _verdicts(sweep_dir, figure, df, ours, f"{figure}.png")
    tab = df.assign(speedup_txt=label_values([_fmt_speed(r) for _, r in df.iterrows()], df.simulated))
    wide = tab.pivot_table(
        index=["model", "step", "beams", "source"], columns="system", values="speedup_txt", aggfunc="first"
    ).reset_index()
    wide = wide[["model", "step", "beams", "source"] + [s for s in systems if s in wide.columns]]
    write_markdown(
        wide,
        sweep_dir / f"{figure}.md",
        title=title_label(f"{title}, speedup over layer-wise of the same source", df.simulated),
        notes=no_layerwise_note(df, "every speedup") + table,
    )
    return df


def _offload_text(at: pd.DataFrame, b: int) -> str:
    """What the runs ``at`` (``b`` beams, every model x step) say about offloading there: in how many
    configurations layer-wise offloads (moves bytes host->device) and in-GPU is OOM."""
    lw, ig = at[at.system == "layerwise"], at[at.system == "in_gpu"]
    text = f"at {b} beams layer-wise offloads in {int(lw.offloads.sum())} of {len(lw)} model x step configurations"
    return text + (f", in-GPU is OOM in {int((ig.status == 'oom').sum())} of {len(ig)}" if len(ig) else "")


def fig9(sweep_dir, runs, cfg):
    """Fig.9: end-to-end speedup over layer-wise per model x beams x step (ablations, in-GPU OOM)."""
    _speedup_report(
        Path(sweep_dir),
        runs,
        "fig9",
        "LBS Fig.9",
        min_beams=16,
        range_rule="over beams >= 16 x steps where layer-wise offloads (the paper's offloading regime)",
    )


def rtx3080ti(sweep_dir, runs, cfg):
    """RTX 3080 Ti speedups (OPT-2.7B, Qwen-4B)."""
    _speedup_report(Path(sweep_dir), runs, "3080ti", "LBS RTX 3080 Ti speedups")


# --- Fig.4 and Fig.5: where the time goes under layer-wise offloading ---------------------------------


def fig4(sweep_dir, runs, cfg):
    """Fig.4: KV share of memory (KV / (KV + weights) at the full sequence) and layer-wise runtime breakdown."""
    import matplotlib.pyplot as plt

    sweep_dir = Path(sweep_dir)
    df = tidy(runs)
    nums = paper_numbers("fig4")
    df["kv_share"] = df.full_kv_bytes / (df.full_kv_bytes + df.weight_bytes)
    lw = df[df.system == "layerwise"].sort_values(["model", "source", "beams"]).reset_index(drop=True)
    kv_num = [
        find(nums, "kv_share_of_memory", beams=r.beams, model=r.model, hardware=r.hardware) for r in lw.itertuples()
    ]
    io_num = [
        find(nums, "io_share", beams=r.beams, system="layerwise", model=r.model, hardware=r.hardware)
        for r in lw.itertuples()
    ]
    mixed = lw.source.nunique() > 1
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    a.plot(lw.beams, 100 * lw.kv_share, "o-", label="ours (analytic, from the model's shapes)")
    pk = [(bm, 100 * n.value) for bm, n in zip(lw.beams, kv_num) if n is not None]
    if pk:
        a.plot(*zip(*pk), "rv--", label="paper (lower bound: > this)")
    _beam_axis(a, lw.beams)
    a.set_ylabel("KV share of memory (%)\nKV / (KV + weights)")
    a.legend(fontsize=8)
    x = np.arange(len(lw))
    sim = sim_label(lw.simulated)
    b.bar(x, lw.compute_s, label=f"compute{sim}")
    b.bar(x, lw.io_stall_s, bottom=lw.compute_s, label=f"I/O stall{sim}")
    b.bar(x, lw.other_s, bottom=lw.compute_s + lw.io_stall_s, label=f"prune+expand{sim}")
    for xi, r, n in zip(x, lw.itertuples(), io_num):
        txt = f"{100 * r.io_share:.0f} % I/O" + (f"\n(paper {100 * n.value:.0f} %)" if n is not None else "")
        b.annotate(txt, (xi, r.e2e_s), ha="center", va="bottom", fontsize=7, color="k")
    b.set_xticks(x, [f"{bm}\n{src}" if mixed else str(bm) for bm, src in zip(lw.beams, lw.source)])
    b.set_xlabel("beams")
    b.set_ylabel("layer-wise end-to-end (s)")
    b.margins(y=0.15)
    b.legend(fontsize=7, loc="upper left")
    seq = ", ".join(str(s) for s in sorted(lw.seq.unique()))
    fig.suptitle(title_label(f"LBS Fig.4 - {_setting(lw)}, seq {seq}, layer-wise", lw.simulated))
    save_figure(fig, sweep_dir, "fig4")

    def ours(n, d):
        r = d[(d.system == "layerwise") & (d.beams == int(n.cfg["beams"]))]
        col = {"kv_share_of_memory": "kv_share", "io_share": "io_share"}[n.metric]
        what = "KV / (KV + weights) at the full sequence" if col == "kv_share" else "layer-wise I/O stall / end-to-end"
        return _span(r, col, what)

    table = _verdicts(sweep_dir, "fig4", lw, ours, "fig4.png")
    out = pd.DataFrame(
        {
            "model": lw.model,
            "beams": lw.beams,
            "KV share (%)": _pct(lw.kv_share),
            "paper KV share (%)": [n.text() if n else "" for n in kv_num],
            "KV share verdict": [n.judge(v) if n else "" for n, v in zip(kv_num, lw.kv_share)],
            "end-to-end (s)": lw.e2e_s,
            "compute (s)": lw.compute_s,
            "I/O stall (s)": lw.io_stall_s,
            "prune+expand (s)": lw.other_s,
            "I/O share (%)": _pct(lw.io_share),
            "paper I/O share (%)": [n.text() if n else "" for n in io_num],
            "I/O share verdict": [n.judge(v) if n else "" for n, v in zip(io_num, lw.io_share)],
            "source": lw.source,
        }
    )
    write_markdown(
        out,
        sweep_dir / "fig4.md",
        title=title_label("LBS Fig.4 (layer-wise runtime breakdown; KV share = KV / (KV + weights))", lw.simulated),
        notes=no_layerwise_note(df, "Fig.4 (the layer-wise runtime breakdown)") + table,
    )


def _weight_bytes(runs: pd.DataFrame) -> pd.Series:
    """Bytes of each run's own model weights (harness.model_facts, from its record's ``config.model``),
    so that a sweep over models divides each KV by its own model's weights."""
    from harness.model_facts import weight_bytes

    cols = [c for c in runs.columns if c.startswith("config.model.")]
    return pd.Series(
        [
            weight_bytes({c[len("config.model.") :]: r[c] for c in cols if not _missing(r[c])})
            for _, r in runs.iterrows()
        ],
        index=runs.index,
        dtype=float,
    )


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def _growth_before_offload(st: pd.DataFrame) -> float:
    """Latency per token of the last step before the first offloading step over the first step's
    (the whole run when nothing offloads): 1.0 = flat."""
    per_tok = (st.latency_s / st.tokens).to_numpy()
    off = np.flatnonzero(st.h2d_bytes.to_numpy() > 0)
    last = (off[0] - 1) if len(off) else len(per_tok) - 1
    return float(per_tok[max(last, 0)] / per_tok[0])


def fig5(sweep_dir, runs, cfg):
    """Fig.5: per-token decode latency vs sequence position (flat, then rising once KV overflows)."""
    import matplotlib.pyplot as plt

    sweep_dir = Path(sweep_dir)
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    rows = []
    ok = runs[runs.status == "ok"]
    for _, r in ok.iterrows():
        st = read_table(r, "steps")
        per_tok = st.latency_s / st.tokens
        pos = st.start_tokens + st.tokens / 2
        (line,) = ax.plot(
            pos,
            per_tok * 1e3,
            label=f"{_name(r.system)}, {int(r['config.workload.beams'])} beams{sim_label(r.simulated)}",
        )
        knee = int(st.start_tokens[st.h2d_bytes > 0].min()) if (st.h2d_bytes > 0).any() else None
        if knee is not None:
            ax.axvline(knee, color=line.get_color(), ls=":", lw=1)
        rows.append(
            {
                "system": r.system,
                "hardware": r.hardware,
                "beams": int(r["config.workload.beams"]),
                "first offload at (token)": knee,
                "ms per token, first step": 1e3 * per_tok.iloc[0],
                "growth before the first offload (x)": _growth_before_offload(st),
                "ms per token, last step": 1e3 * per_tok.iloc[-1],
                "source": source_of(bool(r.simulated)),
            }
        )
    ax.set_xlabel("sequence position (tokens)")
    ax.set_ylabel("ms per token (one decode\niteration of all beams)")
    plain_log(ax)
    ax.legend(fontsize=7, title="dotted: first offload", title_fontsize=7)
    ax.set_title(
        title_label("LBS Fig.5 - latency vs position (paper: flat, then a sharp rise)", ok.simulated), fontsize=9
    )
    save_figure(fig, sweep_dir, "fig5")
    t = pd.DataFrame(
        rows,
        columns=[
            "system",
            "hardware",
            "beams",
            "first offload at (token)",
            "ms per token, first step",
            "growth before the first offload (x)",
            "ms per token, last step",
            "source",
        ],
    )
    num = find(paper_numbers("fig5"), "latency_growth_before_offload")
    if num is not None:  # the paper's claim is about one system (layer-wise): only its rows are judged
        claim = t.system == num.cfg.get("system", t.system)
        t["paper growth (x)"] = np.where(claim, num.text(), "")
        t["verdict"] = [num.judge(v) if c else "" for v, c in zip(t["growth before the first offload (x)"], claim)]
    table = _verdicts(
        sweep_dir,
        "fig5",
        t,
        lambda n, d: _span(
            d[d.system == n.cfg["system"]] if "system" in n.cfg else d,
            "growth before the first offload (x)",
            "per-token latency of the last step before the first offload / the first step's, min-max over beams",
        ),
        "fig5.png",
    )
    write_markdown(
        t,
        sweep_dir / "fig5.md",
        title=title_label("LBS Fig.5", ok.simulated),
        notes=no_layerwise_note(ok, "the paper's claim (layer-wise latency flat before the first offload)") + table,
    )


# --- Fig.7 and Fig.10: transfer volume ----------------------------------------------------------------


def fig7(sweep_dir, runs, cfg):
    """Fig.7: transfer volume, analytic (Eq.1-5) vs what the scheduler moved, vs the paper."""
    import matplotlib.pyplot as plt

    sweep_dir = Path(sweep_dir)
    df = tidy(runs)
    nums = paper_numbers("fig7")
    df["eq_gib"] = np.where(df.system == "layerwise", df.eq3_layerwise_bytes, df.eq5_lbs_bytes) / GiB
    df["moved_gib"] = df.h2d_bytes / GiB
    df = df.drop_duplicates(["model", "beams", "system", "step", "source"]).reset_index(drop=True)
    pn = [
        find(
            nums,
            "h2d_gib",
            system=r.system,
            step=r.step,
            beams=r.beams,
            model=r.model,
            kv_budget=r.kv_budget_bytes,
            hardware=r.hardware,
        )
        for r in df.itertuples()
    ]
    mixed = df.source.nunique() > 1
    several = df.model.nunique() > 1 or df.beams.nunique() > 1  # each bar then says which run it is
    fig, ax = plt.subplots(figsize=(max(7.0, 0.6 * len(df) + 3), 3.8), layout="constrained")
    lab = [
        f"{_name(s)}\nstep {st}" + (f"\n{m}, {b} beams" if several else "") + (f"\n{src}" if mixed else "")
        for s, st, m, b, src in zip(df.system, df.step, df.model, df.beams, df.source)
    ]
    x = np.arange(len(df))
    ax.bar(x - 0.27, df.eq_gib, 0.27, label="Eq.1-3 / Eq.4-5 evaluated")
    ax.bar(x, df.moved_gib, 0.27, label="moved by the scheduler" + sim_label(df.simulated))
    ax.bar(
        x + 0.27,
        [n.value if n else np.nan for n in pn],
        0.27,
        label="paper Fig.7",
        hatch="//",
        alpha=0.6,
        color="tab:red",
    )
    plain_log(ax)
    ax.set_xticks(x, lab, fontsize=7)
    ax.set_ylabel("host->device (GiB)")
    fig.legend(fontsize=7, loc="outside right upper")
    budget = ", ".join(f"{b / GiB:g} GiB" for b in sorted(df.kv_budget_bytes.dropna().unique()))
    ax.set_title(
        title_label(
            f"LBS Fig.7 - {_setting(df)}, {', '.join(map(str, sorted(df.beams.unique())))} beams, {budget} KV budget",
            df.simulated,
        ),
        fontsize=9,
    )
    save_figure(fig, sweep_dir, "fig7")

    def ours(n, d):
        d = d[(d.system == n.cfg["system"]) & ((d.step == int(n.cfg["step"])) if "step" in n.cfg else True)]
        return _span(d, "moved_gib", "bytes the scheduler moved" + ("" if "step" in n.cfg else ", min-max over steps"))

    table = _verdicts(sweep_dir, "fig7", df, ours, "fig7.png")
    out = pd.DataFrame(
        {
            "model": df.model,
            "beams": df.beams,
            "system": df.system,
            "step": df.step,
            "Eq. (GiB)": df.eq_gib,
            "moved (GiB)": df.moved_gib,
            "paper (GiB)": [n.value if n else np.nan for n in pn],
            "verdict (moved vs paper)": [n.judge(v) if n else "" for n, v in zip(pn, df.moved_gib)],
            "source": df.source,
        }
    )
    write_markdown(
        out,
        sweep_dir / "fig7.md",
        floatfmt=",.1f",
        title=title_label("LBS Fig.7 transfer volume, host->device", df.simulated),
        notes="Eq.: layer-wise Eq.1-3, LBS Eq.4-5 (inter-token only). Layer-wise moves Eq.3's bytes minus "
        "the step's own tokens, which stay on the device (docs/kv_offload.md, 'How layer-wise executes').\n\n"
        + no_layerwise_note(df, "the paper's layer-wise volume")
        + table,
    )


def fig10(sweep_dir, runs, cfg):
    """Fig.10: transfer volume normalised to layer-wise; (a) step lengths, (b) with/without prefix reuse."""
    import matplotlib.pyplot as plt

    sweep_dir = Path(sweep_dir)
    df = tidy(runs)
    nums = paper_numbers("fig10")
    base = df[df.system == "layerwise"].groupby(["model", "beams", "step", "source"])["h2d_bytes"].first()
    df = df[df.system != "layerwise"].copy()
    df["normalised_volume"] = [
        r.h2d_bytes / base.get((r.model, r.beams, r.step, r.source), np.nan) for r in df.itertuples()
    ]
    fig, ax = plt.subplots(figsize=(6.5, 3.6), layout="constrained")
    for s in [x for x in SYSTEM_ORDER if x in set(df.system)]:
        for src, d in df[df.system == s].groupby("source"):
            d = d.sort_values("step")
            ax.plot(
                d.step,
                100 * d.normalised_volume,
                ls="-" if src == "simulated" else "--",
                label=f"{_name(s)}{sim_label(d.simulated)}",
                **MARKER.get(s, {}),
            )
    pr = [n for n in nums if n.metric == "normalised_volume"]
    if pr:
        ax.plot(
            [int(n.cfg["step"]) for n in pr], [100 * n.value for n in pr], "rx--", label="paper Fig.10a (inter-token)"
        )
    tot = find(nums, "total_reduction", system="lbs")
    if tot is not None:
        ax.axhline(
            100 * (1 - tot.value),
            color="tab:red",
            ls=":",
            lw=1,
            label=f"paper: full LBS below {100 * (1 - tot.value):g} % (reduction > {100 * tot.value:g} %)",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(df.step.unique()), [str(s) for s in sorted(df.step.unique())])
    ax.minorticks_off()
    ax.set_xlabel("step (tokens)")
    ax.set_ylabel("% of layer-wise volume")
    ax.legend(fontsize=7, loc="center right")
    ax.set_ylim(bottom=0)
    fig.suptitle(title_label(f"LBS Fig.10 - normalised transfer volume, {_setting(df)}", df.simulated), fontsize=10)
    save_figure(fig, sweep_dir, "fig10")
    piv = df.pivot_table(
        index=["model", "hardware", "beams", "step", "source"], columns="system", values="normalised_volume"
    ).reset_index()
    if {"lbs_intertoken", "lbs_interbeam"} <= set(piv.columns):
        piv["prefix_reuse"] = piv.lbs_intertoken / piv.lbs_interbeam
    if "lbs" in piv:
        piv["total_reduction"] = 1 - piv.lbs

    def ours(n, d):
        if n.metric == "normalised_volume":
            d = d[(d.step == int(n.cfg["step"])) & (d.model == n.cfg["model"]) & (d.beams == int(n.cfg["beams"]))]
            if "lbs_intertoken" not in d:
                return None
            return _span(d, "lbs_intertoken", "LBS inter-token bytes / layer-wise bytes")
        col = {"prefix_reuse_reduction": "prefix_reuse", "total_reduction": "total_reduction"}[n.metric]
        what = {"prefix_reuse": "inter-token / +inter-beam volume", "total_reduction": "1 - LBS / layer-wise volume"}
        return _span(d, col, what[col] + ", min-max over the sweep") if col in d else None

    table = _verdicts(sweep_dir, "fig10", piv, ours, "fig10.png")
    out = piv[["model", "beams", "step"]].copy()
    for col, metric, shown, scale in (
        ("lbs_intertoken", "normalised_volume", "LBS inter-token (% of layer-wise)", 100),
        ("lbs_interbeam", None, "LBS +inter-beam (%)", 100),
        ("prefix_reuse", "prefix_reuse_reduction", "prefix reuse cut (x)", 1),
        ("lbs", None, "LBS full (%)", 100),
        ("total_reduction", "total_reduction", "total reduction (%)", 100),
    ):
        if col not in piv:
            continue
        out[shown] = scale * piv[col]
        if metric is None:
            continue
        pn = [
            find(
                nums,
                metric,
                step=r.step,
                model=r.model,
                beams=r.beams,
                hardware=r.hardware,
                system="lbs_interbeam"
                if metric == "prefix_reuse_reduction"
                else "lbs"
                if metric == "total_reduction"
                else "lbs_intertoken",
            )
            for r in piv.itertuples()
        ]
        out[f"paper {shown.split(' (')[0]}"] = [n.text() if n else "" for n in pn]
        out[f"verdict {shown.split(' (')[0]}"] = [n.judge(v) if n else "" for n, v in zip(pn, piv[col])]
    out["source"] = piv.source
    write_markdown(
        out,
        sweep_dir / "fig10.md",
        title=title_label("LBS Fig.10 transfer volume, normalised to layer-wise", df.simulated),
        notes="Paper: Fig.10a inter-token volume per step (OPT-6.7B, 64 beams); Fig.10b prefix reuse a "
        "further > 2x, total reduction > 95 %.\n\n"
        + no_layerwise_note(tidy(runs), "every volume normalised to layer-wise")
        + table,
    )


# --- Fig.11 and Fig.12: time breakdown and I/O time ---------------------------------------------------


def _io_share_paper(nums, r):
    """The most specific paper number for one run's I/O share: its own configuration's, else the
    paper's range or bound for its system."""
    own = find(nums, "io_share", model=r.model, beams=r.beams, system=r.system, step=r.step, hardware=r.hardware)
    general = [
        n
        for n in nums
        if n.metric in ("io_share", "io_share_max")
        and "model" not in n.cfg
        and n.cfg.get("system") == r.system
        and n.matches(n.metric, step=r.step, hardware=r.hardware)
    ]
    return own or (general[0] if general else None)


def fig11(sweep_dir, runs, cfg):
    """Fig.11: time breakdown (I/O stall / compute / prune + expand) as shares of latency, step 32.
    I/O is stacked first, from 0, so the top of its bar is the I/O share the paper reports."""
    import matplotlib.pyplot as plt

    sweep_dir = Path(sweep_dir)
    df = tidy(runs)
    df = df[df.status == "ok"].sort_values(["model", "beams", "system", "source"]).reset_index(drop=True)
    nums = paper_numbers("fig11")
    pn = [_io_share_paper(nums, r) for r in df.itertuples()]
    x = np.arange(len(df))
    tot = df.e2e_s.values
    io, comp, other = df.io_stall_s / tot, df.compute_s / tot, df.other_s / tot
    fig, ax = plt.subplots(figsize=(max(7.0, 0.45 * len(df) + 3), 4.2), layout="constrained")
    ax.bar(x, io, color="tab:orange", label=f"I/O stall{sim_label(df.simulated)}")
    ax.bar(x, comp, bottom=io, color="tab:blue", label=f"compute{sim_label(df.simulated)}")
    ax.bar(x, other, bottom=io + comp, color="tab:green", label=f"prune+expand{sim_label(df.simulated)}")
    own = [(xi, n.value) for xi, n in zip(x, pn) if n is not None and n.kind == "="]
    if own:
        ax.plot(*zip(*own), "_", color="tab:red", ms=16, mew=2.5, ls="none", label="paper I/O share (this config)")
    for s, color in (("layerwise", "tab:red"), ("lbs", "tab:purple")):
        band = find(nums, "io_share", system=s)
        if band is not None and band.kind == "range":
            ax.axhspan(
                band.value,
                band.value_hi,
                color=color,
                alpha=0.08,
                label=f"paper: {_name(s)} {100 * band.value:g}-{100 * band.value_hi:g} %",
            )
        cap = find(nums, "io_share_max", system=s)
        if cap is not None and cap.kind == "<=":
            ax.axhline(cap.value, color=color, ls=":", lw=1, label=f"paper: {_name(s)} < {100 * cap.value:g} %")
    mixed = df.source.nunique() > 1
    ax.set_xticks(
        x,
        [f"{_name(s)}\n{b} beams" + (f"\n{src}" if mixed else "") for s, b, src in zip(df.system, df.beams, df.source)],
        fontsize=6,
        rotation=90,
    )
    for m in df.model.unique():  # the model once under its group of bars
        xs = x[(df.model == m).values]
        ax.annotate(
            m,
            ((xs.min() + xs.max()) / 2, 1.01),
            xycoords=("data", "axes fraction"),
            ha="center",
            va="bottom",
            fontsize=8,
        )
        if xs.min() > 0:
            ax.axvline(xs.min() - 0.5, color="0.3", lw=0.8)
    ax.set_ylim(0, 1)
    ax.set_yticks(np.linspace(0, 1, 6), [f"{v:.0f} %" for v in np.linspace(0, 100, 6)])
    ax.set_ylabel("share of end-to-end latency\n(I/O from 0: its top = I/O share)")
    fig.legend(fontsize=7, loc="outside right upper")
    steps = ", ".join(str(s) for s in sorted(df.step.unique()))
    fig.suptitle(title_label(f"LBS Fig.11 - time breakdown, step {steps}", df.simulated), fontsize=10)
    save_figure(fig, sweep_dir, "fig11")

    def ours(n, d):
        d = d[(d.system == n.cfg["system"]) & (d.step == int(n.cfg["step"]))]
        if "model" in n.cfg:
            d = d[(d.model == n.cfg["model"]) & (d.beams == int(n.cfg["beams"]))]
            return _span(d, "io_share", "I/O stall / end-to-end")
        return _span(d, "io_share", "I/O stall / end-to-end, min-max over models x beams")

    table = _verdicts(sweep_dir, "fig11", df, ours, "fig11.png")
    out = pd.DataFrame(
        {
            "model": df.model,
            "beams": df.beams,
            "system": df.system,
            "end-to-end (s)": df.e2e_s,
            "compute (s)": df.compute_s,
            "I/O stall (s)": df.io_stall_s,
            "prune+expand (s)": df.other_s,
            "I/O share (%)": _pct(df.io_share),
            "paper I/O share (%)": [n.text() if n else "" for n in pn],
            "verdict": [n.judge(v) if n else "" for n, v in zip(pn, df.io_share)],
            "source": df.source,
        }
    )
    write_markdown(
        out,
        sweep_dir / "fig11.md",
        title=title_label(
            "LBS Fig.11 time breakdown (paper: layer-wise 70-90 % I/O, LBS < 15 %; OPT-6.7B 64 beams 86 % -> 10 %)",
            df.simulated,
        ),
        notes="Paper column: this configuration's own number where the paper gives one, else the paper's "
        "range or bound for the system.\n\n" + no_layerwise_note(df, "the paper's layer-wise I/O shares") + table,
    )


def fig12(sweep_dir, runs, cfg):
    """Fig.12: I/O time of each ablation normalised to layer-wise, step 32."""
    import matplotlib.pyplot as plt

    sweep_dir = Path(sweep_dir)
    df = tidy(runs)
    nums = paper_numbers("fig12")
    base = df[df.system == "layerwise"].set_index(["model", "beams", "step", "source"])["io_stall_s"]
    df = df[(df.system != "layerwise") & (df.status == "ok")].copy()
    df["io_time_vs_layerwise"] = [
        r.io_stall_s / base.get((r.model, r.beams, r.step, r.source), np.nan) for r in df.itertuples()
    ]
    claim = {
        s: find(nums, "io_time_vs_layerwise", system=s) or find(nums, "io_time_vs_layerwise_max", system=s)
        for s in SYSTEM_ORDER
    }
    systems = [x for x in SYSTEM_ORDER if x in set(df.system)]
    models = sorted(df.model.unique())
    # one panel per model, one line per system over beams: no line joins points of different models
    fig, axes = plt.subplots(
        1,
        max(len(models), 1),
        figsize=(3.4 * max(len(models), 1) + 2.4, 3.4),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for ax, m in zip(axes[0], models):
        for s in systems:
            for src, d in df[(df.model == m) & (df.system == s)].sort_values("beams").groupby("source"):
                ax.plot(
                    d.beams,
                    100 * d.io_time_vs_layerwise,
                    ls="-" if src == "simulated" else "--",
                    label=f"{_name(s)}{sim_label(d.simulated)}",
                    **MARKER.get(s, {}),
                )
        it, full = claim["lbs_intertoken"], claim["lbs"]
        if it is not None and it.kind == "range":
            ax.axhspan(
                100 * it.value,
                100 * it.value_hi,
                color="0.5",
                alpha=0.15,
                label=f"paper: inter-token {100 * it.value:g}-{100 * it.value_hi:g} %",
            )
        if full is not None:
            ax.axhline(
                100 * full.value,
                color="k",
                ls="--",
                lw=1,
                label=f"paper: full LBS < {100 * full.value:g} % (several configs)",
            )
        _beam_axis(ax, df.beams)
        plain_log(ax, minor=True)
        ax.set_title(m, fontsize=9)
    axes[0][0].set_ylabel("% of layer-wise I/O time")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=7)
    steps = ", ".join(str(s) for s in sorted(df.step.unique()))
    fig.suptitle(title_label(f"LBS Fig.12 - I/O-time ablation, step {steps}", df.simulated), fontsize=10)
    save_figure(fig, sweep_dir, "fig12")
    table = _verdicts(
        sweep_dir,
        "fig12",
        df,
        lambda n, d: _span(
            d[d.system == n.cfg["system"]],
            "io_time_vs_layerwise",
            "I/O stall / layer-wise I/O stall, min-max over models x beams",
        ),
        "fig12.png",
    )
    # dropna=False: a system whose ratios are all NaN (no layer-wise run to divide by) keeps its column
    piv = df.pivot_table(
        index=["model", "beams", "step", "source"], columns="system", values="io_time_vs_layerwise", dropna=False
    ).reset_index()
    out = piv[["model", "beams", "step"]].copy()
    for s in systems:
        out[f"{_name(s)} (%)"] = 100 * piv[s]
        if claim.get(s) is not None:  # the claim is at one step (32): rows at another are not judged
            at = [claim[s].matches(claim[s].metric, step=st) for st in piv.step]
            out[f"paper {_name(s)} (%)"] = np.where(at, claim[s].text(), "")
            out[f"verdict {_name(s)}"] = [claim[s].judge(v) if a else "" for v, a in zip(piv[s], at)]
    out["source"] = piv.source
    write_markdown(
        out,
        sweep_dir / "fig12.md",
        title=title_label("LBS Fig.12 I/O time, % of layer-wise I/O time", df.simulated),
        notes=no_layerwise_note(tidy(runs), "every ratio (I/O stall / layer-wise I/O stall)")
        + "Paper columns: the paper gives ranges over configurations, not per-configuration values "
        "(step 32): inter-token alone 5-10 % of the layer-wise I/O time; full LBS (inter-beam + "
        "prefetch) < 2 % in several configurations.\n\n" + table,
    )
