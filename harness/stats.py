"""Means and 95 % confidence intervals over repeats of a job (``repeats=N``).

How an interval is computed: for the N values x_1..x_N of one metric (one per repeat, each with its
own seed; repeats that failed or left the metric out are dropped, n = how many remain),

    mean = sum(x_i) / n
    s    = sqrt(sum((x_i - mean)^2) / (n - 1))          (sample standard deviation)
    half = t_{0.975, n-1} * s / sqrt(n)                   (Student t quantile, scipy.special.stdtrit)
    95 % interval = [mean - half, mean + half]

the textbook interval for the mean of n independent, roughly normal measurements (e.g. Montgomery &
Runger, *Applied Statistics and Probability for Engineers*, Sec. 8.2). With n = 1 there is no
interval (half width NaN); a metric equal in every repeat has half width 0. Seeds of the repeats are
``seed, seed + 1, ..., seed + N - 1`` (:func:`repeat_seeds`), so repeat i of every job of a sweep
shares its seed and ratios between jobs can be taken repeat by repeat (paired).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from numbers import Real
from typing import Any, Dict, List, Sequence, Tuple

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """Mean and 95 % Student-t interval of one metric over n repeats (units of the metric)."""

    mean: float
    lo: float
    hi: float
    half_width: float  # NaN when n < 2
    n: int

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def repeat_seeds(seed: int, repeats: int) -> List[int]:
    """The seed of each repeat: ``seed + i`` for i in 0..repeats-1 (distinct, recorded)."""
    return [int(seed) + i for i in range(int(repeats))]


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student t quantile ``t_{(1+confidence)/2, df}`` (df >= 1); 4.303 for df = 2."""
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.5 + confidence / 2))


def mean_ci(values: Sequence[Any], confidence: float = CONFIDENCE) -> Interval:
    """:class:`Interval` of the finite numbers in ``values`` (None / NaN dropped).

    n = 0 gives NaN everywhere; n = 1 the value with a NaN half width; identical values a zero
    half width (no t quantile needed)."""
    xs = [float(v) for v in values if is_number(v) and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan, 0)
    mean = math.fsum(xs) / n
    if n == 1:
        return Interval(mean, mean, mean, math.nan, 1)
    if all(x == xs[0] for x in xs):
        return Interval(xs[0], xs[0], xs[0], 0.0, n)
    s = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(n - 1, confidence) * s / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, half, n)


def is_number(v: Any) -> bool:
    """A real number that is not a bool (True/False are flags, not measurements)."""
    return isinstance(v, Real) and not isinstance(v, bool)


def aggregate(summaries: Sequence[Dict[str, Any]]) -> Tuple[Dict[str, Any], Dict[str, Dict[str, Any]]]:
    """Combine the summaries of a job's repeats into (summary, intervals).

    summary: per key, a value equal in every repeat that has the key stays as it is (exactly, ints
    stay ints); numbers that differ become their mean; anything else that differs (strings, lists)
    becomes None (each repeat's own value stays in the record's ``repeat_runs``).
    intervals: per numeric key, :meth:`Interval.as_dict` (mean, lo, hi, half_width, n).
    """
    keys = list(dict.fromkeys(k for s in summaries for k in s))
    summary: Dict[str, Any] = {}
    intervals: Dict[str, Dict[str, Any]] = {}
    for k in keys:
        vals = [s[k] for s in summaries if k in s]
        nums = [v for v in vals if v is not None]
        if nums and all(is_number(v) for v in nums):
            iv = mean_ci(nums)
            intervals[k] = iv.as_dict()
            summary[k] = nums[0] if all(v == nums[0] for v in nums) else iv.mean
        else:
            summary[k] = vals[0] if all(v == vals[0] for v in vals) else None
    return summary, intervals
