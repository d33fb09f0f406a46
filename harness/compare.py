"""Compare two runs or two sweeps, metric by metric: python -m harness.compare A B [--csv PATH] [--differ]

A and B are two run folders (each holding a run.json) or two sweep folders (job folders with a
run.json each, or a runs.parquet alone). Jobs are matched across A and B by their overrides minus
the bookkeeping keys that the config hash leaves out too (results_dir, sweep_name, tracking,
progress, ...: ``BOOKKEEPING``), then by config hash; ``--ignore KEY`` leaves one more override out
of the match (e.g. ``--ignore hardware`` to pair an A100 sweep with an H100 one). Two run folders
are paired whatever their overrides. Jobs found on one side only are listed as such.

Per matched job and summary key (and the job's status): A's value, B's value, B - A and (B - A) / |A|.
"same" is the verdict rule of harness/verdict.py with A as the reference: B within 15 % of A
(``verdict(B, A) == "reproduced"``; a ``*_attainment`` rate within 3 percentage points); text,
flags and the status must be equal.

Only the same source is compared: a simulated job against a measured one exits 2. A simulated
number within 15 % of a measured one is the simulator's fidelity, not the same result, and exit 0
would tell a script they agree (the fidelity studies, ``python -m systems.<family>.fidelity``,
measure that on purpose).

Exit status: 0 every compared value is the same within tolerance and every job is on both sides;
1 some value differs, or a job or a key is on one side only; 2 bad input (a missing folder, no
record, a simulated job against a measured one, two jobs of one side with one match key, no job
matched), with a one-line error.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pandas as pd

from harness.records import BOOKKEEPING_KEYS as BOOKKEEPING
from harness.records import current_summary, read_record, records_below
from harness.report import _flatten
from harness.stats import is_number
from harness.verdict import ATTAINMENT_POINTS, TOLERANCE, verdict

COLUMNS = ["job", "metric", "a", "b", "delta", "rel_delta", "same", "note"]


class BadInput(Exception):
    """Input that cannot be compared: exit 2 with this one-line message."""


@dataclass
class Job:
    key: str  # the match key: overrides minus bookkeeping, sorted, space-separated
    where: str  # the job's folder (or runs.parquet row) for messages
    config_hash: Optional[str]
    simulated: Optional[bool]  # None: not recorded (a job that failed before choosing a backend)
    status: Optional[str]
    summary: Dict[str, Any] = field(default_factory=dict)  # flat: a.b for nested keys


def match_key(overrides: Sequence[str], ignore: Sequence[str] = ()) -> str:
    """A job's identity across sweeps: its overrides without the bookkeeping keys (and ``ignore``),
    sorted: ``beams=4 system=lbs``."""
    drop = BOOKKEEPING | set(ignore)
    kept = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in drop or key.split(".")[0] in drop:
            continue
        kept.append(o)
    return " ".join(sorted(kept))


def _source(simulated: Optional[bool]) -> str:
    return {True: "simulated", False: "measured"}.get(simulated, "unknown")


def _job_from_record(rec: Dict[str, Any], where: Path, ignore: Sequence[str]) -> Job:
    flat: Dict[str, Any] = {}
    _flatten("", current_summary(rec.get("summary") or {}), flat)
    backend = rec.get("backend") if isinstance(rec.get("backend"), dict) else {}
    sim = backend.get("simulated")
    return Job(
        key=match_key(rec.get("overrides") or [], ignore),
        where=str(where),
        config_hash=rec.get("config_hash"),
        simulated=None if sim is None else bool(sim),
        status=rec.get("status"),
        summary=flat,
    )


def _parquet_value(v: Any) -> Any:
    """A runs.parquet cell as the record held it: mixed-type columns were written as text."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str) and v in ("None", "nan"):
        return None
    if hasattr(v, "item"):  # numpy scalar
        return v.item()
    return v


def load_jobs(folder: Path, ignore: Sequence[str] = ()) -> Tuple[List[Job], bool]:
    """The jobs of a run folder (its run.json) or a sweep folder (every run.json below it, else its
    runs.parquet); returns (jobs, is_single_run). Raises BadInput for a missing folder or no record."""
    folder = Path(folder)
    if not folder.exists():
        raise BadInput(f"{folder}: no such folder")
    if not folder.is_dir():
        raise BadInput(f"{folder}: not a folder (give a run folder holding run.json or a sweep folder)")
    if (folder / "run.json").exists():
        rec = read_record(folder)
        if rec is None:
            raise BadInput(f"{folder / 'run.json'}: not a readable record")
        return [_job_from_record(rec, folder, ignore)], True
    jobs = [_job_from_record(rec, where, ignore) for where, rec in records_below(folder)]
    if jobs:
        return jobs, False
    runs = folder / "runs.parquet"
    if runs.exists():
        try:
            df = pd.read_parquet(runs)
        except Exception as e:  # noqa: BLE001 - any unreadable file is bad input, said in one line
            raise BadInput(f"{runs}: not readable ({type(e).__name__}: {e})") from None
        for i, row in df.iterrows():
            summary = {c[len("summary.") :]: _parquet_value(v) for c, v in row.items() if str(c).startswith("summary.")}
            sim = _parquet_value(row.get("simulated"))
            jobs.append(
                Job(
                    key=match_key(str(row.get("overrides") or "").split(), ignore),
                    where=f"{runs} row {i}",
                    config_hash=_parquet_value(row.get("config_hash")),
                    simulated=None if sim is None else bool(sim),
                    status=_parquet_value(row.get("status")),
                    summary=summary,
                )
            )
        if jobs:
            return jobs, False
    raise BadInput(f"{folder}: no record (no run.json in it or below it, no runs.parquet with rows)")


def match(a: List[Job], b: List[Job], single: bool) -> Tuple[List[Tuple[Job, Job]], List[Job], List[Job]]:
    """Pairs of jobs, then A's and B's jobs without a partner: by match key, then by config hash
    (same config reached by other overrides); two single runs are paired as given. Raises BadInput
    when one side holds two jobs with one key."""
    if single:
        return [(a[0], b[0])], [], []
    for side, jobs in (("A", a), ("B", b)):
        seen: Dict[str, Job] = {}
        for j in jobs:
            if j.key in seen:
                raise BadInput(
                    f"{side} holds two jobs with the overrides '{j.key or '(none)'}' ({seen[j.key].where}, "
                    f"{j.where}): give one sweep folder each, or --ignore fewer keys"
                )
            seen[j.key] = j
    by_key = {j.key: j for j in b}
    pairs, rest_a = [], []
    for j in a:
        if j.key in by_key:
            pairs.append((j, by_key.pop(j.key)))
        else:
            rest_a.append(j)
    rest_b = list(by_key.values())
    by_hash: Dict[str, List[Job]] = {}
    for j in rest_b:
        by_hash.setdefault(j.config_hash or "", []).append(j)
    only_a = []
    for j in rest_a:
        cands = by_hash.get(j.config_hash or "") if j.config_hash else None
        if cands and len(cands) == 1:
            partner = cands.pop()
            rest_b.remove(partner)
            pairs.append((j, partner))
        else:
            only_a.append(j)
    return pairs, only_a, rest_b


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def same_value(metric: str, a: Any, b: Any) -> bool:
    """Whether B's value is A's within tolerance: numbers by harness.verdict.verdict (A the
    reference; ``*_attainment`` rates, fractions, in percentage points); anything else equal."""
    if _missing(a) and _missing(b):
        return True
    if _missing(a) or _missing(b):
        return False
    if is_number(a) and is_number(b):
        if a == b:  # also inf == inf and 0 == 0
            return True
        if metric.endswith("_attainment"):
            return verdict(float(b) * 100, float(a) * 100, points=ATTAINMENT_POINTS) == "reproduced"
        return verdict(float(b), float(a)) == "reproduced"
    return a == b


def compare(pairs: List[Tuple[Job, Job]], only_a: List[Job], only_b: List[Job]) -> pd.DataFrame:
    """The table: one row per matched job and key (the status first), then one per job on one side
    only. Columns :data:`COLUMNS`; ``a``/``b`` keep each value as recorded."""
    rows = []
    for ja, jb in sorted(pairs, key=lambda p: p[0].key):
        job = ja.key if ja.key == jb.key else f"{ja.key} | {jb.key}"
        note0 = "" if ja.config_hash == jb.config_hash else f"config hash differs: {ja.config_hash} vs {jb.config_hash}"
        rows.append(_row(job, "status", ja.status, jb.status, note0))
        keys = list(dict.fromkeys([*ja.summary, *jb.summary]))
        for k in keys:
            note = "only in A" if k not in jb.summary else "only in B" if k not in ja.summary else ""
            rows.append(_row(job, k, ja.summary.get(k), jb.summary.get(k), note))
    for side, jobs in (("A", only_a), ("B", only_b)):
        for j in sorted(jobs, key=lambda j: j.key):
            rows.append(_row(j.key, "", None, None, f"only in {side}: the job ({j.where})"))
    return pd.DataFrame(rows, columns=COLUMNS)


def _row(job: str, metric: str, a: Any, b: Any, note: str = "") -> Dict[str, Any]:
    delta = rel = None
    if is_number(a) and is_number(b) and not _missing(a) and not _missing(b):
        delta = float(b) - float(a)
        rel = delta / abs(a) if a != 0 else (0.0 if delta == 0 else None)
    same = same_value(metric, a, b) and not note.startswith("only in")
    return {"job": job, "metric": metric, "a": a, "b": b, "delta": delta, "rel_delta": rel, "same": same, "note": note}


def _fmt(v: Any, sign: bool = False) -> str:
    if _missing(v):
        return ""
    if is_number(v):
        f = float(v)
        if math.isfinite(f) and f.is_integer() and abs(f) < 1e15:
            return f"{int(f):+,}" if sign else f"{int(f):,}"
        return format(f, "+.6g" if sign else ".6g")
    return str(v)


def render(table: pd.DataFrame, differ_only: bool = False) -> str:
    """The table as text (tabulate), the job named once per block; ``differ_only``: only rows not the same."""
    from tabulate import tabulate

    t = table[~table["same"]] if differ_only else table
    lines, last = [], None
    for r in t.itertuples():
        lines.append(
            [
                r.job if r.job != last else "",
                r.metric,
                _fmt(r.a),
                _fmt(r.b),
                _fmt(r.delta, sign=True),
                "" if _missing(r.rel_delta) else f"{r.rel_delta * 100:+.2f} %",
                "yes" if r.same else "NO",
                r.note,
            ]
        )
        last = r.job
    if not lines:
        return "(no rows)"
    return tabulate(lines, headers=["job", "metric", "A", "B", "B - A", "(B - A)/|A|", "same", "note"])


def check_sources(pairs: List[Tuple[Job, Job]]) -> str:
    """The source both sides share (``simulated`` / ``measured``; ``unknown`` when no record says);
    raises BadInput for a pair of a simulated and a measured job."""
    sources = set()
    for ja, jb in pairs:
        if ja.simulated is not None and jb.simulated is not None and ja.simulated != jb.simulated:
            raise BadInput(
                f"'{ja.key or '(no overrides)'}' is {_source(ja.simulated)} in A ({ja.where}) and "
                f"{_source(jb.simulated)} in B ({jb.where}): only simulated with simulated or measured with "
                "measured is compared (the simulator's fidelity to a real engine: python -m "
                "systems.<family>.fidelity)"
            )
        sources |= {s for s in (ja.simulated, jb.simulated) if s is not None}
    return "+".join(_source(s) for s in sorted(sources, reverse=True)) or "unknown"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        print(f"error: {message} (python -m harness.compare --help)", file=sys.stderr)
        sys.exit(2)


def main(argv: Optional[List[str]] = None) -> int:
    ap = _Parser(
        prog="python -m harness.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("a", help="a run folder (run.json) or a sweep folder: the reference")
    ap.add_argument("b", help="a run folder or a sweep folder, judged against A")
    ap.add_argument("--csv", metavar="PATH", help="write the whole table (every row, raw values) to PATH")
    ap.add_argument("--differ", action="store_true", help="print only the rows that differ (the CSV has all)")
    ap.add_argument(
        "--ignore", action="append", default=[], metavar="KEY", help="leave override KEY out of the match (repeatable)"
    )
    args = ap.parse_args(argv)
    try:
        a, single_a = load_jobs(Path(args.a), args.ignore)
        b, single_b = load_jobs(Path(args.b), args.ignore)
        pairs, only_a, only_b = match(a, b, single_a and single_b)
        if not pairs:
            raise BadInput(
                f"no job of A ({len(a)}) matches one of B ({len(b)}) by overrides (paths left out) or config "
                f"hash; A has e.g. '{a[0].key}', B '{b[0].key}' (--ignore KEY leaves a differing override out)"
            )
        source = check_sources(pairs)
        table = compare(pairs, only_a, only_b)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.csv:
        try:
            Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
            table.to_csv(args.csv, index=False)
        except OSError as e:
            print(f"error: --csv {args.csv}: {e.strerror or e}", file=sys.stderr)
            return 2
    compared = table[table["metric"] != ""]
    differ = int((~compared["same"]).sum())
    label = source.upper() if source != "measured" else source
    print(f"A: {args.a} ({len(a)} job{'s' if len(a) != 1 else ''})")
    print(f"B: {args.b} ({len(b)} job{'s' if len(b) != 1 else ''})")
    print(
        f"both {label}; same = B within {TOLERANCE:.0%} of A (harness/verdict.py; a *_attainment rate "
        f"within {ATTAINMENT_POINTS:g} percentage points), other values equal"
    )
    print(render(table, args.differ))
    print(
        f"{len(pairs)} job(s) matched, {len(only_a)} only in A, {len(only_b)} only in B; "
        f"{len(compared) - differ} of {len(compared)} values the same within tolerance, {differ} differ"
        + (f"; table written to {args.csv}" if args.csv else "")
    )
    return 0 if differ == 0 and not only_a and not only_b else 1


__all__ = ["main", "load_jobs", "match", "match_key", "same_value", "compare", "render", "BOOKKEEPING", "BadInput"]

if __name__ == "__main__":
    sys.exit(main())
