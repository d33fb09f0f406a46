"""Where two real runs' beam searches part, and by how much: teacher forcing (issue 37, point 3).

Two runs of the same search (seed, beams, lengths) on a GPU can keep different beams: fp16
arithmetic at another batch size (another scheduler's groups, another GEMM kernel) rounds a log-
probability differently and flips a near-tie, a sampled token or a selection. To tell a flipped near-
tie from a bug, run B is repeated *teacher-forced* on run A's tree (``system.replay_tree=<A>
system.teacher_force=true`` with B's scheduler and decode path): it keeps A's beams and decodes A's
tokens, so both runs score the same paths, and :func:`compare` reports

- the largest difference of a beam's cumulative log-probability between A and B (per step and overall);
- token flips: positions where B's own draw (the same uniform, keyed by seed, beam uid and position)
  falls outside A's token's interval of B's CDF, with the largest distance in probability;
- selection flips: at each step, the beams that B's scores would keep and A's did not (and back),
  each with its margin under both: its score minus the best score left out (a kept beam, > 0) or the
  worst score kept (a dropped one, < 0).

    python -m systems.kv_offload.divergence RUN_A RUN_B_FORCED [--json FILE]

Both folders hold ``beam_tree.json`` recorded by the real engine (``system.record_tree=true``); B's was
teacher-forced on A's tree. Exit 2 (with what is wrong) when they are not such a pair.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

from systems.kv_offload.tree import rank_key


class NotAPair(ValueError):
    """The two trees are not a run and a teacher-forced rerun of it."""


def load(path) -> Dict[str, Any]:
    p = Path(path)
    p = p / "beam_tree.json" if p.is_dir() else p
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise NotAPair(f"{p}: not a readable beam tree ({e})") from None
    if not doc.get("beam_log"):
        raise NotAPair(f"{p}: no beam log (record it on the real engine: backend=torch system.record_tree=true)")
    return doc


def _selection(scores: Dict[int, float], kept: set) -> Dict[int, float]:
    """Each beam's margin of a selection that kept ``kept``: score minus the best score left out (kept
    beams) or minus the worst score kept (dropped beams)."""
    out_best = max((scores[u] for u in scores if u not in kept), default=float("-inf"))
    kept_worst = min(scores[u] for u in kept)
    return {u: scores[u] - (out_best if u in kept else kept_worst) for u in scores}


def compare(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """Run A's tree against run B's teacher-forced rerun of it (both ``beam_tree.json`` documents).
    Raises NotAPair when B did not score A's beams at every step."""
    beam_size = a["beams"] // a["beam_width"]
    steps: List[Dict[str, Any]] = []
    for i, (la, lb) in enumerate(zip(a["beam_log"], b["beam_log"])):
        if la["uid"] != lb["uid"] or la["tokens"] != lb["tokens"]:
            raise NotAPair(f"step {i}: run B did not decode run A's beams and tokens (teacher_force on A's tree?)")
        ca = {int(u): x for u, x in zip(la["uid"], la["cum_logprob"])}
        cb = {int(u): x for u, x in zip(lb["uid"], lb["cum_logprob"])}
        row = {
            "step": i,
            "max_abs_cum_logprob_diff": max(abs(ca[u] - cb[u]) for u in ca),
            "token_flips": sum(lb.get("token_flips") or [0]),
            "max_flip_margin": max(lb.get("flip_margin") or [0.0]),
            "selection_flips": [],
        }
        if i < len(a["steps"]):
            kept_a = {int(u) for u in a["steps"][i]["kept"]}
            kept_b = set(sorted(cb, key=lambda u: rank_key(cb[u], u))[:beam_size])
            ma, mb = _selection(ca, kept_a), _selection(cb, kept_b)
            for u in sorted(kept_a ^ kept_b, key=lambda u: rank_key(ca[u], u)):
                row["selection_flips"].append(
                    {
                        "uid": str(u),
                        "kept_by": "a" if u in kept_a else "b",
                        "score_a": ca[u],
                        "score_b": cb[u],
                        "margin_a": ma[u],
                        "margin_b": mb[u],
                    }
                )
        steps.append(row)
    if len(steps) != len(a["beam_log"]) or len(b["beam_log"]) != len(a["beam_log"]):
        raise NotAPair(f"run A logged {len(a['beam_log'])} steps, run B {len(b['beam_log'])}")
    flips = [f for s in steps for f in s["selection_flips"]]
    return {
        "steps": steps,
        "max_abs_cum_logprob_diff": max(s["max_abs_cum_logprob_diff"] for s in steps),
        "token_flips": sum(s["token_flips"] for s in steps),
        "max_flip_margin": max(s["max_flip_margin"] for s in steps),
        "selection_flips": len(flips),
        "identical": all(s["max_abs_cum_logprob_diff"] == 0 and not s["token_flips"] for s in steps) and not flips,
        "a": {k: a.get(k) for k in ("scheduler", "decode_path", "batch_invariant", "device")},
        "b": {k: b.get(k) for k in ("scheduler", "decode_path", "batch_invariant", "device")},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_a")
    ap.add_argument("run_b_forced")
    ap.add_argument("--json", default=None, help="write the whole comparison here")
    args = ap.parse_args(argv)
    try:
        out = compare(load(args.run_a), load(args.run_b_forced))
    except NotAPair as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    print(
        f"A {out['a']} vs B {out['b']}: largest cumulative log-prob difference {out['max_abs_cum_logprob_diff']:.3g}; "
        f"{out['token_flips']} token flips (largest margin {out['max_flip_margin']:.3g}); "
        f"{out['selection_flips']} selection flips"
    )
    for s in out["steps"]:
        for f in s["selection_flips"]:
            print(
                f"  step {s['step']}: beam {f['uid']} kept by {f['kept_by']}: margin under A {f['margin_a']:+.3g}, "
                f"under B {f['margin_b']:+.3g}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
