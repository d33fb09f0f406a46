"""Fit the step-length and answer-length model of the simulated FastTTS workload (issue 38, item 9)
from public math solutions split on "\\n\\n", and write ``workloads/step_lengths.json``.

Source: the ``solution`` field of MATH-500 (``math/math500/test.jsonl`` under the data folder,
``workloads.data``; the 500-problem PRM800K split of Hendrycks et al.'s MATH test set, MIT, see the
data folder's README). A step is a non-blank "\\n\\n"-separated paragraph (the Qwen2 step delimiter,
FastTTS §1.3); a solution's step count is its number of such paragraphs.

Tokens: no hub tokenizer can be downloaded here, so a step's tokens are counted as
``max(1, ceil(utf8_bytes / 4))``, the common rule of thumb of about 4 characters per token of
English text (:data:`BYTES_PER_TOKEN`). The fit keeps only shapes: the log-normal's sigma, the
quantiles divided by their mean, the spread of log step counts. A constant ratio cancels from all
of them (up to the rounding of short steps); the simulator scales the means to
``workload.step_tokens_mean`` (FastTTS Fig. 3-right, ~100 tokens per step: the paper's workload
statistic used as an input) and ``workload.steps_per_answer_mean``, never to a paper result.

Fitted (all by maximum likelihood / moments of the logs, ddof=0):

- ``step.sigma``: std of log step tokens (the log-normal's shape); ``step.mu`` the mean of the logs
  (reported, not used: the simulator sets the mean);
- ``step.quantiles``: step tokens at 0, 1, ..., 100 % divided by the mean step (the empirical shape);
- ``answer.sigma_between`` / ``answer.sigma_within``: the spread of log step counts split into a
  per-problem part and a per-path part. One solution per problem cannot separate them, so the
  within part is the mean within-group variance over (subject, level) groups of MATH-500: an upper
  bound of the per-path spread, and the between part (total - within) a lower bound of the per-problem
  spread.

``python -m workloads.step_fit`` (``--data FILE`` for another solutions file, ``--out FILE``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

from workloads.data import resolve

SOURCE = "math/math500/test.jsonl"
SOURCE_NOTE = (
    "MATH-500 `solution` field (openai/prm800k math_splits/test.jsonl = hkust-nlp/simpleRL-reason "
    "examples/simplelr_math_eval/data/math500/test.jsonl, MIT), split on blank lines"
)
OUT = Path(__file__).resolve().parent / "step_lengths.json"
BYTES_PER_TOKEN = 4.0  # ~4 characters per token of English text (rule of thumb; no tokenizer here)
DELIMITER = "\n\n"


def step_tokens(text: str) -> int:
    """Tokens of one step: ``max(1, ceil(len(text.encode()) / BYTES_PER_TOKEN))``."""
    return max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))


def split_steps(solution: str) -> List[str]:
    """The non-blank "\\n\\n"-separated paragraphs of a solution."""
    return [s for s in solution.split(DELIMITER) if s.strip()]


def fit(rows: Sequence[Dict]) -> Dict:
    """The fitted parameters (module docstring) of ``rows`` (dicts with ``solution``; ``subject`` and
    ``level`` for the answer-length split, a missing one counts as one group)."""
    lengths, counts, groups = [], [], []
    for r in rows:
        steps = split_steps(r["solution"])
        if not steps:
            continue
        lengths += [step_tokens(s) for s in steps]
        counts.append(len(steps))
        groups.append((str(r.get("subject", "")), str(r.get("level", ""))))
    if len(lengths) < 2:
        raise ValueError(f"need at least 2 steps to fit, got {len(lengths)}")
    x = np.log(np.asarray(lengths, dtype=float))
    q = np.percentile(np.asarray(lengths, dtype=float), np.arange(101))
    lk = np.log(np.asarray(counts, dtype=float))
    total = float(lk.var())
    within = 0.0
    for g in set(groups):
        v = lk[[i for i, h in enumerate(groups) if h == g]]
        within += float(((v - v.mean()) ** 2).sum())
    within /= len(lk)
    return {
        "source": SOURCE_NOTE,
        "tokens": f"max(1, ceil(utf8 bytes / {BYTES_PER_TOKEN:g})) per step",
        "solutions": len(counts),
        "step": {
            "count": len(lengths),
            "mean_tokens": round(float(np.mean(lengths)), 4),
            "mu": round(float(x.mean()), 6),
            "sigma": round(float(x.std()), 6),
            "quantiles": [round(float(v), 6) for v in q / np.mean(lengths)],
        },
        "answer": {
            "mean_steps": round(float(np.mean(counts)), 4),
            "sigma_total": round(math.sqrt(total), 6),
            "sigma_within": round(math.sqrt(within), 6),
            "sigma_between": round(math.sqrt(max(0.0, total - within)), 6),
        },
    }


def read_rows(path: Path) -> List[Dict]:
    """The JSON rows of a solutions file (one object per line); ConfigError for a file that is not a
    regular UTF-8 file (``harness.inputs.read_text``, the rule for every user-given file) or a line
    that is not JSON (naming its 1-based number)."""
    from harness.errors import ConfigError
    from harness.inputs import read_text

    rows = []
    for k, line in enumerate(read_text(path, "--data", "a JSONL solutions file").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"--data={str(path)!r} is not allowed: line {k} is not JSON ({e.msg})") from None
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=SOURCE, help="solutions JSONL (relative: under the data folder)")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    from harness.errors import ConfigError

    try:
        rows = read_rows(resolve(a.data))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    params = fit(rows)
    Path(a.out).write_text(json.dumps(params, indent=1) + "\n")
    s, ans = params["step"], params["answer"]
    print(
        f"{a.out}: {params['solutions']} solutions, {s['count']} steps; step mean {s['mean_tokens']} tokens, "
        f"log-normal sigma {s['sigma']}; answer mean {ans['mean_steps']} steps, sigma within "
        f"{ans['sigma_within']} between {ans['sigma_between']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
