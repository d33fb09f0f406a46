"""Step lengths and answer lengths that are not memoryless (issue 38, item 9): the simulated
workload's ``workload.step_model``.

``geometric`` (the old model, ``sim.StepModel.chunk``): every token ends the step with probability
1 / ``step_tokens_mean`` and every step ends the path with probability 1 / ``steps_per_answer_mean``,
for every problem. Its remaining step length does not depend on how far the step got, so a
speculative head start (FastTTS §4.1) saves nothing in expectation.

The fitted models (:class:`StepLengths`), parameters from ``workloads/step_lengths.json``
(``python -m workloads.step_fit``: MATH-500 solutions split on "\\n\\n", see that module):

- a step's length L (tokens, its boundary token included) is ``ceil(X)`` with X drawn from
  ``lognormal`` (sigma = the fitted ``step.sigma``), ``lognormal_heavy`` (sigma x
  :data:`HEAVY_SIGMA`: a heavier tail, same mean) or ``empirical`` (the fitted quantiles, linear
  between them); each scaled so that E[L] = ``workload.step_tokens_mean`` (FastTTS Fig. 3-right's
  ~100 tokens, an input). A step that already holds ``a`` tokens (a speculative head start,
  ``GenRequest.step_age``) draws L given L > a by inverse transform, u ~ U(F(a), 1): its expected
  remaining length E[L - a | L > a] depends on a (:meth:`StepLengths.expected_remaining`);
- a path's number of steps K: per problem p, log K ~ N(mu_p, sigma_within) with mu_p = mu_K +
  sigma_between * z_p, z_p ~ N(0, 1) drawn from the problem index (the same for every run seed);
  K is rounded, at least 1, and mu_K set so that E[K] over problems = ``steps_per_answer_mean``. A
  step that is the path's k-th ends the path (the end token) with the hazard
  h_p(k) = P(K = k | K >= k) (:meth:`StepLengths.hazard`), so paths of one problem share a length scale.

Seeding (``sim.TokenStream``): the draws come from the request's length generator, two per step
(``random()`` for the length, ``random()`` for the end token), in stream order, so a stream is the
same however far it is read.
"""

from __future__ import annotations

import bisect
import json
import math
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist
from typing import AbstractSet, Dict, List, Optional, Sequence, Tuple

import numpy as np

STEP_MODELS = ("lognormal", "geometric", "empirical", "lognormal_heavy")  # the first: the default
HEAVY_SIGMA = 1.5  # lognormal_heavy: the fitted sigma times this (a heavier tail at the same mean)
PARAMS = Path(__file__).resolve().parents[2] / "workloads" / "step_lengths.json"
MAX_STEPS = 512  # hazard table length; a path past it ends at its next step
_N = NormalDist()
_EPS = 1e-12


@lru_cache(maxsize=4)
def load_params(path: str = str(PARAMS)) -> Dict:
    """The fitted parameters (``workloads/step_fit.py`` writes them)."""
    return json.loads(Path(path).read_text())


class StepLengths:
    """Step and answer lengths of ``kind`` (module docstring), means ``step_mean`` tokens per step
    (> 1) and ``answer_mean`` steps per path (>= 1), parameters ``params`` (``load_params()``)."""

    def __init__(self, kind: str, step_mean: float, answer_mean: float, params: Optional[Dict] = None):
        if kind not in STEP_MODELS or kind == "geometric":
            raise ValueError(f"step model {kind!r}: one of {', '.join(m for m in STEP_MODELS if m != 'geometric')}")
        p = params or load_params()
        self.kind, self.step_mean, self.answer_mean = kind, float(step_mean), float(answer_mean)
        if kind == "empirical":
            q = [float(v) for v in p["step"]["quantiles"]]
            self.qp = [i / (len(q) - 1) for i in range(len(q))]
            self.q0 = q
            self.scale = self._solve(lambda s: self._mean_empirical(s), self.step_mean)
            self.q = [v * self.scale for v in q]
        else:
            self.sigma = float(p["step"]["sigma"]) * (HEAVY_SIGMA if kind == "lognormal_heavy" else 1.0)
            self.mu = self._solve_log(lambda mu: self._mean_lognormal(mu, self.sigma), self.step_mean)
        a = p["answer"]
        self.sb, self.sw = float(a["sigma_between"]), float(a["sigma_within"])
        st = math.hypot(self.sb, self.sw)
        self.mu_k = self._solve_log(lambda mu: self._mean_steps(mu, st), self.answer_mean)
        self._hazards: Dict[int, List[float]] = {}

    # ------------------------------------------------------------------ step length
    @staticmethod
    def _solve(mean_of, target: float) -> float:
        """A scale s with mean_of(s) = target (mean_of increasing, about proportional)."""
        s = 1.0
        for _ in range(30):
            m = mean_of(s)
            if abs(m - target) < 1e-9 * target:
                break
            s *= target / m
        return s

    @classmethod
    def _solve_log(cls, mean_of, target: float) -> float:
        """A log-location mu with mean_of(mu) = target."""
        return math.log(cls._solve(lambda s: mean_of(math.log(s)), target))

    @staticmethod
    def _mean_lognormal(mu: float, sigma: float) -> float:
        """E[ceil(X)] = sum_{k>=0} P(X > k), X log-normal: summed to k = 2^16, the rest as
        E[(X - 2^16)^+] + P(X > 2^16) / 2 (the partial moment in closed form)."""
        from scipy.special import ndtr

        k0 = 1 << 16
        k = np.arange(1, k0, dtype=float)
        head = 1.0 + float(np.sum(ndtr(-(np.log(k) - mu) / sigma)))
        z = (math.log(k0) - mu) / sigma
        tail = math.exp(mu + sigma * sigma / 2) * float(ndtr(sigma - z)) - k0 * float(ndtr(-z))
        return head + tail + 0.5 * float(ndtr(-z))

    def _mean_empirical(self, s: float) -> float:
        """E[ceil(X)] for the quantile function ``q0 * s`` (linear between quantiles)."""
        q = np.asarray(self.q0) * s
        k = np.arange(1, int(math.ceil(q[-1])) + 1, dtype=float)
        return 1.0 + float(np.sum(1.0 - np.interp(k, q, self.qp)))

    def cdf(self, x: float) -> float:
        """F(x) = P(X <= x) of the continuous draw X (L = ceil(X))."""
        if x <= 0:
            return 0.0
        if self.kind == "empirical":
            q = self.q
            if x >= q[-1]:
                return 1.0
            j = bisect.bisect_right(q, x)  # q[j-1] <= x < q[j]
            if j == 0:
                return 0.0
            lo, hi = q[j - 1], q[j]
            return self.qp[j - 1] + (self.qp[j] - self.qp[j - 1]) * (x - lo) / (hi - lo)
        return _N.cdf((math.log(x) - self.mu) / self.sigma)

    def ppf(self, u: float) -> float:
        """The inverse of :meth:`cdf` at u in (0, 1)."""
        if self.kind == "empirical":
            f = u * (len(self.q) - 1)
            j = min(int(f), len(self.q) - 2)
            return self.q[j] + (self.q[j + 1] - self.q[j]) * (f - j)
        return math.exp(self.mu + self.sigma * _N.inv_cdf(min(max(u, _EPS), 1.0 - _EPS)))

    def remaining(self, v: float, age: int) -> int:
        """Tokens left in a step that holds ``age`` tokens (>= 0), for v ~ U[0, 1): L - age with
        L = ceil(F^-1(u)), u = F(age) + (1 - F(age)) v, i.e. L drawn given L > age; at least 1."""
        lo = self.cdf(age) if age > 0 else 0.0
        x = self.ppf(lo + (1.0 - lo) * v)
        return max(1, math.ceil(x) - age)

    def expected_remaining(self, age: int) -> float:
        """E[L - age | L > age] in tokens (numerically: the mean of :meth:`remaining` over a
        fine grid of v)."""
        v = (np.arange(20000) + 0.5) / 20000
        return float(np.mean([self.remaining(x, age) for x in v]))

    # ------------------------------------------------------------------ answer length
    @staticmethod
    def _mean_steps(mu: float, sigma: float) -> float:
        """E[K], K = max(1, round(exp(N(mu, sigma))))."""
        from scipy.special import ndtr

        k = np.arange(1, MAX_STEPS + 1, dtype=float)
        return 1.0 + float(np.sum(ndtr(-(np.log(k + 0.5) - mu) / sigma)))

    def problem_mu(self, problem: int) -> float:
        """mu_p: the log-median step count of ``problem``'s paths (its z_p from the problem index)."""
        z = float(np.random.default_rng([int(problem), 38]).standard_normal())
        return self.mu_k + self.sb * z

    def hazard(self, problem: int, k: int) -> float:
        """P(the path's k-th step (k >= 1) is its last | it reached step k) for ``problem``."""
        h = self._hazards.get(problem)
        if h is None:
            from scipy.special import ndtr

            mu = self.problem_mu(problem)
            kk = np.arange(0, MAX_STEPS + 1, dtype=float)
            surv = np.where(kk == 0, 1.0, ndtr(-(np.log(kk + 0.5) - mu) / self.sw))  # P(K > k)
            with np.errstate(divide="ignore", invalid="ignore"):
                hz = np.where(surv[:-1] > 0, 1.0 - surv[1:] / surv[:-1], 1.0)
            h = self._hazards[problem] = [0.0, *hz.tolist()]  # h[k], k = 1..MAX_STEPS
        return h[k] if k < len(h) else 1.0

    def chunker(self, problem: int, steps_before: int, age: int) -> "Chunker":
        """The chunk source of one request: its path has ``steps_before`` steps, its current step
        ``age`` tokens."""
        return Chunker(self, problem, steps_before, age)


class Chunker:
    """The ``chunk(rng)`` of one token stream under a :class:`StepLengths`: (tokens up to and
    including the next boundary, whether it is the end token). The first chunk finishes the step
    in progress (``age`` tokens already), the next ones are whole steps; the k-th step of the path
    ends it with the problem's hazard."""

    __slots__ = ("m", "problem", "k", "age")

    def __init__(self, m: StepLengths, problem: int, steps_before: int, age: int):
        self.m, self.problem, self.k, self.age = m, int(problem), int(steps_before), int(age)

    def chunk(self, rng: np.random.Generator) -> Tuple[int, bool]:
        n = self.m.remaining(rng.random(), self.age)
        self.age = 0
        self.k += 1
        return n, bool(rng.random() < self.m.hazard(self.problem, self.k))


def problem_of(path: str) -> int:
    """The problem index of a request's path name (``"3/0.1.2"`` -> 3; no name: 0)."""
    head, sep, _ = path.partition("/")
    return int(head) if sep and head.isdigit() else 0


def head_start(
    tokens: Sequence[int], boundaries: AbstractSet[int], age_before: int, steps_before: int
) -> Tuple[int, int]:
    """(steps, age) after ``tokens`` appended to a path of ``steps_before`` steps whose current step
    held ``age_before`` tokens: each boundary token (``boundaries``: the delimiter and end ids)
    ends a step."""
    last = -1
    if boundaries.isdisjoint(tokens):  # the common case, at C speed
        return steps_before, age_before + len(tokens)
    for i, t in enumerate(tokens):
        if t in boundaries:
            steps_before += 1
            last = i
    if last < 0:
        return steps_before, age_before + len(tokens)
    return steps_before, len(tokens) - last - 1
