"""Does ours reproduce the paper's number? One rule, used by every report and by REPRODUCTION.md.

A paper number is a point (``=``), a bound (``>=``, ``<=``) or a range (``lo..hi``); ours is a point
or a range (a sweep's min..max). The verdict:

- ``reproduced``: a point within +-15 % of the paper's point (relative to the paper's value); inside
  a paper bound (with the same 15 % slack); a point inside the paper's range; a range whose both
  ends are within 15 % of the paper's ends.
- ``partly``: a range of ours that overlaps the paper's (or its 15 % slack) but does not satisfy the
  rule above, or a point within 2 x the tolerance.
- ``not reproduced``: otherwise; ``no result`` when ours is missing (a failed or absent run).

Rates close to 100 % (SLO attainment) are judged in percentage points (``points``: within
:data:`ATTAINMENT_POINTS` pp, ``partly`` within twice that), not relative to the paper's value: 15 %
of 95 % would call 81 % (four times the misses) reproduced.

Every verdict row says whether ours is simulated; a simulated "reproduced" means the simulator
with the stated hardware profile agrees, not that a GPU measured it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

TOLERANCE = 0.15
ATTAINMENT_POINTS = 3.0  # percentage points: the tolerance of rates near 100 % (a metric *_attainment)
VERDICTS = ("reproduced", "partly", "not reproduced", "no result")


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * abs(b) if b != 0 else abs(a) <= tol


def verdict(
    ours: Optional[float],
    paper: float,
    kind: str = "=",
    ours_hi: Optional[float] = None,
    paper_hi: Optional[float] = None,
    tol: float = TOLERANCE,
    points: Optional[float] = None,
) -> str:
    """The verdict (module docstring). ``kind``: ``=`` point, ``>=``/``<=`` bound, ``range``
    (``paper``..``paper_hi``). ``ours_hi``: the upper end when ours is a range. ``points``: judge
    in absolute units instead (a rate in %: within ``points`` percentage points, slack of bounds and
    ranges the same). Raises ValueError for an unknown kind or a range without its upper end."""
    if kind not in ("=", ">=", "<=", "range"):
        raise ValueError(f"kind={kind!r} is not allowed: one of =, >=, <=, range")
    if kind == "range" and _nan(paper_hi):
        raise ValueError("a paper range needs paper_hi")
    if _nan(ours):
        return "no result"
    if points is None:  # relative to the paper's value
        lower, upper = (lambda x: x * (1 - tol)), (lambda x: x * (1 + tol))
        close = lambda a, b: _close(a, b, tol)  # noqa: E731
        near = lambda a, b: abs(a - b) / max(abs(b), 1e-300) <= 2 * tol  # noqa: E731
    else:  # absolute (percentage points of a rate)
        lower, upper = (lambda x: x - points), (lambda x: x + points)
        close = lambda a, b: abs(a - b) <= points  # noqa: E731
        near = lambda a, b: abs(a - b) <= 2 * points  # noqa: E731
    lo_o, hi_o = float(ours), float(ours if _nan(ours_hi) else ours_hi)
    if kind == ">=":
        return "reproduced" if lo_o >= lower(paper) else "partly" if hi_o >= lower(paper) else "not reproduced"
    if kind == "<=":
        return "reproduced" if hi_o <= upper(paper) else "partly" if lo_o <= upper(paper) else "not reproduced"
    p_lo, p_hi = (paper, paper) if kind == "=" else (paper, float(paper_hi))
    if lo_o == hi_o:  # a point of ours
        if kind == "range" and lower(p_lo) <= lo_o <= upper(p_hi):
            return "reproduced"
        if kind == "=" and close(lo_o, p_lo):
            return "reproduced"
        return "partly" if near(lo_o, p_lo) or near(lo_o, p_hi) else "not reproduced"
    if close(lo_o, p_lo) and close(hi_o, p_hi):
        return "reproduced"
    overlap = lo_o <= upper(p_hi) and hi_o >= lower(p_lo)
    return "partly" if overlap else "not reproduced"


@dataclass
class Row:
    """One paper number beside ours, as written to a sweep's ``verdicts.csv``."""

    paper: str  # lbs | fasttts | beam
    figure: str  # the paper's figure/table, e.g. fig9
    quantity: str  # what is compared, in words
    paper_value: float
    kind: str = "="  # = | >= | <= | range
    paper_hi: Optional[float] = None
    ours: Optional[float] = None
    ours_hi: Optional[float] = None
    unit: str = ""
    simulated: bool = True
    source: str = ""  # the figure/table file of ours, relative to the sweep dir
    note: str = ""
    points: Optional[float] = None  # judged in absolute units (percentage points for rates), else relative
    verdict: str = field(default="")

    def __post_init__(self):
        self.verdict = verdict(self.ours, self.paper_value, self.kind, self.ours_hi, self.paper_hi, points=self.points)


def write(sweep_dir, rows: List[Row]) -> Path:
    """Write ``<sweep_dir>/verdicts.csv`` (one row per paper number)."""
    import pandas as pd

    p = Path(sweep_dir) / "verdicts.csv"
    p.parent.mkdir(parents=True, exist_ok=True)
    from harness.records import atomic_write_bytes  # whole or not at all: reproduce collects it

    atomic_write_bytes(p, pd.DataFrame([asdict(r) for r in rows]).to_csv(index=False).encode())
    return p


def fmt_range(lo, hi=None, unit: str = "", digits: int = 3) -> str:
    """``5.26-14.6 x``, ``97.2 %`` or ``50,784-52,538 GiB`` for tables (``digits`` significant digits,
    whole numbers from 1,000 on); one value when both ends read the same; empty for a missing value;
    "not reached" for an infinite one (a threshold the runs never crossed, e.g. the offered load at
    which every system misses its SLO: BEAM Fig. 9 printed "inf tokens/s")."""
    if _nan(lo):
        return ""
    if math.isinf(float(lo)):
        return "not reached" if float(lo) > 0 else "reached from the start"
    f = lambda v: f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}g}"
    s = f(lo) if _nan(hi) or f(hi) == f(lo) else f"{f(lo)}-{f(hi)}"
    return f"{s} {unit}".strip()


__all__ = ["verdict", "Row", "write", "fmt_range", "TOLERANCE", "ATTAINMENT_POINTS", "VERDICTS"]
