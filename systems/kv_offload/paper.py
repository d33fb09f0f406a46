"""The LBS paper's numbers for one figure (``results/reference/lbs.csv``) and our verdict on each.

A paper number is one row of lbs.csv, or one range: the ``min`` and ``max`` rows of a metric
(``<stem>_min`` / ``<stem>_max``, same config). Its ``bound`` column gives the kind
(``=`` point, ``>=`` / ``<=`` bound, a min/max pair = ``range``; harness/verdict.py). Each report
says what "ours" is for every paper number of its figure (a point, or min..max over the
configurations the paper's number spans); :func:`verdict_rows` makes one ``harness.verdict.Row``
per paper number and source of ours (simulated / measured) with the verdict of the one rule, and
:func:`verdict_table` shows them in the figure's markdown. Fractions are shown in %. The machinery
is harness/paper.py's (shared with the other families); this module names lbs.csv's metrics.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import pandas as pd

from harness import paper as _paper
from harness.paper import PaperNumber, find  # noqa: F401  (the LBS reports' interface)
from harness.verdict import Row

# what each metric of lbs.csv is, in words (a _max metric with an upper bound reads as the metric)
QUANTITY = {
    "kv_share_of_memory": "KV share of memory",
    "io_share": "I/O share of latency",
    "io_share_max": "I/O share of latency",
    "h2d_gib": "host->device volume",
    "speedup": "speedup over layer-wise",
    "speedup_max": "largest speedup over layer-wise",
    "normalised_volume": "volume / layer-wise volume",
    "prefix_reuse_reduction": "volume cut by prefix reuse",
    "total_reduction": "volume reduction, full LBS",
    "io_time_vs_layerwise": "I/O time / layer-wise I/O time",
    "io_time_vs_layerwise_max": "I/O time / layer-wise I/O time",
    "latency_growth_before_offload": "latency growth before the first offload",
}
Ours = Optional[Tuple[Optional[float], Optional[float], str]]  # (lo, hi or None, what ours is)


# lbs.csv's config keys that name the setting a number was measured at -> the reports' column:
# ours is taken only from runs at that setting (harness.paper.in_setting); ``system`` is left to
# each report (a ratio needs the baseline's rows too)
SETTING = {"model": "model", "beams": "beams", "step": "step", "hardware": "hardware", "kv_budget": "kv_budget_bytes"}


def paper_numbers(figure: str) -> List[PaperNumber]:
    """The paper numbers of ``figure`` in lbs.csv's order, each min/max pair as one range."""
    return _paper.numbers("lbs", figure, QUANTITY)


def verdict_rows(
    figure: str, df: pd.DataFrame, ours: Callable[[PaperNumber, pd.DataFrame], Ours], source_file: str
) -> List[Row]:
    """One Row per paper number of ``figure`` and per source of ours in ``df`` (column ``source``):
    ``ours(number, rows of one source)`` returns (lo, hi or None, what ours is) in the CSV's unit,
    or None for no result. ``source_file``: our figure file, relative to the sweep folder."""

    def as_ours(n, d):
        got = ours(n, d)
        return None if got is None else _paper.Ours(*got)

    return _paper.verdict_rows(paper_numbers(figure), df, as_ours, source_file, setting=SETTING)


def verdict_table(rows: List[Row]) -> str:
    """The rows as a markdown table (quantity, ours, paper, verdict, ours is, what ours is)."""
    return _paper.verdict_table(rows, "lbs")
