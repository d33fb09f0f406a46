"""Repeats of a few configurations of ``scripts/gpu_validate.py`` on the GPU, round-robin, with what
each run's machine was doing: the first device call showed the same work taking from 1x to ~10x the
time from one run to the next (the one-group step of 64 beams x 32 tokens: 0.42 s in one run, 2.16 s
in another), so a single GPU timing is an anecdote here too.

    python scripts/gpu_repeat.py --out DIR --ceilings ceilings.json      # on a CUDA GPU
    python scripts/gpu_repeat.py --out DIR --tiny                        # CPU dry run, tiny model (16 beams)

Per run, beside gpu_validate's row (real and simulated times, bytes): the process's CPU seconds
(``resource.getrusage``, user + system), the machine's steal seconds (``/proc/stat``: time the
hypervisor gave the virtual CPUs to someone else) and, from an NVML sampler thread (every 0.2 s,
read only), the GPU's mean SM clock and utilisation. Configurations run round-robin (repeat 0 of
each, then repeat 1, ...) so drift hits them alike; ``repeats_summary.csv`` gives per configuration
the median, min and max of the real time and the LBS speedup over layer-wise from the medians.
The ceilings come from the first call's ``ceilings.json`` (``--ceilings``; the simulated replays
use them), so this call measures no ceilings. Same hard deadline and packing as gpu_validate.
Results in --out: repeats.csv, repeats_summary.csv, summary.json, runs.tar.gz (+ the wrapper's log).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tarfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_validate as gv  # noqa: E402  (the configurations and the run of one are gpu_validate's)


def short_name(cfg) -> str:
    """A configuration's name without its length (``lbs-b64-s32``): what ``--only`` takes."""
    return gv.config_name(cfg).rsplit("-g", 1)[0]


def default_only(s: dict) -> list:
    """in_gpu, lbs and layerwise at the setting's largest beam count and first step (on the GPU the
    paper's 64-beam pair and the bound; the tiny setting's 16 beams in a dry run)."""
    top = max(c[1] for c in s["configs"])
    step = min(c[2] for c in s["configs"])
    return [
        short_name(c) for c in s["configs"] if c[1] == top and c[2] == step and c[0] in ("in_gpu", "lbs", "layerwise")
    ]


def read_ceilings(path: str) -> dict:
    """``ceilings.json`` of gpu_validate; ValueError naming what is wrong (each of gpu_validate.CEILING_KEYS a
    number > 0)."""
    try:
        ceil = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--ceilings {path}: not a readable JSON file ({e})") from None
    if not isinstance(ceil, dict):
        raise ValueError(f"--ceilings {path}: a JSON object of {', '.join(gv.CEILING_KEYS)} is needed")
    bad = [k for k in gv.CEILING_KEYS if not isinstance(ceil.get(k), (int, float)) or not ceil[k] > 0]
    if bad:
        raise ValueError(
            f"--ceilings {path}: {', '.join(bad)} must be numbers > 0 (got {', '.join(repr(ceil.get(k)) for k in bad)})"
        )
    return ceil


def steal_seconds() -> float | None:
    """Steal time of all CPUs so far (s), from /proc/stat's 'cpu' line (8th value); None if unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class GpuSampler:
    """Mean SM clock (MHz) and GPU utilisation (%) over a window, sampled by a thread every
    ``period`` s through NVML (read only). Without NVML both are None."""

    def __init__(self, period: float = 0.2):
        self.period, self.samples, self._stop = period, [], threading.Event()
        try:
            import pynvml as nv

            nv.nvmlInit()
            self.nv, self.h = nv, nv.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            self.nv = None

    def __enter__(self):
        if self.nv is not None:
            self._t = threading.Thread(target=self._loop, daemon=True)
            self._t.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.period):
            try:
                self.samples.append(
                    (
                        self.nv.nvmlDeviceGetClockInfo(self.h, self.nv.NVML_CLOCK_SM),
                        self.nv.nvmlDeviceGetUtilizationRates(self.h).gpu,
                    )
                )
            except Exception:
                return

    def __exit__(self, *exc):
        self._stop.set()
        if self.nv is not None:
            self._t.join()
        return False

    def means(self) -> dict:
        if not self.samples:
            return {"sm_clock_mean_mhz": None, "gpu_util_mean": None, "gpu_samples": 0}
        return {
            "sm_clock_mean_mhz": statistics.fmean(c for c, _ in self.samples),
            "gpu_util_mean": statistics.fmean(u for _, u in self.samples),
            "gpu_samples": len(self.samples),
        }


def summarize(rows: list) -> list:
    """Per configuration: repeats ok, median/min/max real seconds, median simulated seconds, and the
    speedup over layer-wise (same beams and length) from the medians."""
    by = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("real_s"):
            by.setdefault(r["config"].rsplit("-r", 1)[0], []).append(r)
    out = []
    for name, rs in by.items():
        real = [r["real_s"] for r in rs]
        out.append(
            {
                "config": name,
                "system": rs[0]["system"],
                "beams": rs[0]["beams"],
                "gen_len": rs[0]["gen_len"],
                "repeats_ok": len(rs),
                "real_median_s": statistics.median(real),
                "real_min_s": min(real),
                "real_max_s": max(real),
                "sim_s": statistics.median([r["sim_s"] for r in rs if r.get("sim_s")] or [0]) or None,
                "io_share_median": statistics.median(r["io_share_real"] for r in rs),
                "cpu_over_wall_median": statistics.median(r["cpu_s"] / r["wall_s"] for r in rs),
            }
        )
    for o, x in zip(out, gv.speedups_vs_layerwise([dict(o, seconds=o["real_median_s"]) for o in out])):
        o["speedup_vs_layerwise_median"] = x
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--ceilings", default=None, help="ceilings.json of gpu_validate (default: measure quickly)")
    ap.add_argument(
        "--only",
        default=None,
        help="config names without -g (comma list; default: in_gpu, lbs and layerwise at the largest beam count)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--long", action="store_true", help="then the long tier's layer-wise run, once, if time is left")
    ap.add_argument("--deadline-s", type=float, default=380.0)
    a = ap.parse_args(argv)
    s = gv.setting(a.tiny, a.gen_len)  # arguments checked before any folder or work
    want = default_only(s) if a.only is None else [w.strip() for w in a.only.split(",") if w.strip()]
    allowed = sorted(short_name(c) for c in s["configs"])
    missing = [w for w in want if w not in allowed]
    why = (
        f"--only names no configuration: {missing or want}; allowed: {allowed}"
        if missing or not want
        else f"--repeats {a.repeats} is not allowed: an integer >= 1"
        if a.repeats < 1
        else ""
    )
    if not why and a.ceilings:
        try:
            ceil = read_ceilings(a.ceilings)
        except ValueError as e:
            why = str(e)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    if gv.check_deadline(a):
        return 2
    picked = [c for w in want for c in s["configs"] if short_name(c) == w]
    t_start, deadline, out, work = gv.open_call(a, "gpu_repeat_")
    import torch

    if not a.tiny and not torch.cuda.is_available():
        return gv.no_cuda()
    from harness.config import register_configs, register_resolvers

    register_resolvers()
    register_configs()
    device = "cpu" if a.tiny else "cuda"
    summary = {
        "device": device,
        "started_at": t_start,
        "deadline_s": a.deadline_s,
        "repeats": a.repeats,
        "configs": [gv.config_name(c) for c in picked],
        "status": "started",
        "torch": torch.__version__,
    }
    rows = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if not a.ceilings:
            from harness.calibrate import measure

            ceil = measure(device, quick=True, threads=1)
        hw = gv.measured_hw_of(ceil)
        plan = [(r, c) for r in range(a.repeats) for c in picked]
        if a.long:
            plan += [(0, c) for c in s["long_configs"] if c[0] == "layerwise"]
        for r, c in plan:
            name = gv.config_name(c) + f"-r{r}"
            if time.time() > deadline - 5:
                rows.append(
                    {"config": name, "system": c[0], "beams": c[1], "gen_len": c[4], "status": "skipped (deadline)"}
                )
                continue
            steal0, gs = steal_seconds(), GpuSampler()
            row = gv.real_and_replay(s, c, device, hw, deadline, work, tag=f"-r{r}", probe=gs)
            steal1 = steal_seconds()  # the replay after the real run is ~0.1 s of CPU, no GPU
            row.update(
                config=name,
                repeat=r,
                steal_s=steal1 - steal0 if steal0 is not None and steal1 is not None else None,
                **gs.means(),
            )
            rows.append(row)
            print(
                f"{name}: {row['status']} real {row.get('real_s')} s wall {row['wall_s']:.1f} cpu {row['cpu_s']:.1f} "
                f"steal {row['steal_s']} sm {row['sm_clock_mean_mhz']} util {row['gpu_util_mean']}",
                flush=True,
            )
            _write(work, out, rows)
        summary["status"] = "finished"
    except BaseException as e:
        summary["status"] = f"failed: {type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        _write(work, out, rows)
        gv.finish_status(summary, rows)
        summary["total_s"] = time.time() - t_start
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if (work / "runs").exists():
            with tarfile.open(out / "runs.tar.gz", "w:gz") as tf:
                tf.add(work / "runs", arcname="runs")
        gv.close_work(a, work)
        import pandas as pd

        if rows:
            print(pd.DataFrame(summarize(rows)).to_string(index=False), flush=True)
        print(f"total {time.time() - t_start:.0f} s; outputs in {out}", flush=True)
    return gv.exit_code(summary)


def _write(work: Path, out: Path, rows: list) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_csv(out / "repeats.csv", index=False)
    pd.DataFrame(summarize(rows)).to_csv(out / "repeats_summary.csv", index=False)


if __name__ == "__main__":
    sys.exit(main())
