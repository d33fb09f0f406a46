"""Answer grading for Top-1 and Pass@N (FastTTS §5) with the maintained ``math-verify`` library.

A path's final answer is its last ``\\boxed{...}`` (or ``\\fbox{...}``); a path without one has no
answer and is wrong. Correctness is math-verify's symbolic / numeric equivalence of that answer
with the data set's reference answer (``verify(gold, prediction)``: "0.5" equals
``\\boxed{\\frac{1}{2}}``, AMC's "27.0" equals ``\\boxed{27}``), never string match.

Per problem, over its completed paths (``texts`` decoded without special tokens, ``scores`` the
per-step PRM scores of each path):

- **Top-1** follows search-and-learn's PRM-weighted convention (``pred_weighted``): each path's
  score is its *last-step* score (``agg_strategy=last``); paths are grouped by their normalised
  answer and the answer whose paths' scores sum highest is the prediction (ties: the answer seen
  first in rank order). Paths without an answer do not vote. ``top1_naive`` is the answer of the
  single path with the highest last-step score (search-and-learn ``pred_naive``).
- **Pass@N**: the N = ``n`` paths ranked highest by last-step score (all of them when fewer
  completed); correct if any of them is correct.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence

_BOX = ("\\boxed", "\\fbox")


def _timeout() -> Optional[int]:
    # math-verify times parsing out with signal.alarm, which only works in the main thread
    return 5 if threading.current_thread() is threading.main_thread() else None


def extract_answer(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` of ``text`` (nested braces kept;
    boxes separated only by "and"/"," are joined with ","), or None when the text has no closed box."""
    from latex2sympy2_extended.math_normalization import extract_boxed_content
    if not any(b in text for b in _BOX):
        return None
    ans = extract_boxed_content(text, mode="last")
    if ans == text or (ans.startswith("{") and "}" not in ans):     # no box or an unclosed one
        return None
    return ans


def parse_gold(answer: str):
    """math-verify parse of a reference answer (plain number, expression or LaTeX)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    return parse(f"${answer}$", [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=_timeout())


def is_correct(text: str, gold) -> bool:
    """Whether the last boxed answer of ``text`` is equivalent to ``gold`` (a reference answer string
    or a :func:`parse_gold` result). False without a boxed answer or when it does not parse."""
    from math_verify import LatexExtractionConfig, parse, verify
    ans = extract_answer(text)
    if ans is None:
        return False
    if isinstance(gold, str):
        gold = parse_gold(gold)
    pred = parse("\\boxed{" + ans + "}", [LatexExtractionConfig(boxed_match_priority=0)],
                 parsing_timeout=_timeout())
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=_timeout()))


def answer_key(answer: str) -> str:
    """Normalised answer text used to group paths for the PRM-weighted vote."""
    from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex
    cfg = NormalizationConfig(basic_latex=True, units=True, malformed_operators=True, nits=True,
                              boxed="none", equations=False)
    return normalize_latex(answer, cfg).replace(" ", "")


@dataclass
class Graded:
    """One problem's grades. ``top1_answer``: the predicted answer text (None: no path answered)."""
    top1_correct: bool
    top1_naive_correct: bool
    pass_at_n: bool
    top1_answer: Optional[str]
    paths: int                 # completed paths graded
    answered: int              # paths with a boxed answer
    correct: int               # paths whose answer is correct


def grade_problem(texts: Sequence[str], scores: Sequence[Sequence[float]], gold: str, n: int) -> Graded:
    """Grade one problem's completed paths (see module docstring).

    Args: ``texts`` decoded path texts; ``scores[i]`` per-step scores of path i (last one used; an
        empty list counts as 0); ``gold`` the reference answer; ``n`` the search budget N.
    Returns: :class:`Graded`. Raises ValueError if ``texts`` and ``scores`` differ in length or n < 1."""
    if len(texts) != len(scores):
        raise ValueError(f"{len(texts)} texts but {len(scores)} score lists")
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    g = parse_gold(gold)
    last = [float(s[-1]) if len(s) else 0.0 for s in scores]
    order = sorted(range(len(texts)), key=lambda i: -last[i])          # stable: ties keep path order
    answers = [extract_answer(t) for t in texts]
    ok = [answers[i] is not None and is_correct(texts[i], g) for i in range(len(texts))]
    sums: dict = {}
    first: dict = {}
    for rank, i in enumerate(order):
        if answers[i] is None:
            continue
        k = answer_key(answers[i])
        sums[k] = sums.get(k, 0.0) + last[i]
        first.setdefault(k, (rank, i))
    if sums:
        best = min(sums, key=lambda k: (-sums[k], first[k][0]))
        top_i = first[best][1]
        top1_answer, top1 = answers[top_i], ok[top_i]
    else:
        top1_answer, top1 = None, False
    return Graded(top1_correct=top1, top1_naive_correct=bool(order) and ok[order[0]],
                  pass_at_n=any(ok[i] for i in order[:n]), top1_answer=top1_answer, paths=len(texts),
                  answered=sum(a is not None for a in answers), correct=sum(ok))


def mean_or_none(values: List[bool]) -> Optional[float]:
    return float(sum(values) / len(values)) if values else None
