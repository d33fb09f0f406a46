"""A paper's reported numbers for one figure (``results/reference/<paper>.csv``) and our verdict on
each, for every family's reports (systems/kv_offload/paper.py, systems/energy_serving/paper.py).

A paper number is one row of the CSV, or one range: a metric's ``<stem>_min`` and ``<stem>_max``
rows with the same config. The ``bound`` column gives its kind: ``=`` a point, ``>=`` / ``<=`` a
bound, ``min`` / ``max`` the two ends of a range (harness/verdict.py). Unit ``bool`` marks a
qualitative claim: 1 = it holds (ours is then 1 or 0, by a test the report states). Fractions are
shown in %. A report gives :class:`Ours` for every paper number of its figure; :func:`verdict_rows`
makes one :class:`harness.verdict.Row` per paper number and source of ours (simulated / measured)
with the verdict of the one rule, and :func:`verdict_table` shows them in the report's markdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import pandas as pd

from harness.units import parse_size
from harness.verdict import ATTAINMENT_POINTS, TOLERANCE, Row, fmt_range, verdict

BOOL_UNIT = "(1 = holds)"


@dataclass(frozen=True)
class PaperNumber:
    """One number of a paper (a point, a bound or a range), in the CSV's own unit."""

    paper: str  # lbs | fasttts | beam
    figure: str
    metric: str  # the CSV metric; for a range its stem (speedup for speedup_min/_max)
    config: Tuple[Tuple[str, str], ...]
    kind: str  # = | >= | <= | range
    value: float
    value_hi: Optional[float]
    unit: str  # fraction | x | GiB | % | ms | bool | ...
    note: str
    what: str  # the metric in words

    @property
    def cfg(self) -> Dict[str, str]:
        return dict(self.config)

    @property
    def scale(self) -> float:
        """Factor from the CSV's unit to the shown one (fractions in %)."""
        return 100.0 if self.unit == "fraction" else 1.0

    @property
    def points(self) -> Optional[float]:
        """The absolute tolerance, in the shown unit, of a rate near 100 % (``*_attainment``: percentage
        points, harness/verdict.py); None: the relative one."""
        return ATTAINMENT_POINTS if self.metric.endswith("_attainment") and self.unit in ("fraction", "%") else None

    @property
    def shown_unit(self) -> str:
        return {"fraction": "%", "bool": BOOL_UNIT}.get(self.unit, self.unit)

    @property
    def quantity(self) -> str:
        where = ", ".join(f"{k}={v}" for k, v in self.config)
        return f"{self.what} ({where})" if where else self.what

    def matches(self, metric: str, **conds) -> bool:
        """Same metric, and every condition given agrees with the config where the config names it
        (:func:`_agrees`: as text, number or byte size); ``model`` and ``system``, when given, must be named."""
        c = self.cfg
        return (
            self.metric == metric
            and all(_agrees(v, c[k]) for k, v in conds.items() if k in c)
            and all(k in c for k in conds if k in ("model", "system"))
        )

    def text(self) -> str:
        """The paper's value as shown: ``> 55 %``, ``3.39-9.72 x``, ``2,052 GiB``."""
        s = self.scale
        sign = {">=": "> ", "<=": "< "}.get(self.kind, "")
        return sign + fmt_range(self.value * s, None if self.value_hi is None else self.value_hi * s, self.shown_unit)

    def judge(self, lo: Optional[float], hi: Optional[float] = None) -> str:
        """The verdict (harness/verdict.py) of ours ``lo`` (..``hi``), given in the CSV's unit."""
        s = self.scale
        return verdict(
            None if lo is None else lo * s,
            self.value * s,
            self.kind,
            None if hi is None else hi * s,
            None if self.value_hi is None else self.value_hi * s,
            points=self.points,
        )


@dataclass
class Ours:
    """Our value for a paper number, in the CSV's unit: ``lo`` (..``hi`` for a range over runs),
    what it is (``what``: which runs, which test), and ``simulated`` when it differs from the
    source of the runs it came from (a decision time measured on this CPU inside a simulated run)."""

    lo: Optional[float]
    hi: Optional[float] = None
    what: str = ""
    simulated: Optional[bool] = None


def numbers(paper: str, figure: str, names: Dict[str, str]) -> List[PaperNumber]:
    """The paper numbers of ``figure`` in the CSV's order, each min/max pair as one range; ``names``:
    metric -> what it is in words. Raises ValueError for an unknown bound or an unpaired min/max."""
    from harness.report import load_reference

    out, pending = [], {}
    csv = f"results/reference/{paper}.csv"
    for _, r in load_reference(paper, figure).iterrows():
        config = tuple(tuple(x.split("=", 1)) for x in str(r["config"]).split(";") if "=" in x)
        note = "" if pd.isna(r["note"]) else str(r["note"])
        bound = str(r["bound"])
        if bound in ("min", "max"):
            stem = str(r["metric"]).rsplit("_", 1)[0]
            got = pending.setdefault((stem, config), {})
            got[bound] = (float(r["value"]), note, str(r["unit"]))
            if len(got) == 2:
                out.append(
                    PaperNumber(
                        paper,
                        figure,
                        stem,
                        config,
                        "range",
                        got["min"][0],
                        got["max"][0],
                        got["min"][2],
                        got["min"][1] or got["max"][1],
                        names.get(stem, stem.replace("_", " ")),
                    )
                )
            continue
        if bound not in ("=", ">=", "<="):
            raise ValueError(f"{csv}: bound={bound!r} for {figure} {r['metric']}; allowed: =, >=, <=, min, max")
        metric = str(r["metric"])
        out.append(
            PaperNumber(
                paper,
                figure,
                metric,
                config,
                bound,
                float(r["value"]),
                None,
                str(r["unit"]),
                note,
                names.get(metric, metric.replace("_", " ")),
            )
        )
    unpaired = [k for k, v in pending.items() if len(v) == 1]
    if unpaired:
        raise ValueError(f"{csv}: {figure}: a min or max row without its pair: {unpaired}")
    return out


def find(nums: List[PaperNumber], metric: str, **conds) -> Optional[PaperNumber]:
    """The first paper number of ``metric`` whose config agrees with ``conds`` (:meth:`PaperNumber.matches`)."""
    return next((n for n in nums if n.matches(metric, **conds)), None)


def _agrees(cell, value: str) -> bool:
    """A table cell agrees with a paper config value: equal as text, as numbers, or as byte sizes
    (``7GiB`` against a ``*_bytes`` column); a value ``a,b`` (the paper's runs on several devices)
    agrees with either."""
    for v in str(value).split(","):
        if str(cell) == v:
            return True
        try:
            if float(cell) == float(v):
                return True
        except (TypeError, ValueError):
            try:
                if float(cell) == parse_size(v):
                    return True
            except (TypeError, ValueError):
                pass
    return False


def _in_order(values) -> list:
    """Values numerically ordered when they all are numbers (4, 16, not '16', '4'), else as text."""
    try:
        return sorted(values, key=float)
    except (TypeError, ValueError):
        return sorted(values, key=str)


def _shown(cell, like: str) -> str:
    """A cell as the paper's config writes its value: bytes as GiB where the paper gives a size
    (``4GiB``, not ``4294967296``), whole numbers without ``.0``."""
    try:
        float(like)
    except ValueError:
        try:
            parse_size(like)
            return f"{float(cell) / 2**30:g}GiB"
        except (TypeError, ValueError):
            return str(cell)
    try:
        return f"{float(cell):g}"
    except (TypeError, ValueError):
        return str(cell)


def in_setting(n: PaperNumber, d: pd.DataFrame, setting: Dict[str, str]) -> Tuple[pd.DataFrame, str]:
    """The rows of ``d`` run at the paper number's own setting: for every config key of ``n`` that
    ``setting`` maps to a column of ``d`` (config key -> column: model, beams, step, hardware, ...),
    the rows whose value agrees (:func:`_agrees`). Returns (those rows, '' or why none is left:
    the paper's setting and the values this sweep has). A key the table lacks is not filtered."""
    keep = pd.Series(True, index=d.index)
    each = {}
    for key, col in setting.items():
        if key in n.cfg and col in d.columns:
            each[key] = d[col].map(lambda c, v=n.cfg[key]: _agrees(c, v))
            keep &= each[key]
    if not each or keep.any():
        return d[keep], ""
    wanted = [k for k, ok in each.items() if not ok.any()] or list(each)  # the keys no run agrees with
    have = "; ".join(
        f"{k}=" + ",".join(_shown(x, n.cfg[k]) for x in _in_order(d[setting[k]].dropna().unique())) for k in wanted
    )
    return d[keep], (
        f"no run at the paper's setting ({', '.join(f'{k}={n.cfg[k]}' for k in wanted)}); this sweep has {have}"
    )


def verdict_rows(
    nums: List[PaperNumber],
    df: pd.DataFrame,
    ours: Callable[[PaperNumber, pd.DataFrame], Optional[Ours]],
    source_file: str,
    source_col: str = "source",
    setting: Optional[Dict[str, str]] = None,
) -> List[Row]:
    """One Row per paper number in ``nums`` and per source of ours in ``df[source_col]`` (simulated |
    measured): ``ours(number, rows of one source)``, None for no result. ``source_file``: our figure
    or table file, relative to the sweep folder. ``setting`` (config key -> column of ``df``): ours
    is given only the rows run at the number's own setting (:func:`in_setting`), so a 32-beam run is
    never judged against the paper's 64-beam number; with none left the verdict is 'no result' and
    the note says which setting was missing."""
    sources = sorted(df[source_col].dropna().unique()) if len(df) else []
    rows = []
    for src in sources or ["simulated"]:
        d = df[df[source_col] == src] if len(df) else df
        for n in nums:
            dn, missing = in_setting(n, d, setting or {}) if len(d) else (d, "")
            o = (ours(n, dn) if len(dn) else None) or Ours(None, what=missing or "no run gives this value")
            lo = None if o.lo is None or pd.isna(o.lo) else float(o.lo)
            hi = None if o.hi is None or pd.isna(o.hi) or lo is None or o.hi == lo else float(o.hi)
            s = n.scale
            sim = (src == "simulated") if o.simulated is None else bool(o.simulated)
            rows.append(
                Row(
                    n.paper,
                    n.figure,
                    n.quantity,
                    n.value * s,
                    n.kind,
                    None if n.value_hi is None else n.value_hi * s,
                    ours=None if lo is None else lo * s,
                    ours_hi=None if hi is None else hi * s,
                    unit=n.shown_unit,
                    simulated=sim,
                    source=source_file,
                    note="; ".join(x for x in (f"ours: {o.what}" if o.what else "", n.note) if x),
                    points=n.points,
                )
            )
    return rows


def verdict_table(rows: List[Row], paper: str) -> str:
    """The rows as a markdown section (quantity, ours, paper, verdict, ours is, note)."""
    sign = {">=": "> ", "<=": "< "}
    t = pd.DataFrame(
        [
            {
                "paper number": r.quantity,
                "ours": fmt_range(r.ours, r.ours_hi, r.unit) or "n/a",
                "paper": sign.get(r.kind, "") + fmt_range(r.paper_value, r.paper_hi, r.unit),
                "verdict": r.verdict,
                "ours is": "simulated" if r.simulated else "measured",
                "note": r.note,
            }
            for r in rows
        ]
    )
    tol = round(100 * TOLERANCE)
    head = (
        f"Paper numbers (results/reference/{paper}.csv) and the verdict of harness/verdict.py (within {tol} % "
        f"of a point; inside a bound or range with {tol} % slack; 'partly': a range of ours that overlaps, or a "
        f"point within {2 * tol} %; an SLO attainment within {ATTAINMENT_POINTS:g} percentage points, 'partly' "
        f"within {2 * ATTAINMENT_POINTS:g}):"
    )
    return head + "\n\n" + (t.to_markdown(index=False) if len(t) else "(no paper numbers)")
