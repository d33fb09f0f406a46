"""Wall time of a whole figure sweep, as a user runs it (fresh results folder, W&B offline as default).

    .venv/bin/python scripts/bench_sweep.py                      # experiment=lbs_fig9, goal 60 s
    .venv/bin/python scripts/bench_sweep.py experiment=lbs_fig12 --goal 30

Prints jobs, records, wall seconds and the ratio to the goal; exits 1 when over the goal.
Extra arguments are passed to ``run.py -m``. Timings depend on the machine's load: run it alone.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goal", type=float, default=60.0, help="goal in seconds (default 60, LBS issue's Fig.9 goal)")
    args, overrides = ap.parse_known_args()
    if not any(o.startswith("experiment=") for o in overrides):
        overrides = ["experiment=lbs_fig9", *overrides]
    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "offline")
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "run.py", "-m", *overrides, f"results_dir={tmp}"],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        records = len(list(Path(tmp).glob("sweeps/*/*/run.json")))
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        print(f"sweep failed (exit {out.returncode})", file=sys.stderr)
        return 2
    ok = wall <= args.goal
    print(f"{' '.join(overrides)}: {records} job records in {wall:.1f} s wall "
          f"(goal {args.goal:.0f} s, ratio {wall / args.goal:.2f}, W&B {env['WANDB_MODE']}, "
          f"{os.cpu_count()} CPUs): {'OK' if ok else 'OVER GOAL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
