"""The summary of an ad-hoc sweep (one without an experiment's report): a table and, when a swept
parameter is numeric, a figure.

Columns: the parameters that vary across the sweep's jobs (from each record's command-line
overrides), the status, the headline metric of each job's family (the first row of its printed
table) and whether it is simulated or measured. The figure plots the headline against the first
numeric swept parameter, one line per combination of the others.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

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


def write_summary(sweep_dir, runs: pd.DataFrame) -> List[Path]:
    """Write ``summary.md`` (and ``summary.png``/``.pdf`` when a swept parameter is numeric) in
    ``sweep_dir``; returns the files written (none for an empty sweep)."""
    from harness.report import save_figure, source_of, write_markdown
    if not len(runs):
        return []
    sweep_dir = Path(sweep_dir)
    params = swept(runs)
    t = params.copy()
    t["status"] = runs["status"].to_numpy()
    t["source"] = [source_of(bool(s)) for s in runs.get("simulated", pd.Series([True] * len(runs)))]
    keys = [k for k in runs.get("headline", pd.Series(dtype=object)).dropna().unique() if f"summary.{k}" in runs]
    for k in keys:
        t[k] = runs[f"summary.{k}"].to_numpy()
    if len(params.columns):                  # numbers sort as numbers (4 before 16), the rest as text
        t = t.sort_values(list(params.columns), key=lambda c: pd.to_numeric(c) if _numeric(c) else c)
    out = [write_markdown(t, sweep_dir / "summary.md", title=f"sweep {sweep_dir.name}: {len(t)} jobs",
                          notes="One row per job; the metric columns are each family's headline (first row "
                                "of its printed table; SI units: seconds, bytes, joules). `source`: simulated "
                                "on the hardware profile, or measured by a real engine.")]
    num = [c for c in params.columns if _numeric(params[c])]
    if num and keys:
        import matplotlib.pyplot as plt
        x, others = num[0], [c for c in params.columns if c != num[0]]
        fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
        df = t.assign(_x=pd.to_numeric(t[x]))
        for name, g in (df.groupby(others) if others else [("", df)]):
            g = g.sort_values("_x")
            label = ", ".join(f"{o}={v}" for o, v in zip(others, name if isinstance(name, tuple) else (name,))) if others else keys[0]
            ax.plot(g["_x"], pd.to_numeric(g[keys[0]], errors="coerce"), "o-", label=f"{label} ({g['source'].iloc[0]})")
        ax.set_xlabel(x)
        labels = runs.loc[runs["headline"] == keys[0], "headline_label"].dropna()
        ax.set_ylabel(f"{labels.iloc[0]} ({keys[0]}, SI units)" if len(labels) else keys[0])
        ax.set_title(f"sweep {sweep_dir.name}")
        ax.legend(fontsize=7)
        out += list(save_figure(fig, sweep_dir, "summary").values())
    return out
