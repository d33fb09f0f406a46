"""Sweep reports: gather a sweep's records, read the papers' reference numbers, save figures/tables.

An experiment file names ``report: <module.function>``; at multirun end
:class:`harness.callbacks.SweepReport` calls it through :func:`run_report` with ``runs`` from
:func:`gather_runs`. Paper numbers are read from ``results/reference/<paper>.csv`` (columns
figure, config, metric, value, unit, note) and only ever drawn beside ours.

Repeats (``repeats=N``, harness/stats.py): a report is written for one set of runs, one row per job.
When jobs have N >= 2 repeats, :func:`run_report` calls it once per repeat i (``runs`` holding
repeat i's summaries and ``tables_dir`` its tables; :func:`repeat_views`), collecting what it
passes to :func:`write_markdown` and :func:`save_figure`, then once more with the jobs' mean
summaries, and writes each table cell as the mean over repeats and its 95 % interval (``m ± h``)
and draws each line, bar and scatter point of a figure at the mean over repeats with 95 % error
bars. Every number derived from several jobs (a speedup, a ratio) is thus computed per repeat,
paired by seed, before it is averaged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pandas as pd

from harness.family import current_name
from harness.records import RENAMED_SUMMARY_KEYS, atomic_write_bytes, current_summary, records_below
from harness.stats import is_number, mean_ci

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = ROOT / "results" / "reference"
REFERENCE_COLUMNS = ["figure", "config", "metric", "value", "unit", "note"]


def _flatten(prefix: str, obj: Any, out: Dict[str, Any]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, list):
        out[prefix] = json.dumps(obj)
    else:
        out[prefix] = obj


def record_row(rec: Dict[str, Any], run_dir: Path) -> Dict[str, Any]:
    """One flat row for a run.json: status, system, family (as named now: a record written before the
    families' rename says ttc / tts / serving, harness.family.current_name), model, simulated, run_dir, wall_s, finished_at
    (ISO time, UTC), git_sha, git_dirty, config_hash, overrides (the job's command line),
    headline (the key of its first displayed metric), summary.*, config.*, compiled.* (records written
    while the simulators had Cython-compiled twins: module -> compiled | pure)."""
    row: Dict[str, Any] = {
        "status": rec.get("status"),
        "message": rec.get("message", ""),
        "system": rec.get("system"),
        "family": current_name(str(rec.get("family") or (rec.get("config") or {}).get("system", {}).get("family", ""))),
        "model": rec.get("model"),
        "hardware": rec.get("hardware_profile"),
        "simulated": bool(rec.get("backend", {}).get("simulated")),
        "backend": rec.get("backend", {}).get("name"),
        "run_dir": str(run_dir),
        "wall_s": rec.get("wall_s"),
        "finished_at": rec.get("finished_at"),
        "git_sha": (rec.get("git") or {}).get("sha"),
        "git_dirty": (rec.get("git") or {}).get("dirty"),
        "config_hash": rec.get("config_hash"),
        "overrides": " ".join(rec.get("overrides") or []),
        "headline": RENAMED_SUMMARY_KEYS.get(key := (rec.get("headline") or {}).get("key"), key),
        "headline_label": (rec.get("headline") or {}).get("label"),
    }
    _flatten("summary", current_summary(rec.get("summary") or {}), row)
    _flatten("config", rec.get("config", {}), row)
    _flatten("compiled", rec.get("compiled") or {}, row)
    return row


def gather_runs(sweep_dir: Path) -> pd.DataFrame:
    """Every ``run.json`` below ``sweep_dir`` as one row (see :func:`record_row`)."""
    return pd.DataFrame([record_row(rec, folder) for folder, rec in records_below(sweep_dir)])


def load_reference(paper: str, figure: Optional[str] = None) -> pd.DataFrame:
    """The paper's reported numbers (``results/reference/<paper>.csv``), optionally one figure's."""
    path = REFERENCE_DIR / f"{paper}.csv"
    df = pd.read_csv(path, comment="#")
    missing = set(REFERENCE_COLUMNS) - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}; expected {REFERENCE_COLUMNS}")
    if figure is not None:
        df = df[df["figure"] == figure]
    return df.reset_index(drop=True)


def save_figure(fig, sweep_dir: Path, name: str) -> Dict[str, Path]:
    """Save a matplotlib figure as ``<sweep_dir>/<name>.png`` and ``.pdf``, and the numbers drawn in
    it as ``<name>.data.csv`` (:func:`figure_rows`; not ``<name>.csv``, which a sweep's ``summary.csv``
    would meet); returns the three paths.

    Inside :func:`run_report` with repeats: collected per repeat, then saved with its lines, bars
    and scatter points at the mean over repeats and 95 % error bars (:func:`_draw_intervals`)."""
    import matplotlib.pyplot as plt

    if _PASS is not None:
        if _PASS.collecting:
            _PASS.figures.setdefault(name, []).append(_figure_data(fig))
            plt.close(fig)
            return {}
        _draw_intervals(fig, _PASS.figures.get(name, []))
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    import io

    for ext in ("png", "pdf"):  # written whole or not at all (a Ctrl-C leaves no partial file)
        p = sweep_dir / f"{name}.{ext}"
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=130, bbox_inches="tight")
        atomic_write_bytes(p, buf.getvalue())
        paths[ext] = p
    paths["csv"] = sweep_dir / f"{name}.data.csv"  # the numbers behind the figure, as drawn
    atomic_write_bytes(paths["csv"], figure_rows(fig).to_csv(index=False).encode())
    plt.close(fig)
    return paths


FIGURE_COLUMNS = ["axes", "title", "xlabel", "ylabel", "kind", "series", "x", "x_label", "y", "bottom"]


def figure_rows(fig) -> pd.DataFrame:
    """The numbers a figure draws, one row per point (columns :data:`FIGURE_COLUMNS`): per axes
    (index, title, axis labels) its lines (``kind`` line: x, y), bars (``kind`` bar: x = the bar's
    centre, y its height, ``bottom`` where it starts) and scatter points (``kind`` scatter);
    ``series`` is the legend label ('' for none), ``x_label`` the tick label at x (a category's
    name) where there is one. Error-bar caps are left out (with repeats, the drawn means are the
    rows). What ``<figure>.csv`` beside each saved figure holds."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer, ErrorbarContainer

    def label(artist) -> str:
        text = str(artist.get_label() or "")
        return "" if text.startswith("_") else text  # matplotlib's own names (_child0, _nolegend_)

    rows: List[Dict[str, Any]] = []
    for i, ax in enumerate(fig.axes):
        base = {"axes": i, "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel()}
        ticks = {float(t): lab.get_text() for t, lab in zip(ax.get_xticks(), ax.get_xticklabels()) if lab.get_text()}
        caps = {id(ln) for c in ax.containers if isinstance(c, ErrorbarContainer) for ln in c[1]}
        named = {id(c[0]): label(c) for c in ax.containers if isinstance(c, ErrorbarContainer) and c[0] is not None}

        def add(kind: str, series: str, x, y, bottom=None) -> None:
            xl = ticks.get(float(x)) if isinstance(x, (int, float, np.number)) else None
            rows.append({**base, "kind": kind, "series": series, "x": x, "x_label": xl, "y": y, "bottom": bottom})

        for ln in ax.lines:
            if id(ln) not in caps:
                for x, y in zip(ln.get_xdata(), ln.get_ydata()):
                    add("line", named.get(id(ln), label(ln)), x, y)  # an error bar's line: its container's
        for c in ax.containers:
            if isinstance(c, BarContainer):
                for bar in c.patches:
                    add("bar", label(c), bar.get_x() + bar.get_width() / 2, bar.get_height(), bar.get_y())
        for c in ax.collections:
            if isinstance(c, PathCollection):
                for x, y in np.asarray(c.get_offsets(), dtype=float):
                    add("scatter", label(c), x, y)
    return pd.DataFrame(rows, columns=FIGURE_COLUMNS)


def write_markdown(df: pd.DataFrame, path: Path, title: str = "", notes: str = "", floatfmt: str = ",.4g") -> Path:
    """Write a DataFrame as a markdown table (with an optional title and notes) to ``path``, and
    the same table as LaTeX beside it (``<name>.tex``: :func:`latex_table`).

    Inside :func:`run_report` with repeats: collected per repeat, then written with every cell
    as mean ± 95 % half width over the repeats (:func:`combine_tables`), in both files."""
    path = Path(path)
    if _PASS is not None:
        if _PASS.collecting:
            _PASS.tables.setdefault(str(path), []).append(df.copy())
            return path
        df, note = combine_tables(_PASS.tables.get(str(path), []), df, floatfmt)
        notes = f"{notes}\n\n{note}" if notes else note
    path.parent.mkdir(parents=True, exist_ok=True)
    body = df.to_markdown(index=False, floatfmt=floatfmt) if len(df) else "(no rows)"
    text = (f"# {title}\n\n" if title else "") + body + "\n" + (f"\n{notes}\n" if notes else "")
    atomic_write_bytes(path, text.encode())
    atomic_write_bytes(path.with_suffix(".tex"), latex_table(df, title, notes, floatfmt).encode())
    return path


def latex_table(df: pd.DataFrame, title: str = "", notes: str = "", floatfmt: str = ",.4g") -> str:
    """The tables of a :func:`write_markdown` file as booktabs ``tabular`` s for a paper
    (``\\usepackage{booktabs}``): ``df``, then each markdown table in ``notes`` (a report's paper
    numbers beside ours); the title and the notes' text as ``%`` comments (for a caption). The cells
    are the markdown's: ``df`` through the same tabulate call, format ``latex_booktabs`` instead of
    ``pipe`` (pandas' ``to_latex`` formats numbers its own way), a notes table's cells as written;
    LaTeX's special characters escaped."""
    from tabulate import tabulate

    out = [f"% {line}".rstrip() for line in title.strip().splitlines()] if title else []
    out.append("% needs \\usepackage{booktabs}")
    if len(df):
        out.append(tabulate(df, headers="keys", tablefmt="latex_booktabs", showindex=False, floatfmt=floatfmt))
    else:
        out.append("% (no rows)")
    lines = notes.strip().splitlines() if notes else []
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j].lstrip().startswith("|"):
            j += 1
        block = lines[i:j]
        if len(block) >= 2 and _MD_RULE.fullmatch(block[1].strip()):
            cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in block]
            align = ["right" if c.endswith(":") and not c.startswith(":") else "left" for c in cells[1]]
            out += [
                "",
                tabulate(cells[2:], headers=cells[0], tablefmt="latex_booktabs", disable_numparse=True, colalign=align),
            ]
            i = j
        else:
            out.append(f"% {lines[i]}".rstrip())
            i += 1
    return "\n".join(out) + "\n"


_MD_RULE = re.compile(r"\|(\s*:?-+:?\s*\|)+")  # a markdown table's alignment line


# --- labels: every value, column, point and title says simulated or measured, from its own records ---


def source_of(simulated) -> str:
    """Where the values behind one number, column, point or figure come from, by each record's own
    ``backend.simulated`` (a bool or a sequence of them): ``simulated``, ``measured``, or
    ``simulated+measured`` for a mixed set; '' for none."""
    flags = {bool(x) for x in np.atleast_1d(np.asarray(simulated, dtype=object)) if not _missing(x)}
    return {frozenset([True]): "simulated", frozenset([False]): "measured"}.get(
        frozenset(flags), "simulated+measured" if flags else ""
    )


def sim_label(simulated) -> str:
    """Suffix for a value, column or legend entry: `` (sim)``, `` (measured)`` or `` (sim+measured)``
    (then label each value: :func:`label_values`); '' for no runs."""
    src = source_of(simulated)
    return f" ({src.replace('simulated', 'sim')})" if src else ""


def title_label(title: str, simulated) -> str:
    """A table or figure title with the source of everything in it: `` (simulated)``, `` (measured)``
    or `` (simulated and measured: each value labelled)``."""
    src = source_of(simulated)
    if src == "simulated+measured":
        return f"{title} (simulated and measured: each value labelled)"
    return f"{title} ({src})" if src else title


def label_values(values, simulated) -> List[Any]:
    """``values`` (one per run) each followed by its own run's label when the runs mix simulated and
    measured ones; unchanged otherwise (the column or title says it once). Missing values stay missing."""
    flags = list(np.atleast_1d(np.asarray(simulated, dtype=object)))
    if source_of(flags) != "simulated+measured":
        return list(values)
    return [v if _missing(v) else f"{v}{sim_label(bool(f))}" for v, f in zip(values, flags)]


# --- repeats: one report pass per repeat, then tables and figures with 95 % intervals -----------


class _RepeatPasses:
    """What :func:`run_report` collects while a report runs once per repeat."""

    def __init__(self, repeats: int):
        self.repeats = repeats
        self.collecting = True
        self.tables: Dict[str, List[pd.DataFrame]] = {}
        self.figures: Dict[str, List[list]] = {}


_PASS: Optional[_RepeatPasses] = None


def run_report(report: Callable, sweep_dir: Path, runs: pd.DataFrame, cfg) -> Any:
    """Call ``report(sweep_dir, runs, cfg)``; with repeats, once per repeat and once to write
    tables and figures with intervals (module docstring). Returns the last call's return value."""
    global _PASS
    views = repeat_views(runs)
    if not views:
        return report(sweep_dir, runs, cfg)
    _PASS = _RepeatPasses(len(views))
    try:
        for view in views:
            report(sweep_dir, view, cfg)
        _PASS.collecting = False
        return report(sweep_dir, runs, cfg)
    finally:
        _PASS = None


def repeat_views(runs: pd.DataFrame) -> List[pd.DataFrame]:
    """``runs`` once per repeat index i, when some job has >= 2 repeats (else []): each job's
    ``summary.*`` are its repeat i's (NaN where the job has no repeat i, or repeat i ended with
    another status than the job), ``tables_dir`` that repeat's folder and ``repeat`` = i."""
    if runs is None or not len(runs) or "config.repeats" not in runs:
        return []
    n = int(pd.to_numeric(runs["config.repeats"], errors="coerce").fillna(1).max())
    if n < 2:
        return []
    summary_cols = [c for c in runs.columns if c.startswith("summary.")]
    jobs = [_repeat_runs(Path(d)) for d in runs["run_dir"]]
    views = []
    for i in range(n):
        rows, dirs = [], []
        for (_, job), reps in zip(runs.iterrows(), jobs):
            rep = reps[i] if i < len(reps) else None
            row: Dict[str, Any] = {}
            if rep is not None and rep.get("status") == job["status"]:
                _flatten("summary", rep.get("summary", {}), row)
            rows.append(row)
            dirs.append(str(Path(job["run_dir"]) / rep.get("dir", ".")) if rep else job["run_dir"])
        per = pd.DataFrame(rows, index=runs.index)
        view = runs.drop(columns=summary_cols).copy()
        view = pd.concat([view, per.reindex(columns=list(dict.fromkeys(summary_cols + list(per.columns))))], axis=1)
        view["tables_dir"], view["repeat"] = dirs, i
        views.append(view)
    return views


def _repeat_runs(run_dir: Path) -> List[Dict[str, Any]]:
    try:
        return json.loads((run_dir / "run.json").read_text()).get("repeat_runs", [])
    except (OSError, json.JSONDecodeError):
        return []


def read_table(row, name: str) -> pd.DataFrame:
    """A job's parquet table ``name`` for a row of ``runs``: the repeat's own (``tables_dir``) in a
    :func:`repeat_views` row, else the job folder's (repeat 0)."""
    d = row.get("tables_dir") if hasattr(row, "get") else None
    return pd.read_parquet(Path(d if isinstance(d, str) else row["run_dir"]) / f"{name}.parquet")


_NUMBER_WITH_UNIT = re.compile(r"^\s*([-+]?(?:\d[\d,]*)?\.?\d+(?:[eE][-+]?\d+)?)\s*(\S.*)?$")


def combine_tables(reps: List[pd.DataFrame], fallback: pd.DataFrame, floatfmt: str = ",.4g"):
    """One table from the same table computed per repeat: each cell the mean over repeats ``± h``
    (h = half width of the 95 % Student-t interval; ``(n=k)`` when only k repeats have a value); a
    cell equal in every repeat shown once. Text cells "2.31x" / "12 %" are numbers with a unit; other
    text that differs lists each repeat's value. Returns (table, note). Tables whose shape differs
    between repeats cannot be paired: ``fallback`` (the mean-summary table) without intervals."""
    n = len(reps)
    if n == 0:
        return fallback, ""
    if n < 2 or any(r.shape != reps[0].shape or list(r.columns) != list(reps[0].columns) for r in reps):
        return fallback, (
            f"Values from the mean over {n} repeats of each job; no intervals (the table's rows "
            f"differ between repeats)."
        )
    out = reps[0].copy().astype(object)
    for j in range(out.shape[1]):
        for i in range(out.shape[0]):
            out.iat[i, j] = _combine_cell([r.iat[i, j] for r in reps], floatfmt)
    return out, (
        f"Mean over {n} repeats (seeds seed..seed+{n - 1}) ± half width of the 95 % Student-t interval; "
        f"a value without ± was the same in every repeat; (n=k): only k repeats had a value."
    )


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA


def _combine_cell(vals: list, floatfmt: str):
    present = [v for v in vals if not _missing(v)]
    if not present:
        return None
    if len(present) == len(vals) and all(v == present[0] for v in present):
        v = present[0]
        return format(float(v), floatfmt) if isinstance(v, (float, np.floating)) else v
    if all(is_number(v) for v in present):
        return _interval_cell([float(v) for v in present], len(vals), floatfmt, "")
    parsed = [_NUMBER_WITH_UNIT.match(str(v)) for v in present]
    if all(parsed) and len({(m.group(2) or "") for m in parsed}) == 1:
        nums = [float(m.group(1).replace(",", "")) for m in parsed]
        return _interval_cell(nums, len(vals), floatfmt, parsed[0].group(2) or "")
    return " / ".join(str(v) for v in vals)


def _interval_cell(nums: List[float], total: int, floatfmt: str, unit: str) -> str:
    iv = mean_ci(nums)
    sep = "" if unit in ("x", "%") or not unit else " "
    text = format(iv.mean, floatfmt)
    if iv.n >= 2 and iv.half_width > 0:
        text += f" ± {iv.half_width:.2g}"
    text += f"{sep}{unit}" if unit else ""
    return text + (f" (n={iv.n})" if iv.n < total else "")


def _figure_data(fig) -> list:
    """Per axes of ``fig``: its lines (label, x, y), bar containers (x centre, bottom, height per
    bar) and scatter offsets, as drawn for one repeat."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer

    data = []
    for ax in fig.axes:
        data.append(
            {
                "lines": [(ln.get_label(), _floats(ln.get_xdata()), _floats(ln.get_ydata())) for ln in ax.lines],
                "bars": [
                    np.array([[p.get_x() + p.get_width() / 2, p.get_y(), p.get_height()] for p in c.patches])
                    for c in ax.containers
                    if isinstance(c, BarContainer)
                ],
                "scatters": [
                    np.asarray(c.get_offsets(), dtype=float) for c in ax.collections if isinstance(c, PathCollection)
                ],
            }
        )
    return data


def _floats(a) -> Optional[np.ndarray]:
    try:
        return np.asarray(a, dtype=float)
    except (TypeError, ValueError):
        return None  # categorical data: not averaged


def _stack(arrays: list) -> Optional[np.ndarray]:
    """Arrays of equal shape stacked on a new first axis; None when they cannot be paired."""
    if not arrays or any(a is None or a.shape != arrays[0].shape for a in arrays):
        return None
    return np.stack(arrays)


def _mean_half(stacked: np.ndarray):
    """Mean and 95 % half width over axis 0 for every element (NaN half width where n < 2)."""
    flat = stacked.reshape(stacked.shape[0], -1)
    ivs = [mean_ci(flat[:, k]) for k in range(flat.shape[1])]
    shape = stacked.shape[1:]
    return (
        np.array([iv.mean for iv in ivs]).reshape(shape),
        np.nan_to_num(np.array([iv.half_width for iv in ivs]).reshape(shape)),
    )


def _draw_intervals(fig, reps: list) -> None:
    """Move each line / bar / scatter point of ``fig`` (drawn from the mean summaries) to the mean
    over the repeats' figures and add 95 % error bars; elements that differ in structure between
    repeats (another number of points, categorical data) are left as drawn. Says so in the title."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer

    if not reps:
        return
    drawn = False
    for a, ax in enumerate(fig.axes):
        per_ax = [r[a] for r in reps if a < len(r)]
        if len(per_ax) < 2:
            continue
        for k, ln in enumerate(list(ax.lines)):
            got = [p["lines"][k] for p in per_ax if k < len(p["lines"]) and p["lines"][k][0] == ln.get_label()]
            xs, ys = (
                (_stack([g[1] for g in got]), _stack([g[2] for g in got])) if len(got) == len(per_ax) else (None, None)
            )
            if xs is None or ys is None or not ys.size:
                continue
            (xm, xh), (ym, yh) = _mean_half(xs), _mean_half(ys)
            ln.set_data(xm, ym)
            if (yh > 0).any() or (xh > 0).any():
                ax.errorbar(
                    xm,
                    ym,
                    yerr=yh if (yh > 0).any() else None,
                    xerr=xh if (xh > 0).any() else None,
                    fmt="none",
                    ecolor=ln.get_color(),
                    elinewidth=0.9,
                    capsize=2,
                )
                drawn = True
        bars = [c for c in ax.containers if isinstance(c, BarContainer)]
        for k, c in enumerate(bars):
            st = _stack([p["bars"][k] if k < len(p["bars"]) else None for p in per_ax])
            if st is None or len(st[0]) != len(c.patches):
                continue
            mean, half = _mean_half(st)
            for p, (_, bottom, height) in zip(c.patches, mean):
                p.set_y(bottom)
                p.set_height(height)
            if (half[:, 2] > 0).any():
                ax.errorbar(
                    mean[:, 0],
                    mean[:, 1] + mean[:, 2],
                    yerr=half[:, 2],
                    fmt="none",
                    ecolor="k",
                    elinewidth=0.9,
                    capsize=2,
                )
                drawn = True
        scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
        for k, c in enumerate(scatters):
            st = _stack([p["scatters"][k] if k < len(p["scatters"]) else None for p in per_ax])
            if st is None or not st.size:
                continue
            mean, half = _mean_half(st)
            c.set_offsets(mean)
            if (half > 0).any():
                ax.errorbar(
                    mean[:, 0],
                    mean[:, 1],
                    xerr=half[:, 0] if (half[:, 0] > 0).any() else None,
                    yerr=half[:, 1],
                    fmt="none",
                    ecolor="k",
                    elinewidth=0.9,
                    capsize=2,
                )
                drawn = True
    _note_intervals(fig, len(reps), drawn)


def _note_intervals(fig, repeats: int, drawn: bool) -> None:
    note = f"mean of {repeats} repeats" + (", bars: 95 % interval" if drawn else ", equal in every repeat")
    title = next((t for t in fig.texts if fig.get_suptitle() and t.get_text() == fig.get_suptitle()), None)
    if title is None and fig.axes:
        title = fig.axes[0].title
    if title is not None:
        title.set_text(f"{title.get_text()}\n({note})" if title.get_text() else f"({note})")
