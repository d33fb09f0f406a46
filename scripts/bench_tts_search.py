"""The FastTTS search loop alone (issue 18): CPU seconds of ``Search.run_problem`` over the main
command's 30 problems with the engines replayed, so that only the search's own work is timed.

    .venv/bin/python scripts/bench_tts_search.py                       # this checkout, 5 rounds
    .venv/bin/python scripts/bench_tts_search.py --against ../base     # before/after in the same run

The simulated engines' answers (every ``GenResult`` and ``VerifierOutput`` of the main command,
``system=fasttts ... n=64``) are recorded once with this checkout; each round then runs, in one
fresh process per checkout (in shuffled order), the search of every problem against engines that
return the recorded answers (no engine cost), and checks that the survivors and their content keys
are the recorded ones (a checkout whose search decides otherwise is an error, not a timing). Prints
the best CPU seconds of the rounds per checkout and their ratio. The synthetic PRM and the verifier's
token map run inside the simulated verifier and are not timed here (``scripts/bench_sim.py`` times
the whole runner). The load average is printed: timings on a shared machine swing with it.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def record(root: Path, out: Path) -> None:
    """In a child: run the main command's search on the simulated engines, pickling the settings,
    the prompts, every engine answer in call order and each iteration's survivors and keys."""
    sys.path.insert(0, str(root))
    from bench_sim import FASTTTS_MAIN, sim_config

    from harness.backend import Backend
    from systems.verifier_search import runner
    from systems.verifier_search.search import Search

    with tempfile.TemporaryDirectory(prefix="bench_tts_search_") as tmp:
        cfg = sim_config(root, tmp, FASTTTS_MAIN)
    runner.validate(cfg)
    st, problems, prompts, gen, ver, hook, *_ = runner.build(cfg, Backend("sim", "sim", True, "bench"), None)
    gens, vers = [], []

    class Gen:
        def extend(self, requests, policy):
            gens.append(gen.extend(requests, policy))
            return gens[-1]

    class Ver:
        def verify(self, problem, items, paths=None):
            vers.append(ver.verify(problem, items, paths))
            return vers[-1]

    search = Search(st, Gen(), Ver(), before_iteration=hook)
    runs = [(p.index, prompts[p.index]) for p in problems]
    results = [search.run_problem(i, prompt) for i, prompt in runs]
    out.write_bytes(pickle.dumps((st, runs, gens, vers, _decisions(results))))


def _decisions(results) -> list:
    return [[(r.selected, r.selected_keys) for r in res.iterations] for res in results]


def replay(root: Path, recording: Path, repeats: int) -> None:
    """In a child: the best CPU seconds of ``repeats`` searches of every problem against the
    recorded answers, printed last."""
    sys.path.insert(0, str(root))
    from systems.verifier_search.search import Search

    st, runs, gens, vers, decisions = pickle.loads(recording.read_bytes())
    best = float("inf")
    for _ in range(repeats):
        g, v = iter(gens), iter(vers)

        class Gen:
            def extend(self, requests, policy):
                return next(g)

        class Ver:
            def verify(self, problem, items, paths=None):
                return next(v)

        search = Search(st, Gen(), Ver())
        cpu0 = time.process_time()
        results = [search.run_problem(i, prompt) for i, prompt in runs]
        best = min(best, time.process_time() - cpu0)
        if _decisions(results) != decisions:
            raise SystemExit(f"{root}: the search's survivors or keys differ from the recording")
    print(best)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per checkout")
    ap.add_argument("--repeats", type=int, default=3, help="searches of all problems per process (best kept)")
    ap.add_argument("--against", type=Path, help="another checkout, measured in the same run (before/after)")
    a = ap.parse_args()
    roots = [ROOT] + ([a.against.resolve()] if a.against else [])
    load0 = os.getloadavg()
    best = {r: float("inf") for r in roots}
    with tempfile.TemporaryDirectory(prefix="bench_tts_search_") as tmp:
        recording = Path(tmp) / "answers.pkl"
        subprocess.run(
            [sys.executable, __file__, "--record", str(ROOT), str(recording)], cwd=ROOT, check=True, capture_output=True
        )
        for _ in range(a.rounds):
            for root in random.sample(roots, len(roots)):
                out = subprocess.run(
                    [sys.executable, __file__, "--replay", str(root), str(recording), str(a.repeats)],
                    cwd=root,
                    capture_output=True,
                    text=True,
                )
                if out.returncode != 0:
                    raise RuntimeError(f"replay in {root} exited {out.returncode}:\n{out.stderr[-2000:]}")
                best[root] = min(best[root], float(out.stdout.strip().splitlines()[-1]))
    load1 = os.getloadavg()
    print(f"{a.rounds} rounds x {a.repeats} searches, load average {load0[0]:.2f} before / {load1[0]:.2f} after")
    for root in roots:
        print(
            f"[{'this checkout' if root == ROOT else f'against {root}'}] FastTTS search loop alone (30 problems, "
            f"n = 64, engines replayed): best {best[root]:.3f} s CPU"
        )
    if a.against:
        print(f"this checkout / against: {best[ROOT] / best[roots[1]]:.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--record":
        record(Path(sys.argv[2]), Path(sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "--replay":
        replay(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
        sys.exit(0)
    sys.exit(main())
