"""The summary of an ad-hoc sweep (one without an experiment's report): a table and, when a swept
parameter is numeric, a figure; and every sweep's ``summary.csv`` (:func:`write_summary_csv`).

Columns: the parameters that vary across the sweep's jobs (from each record's command-line
overrides), the status, the headline metric of each job's family (the first row of its printed
table) and whether it is simulated or measured. The figure plots the headline against the first
numeric swept parameter, one line per combination of the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd


def swept(runs: pd.DataFrame) -> pd.DataFrame:
    """One column per override key whose value differs between jobs (values as given)."""
    rows: List[Dict[str, str]] = []
    for o in runs.get("overrides", pd.Series([""] * len(runs))).fillna(""):
        rows.append(dict(kv.split("=", 1) for kv in str(o).split() if "=" in kv))
    table = pd.DataFrame(rows, index=runs.index)
    keep = [c for c in table.columns if table[c].nunique(dropna=False) > 1]
    return table[keep]


def _numeric(col: pd.Series) -> bool:
    return pd.to_numeric(col, errors="coerce").notna().all()


def _sorted_by(t: pd.DataFrame, params: List[str]) -> pd.DataFrame:
    """``t`` sorted by the swept columns ``params``: numbers as numbers (4 before 16), the rest as text."""
    if not params:
        return t
    return t.sort_values(params, key=lambda c: pd.to_numeric(c) if _numeric(c) else c)


SUMMARY_CSV_COLUMNS = ("status", "message", "simulated", "system", "family", "model", "hardware", "run_dir")


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One flat row per job of a sweep (``runs``: :func:`harness.report.gather_runs`): the swept values
    (a column per parameter that varies, named as on the command line), then status, message,
    simulated, system, family, model, hardware, run_dir (those not swept), then every ``summary.*``
    column (the jobs' summary keys, named as in runs.parquet). Sorted by the swept values."""
    params = swept(runs)
    t = params.copy()
    for c in SUMMARY_CSV_COLUMNS:
        if c in runs and c not in t:
            t[c] = runs[c].to_numpy()
    for c in runs.columns:
        if c.startswith("summary."):
            t[c] = runs[c].to_numpy()
    return _sorted_by(t, list(params.columns)).reset_index(drop=True)


def write_summary_csv(sweep_dir, runs: pd.DataFrame) -> Optional[Path]:
    """Write ``summary.csv`` (:func:`summary_table`) in ``sweep_dir``, atomically; None for an empty
    sweep. Every sweep gets one (harness.callbacks); an ad-hoc sweep's figure is drawn from its
    columns (the swept values, status and the headline's ``summary.*`` column)."""
    from harness.records import atomic_write_bytes

    if not len(runs):
        return None
    path = Path(sweep_dir) / "summary.csv"
    atomic_write_bytes(path, summary_table(runs).to_csv(index=False).encode())
    return path


def write_summary(sweep_dir, runs: pd.DataFrame) -> List[Path]:
    """Write ``summary.md`` (and ``summary.png``/``.pdf`` when a swept parameter is numeric) in
    ``sweep_dir``; returns the files written (none for an empty sweep)."""
    from harness.report import save_figure, source_of, title_label, write_markdown

    if not len(runs):
        return []
    sweep_dir = Path(sweep_dir)
    params = swept(runs)
    t = params.copy()
    t["status"] = runs["status"].to_numpy()
    sim = runs.get("simulated", pd.Series([True] * len(runs)))
    t["source"] = [source_of(bool(s)) for s in sim]
    keys = [k for k in runs.get("headline", pd.Series(dtype=object)).dropna().unique() if f"summary.{k}" in runs]
    for k in keys:
        t[k] = runs[f"summary.{k}"].to_numpy()
    t = _sorted_by(t, list(params.columns))
    out = [
        write_markdown(
            t,
            sweep_dir / "summary.md",
            title=f"sweep {sweep_dir.name}: {len(t)} jobs",
            notes="One row per job; the metric columns are each family's headline (first row "
            "of its printed table; SI units: seconds, bytes, joules). `source`: simulated "
            "on the hardware profile, or measured by a real engine."
            + _failed_notes(t[t["status"] != "ok"], runs, list(params.columns)),
        )
    ]
    num = [c for c in params.columns if _numeric(params[c])]
    if num and keys:
        labels = runs.loc[runs["headline"] == keys[0], "headline_label"].dropna()
        fig = draw(
            t,
            num[0],
            [c for c in params.columns if c != num[0]],
            keys[0],
            f"{labels.iloc[0] if len(labels) else keys[0]} ({unit_of(keys[0])})",
            title_label(f"sweep {sweep_dir.name}", [bool(s) for s in sim]),
        )
        out += list(save_figure(fig, sweep_dir, "summary").values())
    return out


UNITS = (
    ("_tok_s", "tok/s"),
    ("_bytes", "bytes"),
    ("_s", "s"),
    ("_j", "J"),
    ("_w", "W"),
    ("_mhz", "MHz"),
    ("_pct", "%"),
)


def unit_of(key: str) -> str:
    """The unit of a summary key by the harness's naming (``e2e_s`` -> s, ``energy_per_token_j`` -> J,
    ``precise_goodput_tok_s`` -> tok/s); else the key itself (a ratio or a count)."""
    return next((f"{key}, {u}" for suffix, u in UNITS if key.endswith(suffix)), key)


def _failed_notes(failed: pd.DataFrame, runs: pd.DataFrame, params: List[str]) -> str:
    """The summary's list of jobs without a result: their swept values, status and message."""
    if not len(failed):
        return ""

    def line(i, r):
        msg = runs.at[i, "message"] if "message" in runs else None
        msg = f": {msg.splitlines()[0][:160]}" if isinstance(msg, str) and msg else ""
        return f"\n- {', '.join(f'{c}={r[c]}' for c in params)}: {r['status']}{msg}"

    return f"\n\nJobs without a result ({len(failed)}; marked on the figure's x axis):" + "".join(
        line(i, r) for i, r in failed.iterrows()
    )


MARKERS = "osD^vP*X"


def draw(t: pd.DataFrame, x: str, others: List[str], key: str, ylabel: str, title: str):
    """The summary figure of table ``t`` (one row per job: the swept columns, status, source, ``key``):
    ``key`` against ``x``, one line per combination of ``others``. Lines are drawn widest first, each
    with its own marker shape and a smaller marker than the one before, so points that coincide stay
    visible; a job without a value (oom, error, timeout) is an 'x' on the x axis at its x, labelled
    with its status, in its line's colour."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    df = t.assign(_x=pd.to_numeric(t[x]), _y=pd.to_numeric(t[key], errors="coerce"))
    groups = list(df.groupby(others) if others else [("", df)])
    for n, (name, g) in enumerate(groups):
        g = g.sort_values("_x")
        label = (
            ", ".join(f"{o}={v}" for o, v in zip(others, name if isinstance(name, tuple) else (name,)))
            if others
            else key
        )
        ok = g[g["status"].eq("ok") & g["_y"].notna()]
        size = 4 + 3 * (len(groups) - 1 - n)  # the first drawn is the widest
        (line,) = ax.plot(
            ok["_x"],
            ok["_y"],
            marker=MARKERS[n % len(MARKERS)],
            markersize=size,
            linewidth=1 + 0.8 * (len(groups) - 1 - n),
            zorder=2 + n,
            label=f"{label} ({g['source'].iloc[0]})",
        )
        for _, r in g.drop(ok.index).iterrows():
            ax.plot(
                [r["_x"]],
                [0],
                marker="x",
                markersize=9,
                mew=2,
                color=line.get_color(),
                clip_on=False,
                transform=ax.get_xaxis_transform(),
                zorder=10,
                gid=f"failed:{label}:{r[x]}",
            )
            ax.annotate(
                r["status"],
                (r["_x"], 0),
                xycoords=ax.get_xaxis_transform(),
                xytext=(0, 6 + 9 * n),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color=line.get_color(),
            )
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    return fig
