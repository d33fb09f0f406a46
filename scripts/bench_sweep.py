"""Wall time of a whole figure sweep, as a user runs it (fresh results folder, W&B offline as default).

    .venv/bin/python scripts/bench_sweep.py                      # experiment=lbs_fig9, goal 30 s
    .venv/bin/python scripts/bench_sweep.py experiment=lbs_fig12 --goal 20
    .venv/bin/python scripts/bench_sweep.py --against ../base --repeat 2   # before/after, alternating

Prints jobs, records, wall seconds, the load average before each run and the ratio to the goal;
exits 1 when the best run of this checkout is over the goal. ``--against DIR`` times another
checkout of the project (e.g. ``git worktree add ../base main``) in the same session, runs of the
two alternating so both see the same machine load, and prints the ratio of their best times.
Extra arguments are passed to ``run.py -m``. Timings depend on the machine's load: run it alone.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_sweep(root: Path, overrides: list, env: dict) -> float:
    """Wall seconds of ``run.py -m`` in checkout ``root``; prints one line per run."""
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp:
        load = os.getloadavg()[0]
        cpu0 = _children_cpu_s()
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "run.py", "-m", *overrides, f"results_dir={tmp}"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        cpu = _children_cpu_s() - cpu0
        records = len(list(Path(tmp).glob("sweeps/*/*/run.json")))
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"sweep in {root} failed (exit {out.returncode})")
    print(
        f"  {root}: {records} job records in {wall:.1f} s wall, {cpu:.1f} s CPU (load average before: {load:.2f})",
        flush=True,
    )
    return wall


def _children_cpu_s() -> float:
    """User + system CPU seconds of the finished child processes (the sweep and its workers)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goal", type=float, default=30.0, help="goal in seconds (default 30, issue 15's Fig.9 goal)")
    ap.add_argument("--against", type=Path, help="another checkout to time in alternation (before/after)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each checkout (best one counts)")
    args, overrides = ap.parse_known_args()
    if not any(o.startswith("experiment=") for o in overrides):
        overrides = ["experiment=lbs_fig9", *overrides]
    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "offline")
    roots = [ROOT] + ([args.against.resolve()] if args.against else [])
    best: dict = {}
    for _ in range(args.repeat):
        for root in roots:
            wall = one_sweep(root, overrides, env)
            best[root] = min(best.get(root, wall), wall)
    ok = best[ROOT] <= args.goal
    print(
        f"{' '.join(overrides)}: best of {args.repeat} {best[ROOT]:.1f} s wall (goal {args.goal:.0f} s, "
        f"ratio {best[ROOT] / args.goal:.2f}, W&B {env['WANDB_MODE']}, {os.cpu_count()} CPUs): "
        f"{'OK' if ok else 'OVER GOAL'}"
    )
    if args.against:
        print(
            f"against {roots[1]}: best {best[roots[1]]:.1f} s; this checkout takes "
            f"{best[ROOT] / best[roots[1]]:.2f}x its time"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
