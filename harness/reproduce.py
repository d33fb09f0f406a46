"""Reproduce every paper experiment with one command, then one page of verdicts and one of figures.

    python -m harness.reproduce                 # every simulated paper experiment (conf/experiment/*)
    python -m harness.reproduce --real          # + the real-engine fidelity studies that fit this machine
    python -m harness.reproduce --only lbs_fig9,beam_fig7   # run and collect only these two
    python -m harness.reproduce --collect-only  # rebuild the two pages from the sweeps already recorded
    python -m harness.reproduce --quick         # a one-minute check: one small experiment per family

Each experiment runs as ``python run.py -m experiment=<name>`` (resumable: recorded jobs are
skipped) with its log in ``<results_dir>/reproduce/<name>.log``, after a line ``[k/N] experiment
NAME (elapsed 3m, ~12m left)`` (the estimate: seconds per job so far, per family, times the jobs
left). ``--quick`` runs only :data:`QUICK`, one small simulated experiment per family (about a
minute on 2 CPU cores), into ``<results_dir>/quick`` unless ``--results-dir`` is given: it tries
the tools, it is not the reproduction (its pages say so). Then:

- ``<results_dir>/REPRODUCTION.md``: one row per paper number -- ours, the paper's, the verdict of
  :mod:`harness.verdict` (one rule), whether ours is simulated, and a link to the figure -- read from
  every sweep's ``verdicts.csv`` (with ``--only``, the named experiments' sweeps only); on top, how
  many of all paper numbers (every row of ``results/reference/*.csv``) were run, and the verdict
  counts; the paper numbers of figures without a sweep are listed last, per figure, as ``not run``.
  A figure with several sweeps gives the verdicts of one: the newest complete one (the page names the others).
- ``<results_dir>/index.html``: every sweep's figures and tables on one static page.

Extra arguments go to every experiment (W&B is opt-in: ``tracking=none`` unless they set
``tracking=wandb`` or a ``tracking.`` key); they are checked first as ``run.py``
checks its own, then by each experiment's sweep with them (``$TTC_SWEEP_CHECK_ONLY``: its up-front
checks of its jobs, nothing run); an unknown option or key, or a value an experiment's jobs refuse,
exits 2 before anything runs. An experiment that fails is
listed with its exit code and log, and the log's last lines are printed; the others still run.
"""

from __future__ import annotations

import argparse
import html
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd

from harness.config import default_results_dir
from harness.errors import ConfigError
from harness.records import atomic_write_bytes
from harness.verdict import VERDICTS

ROOT = Path(__file__).resolve().parent.parent
# real-engine studies (CPU here): module -> sweep folder it writes
REAL = {
    "systems.kv_offload.fidelity": "lbs_fidelity",
    "systems.energy_serving.fidelity": "serving_fidelity",
    "systems.verifier_search.fidelity": "tts_fidelity",
}
NOT_PAPER = {
    "lbs_fidelity",
    "beam_fidelity",
    "beam_fidelity_sim",  # not paper figures (--real runs them)
    "fasttts_offload",
    "fasttts_workload_sensitivity",  # re-judges Fig. 12 once per workload model: not the paper's count
    "lbs_energy",
}  # cross-paper studies: no paper numbers
# --quick: one small simulated experiment per family, each at the paper's own settings (own verdicts);
# on 2 shared CPU cores: lbs_fig4 5 jobs ~3 s, fasttts_memory 9 jobs ~37 s, beam_fig9 3 jobs ~5 s
QUICK = ["lbs_fig4", "fasttts_memory", "beam_fig9"]
QUICK_NOTE = (
    "**Quick check (`--quick`): only " + ", ".join(QUICK) + ", one small simulated experiment per family. "
    "Not the reproduction: `python -m harness.reproduce` runs every paper experiment.**"
)


def paper_experiments() -> List[str]:
    return sorted(
        p.stem
        for p in (ROOT / "conf" / "experiment").glob("*.yaml")
        if not p.stem.startswith("_") and p.stem not in NOT_PAPER
    )


def _run(cmd: List[str], log: Path, timeout_s: float) -> Dict:
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "a") as f:  # a re-run adds to the log of an interrupted one
        f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"rc": rc, "wall_s": time.perf_counter() - t0, "log": str(log)}


def _tell_failure(r: Dict, lines: int = 5) -> None:
    """A failed command's last log lines (its reason) on stderr, with the log's path."""
    if str(r["rc"]) == "0":
        return
    tail = Path(r["log"]).read_text(errors="replace").splitlines()[-lines:]
    print(f"[reproduce] last lines of {r['log']}:\n" + "\n".join(f"  {ln}" for ln in tail), file=sys.stderr, flush=True)


def with_tracking_default(overrides: List[str]) -> List[str]:
    """The experiments' overrides with ``tracking=none`` first unless they choose tracking themselves:
    a reproduction is 30 experiments, each a sweep whose W&B run would be logged (W&B is opt-in:
    ``tracking=wandb``)."""
    own = any(o.lstrip("+~").split("=", 1)[0].split(".")[0] == "tracking" for o in overrides)
    return list(overrides) if own else ["tracking=none", *overrides]


def check_overrides(
    overrides: List[str], collect_only: bool, names: List[str] = (), results_dir: Optional[Path] = None
) -> None:
    """Raise ConfigError for extra arguments that no experiment could run with: ignored (with
    --collect-only), set by this command itself (``experiment=``, ``results_dir=``), refused by
    run.py's own pre-flight (an unknown option or key: :func:`harness.cli.preflight`), or refused by
    the sweep of one of the experiments ``names`` (``seed=-1``, ``tp=3`` where the experiment's jobs
    need tp x pp <= 8 GPUs, a folder holding another config's record): each experiment's sweep makes its
    own up-front checks with them and runs nothing (``$TTC_SWEEP_CHECK_ONLY``, the sweeper's point 7;
    ~1-3 s each, two at a time, only when there are overrides); the error is the sweep's, naming the
    experiment."""
    from concurrent.futures import ThreadPoolExecutor

    from harness.cli import preflight
    from harness.config import register_configs

    if overrides and collect_only:
        raise ConfigError(
            f"{' '.join(overrides)}: --collect-only runs no experiment, so these overrides would "
            f"be ignored (drop them, or drop --collect-only)"
        )
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in ("experiment", "results_dir"):
            raise ConfigError(
                f"{o}: set by this command (use --only NAME,... for experiments, --results-dir "
                f"PATH for the results folder)"
            )
    register_configs()
    preflight(["-m", *overrides], ROOT / "conf")  # they go to experiments' sweeps: a,b sweeps there
    if not overrides or collect_only or not names:
        return
    print(f"[reproduce] checking {' '.join(overrides)} with the jobs of {len(names)} experiment(s) ...", flush=True)
    env = dict(os.environ, TTC_SWEEP_CHECK_ONLY="1", WANDB_MODE="disabled")

    def check(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            experiment_command(name, results_dir or default_results_dir(), overrides),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        for name, p in zip(names, pool.map(check, names)):
            if p.returncode != 0:
                lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
                why = "\n".join(ln for ln in lines if ln.startswith(("error:", "  (in the sweep job"))) or "\n".join(
                    lines[-5:]
                )
                raise ConfigError(
                    f"experiment={name} refuses {' '.join(overrides)} (exit {p.returncode}; nothing was run):\n{why}"
                )


def experiment_command(name: str, results_dir: Path, extra: List[str]) -> List[str]:
    """The command that runs experiment ``name`` (its sweep) with the extra arguments."""
    return [
        sys.executable,
        "run.py",
        "-m",
        f"experiment={name}",
        f"results_dir={results_dir}",
        "progress=false",
        *extra,
    ]


_clock = time.monotonic  # the progress lines' clock (tests replace it)


def job_count(name: str, extra: List[str] = ()) -> Optional[int]:
    """How many jobs experiment ``name``'s sweep runs: its ``hydra.sweeper.params`` expanded with the
    extra overrides as the sweeper expands them (``hydra_plugins.harness_sweeper.sweep_jobs``:
    ``beams=4`` makes lbs_fig9's 225 jobs 45); None when the file cannot say (a sweep it cannot count)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from hydra_plugins.harness_sweeper import sweep_jobs

    try:
        cfg = OmegaConf.load(ROOT / "conf" / "experiment" / f"{name}.yaml")
        params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=False) or {}
        return len(sweep_jobs(params, extra, OverridesParser.create()))
    except Exception:  # noqa: BLE001 - an estimate, never a reason to stop
        return None


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def estimate_left(todo: List[tuple], done: List[tuple]) -> str:
    """``~Ym left`` for the commands ``todo`` (family, jobs or None), from ``done`` (family, jobs or
    None, seconds): per command, its jobs x the seconds per job its family's experiments took so far
    (every family's when none of its own ran yet); a command with no job count (a real-engine study)
    is not estimated and said so. ``estimate unknown`` before any experiment ended. Jobs a resumed
    sweep skips (recorded before) take no time, so a resumed reproduction's estimate runs low."""
    per_family: Dict[str, List[float]] = {}
    for fam, jobs, secs in done:
        if jobs:
            per_family.setdefault(fam, [0.0, 0.0])
            per_family[fam][0] += secs
            per_family[fam][1] += jobs
    total = [sum(v[0] for v in per_family.values()), sum(v[1] for v in per_family.values())]
    if not total[1]:
        return "estimate unknown"
    left, unknown = 0.0, 0
    for fam, jobs in todo:
        if not jobs:
            unknown += 1
            continue
        secs, n = per_family.get(fam, total)
        left += jobs * secs / n
    if unknown == len(todo):
        return "estimate unknown"
    return f"~{_duration(left)} left" + (f" + {unknown} not estimated" if unknown else "")


def run_all(names: List[str], results_dir: Path, real: List[str], extra: List[str], timeout_s: float) -> pd.DataFrame:
    """Run the experiments (and real-engine studies); returns one row per command with its status.
    Before each: ``[k/N] experiment NAME (elapsed 3m, ~12m left)`` (:func:`estimate_left`)."""
    rows = []
    py = sys.executable
    cmds = [(name, f"experiment {name}", name.split("_")[0], job_count(name, extra)) for name in names]
    cmds += [(mod, f"python -m {mod}", "real", None) for mod in real]
    t0, done = _clock(), []
    for k, (what, label, fam, jobs) in enumerate(cmds):
        eta = estimate_left([(f, j) for _, _, f, j in cmds[k:]], done)
        print(f"[{k + 1}/{len(cmds)}] {label} (elapsed {_duration(_clock() - t0)}, {eta})", flush=True)
        t = _clock()
        if fam == "real":
            r = _run(
                [py, "-m", what, f"results_dir={results_dir}"], results_dir / "reproduce" / f"{what}.log", timeout_s
            )
            rows.append({"command": f"python -m {what}", **r})
            print(f"[reproduce] {what}: exit {r['rc']} in {r['wall_s']:.0f} s", flush=True)
        else:
            r = _run(experiment_command(what, results_dir, extra), results_dir / "reproduce" / f"{what}.log", timeout_s)
            rows.append({"command": f"run.py -m experiment={what}", **r})
            print(f"[reproduce] experiment={what}: exit {r['rc']} in {r['wall_s']:.0f} s", flush=True)
        done.append((fam, jobs, _clock() - t))
        _tell_failure(r)
    return pd.DataFrame(rows)


def _by_figure(df: pd.DataFrame, *then: str) -> pd.DataFrame:
    """Rows by paper, then figure in natural order (fig4 before fig10), then ``then``."""
    key = df["figure"].astype(str).str.extract(r"^(\D*)(\d*)")
    df = df.assign(_f=key[0], _n=pd.to_numeric(key[1], errors="coerce"))
    return df.sort_values(["paper", "_f", "_n", *then], kind="stable").drop(columns=["_f", "_n"]).reset_index(drop=True)


def _complete(sweep_dir: Path) -> bool:
    """Whether the sweep has nothing left to run: its runs.parquet lists jobs, each with a valid
    record (``records.VALID_STATUSES``, what a re-run skips)."""
    from harness.records import VALID_STATUSES

    p = sweep_dir / "runs.parquet"
    if not p.exists():
        return False
    status = pd.read_parquet(p, columns=["status"])["status"]
    return bool(len(status)) and bool(status.isin(VALID_STATUSES).all())


def _one_sweep_per_figure(v: pd.DataFrame) -> pd.DataFrame:
    """Per paper figure, the rows of one sweep: the newest complete one (:func:`_complete`; newest =
    its verdicts.csv written last), else the newest; column ``over`` names the sweeps left out."""
    fig = [(str(p), str(f)) for p, f in zip(v["paper"], v["figure"])]
    best: Dict[tuple, str] = {}
    others: Dict[tuple, List[str]] = {}
    for f, _, _, sweep in sorted(
        set(zip(fig, v["complete"], v["written"], v["sweep"])), key=lambda t: t[1:], reverse=True
    ):  # complete first, then newest
        if best.setdefault(f, sweep) != sweep:
            others.setdefault(f, []).append(sweep)
    keep = [best[f] == s for f, s in zip(fig, v["sweep"])]
    return v[keep].assign(over=[", ".join(others.get(f, [])) for f, k in zip(fig, keep) if k])


def collect(results_dir: Path, sweeps: Optional[List[str]] = None) -> pd.DataFrame:
    """Every ``verdicts.csv`` under ``<results_dir>/sweeps`` as one table (column ``sweep`` added),
    one sweep per paper figure (:func:`_one_sweep_per_figure`: a second sweep of an experiment does
    not count its paper numbers twice); ``sweeps``: only those sweep folders (None = all)."""
    frames = []
    for p in sorted((results_dir / "sweeps").glob("*/verdicts.csv")):
        if sweeps is not None and p.parent.name not in sweeps:
            continue
        df = pd.read_csv(p)
        df.insert(0, "sweep", p.parent.name)
        frames.append(df.assign(complete=_complete(p.parent), written=p.stat().st_mtime, subset=_subset(p.parent)))
    if frames:
        return _by_figure(_one_sweep_per_figure(pd.concat(frames, ignore_index=True)), "sweep")
    return pd.DataFrame(
        columns=[
            "sweep",
            "paper",
            "figure",
            "quantity",
            "paper_value",
            "kind",
            "paper_hi",
            "ours",
            "ours_hi",
            "unit",
            "simulated",
            "source",
            "note",
            "verdict",
            "complete",
            "written",
            "over",
            "subset",
        ]
    )


def _subset(sweep_dir: Path) -> str:
    """'first K problems' when the sweep's jobs ran ``workload.num_problems=K`` (its runs.parquet), else
    '': such verdicts compare a subset with the paper's full-dataset numbers, and REPRODUCTION.md says so."""
    p = sweep_dir / "runs.parquet"
    col = "config.workload.num_problems"
    try:
        import pyarrow.parquet as pq

        if col not in pq.read_schema(p).names:
            return ""
        k = pd.to_numeric(pd.read_parquet(p, columns=[col])[col], errors="coerce").dropna().unique()
    except (OSError, ValueError):
        return ""
    return f"first {', '.join(str(int(x)) for x in sorted(k))} problems" if len(k) else ""


def _value(lo, hi, kind: str = "=", unit: str = "") -> str:
    from harness.verdict import fmt_range

    s = fmt_range(lo, hi)
    if not s or isinstance(lo, float) and math.isinf(lo):  # "not reached": no unit, no bound sign
        return s
    return f"{'> ' if kind == '>=' else '< ' if kind == '<=' else ''}{s} {unit}".strip()


def reference_rows() -> pd.DataFrame:
    """Every paper number: each row of ``results/reference/*.csv`` (column ``paper`` = the file's name)."""
    from harness.report import REFERENCE_DIR, load_reference

    frames = [load_reference(p.stem).assign(paper=p.stem) for p in sorted(REFERENCE_DIR.glob("*.csv"))]
    ref = pd.concat(frames, ignore_index=True)
    return ref.assign(figure=ref["figure"].astype(str))


def not_run(v: pd.DataFrame, ref: pd.DataFrame) -> pd.DataFrame:
    """The reference rows of figures that no collected sweep gives a verdict for."""
    done = set(zip(v["paper"].astype(str), v["figure"].astype(str)))
    return ref[[(p, f) not in done for p, f in zip(ref["paper"], ref["figure"])]].reset_index(drop=True)


def write_reproduction(
    results_dir: Path,
    v: pd.DataFrame,
    runs: Optional[pd.DataFrame] = None,
    only: Optional[List[str]] = None,
    note: str = "",
) -> Path:
    """``REPRODUCTION.md``: how many paper numbers (rows of results/reference/*.csv) were run, counts
    per verdict, then one row per paper number and source of ours, and last the paper numbers of
    figures without a collected sweep (``not run``), per figure. ``only``: the experiments collected
    (--only); ``note``: a paragraph under the title (--quick says what it is)."""
    counts = v["verdict"].value_counts() if len(v) else pd.Series(dtype=int)
    ref = reference_rows()
    missing = not_run(v, ref)
    lines = [
        "# Reproduction status",
        "",
        "Every paper number next to ours and the verdict of `harness/verdict.py` (within 15 % of a point,",
        "inside a stated range or bound; an SLO attainment within 3 percentage points). `sim` = ours is simulated (the simulator on the named GPU profile),",
        "`measured` = a real engine measured it on this machine. Built by `python -m harness.reproduce`.",
        "",
    ]
    if note:
        lines += [note, ""]
    if only is not None:
        lines += [
            f"Only these experiments' sweeps are collected (--only): {', '.join(only)}; any other sweep "
            f"under `{results_dir / 'sweeps'}` is left out.",
            "",
        ]
    why = "not collected (--only) or no sweep here" if only is not None else "no sweep here"
    lines += [
        f"**{len(ref) - len(missing)} of {len(ref)} paper numbers run** (rows of results/reference/*.csv), "
        f"**{len(missing)} not run** ({why}; listed last). Verdicts of {len(v)} paper numbers "
        "(one per source of ours; a stated min-max pair is one range): **"
        + ", ".join(f"{counts.get(k, 0)} {k}" for k in VERDICTS)
        + "**"
        + (
            " ("
            + "; ".join(
                f"{paper}: " + " / ".join(str(int((g == k).sum())) for k in VERDICTS) + f" of {len(g)}"
                for paper, g in v.groupby("paper")["verdict"]
            )
            + ", as reproduced / partly / not reproduced / no result)"
            if len(v) and "paper" in v
            else ""
        )
        + ".",
        "",
    ]
    cut = (
        sorted(
            {
                f"{r.paper} {r.figure} ({r.subset})"
                for r in v.itertuples()
                if isinstance(getattr(r, "subset", ""), str) and r.subset
            }
        )
        if len(v)
        else []
    )
    if cut:
        lines += [
            "Sweeps run on a subset of the problems (`workload.num_problems`), judged against the paper's "
            "full-dataset numbers: " + "; ".join(cut) + ".",
            "",
        ]
    over = v[v["over"].astype(bool)].drop_duplicates(["paper", "figure"]) if len(v) else v
    if len(over):
        lines += [
            "Figures with more than one sweep: each shows the newest complete sweep (every job recorded ok "
            "or oom; newest = its verdicts.csv written last), else the newest; the others are left out:",
            "",
        ]
        lines += [f"- {r.paper} {r.figure}: `{r.sweep}` (left out: {r.over})" for r in over.itertuples()] + [""]
    if runs is not None and len(runs):
        bad = runs[runs["rc"].astype(str) != "0"]
        if len(bad):
            lines += ["Commands that failed (see their logs):", ""]
            lines += [f"- `{r.command}`: exit {r.rc} ({r.log})" for r in bad.itertuples()] + [""]
    lines += [
        "| paper | figure | quantity | ours | paper | verdict | ours is | figure of ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in v.itertuples():
        link = f"[{r.source}](sweeps/{r.sweep}/{r.source})" if isinstance(r.source, str) and r.source else ""
        lines.append(
            f"| {r.paper} | {r.figure} | {r.quantity} | {_value(r.ours, r.ours_hi, '=', r.unit)} | "
            f"{_value(r.paper_value, r.paper_hi, r.kind, r.unit)} | {r.verdict} | "
            f"{'sim' if bool(r.simulated) else 'measured'}"
            f"{', ' + r.subset if isinstance(getattr(r, 'subset', ''), str) and r.subset else ''} | {link} |"
        )
    if len(missing):
        lines += [
            "",
            f"## Not run ({len(missing)} paper numbers: "
            + (
                "no sweep of their figure collected (--only), or none here)"
                if only is not None
                else "no sweep of their figure here)"
            ),
            "",
        ]
        per_figure = _by_figure(missing).groupby(["paper", "figure"], sort=False)
        lines += [
            f"- {p} {f}: {len(g)} not run ({', '.join(dict.fromkeys(g['metric'].astype(str)))})"
            for (p, f), g in per_figure
        ]
    p = results_dir / "REPRODUCTION.md"
    atomic_write_bytes(p, ("\n".join(lines) + "\n").encode())
    return p


PAPERS = {  # the papers' order on the figure page, and their names there
    "lbs": "LBS: locality-aware beam scheduling (MLSys 26)",
    "fasttts": "FastTTS: generator + verifier test-time scaling (ASPLOS 26)",
    "beam": "BEAM: energy-aware serving under TTFT/TBT SLOs (MLSys 26)",
}
_PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:auto;padding:0 8px} img{max-width:100%;"
    "border:1px solid #ccc} table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #bbb;"
    "padding:2px 6px;vertical-align:top} .wide{overflow-x:auto;max-width:100%} h2{border-top:2px solid #444;"
    "padding-top:8px} .reproduced{background:#e3f4e3} .partly{background:#fdf3d7} .not{background:#f8e1e1}"
)


def _markdown_html(text: str) -> str:
    """Markdown to HTML, with a blank line put before a list that follows a paragraph line (Python-
    Markdown reads such a list as part of the paragraph: REPRODUCTION.md's lists came out as one
    paragraph) and every table in a horizontally scrolling box (a wide table overran the column)."""
    import markdown

    lines = text.splitlines()
    fixed = []
    for i, line in enumerate(lines):
        if re.match(r"\s*[-*] ", line) and i and lines[i - 1].strip() and not re.match(r"\s*[-*] ", lines[i - 1]):
            fixed.append("")
        fixed.append(line)
    out = markdown.markdown("\n".join(fixed), extensions=["tables"])
    return out.replace("<table>", "<div class='wide'><table>").replace("</table>", "</table></div>")


def _verdict_table(v: pd.DataFrame) -> str:
    """One paper's verdict rows as an HTML table: figure, quantity, ours, the paper's, verdict, source."""
    head = "<tr><th>figure</th><th>quantity</th><th>ours</th><th>paper</th><th>verdict</th><th>ours is</th></tr>"
    rows = []
    for r in v.itertuples():
        css = "not" if r.verdict == "not reproduced" else str(r.verdict).replace(" ", "")
        cells = [
            r.figure,
            r.quantity,
            _value(r.ours, r.ours_hi, "=", r.unit),
            _value(r.paper_value, r.paper_hi, r.kind, r.unit),
            r.verdict,
            "sim" if bool(r.simulated) else "measured",
        ]
        rows.append(f"<tr class='{css}'>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f"<div class='wide'><table>{head}{''.join(rows)}</table></div>"


def _sweep_html(results_dir: Path, d: Path, what: str) -> List[str]:
    """A sweep's figures (``what`` = figures) or its tables (tables), as HTML parts."""
    name = html.escape(d.name)
    if what == "figures":
        return [
            f"<p><img src='sweeps/{name}/{html.escape(p.name)}' alt='{html.escape(p.stem)}'></p>"
            for p in sorted(d.glob("*.png"))
        ]
    parts = []
    for p in sorted(d.glob("*.md")):
        body = re.sub(r"(?m)^#(?=#* )", "#####", p.read_text())  # the table's own title below h4
        parts.append(f"<h4>{html.escape(p.name)} (<a href='sweeps/{name}/{html.escape(p.stem)}.tex'>LaTeX</a>)</h4>")
        parts.append(_markdown_html(body))
    return parts


def write_index(results_dir: Path, only: Optional[List[str]] = None) -> Path:
    """``index.html``: one static page of the results. Per paper (LBS, FastTTS, BEAM): its sweeps'
    figures first, then its paper numbers beside ours with their verdicts, then its sweeps' tables;
    sweeps that are no paper experiment (ad-hoc) last; REPRODUCTION.md's full table is linked, not
    put before the figures. Tables scroll sideways where they are wide; a value never reached reads
    "not reached" (it read "inf tokens/s"). ``only``: just these sweeps (--only), as REPRODUCTION.md."""
    sweeps = sorted(d for d in (results_dir / "sweeps").glob("*") if d.is_dir() and (only is None or d.name in only))
    sweeps = [d for d in sweeps if any(d.glob("*.png")) or any(d.glob("*.md"))]
    experiments = set(paper_experiments())
    by_paper = {p: [d for d in sweeps if d.name in experiments and d.name.split("_")[0] == p] for p in PAPERS}
    adhoc = [d for d in sweeps if not any(d in ds for ds in by_paper.values())]
    v = collect(results_dir, [d.name for d in sweeps])
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>ttc-sched-bench results</title>",
        f"<style>{_PAGE_STYLE}</style></head><body>",
        "<h1>ttc-sched-bench: figures and tables</h1>",
        "<p>Each paper's figures, then its numbers beside ours with the verdict of <code>harness/verdict.py</code> "
        "(<code>sim</code>: ours is simulated on the named GPU profile; <code>measured</code>: a real engine on this "
        "machine), then its tables. The whole list, with the paper numbers not run: "
        "<a href='REPRODUCTION.md'>REPRODUCTION.md</a>.</p>",
    ]

    def links(ds: List[Path]) -> str:
        return " ".join(f"<a href='#{html.escape(d.name)}'>{html.escape(d.name)}</a>" for d in ds)

    nav = [f"<b><a href='#{p}'>{p}</a></b>: {links(ds)}" for p, ds in by_paper.items() if ds]
    nav += [f"<b><a href='#adhoc'>other sweeps</a></b>: {links(adhoc)}"] if adhoc else []
    parts.append("<p>" + "<br>".join(nav) + "</p>")
    for paper, ds in by_paper.items():
        if not ds:
            continue
        parts.append(f"<h2 id='{paper}'>{html.escape(PAPERS[paper])}</h2>")
        for d in ds:
            parts.append(f"<h3 id='{html.escape(d.name)}'>{html.escape(d.name)}</h3>")
            parts += _sweep_html(results_dir, d, "figures")
        mine = v[v["paper"] == paper] if len(v) else v
        if len(mine):
            counts = mine["verdict"].value_counts()
            said = ", ".join(f"{int(counts.get(k, 0))} {k}" for k in VERDICTS)
            parts.append(f"<h3>{html.escape(paper)}: paper numbers beside ours ({said})</h3>")
            parts.append(_verdict_table(mine))
        for d in ds:
            tables = _sweep_html(results_dir, d, "tables")
            if tables:
                parts.append(f"<h3>{html.escape(d.name)}: tables</h3>")
                parts += tables
    if adhoc:
        parts.append("<h2 id='adhoc'>Other sweeps (no paper experiment)</h2>")
        for d in adhoc:
            parts.append(f"<h3 id='{html.escape(d.name)}'>{html.escape(d.name)}</h3>")
            parts += _sweep_html(results_dir, d, "figures") + _sweep_html(results_dir, d, "tables")
    parts.append("</body></html>")
    out = results_dir / "index.html"
    atomic_write_bytes(out, "\n".join(parts).encode())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.reproduce", description=__doc__.split("\n\n")[0])
    ap.add_argument("--real", action="store_true", help="also the real-engine fidelity studies (CPU)")
    ap.add_argument(
        "--only", action="append", default=None, help="comma-separated experiment names (may be repeated: the union)"
    )
    ap.add_argument("--collect-only", action="store_true", help="only rebuild REPRODUCTION.md and index.html")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"a one-minute check, not the reproduction: only {', '.join(QUICK)} (one per family, "
        "simulated), into <results dir>/quick unless --results-dir is given",
    )
    ap.add_argument(
        "--results-dir",
        default=None,
        help="default: $TTC_RESULTS_DIR, else <repo>/results (as run.py's results_dir); with --quick, its quick/",
    )
    ap.add_argument("--timeout", type=float, default=None, help="seconds per command (default 3600)")
    ap.add_argument("overrides", nargs="*", help="extra overrides for every experiment (e.g. tracking=none)")
    a = ap.parse_args(argv)
    names = paper_experiments()
    if a.quick and (a.only is not None or a.real):
        print(
            "error: --quick runs its own experiments ("
            + ", ".join(QUICK)
            + "), simulated: drop "
            + ("--only" if a.only is not None else "--real"),
            file=sys.stderr,
        )
        return 2
    if a.results_dir is None:
        a.results_dir = default_results_dir() / "quick" if a.quick else default_results_dir()
    if a.quick:
        names, a.only = list(QUICK), list(QUICK)  # collected as with --only: the quick sweeps alone
    elif a.only is not None:  # every --only counts; an empty one is an error, not "all"
        wanted = list(dict.fromkeys(x.strip() for o in a.only for x in o.split(",") if x.strip()))
        if not wanted:
            print(
                f"error: --only {','.join(map(repr, a.only))}: names no experiment; one or more of "
                f"{', '.join(names)} (comma-separated), or no --only for all",
                file=sys.stderr,
            )
            return 2
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            print(
                f"error: --only {','.join(unknown)}: not a paper experiment; one of {', '.join(names)}", file=sys.stderr
            )
            return 2
        names = wanted
    problems = []  # checked before anything runs or is written
    if not str(a.results_dir).strip():
        problems.append(
            "--results-dir '': a folder (an empty one wrote into the current directory); leave it "
            "out for $TTC_RESULTS_DIR, else <repo>/results"
        )
    if a.timeout is not None and not a.timeout > 0:
        problems.append(f"--timeout {a.timeout:g}: seconds per command, > 0")
    if a.collect_only and (a.real or a.timeout is not None):
        problems.append("--collect-only runs nothing: --real and --timeout have no effect with it")
    a.results_dir, a.timeout = Path(a.results_dir), 3600.0 if a.timeout is None else a.timeout
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    try:
        check_overrides(a.overrides, a.collect_only, names, a.results_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.collect_only and not (a.results_dir / "sweeps").is_dir():
        problems.append(f"--collect-only: {a.results_dir / 'sweeps'} does not exist: nothing to collect")
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    runs = None
    real = [m for m in REAL if (ROOT / (m.replace(".", "/") + ".py")).exists()] if a.real else []
    if a.quick and not a.collect_only:
        print(
            f"[reproduce] --quick: {len(QUICK)} small simulated experiments, one per family, into "
            f"{a.results_dir}; not the reproduction (python -m harness.reproduce runs all {len(paper_experiments())})",
            flush=True,
        )
    if not a.collect_only:
        try:
            runs = run_all(names, a.results_dir, real, with_tracking_default(a.overrides), a.timeout)
        except KeyboardInterrupt:  # one line, not a traceback; each sweep keeps what it recorded
            print(
                f"interrupted: every record written before is intact; the same command again skips them "
                f"(REPRODUCTION.md not rewritten; --collect-only rebuilds it from {a.results_dir})",
                file=sys.stderr,
            )
            return 130
    collected = [*names, *(REAL[m] for m in real)] if a.only is not None else None
    v = collect(a.results_dir, collected)
    rep = write_reproduction(a.results_dir, v, runs, collected, QUICK_NOTE if a.quick else "")
    idx = write_index(a.results_dir, collected)
    print(f"wrote {rep} ({len(v)} verdict rows) and {idx}")
    failed = runs is not None and (runs["rc"].astype(str) != "0").any()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
