"""Report of ``experiment=fasttts_workload_sensitivity`` (issue 38, item 9): FastTTS's goodput gain over
``vllm_tts`` and the verdicts of the paper's Fig. 12 goodput points under each simulated workload model
(``workload.step_model``: ``step_lengths.STEP_MODELS``), so that a reader sees how much of the verdicts
the workload decides. A sensitivity study, not a paper figure: its verdicts re-judge Fig. 12's numbers
once per model and go to ``workload_verdicts.csv`` (with a ``step_model`` column), never to the
``verdicts.csv`` that ``harness.reproduce`` counts.

Writes ``workload_sensitivity.md``: per step model and (pair, dataset, n), the goodput of both systems
(tok/s), fasttts/base (x), the paper's numbers where Fig. 12 has them and each one's verdict
(``harness.verdict``, the 15 % rule, as ``report.report_goodput``); and below it the verdict counts
per step model. ``workload_sensitivity.png/.pdf``: fasttts/base against n, a line per step model.
Every value labelled simulated or measured by its own record (``report.tidy``).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd

from harness import verdict as vd
from harness.report import save_figure, write_markdown
from systems.verifier_search.report import (
    LABELS,
    N_AXIS,
    _blank_nan,
    _gains,
    _judge,
    _labels,
    _paper,
    _ref,
    _title,
    tidy,
)
from systems.verifier_search.step_lengths import STEP_MODELS

KEYS = ["step_model", "pair", "dataset", "n"]
OLD = "geometric"  # a record from before the setting drew geometric steps
NAME = "workload_sensitivity"


def _frame(runs: pd.DataFrame) -> pd.DataFrame:
    """``report.tidy`` with the run's ``step_model``."""
    df = tidy(runs)
    if not len(df):
        return df.assign(step_model=pd.Series(dtype=str))
    ok = runs[runs["status"] == "ok"].reset_index(drop=True)
    col = "config.workload.step_model"
    df["step_model"] = ok[col].fillna(OLD).astype(str) if col in ok else OLD
    return df


def _order(t: pd.DataFrame) -> pd.DataFrame:
    rank = {m: i for i, m in enumerate((OLD, *[m for m in STEP_MODELS if m != OLD]))}
    return (
        t.assign(_o=t["step_model"].map(rank).fillna(len(rank)))
        .sort_values(["_o", "pair", "dataset", "n"])
        .drop(columns="_o")
        .reset_index(drop=True)
    )


def table(runs: pd.DataFrame):
    """(the gain table, the verdict rows with their step model) of the successful runs."""
    df = _frame(runs)
    t = _gains(df, KEYS, ["fasttts"])
    if not len(t):
        return t, []
    t = _order(t)
    ref = _ref("fig12")
    rows = []
    for s in ("vllm_tts", "fasttts"):
        t[f"paper {s}"] = [
            _paper(ref, "goodput_tok_s", pair=r.pair, dataset=r.dataset, n=r.n, system=s) for r in t.itertuples()
        ]
        for lab in _labels(t, s):
            t[f"verdict {s}{lab}"] = [_judge(o, p) for o, p in zip(t[f"{s}{lab}"], t[f"paper {s}"])]
            for i in t.index:
                paper, ours, r = t.at[i, f"paper {s}"], t.at[i, f"{s}{lab}"], t.loc[i]
                if paper is None or paper != paper:
                    continue
                rows.append(
                    (
                        r["step_model"],
                        vd.Row(
                            "fasttts",
                            "fig12",
                            f"goodput {s} {r['pair']} {r['dataset']} n={r['n']} (workload.step_model={r['step_model']})",
                            float(paper),
                            ours=None if ours != ours else float(ours),
                            unit="tok/s",
                            simulated=lab == LABELS[0],
                            source=f"{NAME}.png",
                        ),
                    )
                )
    t["paper fasttts/base"] = t["paper fasttts"] / t["paper vllm_tts"]
    return t, rows


def counts(rows) -> pd.DataFrame:
    """Verdict counts per step model (one row each, in ``table``'s order): a column per verdict."""
    out = {}
    for model, r in rows:
        c = out.setdefault(model, dict.fromkeys(vd.VERDICTS, 0))
        c[r.verdict] += 1
    return pd.DataFrame([{"step_model": m, **c} for m, c in out.items()], columns=["step_model", *vd.VERDICTS])


def report_workload_sensitivity(sweep_dir: Path, runs: pd.DataFrame, cfg=None) -> pd.DataFrame:
    """Table, verdict counts and figure of the study (module docstring); returns the table."""
    df = _frame(runs)
    t, rows = table(runs)
    c = counts(rows)
    sweep_dir = Path(sweep_dir)
    if rows:
        frame = pd.DataFrame([{"step_model": m, **asdict(r)} for m, r in rows])
        frame.to_csv(sweep_dir / "workload_verdicts.csv", index=False)
    gains = []
    for lab in _labels(t, "fasttts/base") if len(t) else []:
        g = t.groupby("step_model", sort=False)[f"fasttts/base{lab}"].agg(["mean", "min", "max"]).dropna()
        gains += [f"{m}{lab}: {x['mean']:.2f}x ({x['min']:.2f}-{x['max']:.2f}x)" for m, x in g.iterrows()]
    notes = (
        "A sensitivity study, not a paper figure: the same search under each simulated workload model "
        "(workload.step_model; docs/verifier_search.md, 'Workload model'). geometric: memoryless steps "
        "(mean step_tokens_mean) and paths (mean steps_per_answer_mean); lognormal / empirical: step lengths "
        "fitted to MATH-500 solutions, a remaining step length that depends on the step's progress, a path "
        "length per problem; lognormal_heavy: the fitted sigma x 1.5. Goodput: precise goodput (tok/s); "
        "fasttts/base: FastTTS over vllm_tts at the same setting (x). The paper's Fig. 12 numbers are judged "
        "once per model (harness.verdict, within 15 %), written to workload_verdicts.csv, not to "
        "verdicts.csv: they are not counted among the paper's.\n\n"
        + ("Gain per model, mean (range): " + "; ".join(gains) + ".\n\n" if gains else "no successful runs.\n\n")
        + "Verdict counts per workload model:\n\n"
        + (c.to_markdown(index=False) if len(c) else "(no paper number at the settings run)")
    )
    write_markdown(
        _blank_nan(t),
        sweep_dir / f"{NAME}.md",
        _title("FastTTS goodput gain and Fig. 12 verdicts under each workload model", df, runs),
        notes,
    )
    _plot(t, _title("FastTTS gain over vllm_tts by workload model", df, runs), sweep_dir)
    return t


def _plot(t: pd.DataFrame, title: str, sweep_dir: Path) -> None:
    """fasttts/base (x) against n, one line per step model and label; the paper's Fig. 12 ratio as a
    dotted line where it has one."""
    if not len(t) or not _labels(t, "fasttts/base"):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(t.groupby(["pair", "dataset"], sort=False))
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8), layout="constrained", squeeze=False)
    for ax, ((pair, dataset), g) in zip(axes[0], groups):
        for lab in _labels(g, "fasttts/base"):
            for model, s in g.groupby("step_model", sort=False):
                s = s.sort_values("n")
                ax.plot(s["n"], s[f"fasttts/base{lab}"], marker="o", label=f"{model}{lab}")
        p = g.drop_duplicates("n").sort_values("n")
        if p["paper fasttts/base"].notna().any():
            ax.plot(p["n"], p["paper fasttts/base"], "k:", marker="x", label="paper Fig. 12")
        xs = sorted(g["n"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
        ax.axhline(1.0, color="grey", linewidth=0.6)
        ax.set_xlabel(N_AXIS)
        ax.set_ylabel("goodput gain fasttts / vllm_tts (x)")
        ax.set_title(f"{pair}, {dataset}", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, sweep_dir, NAME)
