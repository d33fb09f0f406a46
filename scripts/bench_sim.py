"""Simulated runs at interactive speed (issue 18), each goal printed as a ratio (<= 1: met).

    .venv/bin/python scripts/bench_sim.py                          # every case, 5 rounds
    .venv/bin/python scripts/bench_sim.py --only lbs,startup --rounds 7
    .venv/bin/python scripts/bench_sim.py --against ../base        # before/after: another checkout, same run

Two kinds of case:

- **process** (``Case``): a command as a user runs it (``python run.py ...`` in a fresh process, a
  temporary results folder). Each round runs every case and, per case, an empty Hydra app composing
  the same overrides, in shuffled order; a case's time beyond the app is median(case) -
  median(empty app) over the rounds, its goal in seconds. Cases without ``tracking=`` keep the
  default (W&B offline): after each such run the benchmark waits until the run's background W&B
  mirror (harness.tracking) has finished, so it never overlaps the next measurement, and prints
  how long after the command's end the mirror was done, and what one mirror costs when run alone
  (``python -m harness.tracking RUN_DIR``, wall and CPU seconds). The rounds share one results
  folder, so what runs keep in ``results_dir/cache`` (serving request streams of traces) is there
  for every run but the first of each checkout: a run that added a file to that folder counts as
  a cold-cache run (a user's first run into a fresh results folder) and is left out of the
  medians and ratio (warm cache, a user's next run) and printed beside them.
- **runner** (``RunnerCase``): the runner's own time (``repeat_runs[0].wall_s`` of the record: the
  family's ``run(cfg, ctx)``, no start-up) of one config, best of the rounds, in one process per
  checkout; ``LinearCase``: the runner time per beam-step of a long generation over a short one.

Commands run as a user's do, with Python's bytecode cache (``__pycache__``, ignored by git): each
checkout's packages are compiled first (``compileall``) and ``PYTHONDONTWRITEBYTECODE`` is dropped
from the commands' environment; where it is set, as on this team's machine, every run would compile
the project's modules again (~0.1 s a command) and a user's runs never do.

``--against DIR`` measures another checkout of the project (``git worktree add ../base <commit>``)
in the same run, its runs interleaved with this checkout's, and prints both. The load average is
printed before and after: timings on a shared machine swing with it, so run it alone on a quiet
machine. Exits 1 when a ratio of this checkout is over 1 or a timed run did not end ok (nothing was
simulated: no time to count); 2 for bad arguments.

Cases live in one function per family (``fasttts_cases``, ``lbs_cases``, ...): each returns cases.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
EMPTY_APP = "--empty-app"
RUNNER = "--runner"


@dataclass
class Case:
    """One command: ``overrides`` of ``run.py``; goal: at most ``goal_s`` seconds of process wall
    time beyond the empty app composing the same overrides."""

    name: str
    overrides: List[str]
    goal_s: float = 1.0


@dataclass
class RunnerCase:
    """The runner time (s) of one simulated config; goal: at most ``goal_s`` (best of the rounds)."""

    name: str
    overrides: List[str]
    goal_s: float = 1.0


@dataclass
class LinearCase:
    """Cost linear in beams x steps: runner time per beam-step of ``long`` over that of ``short``
    (each ``(overrides, beams x steps)``), goal at most ``tolerance`` (1 = exactly linear)."""

    name: str
    short: Tuple[List[str], int]
    long: Tuple[List[str], int]
    tolerance: float = 1.25


# --- FastTTS (engineers G, N) -------------------------------------------------------------------------
FASTTTS_MAIN = ["system=fasttts", "model=qwen2.5-math-1.5b", "verifier=skywork-prm-1.5b", "workload=aime24", "n=64"]


def fasttts_cases() -> List[Case]:
    """The README's simulated FastTTS main command (AIME 2024, 30 problems, n = 64, 1.5B+1.5B on a
    simulated RTX 4090); W&B off (its offline start is the harness's cost, measured separately by
    ``--with-tracking``)."""
    return [Case("fasttts main command", [*FASTTTS_MAIN, "tracking=none"], 1.0)]


def fasttts_runner_cases() -> List[RunnerCase]:
    """The main command's runner alone (build + search of 30 problems + metrics, no start-up): best of
    the rounds, steadier than the process time on a shared machine; the same 1 s goal."""
    return [RunnerCase("fasttts runner, main command", FASTTTS_MAIN, 1.0)]


# --- LBS family and the harness's start-up (engineer I) ------------------------------------------------
LBS_MAIN = ["system=lbs", "model=opt-6.7b", "beams=64"]


def lbs_cases() -> List[Case]:
    """The README's LBS main command (simulated RTX 4090 without a CUDA GPU) as a user runs it:
    default config, W&B offline (a simulated single run mirrors its record to W&B in a background
    process after it returns, harness/tracking.py)."""
    return [Case("lbs main command (default: W&B offline)", LBS_MAIN, 1.0)]


def startup_cases() -> List[Case]:
    """What W&B costs the command: the LBS main command without it (``tracking=none``)."""
    return [Case("lbs main command, tracking=none", [*LBS_MAIN, "tracking=none"], 1.0)]


# LLaMA-3.1-8B: a 131072-token context. Host memory not checked: 256 beams x 8192 tokens of its KV do not
# fit the RTX 4090 testbed's 128 GiB (a predicted oom, no simulation), and this case times the simulator
LBS_LONG = ["system=lbs", "model=llama-3.1-8b", "beams=256", "hardware.host_memory_bytes=null"]


def lbs_runner_cases() -> List[RunnerCase]:
    """The LBS simulator at the issue's long-generation scale: 256 beams x 8192 tokens (step 32: 256
    steps)."""
    return [RunnerCase("lbs runner, 256 beams x 8192 tokens", [*LBS_LONG, "gen_len=8192"], 1.0)]


def lbs_linear_cases() -> List[LinearCase]:
    """256 beams, 2048 -> 8192 tokens (64 -> 256 steps of 32); the old code's cost grew like beams x
    steps^2 (64 beams, 1920 -> 8192 tokens: 15x for 4.3x the work). Goal: per beam-step at most 1.25x
    the short run's (per-step costs that do not grow with the tree's depth)."""
    return [
        LinearCase(
            "lbs runner per beam-step, 256 beams: 8192 vs 2048 tokens",
            ([*LBS_LONG, "gen_len=2048"], 256 * 64),
            ([*LBS_LONG, "gen_len=8192"], 256 * 256),
        )
    ]


# --- BEAM serving (engineer M) -------------------------------------------------------------------------
SERVING_MAIN = ["system=beam", "model=llama-3.3-70b", "hardware=a100-80gb", "tp=2", "pp=4", "workload=servegen"]


def serving_cases() -> List[Case]:
    """The README's simulated BEAM main command (ServeGen 19:00-20:00, LLaMA-3.3-70B on 8 simulated
    A100s, tp=2 pp=4: about 8,000 requests, 83,000 iterations, 18,000 decisions); W&B off. Its
    request stream is kept in results_dir/cache: the median is a run that finds it there, the first
    run of each checkout (which builds it from the trace's 300 files) is printed beside it."""
    return [Case("serving main command, tracking=none", [*SERVING_MAIN, "tracking=none"], 1.0)]


def serving_runner_cases() -> List[RunnerCase]:
    """The same config's runner alone (request stream, profiling pass, serving, tables; no start-up):
    what the simulator itself costs."""
    return [RunnerCase("serving runner, main command", SERVING_MAIN, 1.0)]


CASES: Dict[str, Callable[[], list]] = {
    "fasttts": fasttts_cases,
    "fasttts-runner": fasttts_runner_cases,
    "lbs": lbs_cases,
    "startup": startup_cases,
    "lbs-runner": lbs_runner_cases,
    "lbs-linear": lbs_linear_cases,
    "serving": serving_cases,
    "serving-runner": serving_runner_cases,
}


# --- measurement: process cases ------------------------------------------------------------------------
def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


PACKAGES = ("harness", "systems", "workloads", "hydra_plugins")  # compiled before measuring (module docstring)


def _user_env(**extra: str) -> Dict[str, str]:
    """The environment of a measured command: ours, with Python's bytecode cache on, and ``extra``."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, **extra}


def compile_packages(root: Path) -> None:
    """Write the bytecode cache of checkout ``root``'s packages, as its first run would."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *[str(root / p) for p in PACKAGES]],
        check=True,
        capture_output=True,
        env=_user_env(),
    )


def _run(cmd: List[str], root: Path, env: Dict[str, str]) -> Tuple[float, float]:
    """(wall s, CPU s) of a command run in checkout ``root``."""
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu_s() - cpu0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} in {root} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return wall, cpu


def _mirror_processes(results: Path) -> List[int]:
    """Pids of the background W&B mirrors (``python -m harness.tracking``) of runs under ``results``."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"harness.tracking" in cmd and any(str(results).encode() in a for a in cmd) and state != "Z":
            pids.append(int(d.name))
    return pids


def _wait_for_mirrors(results: Path, timeout_s: float = 180.0) -> Optional[float]:
    """Seconds until every background W&B mirror under ``results`` has written its W&B run
    (harness.tracking writes 'mirrored' last in its log); None when there is none. Then waits for
    the mirror processes to exit, so none overlaps the next measurement. Each log counts once."""
    logs = [p for p in results.rglob("wandb/mirror.log") if not p.with_suffix(".waited").exists()]
    if not logs:
        return None
    t0 = time.perf_counter()
    while not all("mirrored" in p.read_text() for p in logs):
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"W&B mirror not done after {timeout_s:.0f} s: {logs}")
        time.sleep(0.05)
    done = time.perf_counter() - t0
    while _mirror_processes(results) and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.05)
    for p in logs:
        p.with_suffix(".waited").touch()
    return done


def measure(cases: List[Case], roots: List[Path], rounds: int, tracking: bool) -> List[dict]:
    """Median wall and CPU time of each case and of the empty app with each case's overrides, per
    checkout in ``roots``."""
    py = sys.executable
    keys = [(c.name, root, kind) for c in cases for root in roots for kind in ("case", "app")]
    wall: Dict[tuple, List[float]] = {k: [] for k in keys}
    cpu: Dict[tuple, List[float]] = {k: [] for k in keys}
    cold: Dict[tuple, List[Tuple[float, float]]] = {k: [] for k in keys}  # (wall, CPU) of cold-cache runs
    mirror: Dict[tuple, List[float]] = {k: [] for k in keys}
    by_name = {c.name: c for c in cases}
    with tempfile.TemporaryDirectory(prefix="bench_sim_") as tmp:
        env = _user_env(TTC_RESULTS_DIR=tmp, WANDB_MODE="offline", WANDB_DIR=tmp)
        for _ in range(rounds):
            order = list(keys)
            random.shuffle(order)
            for key in order:
                name, root, kind = key
                c = by_name[name]
                over = c.overrides if not tracking else [o for o in c.overrides if not o.startswith("tracking=")]
                cmd = (
                    [py, "run.py", *over] if kind == "case" else [py, str(Path(__file__)), EMPTY_APP, str(root), *over]
                )
                cached = _cache_files(Path(tmp))
                w, u = _run(cmd, root, env)
                if _cache_files(Path(tmp)) - cached:
                    cold[key].append((w, u))
                else:
                    wall[key].append(w)
                    cpu[key].append(u)
                done = _wait_for_mirrors(Path(tmp))
                if done is not None:
                    mirror[key].append(done)
        mirrored = sorted(Path(tmp).rglob("wandb/mirror.log"))
        mirror_cost = (
            _run([py, "-m", "harness.tracking", str(mirrored[0].parent.parent)], ROOT, env) if mirrored else None
        )
    out = []
    for c in cases:
        for root in roots:
            key = (c.name, root, "case")
            if not wall[key]:  # every run filled the cache (one round): those are the numbers
                wall[key], cpu[key] = [w for w, _ in cold[key]], [u for _, u in cold[key]]
            case, app = (statistics.median(wall[(c.name, root, k)]) for k in ("case", "app"))
            case_cpu, app_cpu = (statistics.median(cpu[(c.name, root, k)]) for k in ("case", "app"))
            m = mirror[key]
            cold_s = [(w - app, u - app_cpu) for w, u in cold[key]] if len(wall[key]) != len(cold[key]) else []
            out.append(
                {
                    "case": c,
                    "root": root,
                    "wall_s": case,
                    "app_s": app,
                    "extra_s": case - app,
                    "extra_cpu_s": case_cpu - app_cpu,
                    "ratio": (case - app) / c.goal_s,
                    "cold": cold_s,
                    "mirror_s": statistics.median(m) if m else None,
                    "mirror_cost": mirror_cost if m and root == ROOT else None,
                }
            )
    return out


def _cache_files(results: Path) -> set:
    """The files runs keep in ``results``/cache (systems.energy_serving.build.cache_dir)."""
    return set((results / "cache").glob("*")) if (results / "cache").is_dir() else set()


def empty_app(root: Path) -> None:
    """A Hydra app composing ``run.py``'s config in checkout ``root`` (same config dir, resolvers and
    schemas) that does nothing."""
    sys.path.insert(0, str(root))
    import hydra

    from harness.config import register_configs, register_resolvers

    register_resolvers()
    register_configs()

    @hydra.main(version_base="1.3", config_path=str(root / "conf"), config_name="config")
    def app(cfg) -> None:
        pass

    app()


# --- measurement: runner cases (in one process per checkout) ------------------------------------------
def runner_times(root: Path, overrides: List[str], rounds: int) -> List[float]:
    """Runner seconds of ``rounds`` runs of one simulated config in checkout ``root`` (a fresh process,
    the config composed once, records in a temporary folder, W&B off)."""
    out = subprocess.run(
        [sys.executable, str(Path(__file__)), RUNNER, str(root), str(rounds), *overrides],
        cwd=root,
        capture_output=True,
        text=True,
        env=_user_env(),
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [""])[-1]
        raise SystemExit(
            last
            if last.startswith("error:")
            else f"error: runner case {overrides} in {root} exited {out.returncode}:\n{out.stderr[-2000:]}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def sim_config(root: Path, tmp: str, overrides: List[str]):
    """The config of checkout ``root`` (on its ``sys.path``) for a simulated run writing only under
    ``tmp``, W&B and progress off, composed once."""
    from hydra import compose, initialize_config_dir

    from harness.config import register_configs, register_resolvers

    register_resolvers()
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(root / "conf")):
        return compose(
            "config",
            overrides=[
                f"output_dir={tmp}",
                f"results_dir={tmp}",
                "tracking=none",
                "progress=false",
                "backend=sim",
                "resume=false",
                *overrides,
            ],
        )


def runner_child(root: Path, rounds: int, overrides: List[str]) -> None:
    """In the child: compose once, run ``rounds`` times, print the runner times as JSON (records and
    caches in a temporary folder, never the checkout's results/)."""
    sys.path.insert(0, str(root))
    from harness.run import run

    with tempfile.TemporaryDirectory(prefix="bench_sim_runner_") as tmp:
        cfg = sim_config(root, tmp, overrides)
        walls = []
        for _ in range(rounds):
            rec = run(cfg, multirun=True, overrides=[])
            if rec["status"] != "ok":  # nothing simulated: no time to count, so no ratio
                raise SystemExit(
                    f"error: {' '.join(overrides)}: status {rec['status']} ({rec.get('message')}); "
                    f"a runner case times a simulation that runs"
                )
            walls.append(rec["repeat_runs"][0]["wall_s"])
    print(json.dumps(walls))


def measure_runners(cases: list, roots: List[Path], rounds: int) -> List[dict]:
    """Best runner time of each RunnerCase, and the per-beam-step ratio of each LinearCase, per
    checkout; each round one process per config and checkout, the checkouts in shuffled order."""
    configs = {
        tuple(o) for c in cases for o in ([c.overrides] if isinstance(c, RunnerCase) else [c.short[0], c.long[0]])
    }
    best: Dict[tuple, float] = {}
    for _ in range(rounds):
        for over in sorted(configs):
            for root in random.sample(roots, len(roots)):
                t = runner_times(root, list(over), 1)[0]
                best[(root, over)] = min(best.get((root, over), t), t)
    out = []
    for c in cases:
        for root in roots:
            if isinstance(c, RunnerCase):
                t = best[(root, tuple(c.overrides))]
                out.append({"case": c, "root": root, "best_s": t, "ratio": t / c.goal_s})
            else:
                short = best[(root, tuple(c.short[0]))] / c.short[1]
                long = best[(root, tuple(c.long[0]))] / c.long[1]
                out.append(
                    {
                        "case": c,
                        "root": root,
                        "short_us": short * 1e6,
                        "long_us": long * 1e6,
                        "ratio": long / short / c.tolerance,
                    }
                )
    return out


# --- report ----------------------------------------------------------------------------------------------
def _verdict(ratio: float) -> str:
    return "OK" if ratio <= 1 else "OVER GOAL"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help=f"comma-separated families: {', '.join(CASES)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--with-tracking", action="store_true", help="keep each config's W&B tracking (offline)")
    ap.add_argument("--against", type=Path, help="another checkout, measured in the same run (before/after)")
    a = ap.parse_args()
    families = [f for f in a.only.split(",") if f] or list(CASES)
    unknown = [f for f in families if f not in CASES]
    problems = (
        ([f"--only {','.join(unknown)}: not a family of cases; one or more of {', '.join(CASES)}"] if unknown else [])
        + ([f"--rounds {a.rounds}: at least 1"] if a.rounds < 1 else [])
        + (
            [f"--against {a.against}: not a checkout of this project (no run.py and conf/ in it)"]
            if a.against and not ((a.against / "run.py").is_file() and (a.against / "conf").is_dir())
            else []
        )
    )
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    cases = [c for f in families for c in CASES[f]()]
    roots = [ROOT] + ([a.against.resolve()] if a.against else [])
    label = {ROOT: "this checkout", **({roots[1]: f"against {roots[1]}"} if a.against else {})}
    for root in roots:
        compile_packages(root)
    load0 = os.getloadavg()
    procs = measure([c for c in cases if isinstance(c, Case)], roots, a.rounds, a.with_tracking)
    runners = measure_runners([c for c in cases if not isinstance(c, Case)], roots, a.rounds)
    load1 = os.getloadavg()
    print(
        f"{a.rounds} rounds, {os.cpu_count()} CPUs, load average {load0[0]:.2f} before / {load1[0]:.2f} after"
        f"{', W&B offline' if a.with_tracking else ''}, Python's bytecode cache on"
    )
    for r in procs:
        c = r["case"]
        mirror = ""
        if r["mirror_s"] is not None:
            mirror = f"; W&B mirror done {r['mirror_s']:.1f} s after the command"
        if r["mirror_cost"] is not None:
            mirror += f" (the mirror alone: {r['mirror_cost'][0]:.1f} s wall, {r['mirror_cost'][1]:.1f} s CPU)"
        cache = ""
        if r["cold"]:
            cache = (
                " [results_dir/cache warm; the run that filled it (a fresh results folder): "
                + ", ".join(f"{w:.2f} s wall / {u:.2f} s CPU" for w, u in r["cold"])
                + " beyond the app]"
            )
        print(
            f"[{label[r['root']]}] {c.name}: {r['wall_s']:.2f} s, empty Hydra app {r['app_s']:.2f} s, beyond it "
            f"{r['extra_s']:.2f} s wall / {r['extra_cpu_s']:.2f} s CPU (goal {c.goal_s:g} s){mirror}{cache}: "
            f"ratio {r['ratio']:.2f} {_verdict(r['ratio'])}"
        )
    for r in runners:
        c = r["case"]
        if isinstance(c, RunnerCase):
            print(
                f"[{label[r['root']]}] {c.name}: best of {a.rounds} {r['best_s']:.2f} s (goal {c.goal_s:g} s): "
                f"ratio {r['ratio']:.2f} {_verdict(r['ratio'])}"
            )
        else:
            print(
                f"[{label[r['root']]}] {c.name}: {r['long_us']:.1f} vs {r['short_us']:.1f} us per beam-step "
                f"(goal <= {c.tolerance:g}x): ratio {r['ratio']:.2f} {_verdict(r['ratio'])}"
            )
    return 0 if all(r["ratio"] <= 1 for r in procs + runners if r["root"] == ROOT) else 1


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == EMPTY_APP:
        root = Path(sys.argv[2])
        del sys.argv[1:3]
        empty_app(root)
        sys.exit(0)
    if len(sys.argv) > 3 and sys.argv[1] == RUNNER:
        runner_child(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
        sys.exit(0)
    sys.exit(main())
