"""Figures and tables of the LBS paper's evaluation, drawn from a sweep's records.

Each function has the signature ``report(sweep_dir, runs, cfg)`` (see harness/report.py) and is
named by an experiment file (``conf/experiment/lbs_*.yaml``). Paper values come from
``results/reference/lbs.csv`` and are drawn beside ours (dashed / hatched, labelled "paper").
Every value of ours is labelled by its own record (``harness.report`` labels; tables also carry a
``source`` column per row); ratios (speedup, normalised volume, I/O time) are taken between records
of the same source only, so a sweep that mixes the simulated and the real backend shows both side
by side, never one divided by the other.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.report import (label_values, load_reference, read_table, save_figure, sim_label, source_of,
                            title_label, write_markdown)

GiB = 2**30
SYSTEM_ORDER = ["in_gpu", "layerwise", "hf_offload", "lbs_intertoken", "lbs_interbeam", "lbs_prefetch", "lbs"]


def _tidy(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per job with short column names."""
    df = pd.DataFrame({
        "system": runs["system"], "model": runs["model"], "hardware": runs["hardware"],
        "status": runs["status"], "simulated": runs["simulated"].astype(bool),
        "beams": runs["config.workload.beams"].astype(int), "step": runs["config.workload.step"].astype(int),
    })
    for k in ("e2e_s", "compute_s", "io_stall_s", "other_s", "io_share", "h2d_bytes", "d2h_bytes",
              "eq3_layerwise_bytes", "eq5_lbs_bytes", "full_kv_bytes", "groups_per_step",
              "peak_device_kv_bytes", "kv_budget_bytes"):
        col = f"summary.{k}"
        df[k] = pd.to_numeric(runs[col], errors="coerce") if col in runs else np.nan
    df["source"] = [source_of(bool(x)) for x in df["simulated"]]
    return df.sort_values(["model", "step", "beams"]).reset_index(drop=True)


def _sim_title(title: str, simulated) -> str:
    """A title saying whether the values behind it are simulated, measured or both (each labelled)."""
    return title_label(title, simulated)


def _sim_col(name: str, simulated) -> str:
    """A table column or legend entry of our values, labelled (sim), (measured) or (sim+measured)."""
    return name + sim_label(simulated)


def _ref_value(ref: pd.DataFrame, metric: str, **conds):
    """The paper value for a metric whose config string contains every key=value given."""
    for _, r in ref[ref["metric"] == metric].iterrows():
        kv = dict(x.split("=", 1) for x in str(r["config"]).split(";") if "=" in x)
        if all(str(kv.get(k)) == str(v) for k, v in conds.items() if k in kv) and \
                all(k in kv for k in conds if k in ("model", "system")):
            return float(r["value"])
    return None


def _speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Speedup of every system over layer-wise at the same (hardware, model, beams, step)."""
    keys = ["hardware", "model", "beams", "step", "source"]          # never a measured / simulated ratio
    base = df[df.system == "layerwise"].set_index(keys)["e2e_s"]
    out = df.copy()
    out["layerwise_s"] = [base.get(tuple(r[k] for k in keys), np.nan) for _, r in out.iterrows()]
    out["speedup"] = np.where(out.status == "ok", out["layerwise_s"] / out["e2e_s"], np.nan)
    out["offloads"] = [bool(df[(df.system == "layerwise") & (df.model == r.model) & (df.beams == r.beams)
                               & (df.step == r.step) & (df.source == r.source)]["h2d_bytes"].gt(0).any())
                       for _, r in out.iterrows()]
    return out


def _fmt_speed(r) -> str:
    if r.status == "oom":
        return "OOM"
    if r.status != "ok":
        return r.status
    return f"{r.speedup:.2f}x"


def _speedup_report(sweep_dir: Path, runs: pd.DataFrame, figure: str, title: str, min_beams: int = 0,
                    range_rule: str = "Ranges over configurations where layer-wise offloads") -> pd.DataFrame:
    """Speedup figure and table; the LBS range "ours" is taken over runs where layer-wise offloads and
    beams >= ``min_beams`` (``range_rule`` says which rule, and why, in the table's notes)."""
    import matplotlib.pyplot as plt
    df = _speedups(_tidy(runs))
    ref = load_reference("lbs", figure)
    models, steps = sorted(df.model.unique()), sorted(df.step.unique())
    systems = [s for s in SYSTEM_ORDER if s in set(df.system)]
    fig, axes = plt.subplots(len(models), len(steps), figsize=(4.2 * len(steps), 3.2 * len(models)),
                             squeeze=False, sharey=True, layout="constrained")
    for i, m in enumerate(models):
        for j, st in enumerate(steps):
            ax = axes[i][j]
            sub = df[(df.model == m) & (df.step == st)]
            for k, (s, src) in enumerate((s, src) for s in systems for src in ("simulated", "measured")):
                d = sub[(sub.system == s) & (sub.source == src)].sort_values("beams")
                if d.empty:
                    continue
                line, = ax.plot(d.beams, d.speedup, marker="o", ls="-" if src == "simulated" else "--",
                                label=f"{s}{sim_label(d.simulated)}")
                oom = d[d.status == "oom"]
                if len(oom):      # OOM: no speedup; an x on the floor of the plot, in the line's colour
                    ax.plot(oom.beams, [0.25 * (k + 1)] * len(oom), "x", color=line.get_color(), ms=7,
                            label=f"{s}{sim_label(d.simulated)}: OOM")
            lo, hi = _ref_value(ref, "speedup_min", model=m), _ref_value(ref, "speedup_max", model=m)
            if hi is not None:
                ax.axhspan(lo if lo is not None else hi, hi, color="tab:red", alpha=0.12,
                           label=f"paper LBS range {lo or ''}-{hi}x")
                ax.axhline(hi, color="tab:red", ls="--", lw=1)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{m}, step {st}", fontsize=9)
            ax.set_xlabel("beams")
            if j == 0:
                ax.set_ylabel("speedup over layer-wise")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(_sim_title(title, df.simulated))
    save_figure(fig, sweep_dir, figure)
    tab = df.assign(speedup_txt=label_values([_fmt_speed(r) for _, r in df.iterrows()], df.simulated))
    wide = tab.pivot_table(index=["model", "step", "beams", "source"], columns="system", values="speedup_txt",
                           aggfunc="first").reset_index()
    wide = wide[["model", "step", "beams", "source"] + [s for s in systems if s in wide.columns]]
    rng = []
    for m in models:
        for src in ("simulated", "measured"):
            d = df[(df.model == m) & (df.system == "lbs") & (df.status == "ok") & df.offloads
                   & (df.beams >= min_beams) & (df.source == src)]
            if len(d):
                rng.append({"model": m, "ours_is": src, "ours_lbs_speedup_min": d.speedup.min(),
                            "ours_lbs_speedup_max": d.speedup.max(),
                            "paper_min": _ref_value(ref, "speedup_min", model=m),
                            "paper_max": _ref_value(ref, "speedup_max", model=m)})
    rng = pd.DataFrame(rng)
    write_markdown(wide, sweep_dir / f"{figure}.md",
                   title=title_label(f"{title}, speedup over layer-wise of the same source", df.simulated),
                   notes=range_rule + ":\n\n" + rng.to_markdown(index=False, floatfmt=".2f"))
    return rng


def fig9(sweep_dir, runs, cfg):
    """Fig.9: end-to-end speedup over layer-wise per model x beams x step (ablations, in-GPU OOM)."""
    _speedup_report(Path(sweep_dir), runs, "fig9", "LBS Fig.9 - RTX 4090", min_beams=16,
                    range_rule="Ranges of ours over beams >= 16 where layer-wise offloads (the paper: at 4-8 beams "
                               "all methods are about equal, no offload; its ranges are for the offloading regime, "
                               "so 4-8 beams are left out of ours to compare like for like)")


def rtx3080ti(sweep_dir, runs, cfg):
    """RTX 3080 Ti speedups (OPT-2.7B, Qwen-4B)."""
    _speedup_report(Path(sweep_dir), runs, "3080ti", "LBS - RTX 3080 Ti")


def fig4(sweep_dir, runs, cfg):
    """Fig.4: KV share of GPU memory (KV / (KV + weights) at seq 2048) and layer-wise runtime breakdown."""
    import matplotlib.pyplot as plt
    from harness.model_facts import weight_bytes
    sweep_dir = Path(sweep_dir)
    df = _tidy(runs)
    weights = weight_bytes(cfg.model)
    df["kv_share_of_memory"] = df.full_kv_bytes / (df.full_kv_bytes + weights)
    ref = load_reference("lbs", "fig4")
    df["paper_kv_share_lower_bound"] = [_ref_value(ref, "kv_share_of_memory", beams=b) for b in df.beams]
    df["paper_io_share"] = [_ref_value(ref, "io_share", beams=b, system="layerwise") for b in df.beams]
    lw = df[df.system == "layerwise"].sort_values(["source", "beams"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5), layout="constrained")
    sim = sim_label(lw.simulated)
    a.plot(lw.beams, lw.kv_share_of_memory, "o-", label="ours (analytic from shapes)")
    a.plot(lw.beams, lw.paper_kv_share_lower_bound, "rv--", label="paper (lower bound)")
    a.set_xscale("log", base=2); a.set_xlabel("beams"); a.set_ylabel("KV share of GPU memory"); a.legend(fontsize=8)
    x = np.arange(len(lw))
    b.bar(x, lw.compute_s, label=f"compute{sim}")
    b.bar(x, lw.io_stall_s, bottom=lw.compute_s, label=f"I/O stall{sim}")
    b.bar(x, lw.other_s, bottom=lw.compute_s + lw.io_stall_s, label=f"prune+expand{sim}")
    for xi, (_, r) in zip(x, lw.iterrows()):
        b.annotate(f"{100 * r.io_share:.0f}% I/O", (xi, r.e2e_s), ha="center", fontsize=7)
    b.set_xticks(x, [f"{bm}\n{src}" for bm, src in zip(lw.beams, lw.source)]); b.set_xlabel("beams")
    b.set_ylabel("seconds (layer-wise)"); b.legend(fontsize=7)
    fig.suptitle(title_label("LBS Fig.4 - OPT-6.7B, seq 2048, RTX 4090, runtime", lw.simulated))
    save_figure(fig, sweep_dir, "fig4")
    write_markdown(lw[["beams", "kv_share_of_memory", "paper_kv_share_lower_bound", "e2e_s", "compute_s",
                       "io_stall_s", "io_share", "paper_io_share", "source"]], sweep_dir / "fig4.md",
                   title=_sim_title("LBS Fig.4 (layer-wise runtime breakdown; KV share = KV/(KV+weights))",
                                    lw.simulated))


def fig5(sweep_dir, runs, cfg):
    """Fig.5: per-token decode latency vs sequence position (flat, then rising once KV overflows)."""
    import matplotlib.pyplot as plt
    sweep_dir = Path(sweep_dir)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    rows = []
    ok = runs[runs.status == "ok"]
    for _, r in ok.iterrows():
        st = read_table(r, "steps")
        per_tok = st.latency_s / st.tokens
        pos = st.start_tokens + st.tokens / 2
        ax.plot(pos, per_tok * 1e3, label=f"{r.system} {int(r['config.workload.beams'])} beams"
                                          f"{sim_label(r.simulated)}")
        knee = st.start_tokens[st.h2d_bytes > 0].min() if (st.h2d_bytes > 0).any() else None
        rows.append({"system": r.system, "beams": int(r["config.workload.beams"]),
                     "source": source_of(bool(r.simulated)),
                     "first_offload_position": knee, "ms_per_token_first": 1e3 * per_tok.iloc[0],
                     "ms_per_token_last": 1e3 * per_tok.iloc[-1]})
    ax.set_xlabel("sequence position (tokens)"); ax.set_ylabel("ms per decode step (all beams)")
    ax.set_yscale("log"); ax.legend(fontsize=7)
    ax.set_title(_sim_title("LBS Fig.5 - per-step latency vs position (paper: flat, then sharp rise)", ok.simulated),
                 fontsize=9)
    save_figure(fig, sweep_dir, "fig5")
    write_markdown(pd.DataFrame(rows), sweep_dir / "fig5.md", title=_sim_title("LBS Fig.5", ok.simulated))


def fig7(sweep_dir, runs, cfg):
    """Fig.7: transfer volume, analytic (Eq.1-5) vs what the scheduler moved, vs the paper."""
    import matplotlib.pyplot as plt
    sweep_dir = Path(sweep_dir)
    df = _tidy(runs)
    ref = load_reference("lbs", "fig7")
    rows = []
    for _, r in df.iterrows():
        eq = r.eq3_layerwise_bytes if r.system == "layerwise" else r.eq5_lbs_bytes
        rows.append({"system": r.system, "step": r.step, "eq_gib": eq / GiB, "moved_gib": r.h2d_bytes / GiB,
                     "paper_gib": _ref_value(ref, "h2d_gib", system=r.system, step=r.step)
                     if r.system != "layerwise" else _ref_value(ref, "h2d_gib", system="layerwise"),
                     "source": r.source})
    t = pd.DataFrame(rows).drop_duplicates(["system", "step", "source"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    # layer-wise depends on the step too: the step's own tokens of offloaded layers stay on the device
    lab = [f"{s}\nstep {st}{sim_label(src == 'simulated')}" for s, st, src in zip(t.system, t.step, t.source)]
    x = np.arange(len(t))
    ax.bar(x - 0.27, t.eq_gib, 0.27, label="Eq.1-5 (ours)")
    ax.bar(x, t.moved_gib, 0.27, label=_sim_col("scheduler moved", df.simulated))
    ax.bar(x + 0.27, t.paper_gib.astype(float), 0.27, label="paper Fig.7", hatch="//", alpha=0.6)
    ax.set_yscale("log"); ax.set_xticks(x, lab, fontsize=7); ax.set_ylabel("host->GPU GiB"); ax.legend(fontsize=7)
    ax.set_title(_sim_title("LBS Fig.7 - OPT-6.7B, 64 beams, 7 GiB KV", df.simulated), fontsize=9)
    save_figure(fig, sweep_dir, "fig7")
    write_markdown(t, sweep_dir / "fig7.md", title="LBS Fig.7 transfer volume (GiB)", floatfmt=",.1f")


def fig10(sweep_dir, runs, cfg):
    """Fig.10: transfer volume normalised to layer-wise; (a) step lengths, (b) with/without prefix reuse."""
    import matplotlib.pyplot as plt
    sweep_dir = Path(sweep_dir)
    df = _tidy(runs)
    ref = load_reference("lbs", "fig10")
    base = df[df.system == "layerwise"].groupby(["model", "beams", "source"])["h2d_bytes"].first()
    df = df[df.system != "layerwise"].copy()
    df["normalised_volume"] = [r.h2d_bytes / base.get((r.model, r.beams, r.source), np.nan) for _, r in df.iterrows()]
    df["paper"] = [_ref_value(ref, "normalised_volume", system=r.system, step=r.step) for _, r in df.iterrows()]
    sim = sim_label(df.simulated)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for (s, src), d in df.groupby(["system", "source"]):
        ax.plot(d.step, 100 * d.normalised_volume, "o-", label=f"{s}{sim_label(d.simulated)}")
    pr = df.dropna(subset=["paper"])
    ax.plot(pr.step, 100 * pr.paper.astype(float), "rx--", label="paper Fig.10a (inter-token)")
    ax.set_xscale("log", base=2); ax.set_xlabel("step (tokens)"); ax.set_ylabel("% of layer-wise volume")
    ax.legend(fontsize=7); ax.set_title(_sim_title("LBS Fig.10 - normalised transfer volume", df.simulated), fontsize=9)
    save_figure(fig, sweep_dir, "fig10")
    piv = df.pivot_table(index=["model", "beams", "step", "source"], columns="system",
                         values="normalised_volume").reset_index()
    cols = ["model", "beams", "step", "source"]
    if "lbs_intertoken" in piv:     # paper beside ours: Fig.10a (inter-token only, per step)
        piv["paper lbs_intertoken"] = [_ref_value(ref, "normalised_volume", system="lbs_intertoken", step=st)
                                       for st in piv.step]
        cols += ["lbs_intertoken", "paper lbs_intertoken"]
    if "lbs_interbeam" in piv:
        cols += ["lbs_interbeam"]
    if {"lbs_intertoken", "lbs_interbeam"} <= set(piv.columns):
        piv["prefix_reuse_reduction_x"] = piv.lbs_intertoken / piv.lbs_interbeam
        piv["paper prefix_reuse_reduction_x (>)"] = _ref_value(ref, "prefix_reuse_reduction", system="lbs_interbeam")
        cols += ["prefix_reuse_reduction_x", "paper prefix_reuse_reduction_x (>)"]
    if "lbs" in piv:
        piv["lbs_total_reduction"] = 1 - piv.lbs
        piv["paper lbs_total_reduction (>)"] = _ref_value(ref, "total_reduction", system="lbs")
        cols += ["lbs", "lbs_total_reduction", "paper lbs_total_reduction (>)"]
    ours = {c: c + sim for c in cols[4:] if not c.startswith("paper")}
    write_markdown(piv[cols].rename(columns=ours), sweep_dir / "fig10.md",
                   title=_sim_title("LBS Fig.10 (fraction of layer-wise volume)", df.simulated),
                   notes="Paper columns from results/reference/lbs.csv: Fig.10a inter-token volume per step (OPT-6.7B, "
                         "64 beams); '(>)' marks the paper's lower bounds (prefix reuse a further > 2x; total "
                         "reduction > 95 %).")


def fig11(sweep_dir, runs, cfg):
    """Fig.11: time breakdown (compute / I/O stall / prune + expand), step 32."""
    import matplotlib.pyplot as plt
    sweep_dir = Path(sweep_dir)
    df = _tidy(runs)
    df = df[df.status == "ok"]
    ref = load_reference("lbs", "fig11")
    df["paper_io_share"] = [_ref_value(ref, "io_share", model=r.model, beams=r.beams, system=r.system)
                            for _, r in df.iterrows()]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    lab = [f"{m}\n{b}b {s}{sim_label(sim)}" for m, b, s, sim in zip(df.model, df.beams, df.system, df.simulated)]
    x = np.arange(len(df))
    tot = df.e2e_s.values
    ax.bar(x, df.compute_s / tot, label=_sim_col("compute", df.simulated))
    ax.bar(x, df.io_stall_s / tot, bottom=df.compute_s / tot, label=_sim_col("I/O", df.simulated))
    ax.bar(x, df.other_s / tot, bottom=(df.compute_s + df.io_stall_s) / tot, label=_sim_col("prune+expand", df.simulated))
    pr = df.paper_io_share.astype(float)
    ax.plot(x, pr, "r_", ms=14, mew=2, ls="none", label="paper I/O share")
    ax.set_xticks(x, lab, fontsize=5, rotation=90); ax.set_ylabel("share of latency"); ax.legend(fontsize=7)
    ax.set_title(_sim_title("LBS Fig.11 - time breakdown, step 32", df.simulated), fontsize=9)
    save_figure(fig, sweep_dir, "fig11")
    write_markdown(df[["model", "beams", "system", "e2e_s", "compute_s", "io_stall_s", "other_s", "io_share",
                       "paper_io_share", "source"]], sweep_dir / "fig11.md",
                   title=_sim_title("LBS Fig.11 (paper: layer-wise 70-90 % I/O, LBS < 15 %; OPT-6.7B 64 beams "
                                    "86 % -> 10 %)", df.simulated))


def fig12(sweep_dir, runs, cfg):
    """Fig.12: I/O time of each ablation normalised to layer-wise, step 32."""
    import matplotlib.pyplot as plt
    sweep_dir = Path(sweep_dir)
    df = _tidy(runs)
    ref = load_reference("lbs", "fig12")
    base = df[df.system == "layerwise"].set_index(["model", "beams", "source"])["io_stall_s"]
    df = df[(df.system != "layerwise") & (df.status == "ok")].copy()
    df["io_time_vs_layerwise"] = [r.io_stall_s / base.get((r.model, r.beams, r.source), np.nan)
                                  for _, r in df.iterrows()]
    sim = sim_label(df.simulated)
    p_it_lo = _ref_value(ref, "io_time_vs_layerwise_min", system="lbs_intertoken", step=32)
    p_it_hi = _ref_value(ref, "io_time_vs_layerwise_max", system="lbs_intertoken", step=32)
    p_lbs_hi = _ref_value(ref, "io_time_vs_layerwise_max", system="lbs", step=32)
    systems = [x for x in SYSTEM_ORDER if x in set(df.system)]
    models = sorted(df.model.unique())
    # one panel per model, one line per system over beams: no line joins points of different models
    fig, axes = plt.subplots(1, max(len(models), 1), figsize=(3.4 * max(len(models), 1) + 1.8, 3.4),
                             squeeze=False, sharey=True, layout="constrained")
    for ax, m in zip(axes[0], models):
        for s in systems:
            for src, d in df[(df.model == m) & (df.system == s)].sort_values("beams").groupby("source"):
                ax.plot(d.beams, 100 * d.io_time_vs_layerwise, "o-", label=f"{s}{sim_label(d.simulated)}")
        if p_it_lo is not None and p_it_hi is not None:
            ax.axhspan(100 * p_it_lo, 100 * p_it_hi, color="0.5", alpha=0.15,
                       label=f"paper: inter-token {100 * p_it_lo:g}-{100 * p_it_hi:g} %")
        if p_lbs_hi is not None:
            ax.axhline(100 * p_lbs_hi, color="k", ls="--", lw=1,
                       label=f"paper: full LBS < {100 * p_lbs_hi:g} % (several configs)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(df.beams.unique()), [str(b) for b in sorted(df.beams.unique())])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("beams")
    axes[0][0].set_ylabel("% of layer-wise I/O time")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=7)
    fig.suptitle(_sim_title("LBS Fig.12 - I/O-time ablation, step 32", df.simulated), fontsize=10)
    save_figure(fig, sweep_dir, "fig12")
    piv = df.pivot_table(index=["model", "beams", "source"], columns="system", values="io_time_vs_layerwise").reset_index()
    cols = ["model", "beams", "source"]
    for s in systems:
        cols.append(s)
        if s == "lbs_intertoken":
            piv["paper lbs_intertoken min"], piv["paper lbs_intertoken max"] = p_it_lo, p_it_hi
            cols += ["paper lbs_intertoken min", "paper lbs_intertoken max"]
        if s == "lbs":
            piv["paper lbs (<)"] = p_lbs_hi
            cols.append("paper lbs (<)")
    write_markdown(piv[cols].rename(columns={s: s + sim for s in systems}), sweep_dir / "fig12.md",
                   title=_sim_title("LBS Fig.12 (I/O time / layer-wise I/O time)", df.simulated),
                   notes="Paper columns from results/reference/lbs.csv (step 32; the paper gives ranges, not "
                         "per-configuration values): inter-token alone 5-10 % of the layer-wise I/O time; full LBS "
                         "(inter-beam + prefetch) < 2 % in several configurations ('(<)': an upper bound).")
