"""A job's repeats (``repeats=N``): each with its own seed and folder, failures recorded as results,
then one result with each metric's mean and 95 % interval.
"""

from __future__ import annotations

import copy
import logging
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import open_dict

from harness import machine
from harness.backend import Backend
from harness.errors import RunOOM
from harness.family import WARMUP_KEY, Family, RunContext, RunResult
from harness.process import INTERRUPTED
from harness.stats import aggregate

log = logging.getLogger(__name__)


@dataclass
class Repeat:
    """One repeat of a job: its index, seed, folder (repeat 0: the job's own), wall time, result and,
    on a real engine, the machine's load average before and after it."""

    index: int
    seed: int
    outdir: Path
    wall_s: float
    result: RunResult
    load_avg_before: Optional[list] = None
    load_avg_after: Optional[list] = None

    @property
    def dir_name(self) -> str:
        return "." if self.index == 0 else self.outdir.name


def run_repeat(
    family: Family, cfg, backend: Backend, outdir: Path, tracker, index: int, seed: int, repeats: int
) -> Repeat:
    """Run repeat ``index`` with ``seed`` (the job's config itself when repeats == 1)."""
    if repeats > 1:
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            cfg.seed = seed
        outdir = outdir if index == 0 else outdir / f"repeat-{index}"
    ctx = RunContext(cfg, backend, outdir, tracker, show_progress=bool(cfg.get("progress", True)))
    before = None if backend.simulated else machine.load_avg()
    t0 = time.perf_counter()
    res = run_once(family, cfg, ctx)
    wall = time.perf_counter() - t0
    return Repeat(index, seed, outdir, wall, res, before, None if backend.simulated else machine.load_avg())


def run_once(family: Family, cfg, ctx: RunContext) -> RunResult:
    """``family.run(cfg, ctx)`` with failures as results (oom / error) and, on a real engine, the
    GPU energy of the window (NVML; None = unavailable)."""
    meter = None
    if not ctx.backend.simulated:  # measured GPU energy for the run window (NVML counter)
        from harness.meters import EnergyMeter

        meter = EnergyMeter()  # the job's GPUs (CUDA_VISIBLE_DEVICES), by UUID
        meter.begin_window("run")
    gpus = (
        [{"cuda_index": g.ordinal, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id} for g in meter.gpus]
        if meter is not None
        else None
    )
    try:
        res = family.run(cfg, ctx)
    except KeyboardInterrupt:  # SIGINT (Ctrl-C): recorded, then the job stops (_record_job)
        res = RunResult(status="interrupted", message=INTERRUPTED)
    except RunOOM as e:
        res = RunResult(status="oom", message=str(e))
    except MemoryError as e:
        res = RunResult(
            status="oom",
            message=f"host MemoryError: this process ran out of host memory"
            f"{f' ({e})' if str(e) else ''} (the run's own state, not a modelled KV cache)",
        )
    except Exception as e:
        if type(e).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError
            res = RunResult(status="oom", message=str(e).splitlines()[0])
        else:
            log.error("run failed: %s", traceback.format_exc())
            res = RunResult(status="error", message=f"{type(e).__name__}: {e}")
    if meter is not None:
        m = meter.end_window("run")
        res.summary.setdefault("gpu_energy_j", m.energy_j)  # None = unavailable, never 0
        res.summary.setdefault("gpu_avg_power_w", m.avg_power_w)
        if m.energy_j is None:
            res.summary.setdefault("gpu_energy_note", m.reason)
        res.extra.setdefault("energy_gpus", gpus)  # stored in the record (repeat 0's at top level)
    return res


def combine_repeats(repeats: List[Repeat], rec: Dict[str, Any]) -> RunResult:
    """The job's result from its repeats, and the repeat fields of its record.

    status: interrupted if a repeat was (the last one run), else error if any repeat errored, else oom
    if any ran out of memory, else timeout if any passed its deadline, else ok. summary: over
    the repeats that finished ok (all of them when none did), each value the mean of the repeats or
    the value they all share (:func:`harness.stats.aggregate`); ``summary_ci95`` (repeats >= 2): per
    numeric metric its mean and 95 % Student-t interval. ``repeat_runs``: every repeat's seed, folder,
    status, wall time, summary and whether a warm-up was excluded (``WARMUP_KEY`` in its summary).
    display, tables' names and ``extra`` are repeat 0's (its tables are the job folder's own)."""
    first = repeats[0].result
    if len(repeats) == 1:
        res = first
    else:
        bad_runs = [r for r in repeats if r.result.status != "ok"]
        status = next(
            (s for s in ("interrupted", "error", "oom", "timeout") if any(r.result.status == s for r in repeats)), "ok"
        )
        ok = [r.result.summary for r in repeats if r.result.status == "ok"]
        summary, intervals = aggregate(ok or [r.result.summary for r in repeats])
        rec["summary_ci95"] = intervals
        message = "; ".join(
            f"repeat {r.index} (seed {r.seed}): {r.result.status}: {r.result.message}" for r in bad_runs
        )
        res = RunResult(
            status=status,
            message=message,
            summary=summary,
            display=first.display,
            tables=first.tables,
            extra=first.extra,
        )
    rec["repeats"] = len(repeats)
    rec["seeds"] = [r.seed for r in repeats]
    rec["repeat_runs"] = [repeat_entry(r, len(repeats)) for r in repeats]
    if repeats[0].load_avg_before is not None:
        rec["load_avg_before"], rec["load_avg_after"] = repeats[0].load_avg_before, repeats[-1].load_avg_after
        rec["load_warning"] = next(
            (w for w in (machine.load_warning(r.load_avg_before, r.load_avg_after) for r in repeats) if w), None
        )
        machine.note_load(rec["load_warning"])
    return res


def repeat_entry(r: Repeat, repeats: int) -> Dict[str, Any]:
    entry = {
        "repeat": r.index,
        "seed": r.seed,
        "dir": r.dir_name,
        "status": r.result.status,
        "message": r.result.message,
        "wall_s": r.wall_s,
        "warmup_excluded": WARMUP_KEY in r.result.summary,
        "summary": r.result.summary,
    }
    if r.load_avg_before is not None:
        entry.update(load_avg_before=r.load_avg_before, load_avg_after=r.load_avg_after)
    if repeats > 1 and r.result.extra:
        entry["extra"] = r.result.extra
    return entry
