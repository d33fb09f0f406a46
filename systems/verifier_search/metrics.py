"""FastTTS metrics (the FastTTS paper's evaluation metrics). Times in seconds, lengths in tokens.

- Precise goodput (tokens/s) = sum_p mean_b(tokens_b) / sum_p mean_b(completion_time_b), with
  tokens_b the completion's generated length and completion_time_b the problem's cumulative
  generator + verifier time at the iteration where path b completed, before that iteration's
  verifier call (FastTTS AE formula and stamp; ``system.completion_stamp``, ``artifact.py``).
- Completion latency: per problem, generator + verifier time until the search ends; averaged.
- Prefix-cache hit rate per engine: cached prompt tokens / prompt tokens.
- Speculative tokens: generated past a step boundary; kept = carried by surviving paths (child 0,
  counted once); wasted = generated - kept.
- Steps: ``mean_step_tokens`` = mean over completed paths of tokens / steps. It mixes two kinds of
  step: those ended by the stop string or the end token (``step_tokens_before_last``) and, for paths
  still active in the last iteration, one step decoded to the end token without the stop string
  (FastTTS §1.1; ``last_step_tokens``), which is several steps long.
"""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np

from systems.verifier_search.search import ProblemResult


def _step_lengths(results: List[ProblemResult], last_iteration: int):
    """(lengths of the completed paths' steps ended by a boundary, lengths of the final steps of the
    paths completed in iteration ``last_iteration``, decoded without the stop string)."""
    ended, last = [], []
    for r in results:
        for b in r.completions:
            ends = list(b.step_ends)
            steps = [end - start for start, end in zip([0] + ends, ends)]  # np.diff's values, without an array per path
            if b.completed_iteration == last_iteration and b.finish != "budget" and steps:
                last.append(steps.pop())
            ended.extend(steps)
    return ended, last


def summarize(results: List[ProblemResult], last_iteration: int) -> Dict[str, float]:
    """Summary scalars over problems (see module docstring); ``last_iteration``: the index of the
    search's last iteration (decoded without the stop string)."""
    tok = [np.mean([len(b.tokens) for b in r.completions]) for r in results if r.completions]
    ct = [np.mean([b.completion_time_s for b in r.completions]) for r in results if r.completions]
    its = [rec for r in results for rec in r.iterations]
    gp, gc = sum(i.gen_prompt_tokens for i in its), sum(i.gen_cached_tokens for i in its)
    vp, vc = sum(i.ver_prompt_tokens for i in its), sum(i.ver_cached_tokens for i in its)
    sg, sk = sum(i.spec_generated for i in its), sum(i.spec_kept for i in its)
    steps = [len(b.tokens) / max(1, b.num_steps) for r in results for b in r.completions]
    ended, last = _step_lengths(results, last_iteration)
    return {
        "precise_goodput_tok_s": float(sum(tok) / sum(ct)) if ct and sum(ct) > 0 else None,
        "latency_s": float(np.mean([r.latency_s for r in results])),
        "gen_latency_s": float(np.mean([r.gen_time_s for r in results])),
        "ver_latency_s": float(np.mean([r.ver_time_s for r in results])),
        "completion_time_s": float(np.mean(ct)) if ct else None,
        "completion_tokens": float(np.mean(tok)) if tok else None,
        "completions_per_problem": float(np.mean([len(r.completions) for r in results])),
        "iterations_per_problem": float(np.mean([len(r.iterations) for r in results])),
        "mean_step_tokens": float(np.mean(steps)) if steps else None,
        "step_tokens_before_last": float(np.mean(ended)) if ended else None,
        "last_step_tokens": float(np.mean(last)) if last else None,
        "gen_prefix_hit_rate": gc / gp if gp else None,
        "ver_prefix_hit_rate": vc / vp if vp else None,
        "gen_requests": int(sum(i.gen_requests for i in its)),
        "gen_skipped": int(sum(i.gen_skipped for i in its)),
        "ver_requests": int(sum(i.ver_requests for i in its)),
        "spec_tokens_generated": int(sg),
        "spec_tokens_kept": int(sk),
        "spec_tokens_wasted": int(sg - sk),
        "problems": len(results),
    }


def tables(results: List[ProblemResult]) -> Dict[str, List[dict]]:
    """``iterations`` (one row per problem x iteration) and ``completions`` (one row per path), as
    row dicts (``harness.run`` writes them to parquet without importing pandas)."""
    it = [dict(vars(rec)) for r in results for rec in r.iterations]
    comp = [
        {
            "problem": r.problem,
            "uid": b.uid,
            "tokens": len(b.tokens),
            "steps": b.num_steps,
            "finish": b.finish,
            "completion_time_s": b.completion_time_s,
            "completed_iteration": b.completed_iteration,
            "score_last": b.scores[-1] if b.scores else None,
            "score_prod": float(math.prod(b.scores)) if b.scores else None,
        }  # np.prod's order: left to right
        for r in results
        for b in r.completions
    ]
    return {"iterations": it, "completions": comp}
