"""Answer grading for Top-1 and Pass@N (FastTTS §5) by the MATH / search-and-learn convention.

**Extraction** (MATH ``last_boxed_only_string``): a path's answer is the content of its *last*
``\\boxed{...}`` or ``\\fbox{...}``, braces balanced (escaped ``\\{`` ``\\}`` do not count); never two
boxes joined. ``\\boxed 7`` (no braces) is the one token after the space, trailing punctuation
dropped. A path whose last box is not closed, or without a box, has no answer and is wrong.

**Equivalence** (:func:`equivalent`, symmetric): both answers are first normalised the same way
(MATH ``strip_string``: ``%``, ``^\\circ``, ``\\$``, spacing commands, a trailing ``\\text{ unit}``, a
``x =`` prefix, a trailing period; a whole-answer ``\\text{...}`` is unwrapped); equal strings are
equal. Otherwise both are parsed with ``math-verify``: two numbers are equal when both are integers
and identical, else when their relative difference is at most 1e-4 (search-and-learn's
``math_equal`` tolerance), so values that differ by a factor of 2 are never equal however small
(math-verify alone rounds to 6 decimals and calls 2/5^40 and 2/5^41 equal); anything else is
math-verify's symbolic ``verify``, in either order.

Per problem, over its completed paths (``texts`` decoded without special tokens, ``scores`` the
per-step PRM scores of each path):

- **Top-1** follows search-and-learn's PRM-weighted vote (``pred_weighted``): each path weighs its
  *last-step* score (``agg_strategy=last``); paths are grouped by :func:`equivalent` answers (one
  representative per group: its best-scored path's answer) and the group whose scores sum highest
  wins (ties: the group whose best path ranks first). Paths without an answer do not vote.
  ``top1_naive`` is the answer of the single path with the highest last-step score (``pred_naive``).
- **Pass@N**: the N = ``n`` paths ranked highest by last-step score (all of them when fewer
  completed); correct if any of them is correct.
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence

_BOX = re.compile(r"\\(?:boxed|fbox)")
REL_TOL = 1e-4


def _timeout() -> Optional[int]:
    # math-verify times parsing out with signal.alarm, which only works in the main thread
    return 5 if threading.current_thread() is threading.main_thread() else None


def extract_answer(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` of ``text`` (see
    module docstring), or None when there is no box or the last one is not closed."""
    boxes = list(_BOX.finditer(text))
    if not boxes:
        return None
    i = boxes[-1].end()
    if text.startswith(" ", i) and not text[i:].lstrip().startswith("{"):  # \boxed 7
        m = re.match(r"\s+([^\s$]+)", text[i:])
        return m.group(1).rstrip(".,;:") or None if m else None
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, start = 0, i + 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2  # escaped brace or command
            continue
        depth += (c == "{") - (c == "}")
        if depth == 0:
            return text[start:i]
        i += 1
    return None


_UNIT = re.compile(r"^(.+?)\s*\\(?:text|mbox|textrm|mathrm)\{\s*[A-Za-z][A-Za-z ]*\}(\^\{?\d\}?)?$")
_WRAPPED = re.compile(r"^\\(?:text|textbf|mbox|textrm|mathrm)\{(.*)\}$")


def normalize(ans: str) -> str:
    """MATH-style normalisation applied to both sides of a comparison (module docstring)."""
    s = ans.strip()
    for a, b in (
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\ ", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\circ", ""),
        ("°", ""),
        ("\\%", ""),
        ("%", ""),
        ("\\$", ""),
        ("$", ""),
    ):
        s = s.replace(a, b)
    s = s.strip().rstrip(".").strip()
    m = _UNIT.match(s)
    if m and not _WRAPPED.match(s):
        s = m.group(1).strip()
    m = _WRAPPED.match(s)
    if m:
        s = m.group(1).strip()
    m = re.match(r"^[A-Za-z]\s*=\s*(.+)$", s)  # x = 5 -> 5
    if m:
        s = m.group(1).strip()
    return re.sub(r"\s+", "", s)


def _parse(ans: str):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(f"${ans}$", [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=_timeout())


def _number(parsed):
    """The parsed answer as a sympy number, or None."""
    import sympy

    x = parsed[0] if parsed else None
    return x if isinstance(x, sympy.Basic) and x.is_number else None


def _same(a: "Answer", b: "Answer") -> bool:
    if a.norm == b.norm:
        return True
    pa, pb = a.parsed, b.parsed
    if not pa or not pb:
        return False
    na, nb = _number(pa), _number(pb)
    if na is not None and nb is not None:
        if na.is_Integer and nb.is_Integer:
            return bool(na == nb)
        try:
            x, y = complex(na.evalf(30)), complex(nb.evalf(30))
        except (TypeError, ValueError):
            return False
        return abs(x - y) <= REL_TOL * max(abs(x), abs(y))
    from math_verify import verify

    t = _timeout()
    return bool(verify(pa, pb, timeout_seconds=t) or verify(pb, pa, timeout_seconds=t))


class Answer:
    """An answer normalised once and parsed (lazily) once, for repeated comparisons."""

    def __init__(self, text: str):
        self.text, self.norm = text, normalize(text)

    @functools.cached_property
    def parsed(self) -> list:
        return _parse(self.norm) if self.norm else []

    def __eq__(self, other: "Answer") -> bool:  # equivalence, see the module docstring
        return _same(self, other)

    __hash__ = None


def equivalent(a: str, b: str) -> bool:
    """Whether two answers are equal by the grading convention (symmetric; module docstring)."""
    return Answer(a) == Answer(b)


def is_correct(text: str, gold) -> bool:
    """Whether the last boxed answer of ``text`` is equivalent to ``gold`` (a reference answer
    string or an :class:`Answer`). False without a boxed answer."""
    ans = extract_answer(text)
    if ans is None:
        return False
    return Answer(ans) == (gold if isinstance(gold, Answer) else Answer(str(gold)))


@dataclass
class Graded:
    """One problem's grades. ``top1_answer``: the predicted answer text (None: no path answered)."""

    top1_correct: bool
    top1_naive_correct: bool
    pass_at_n: bool
    top1_answer: Optional[str]
    paths: int  # completed paths graded
    answered: int  # paths with a boxed answer
    correct: int  # paths whose answer is correct


def grade_problem(texts: Sequence[str], scores: Sequence[Sequence[float]], gold: str, n: int) -> Graded:
    """Grade one problem's completed paths (see module docstring).

    Args: ``texts`` decoded path texts; ``scores[i]`` per-step scores of path i (last one used; an
        empty list counts as 0); ``gold`` the reference answer; ``n`` the search budget N.
    Returns: :class:`Graded`. Raises ValueError if ``texts`` and ``scores`` differ in length or n < 1."""
    if len(texts) != len(scores):
        raise ValueError(f"{len(texts)} texts but {len(scores)} score lists")
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    g = Answer(str(gold))
    last = [float(s[-1]) if len(s) else 0.0 for s in scores]
    order = sorted(range(len(texts)), key=lambda i: -last[i])  # stable: ties keep path order
    raw = [extract_answer(t) for t in texts]
    groups: List[list] = []  # [representative, weight, correct]
    group_of, by_norm, correct = {}, {}, {}
    for i in order:  # best-scored first: it represents
        if raw[i] is None:
            continue
        a = Answer(raw[i])
        if a.norm not in correct:
            correct[a.norm] = a == g
        k = by_norm.get(a.norm)
        if k is None:
            k = next((j for j, grp in enumerate(groups) if grp[0] == a), len(groups))
            if k == len(groups):
                groups.append([a, 0.0, correct[a.norm]])
            by_norm[a.norm] = k
        groups[k][1] += last[i]
        group_of[i] = a.norm
    ok = [i in group_of and correct[group_of[i]] for i in range(len(texts))]
    if groups:
        best = max(range(len(groups)), key=lambda k: (groups[k][1], -k))
        top1_answer, top1 = groups[best][0].text, groups[best][2]
    else:
        top1_answer, top1 = None, False
    return Graded(
        top1_correct=top1,
        top1_naive_correct=bool(order) and ok[order[0]],
        pass_at_n=any(ok[i] for i in order[:n]),
        top1_answer=top1_answer,
        paths=len(texts),
        answered=sum(a is not None for a in raw),
        correct=sum(ok),
    )


def mean_or_none(values: List[bool]) -> Optional[float]:
    return float(sum(values) / len(values)) if values else None
