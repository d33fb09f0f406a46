"""The LBS paper's numbers for one figure (``results/reference/lbs.csv``) and our verdict on each.

A paper number is one row of lbs.csv, or one range: the ``min`` and ``max`` rows of a metric
(``<stem>_min`` / ``<stem>_max``, same config). Its ``bound`` column gives the kind
(``=`` point, ``>=`` / ``<=`` bound, a min/max pair = ``range``; harness/verdict.py). Each report
says what "ours" is for every paper number of its figure (a point, or min..max over the
configurations the paper's number spans); :func:`verdict_rows` makes one ``harness.verdict.Row``
per paper number and source of ours (simulated / measured) with the verdict of the one rule, and
:func:`verdict_table` shows them in the figure's markdown. Fractions are shown in %.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import pandas as pd

from harness.verdict import TOLERANCE, Row, fmt_range, verdict

# what each metric of lbs.csv is, in words (a _max metric with an upper bound reads as the metric)
QUANTITY = {"kv_share_of_memory": "KV share of memory", "io_share": "I/O share of latency",
            "io_share_max": "I/O share of latency", "h2d_gib": "host->device volume",
            "speedup": "speedup over layer-wise", "speedup_max": "largest speedup over layer-wise",
            "normalised_volume": "volume / layer-wise volume", "prefix_reuse_reduction": "volume cut by prefix reuse",
            "total_reduction": "volume reduction, full LBS", "io_time_vs_layerwise": "I/O time / layer-wise I/O time",
            "io_time_vs_layerwise_max": "I/O time / layer-wise I/O time",
            "latency_growth_before_offload": "latency growth before the first offload"}
Ours = Optional[Tuple[Optional[float], Optional[float], str]]      # (lo, hi or None, what ours is)


@dataclass(frozen=True)
class PaperNumber:
    """One number of the paper (a point, a bound or a range), in the CSV's own unit."""
    figure: str
    metric: str                     # the CSV metric; for a range its stem (speedup for speedup_min/_max)
    config: Tuple[Tuple[str, str], ...]
    kind: str                       # = | >= | <= | range
    value: float
    value_hi: Optional[float]
    unit: str                       # fraction | x | GiB
    note: str

    @property
    def cfg(self) -> Dict[str, str]:
        return dict(self.config)

    @property
    def scale(self) -> float:
        """Factor from the CSV's unit to the shown one (fractions in %)."""
        return 100.0 if self.unit == "fraction" else 1.0

    @property
    def shown_unit(self) -> str:
        return "%" if self.unit == "fraction" else self.unit

    @property
    def quantity(self) -> str:
        what = QUANTITY.get(self.metric, self.metric.replace("_", " "))
        where = ", ".join(f"{k}={v}" for k, v in self.config)
        return f"{what} ({where})" if where else what

    def matches(self, metric: str, **conds) -> bool:
        """Same metric, and every condition given agrees with the config where the config names it;
        ``model`` and ``system``, when given, must be named."""
        c = self.cfg
        return (self.metric == metric and all(str(c[k]) == str(v) for k, v in conds.items() if k in c)
                and all(k in c for k in conds if k in ("model", "system")))

    def text(self) -> str:
        """The paper's value as shown: ``> 55 %``, ``3.39-9.72 x``, ``2,052 GiB``."""
        s = self.scale
        sign = {">=": "> ", "<=": "< "}.get(self.kind, "")
        return sign + fmt_range(self.value * s, None if self.value_hi is None else self.value_hi * s, self.shown_unit)

    def judge(self, lo: Optional[float], hi: Optional[float] = None) -> str:
        """The verdict (harness/verdict.py) of ours ``lo`` (..``hi``), given in the CSV's unit."""
        s = self.scale
        return verdict(None if lo is None else lo * s, self.value * s, self.kind,
                       None if hi is None else hi * s, None if self.value_hi is None else self.value_hi * s)


def paper_numbers(figure: str) -> List[PaperNumber]:
    """The paper numbers of ``figure`` in lbs.csv's order, each min/max pair as one range."""
    from harness.report import load_reference
    ref = load_reference("lbs", figure)
    out, pending = [], {}
    for _, r in ref.iterrows():
        config = tuple(tuple(x.split("=", 1)) for x in str(r["config"]).split(";") if "=" in x)
        note = "" if pd.isna(r["note"]) else str(r["note"])
        bound = str(r["bound"])
        if bound in ("min", "max"):
            stem = str(r["metric"]).rsplit("_", 1)[0]
            pending.setdefault((stem, config), {})[bound] = (float(r["value"]), note, str(r["unit"]))
            got = pending[(stem, config)]
            if len(got) == 2:
                out.append(PaperNumber(figure, stem, config, "range", got["min"][0], got["max"][0], got["min"][2],
                                       got["min"][1] or got["max"][1]))
            continue
        if bound not in ("=", ">=", "<="):
            raise ValueError(f"results/reference/lbs.csv: bound={bound!r} for {figure} {r['metric']}; "
                             f"allowed: =, >=, <=, min, max")
        out.append(PaperNumber(figure, str(r["metric"]), config, bound, float(r["value"]), None, str(r["unit"]), note))
    unpaired = [k for k, v in pending.items() if len(v) == 1]
    if unpaired:
        raise ValueError(f"results/reference/lbs.csv: {figure}: a min or max row without its pair: {unpaired}")
    return out


def find(nums: List[PaperNumber], metric: str, **conds) -> Optional[PaperNumber]:
    """The first paper number of ``metric`` whose config agrees with ``conds`` (:meth:`PaperNumber.matches`)."""
    return next((n for n in nums if n.matches(metric, **conds)), None)


def verdict_rows(figure: str, df: pd.DataFrame, ours: Callable[[PaperNumber, pd.DataFrame], Ours],
                 source_file: str) -> List[Row]:
    """One Row per paper number of ``figure`` and per source of ours in ``df`` (column ``source``):
    ``ours(number, rows of one source)`` returns (lo, hi or None, what ours is) in the CSV's unit,
    or None for no result. ``source_file``: our figure file, relative to the sweep folder."""
    sources = sorted(df["source"].dropna().unique()) if len(df) else []
    rows = []
    for src in sources or ["simulated"]:
        d = df[df["source"] == src]
        for n in paper_numbers(figure):
            got = ours(n, d) if len(d) else None
            lo, hi, what = got if got is not None else (None, None, "no run gives this value")
            lo = None if lo is None or pd.isna(lo) else float(lo)
            hi = None if hi is None or pd.isna(hi) or hi == lo else float(hi)
            s = n.scale
            rows.append(Row("lbs", figure, n.quantity, n.value * s, n.kind,
                            None if n.value_hi is None else n.value_hi * s,
                            ours=None if lo is None else lo * s, ours_hi=None if hi is None else hi * s,
                            unit=n.shown_unit, simulated=src == "simulated", source=source_file,
                            note="; ".join(x for x in (f"ours: {what}" if what else "", n.note) if x)))
    return rows


def verdict_table(rows: List[Row]) -> str:
    """The rows as a markdown table (quantity, ours, paper, verdict, ours is, what ours is)."""
    sign = {">=": "> ", "<=": "< "}
    t = pd.DataFrame([{"paper number": r.quantity, "ours": fmt_range(r.ours, r.ours_hi, r.unit) or "n/a",
                       "paper": sign.get(r.kind, "") + fmt_range(r.paper_value, r.paper_hi, r.unit),
                       "verdict": r.verdict, "ours is": "simulated" if r.simulated else "measured",
                       "note": r.note} for r in rows])
    tol = round(100 * TOLERANCE)
    head = (f"Paper numbers (results/reference/lbs.csv) and the verdict of harness/verdict.py (within {tol} % of "
            f"a point; inside a bound or range with {tol} % slack; 'partly': a range of ours that overlaps, or a "
            f"point within {2 * tol} %):")
    return head + "\n\n" + (t.to_markdown(index=False) if len(t) else "(no paper numbers)")
