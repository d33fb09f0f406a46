"""Simulator fidelity in one command: calibrate this CPU, run ``experiment=lbs_fidelity`` on the real
engine ``repeats`` times, replay each configuration's beam tree on the simulated backend, and
compare.

    python -m systems.kv_offload.fidelity [repeats=3] [recalibrate=false] [any run.py override ...]

Writes ``<results_dir>/sweeps/lbs_fidelity/fidelity.md`` (per configuration: the real end-to-end
time of the fastest repeat, the least disturbed by other jobs on a shared machine, with the mean and
the slowest beside it, and the simulated time; the MAPE of the fastest, of the mean and of each
repeat; bytes, which must match exactly since the simulator executes the same plans),
``fidelity_summary.csv`` and ``fidelity.png``, and prints the summary. Each repeat is its own sweep
(``lbs_fidelity/rep<i>``, its ``hydra.sweep.dir``; all configurations in turn, so a change of machine load spreads over every
configuration); real runs fix torch's threads to 1 and warm up first (``systems.kv_offload.runner``); the
calibration measures with the same single thread. The repeat loop is kept here, simple, until the
harness has a generic one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["system", "model", "beams", "step"]


def main(argv=None) -> int:
    from harness.cli import tool_args

    args = list(sys.argv[1:] if argv is None else argv)
    tool_args(args, __doc__)  # --help; key=value only (the rest goes to run.py)
    opts = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith(("recalibrate=", "repeats="))}
    args = [a for a in args if not a.startswith(("recalibrate=", "repeats="))]
    from harness.cli import check_tool_values
    from harness.config import results_dir_of
    from harness.errors import ConfigError
    from harness.reproduce import check_overrides

    try:  # before minutes of calibration: its own values, then run.py's arguments with its sweep's jobs
        check_tool_values(opts, ints=("repeats",), flags=("recalibrate",))
        check_overrides(
            [a for a in args if not a.startswith("results_dir=")], False, ["lbs_fidelity"], results_dir_of(args)
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    repeats = int(opts.get("repeats", 3))
    prof = ROOT / "conf" / "hardware" / "cpu-calibrated.yaml"
    if opts.get("recalibrate", "true") != "false" or not prof.exists():
        gemv = f"gemv_bytes={model_weight_bytes(args)}"  # mem_bw as this model's decode sees it
        rc = subprocess.call([sys.executable, "-m", "harness.calibrate", "hardware=cpu", "threads=1", gemv], cwd=ROOT)
        if rc:
            return rc
    out = results_dir_of(args) / "sweeps" / "lbs_fidelity"  # where run.py's jobs below write
    reps = []
    for i in range(repeats):
        rc = subprocess.call(
            [
                sys.executable,
                "run.py",
                "-m",
                "experiment=lbs_fidelity",
                "hardware=cpu-calibrated",
                f"hydra.sweep.dir={out / f'rep{i}'}",  # a sweep_name is one folder's name, no '/'
                "report=null",
                *args,
            ],
            cwd=ROOT,
        )
        if rc:
            return rc
        reps.append(out / f"rep{i}")
    from harness.report import gather_runs

    report_repeats(out, [gather_runs(d) for d in reps])
    return 0


def model_weight_bytes(args: List[str]) -> int:
    """Weight bytes of the experiment's model under run.py's arguments ``args``: the working set of
    the calibration's decode-GEMV bandwidth, so that a CPU's caches count as they do for this model
    (a tiny model's weights are partly cache-resident; a 512 MiB matrix's are not)."""
    from hydra import compose, initialize_config_dir

    from harness.config import register_configs, register_resolvers
    from harness.model_facts import weight_bytes

    register_resolvers()
    register_configs()
    keep = [a for a in args if a.startswith(("model=", "model."))]
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=["experiment=lbs_fidelity", *keep])
    return int(weight_bytes(cfg.model))


def report(sweep_dir, runs, cfg):
    """The experiment's report hook (``run.py -m experiment=lbs_fidelity``): one sweep, one repeat."""
    report_repeats(Path(sweep_dir), [runs])


def replay_in_sim(out_dir: Path, runs: pd.DataFrame) -> pd.DataFrame:
    """Each ok real run of ``runs`` again on the simulated backend, replaying its recorded beam tree
    (same plans), with the real run's config otherwise; returns the simulated runs' rows."""
    from omegaconf import OmegaConf

    from harness.report import gather_runs
    from harness.run import run as run_job

    for _, r in runs[(~runs.simulated.astype(bool)) & (runs.status == "ok")].iterrows():
        real_dir = Path(r.run_dir)
        c = json.loads((real_dir / "run.json").read_text())["config"]
        c["backend"] = {"name": "sim", "device": "auto"}
        c["system"].update(replay_tree=str(real_dir), record_tree=False)
        c["tracking"] = {"name": "none", "mode": "disabled", "project": "", "entity": None}
        c["output_dir"] = str(out_dir / f"sim-replay-of-{real_dir.name}")
        run_job(OmegaConf.create(c), multirun=True)
    return gather_runs(out_dir)


def report_repeats(out_dir: Path, repeats: List[pd.DataFrame]) -> pd.DataFrame:
    """fidelity.md / fidelity_summary.csv / fidelity.png in ``out_dir`` from the runs of each repeat
    (the simulated side: the first repeat's real runs replayed). Returns the summary row."""
    from harness.report import write_markdown
    from systems.kv_offload.report import tidy

    out_dir = Path(out_dir)
    real = pd.concat([tidy(r).assign(repeat=i) for i, r in enumerate(repeats)], ignore_index=True)
    real = real[(~real.simulated) & (real.status == "ok")]
    if real.empty:  # e.g. experiment=lbs_fidelity backend=sim: nothing to replay
        why = "no ok real-engine runs in the sweep: the fidelity report replays real runs (backend=torch) in the simulator"
        print(f"warning: {why}", file=sys.stderr)
        write_markdown(
            pd.DataFrame(),
            out_dir / "fidelity.md",
            title="LBS fidelity: no pairs of real and simulated runs",
            notes=why,
        )
        return pd.DataFrame()
    sim = tidy(replay_in_sim(out_dir / "sim_replay", repeats[0]))
    sim = sim[sim.status == "ok"].set_index(KEYS)
    if real.empty or sim.empty:
        write_markdown(
            pd.DataFrame(), out_dir / "fidelity.md", title="LBS fidelity: no pairs of real and simulated runs"
        )
        return pd.DataFrame()
    g = real.groupby(KEYS)
    agg = pd.DataFrame(
        {
            "repeats": g.e2e_s.size(),
            "e2e_s_real": g.e2e_s.min(),
            "e2e_s_real_mean": g.e2e_s.mean(),
            "e2e_s_real_max": g.e2e_s.max(),
            "compute_s_real": g.compute_s.min(),
            "io_stall_s_real": g.io_stall_s.min(),
            "h2d_bytes_real": g.h2d_bytes.max(),
            "d2h_bytes_real": g.d2h_bytes.max(),
            "bytes_same_every_repeat": g.h2d_bytes.nunique().eq(1) & g.d2h_bytes.nunique().eq(1),
        }
    )
    both = agg.join(
        sim[["e2e_s", "compute_s", "io_stall_s", "h2d_bytes", "d2h_bytes"]].add_suffix("_sim"), how="inner"
    ).reset_index()
    err = lambda real_s: (both.e2e_s_sim - real_s) / real_s
    both["e2e_s_err"] = err(both.e2e_s_real)
    both["compute_s_err"] = (both.compute_s_sim - both.compute_s_real) / both.compute_s_real
    per_rep = []
    for i, d in real.groupby("repeat"):
        j = d.set_index(KEYS).join(sim[["e2e_s"]].add_suffix("_sim"), how="inner")
        per_rep.append(float(((j.e2e_s_sim - j.e2e_s) / j.e2e_s).abs().mean()))
    summary = pd.DataFrame(
        [
            {
                "pairs": len(both),
                "repeats": len(repeats),
                "time_mape": float(both.e2e_s_err.abs().mean()),
                "time_mape_of_mean": float(err(both.e2e_s_real_mean).abs().mean()),
                "time_mape_each_repeat": " ".join(f"{m:.3f}" for m in per_rep),
                "compute_mape": float(both.compute_s_err.abs().mean()),
                "real_spread_max": float(((both.e2e_s_real_max - both.e2e_s_real) / both.e2e_s_real_mean).max()),
                "bytes_exact": bool(
                    (both.h2d_bytes_real == both.h2d_bytes_sim).all()
                    and (both.d2h_bytes_real == both.d2h_bytes_sim).all()
                    and both.bytes_same_every_repeat.all()
                ),
            }
        ]
    )
    write_markdown(
        _shown(both),
        out_dir / "fidelity.md",
        title="LBS simulator fidelity (real CPU engine, fastest of the repeats, vs simulated with the "
        "calibrated CPU profile)",
        notes="A configuration's real time is its fastest repeat, the one least disturbed by other jobs "
        "(the calibration's ceilings are likewise its fastest timing windows); the mean and the "
        "slowest are beside it; error = (simulated - measured) / measured. Summary (time MAPE: "
        "of the fastest repeat; of the mean; of each repeat; real spread: the largest (slowest - "
        "fastest) / mean of a configuration):\n\n" + _shown_summary(summary).to_markdown(index=False, floatfmt=".1f"),
    )
    summary.to_csv(out_dir / "fidelity_summary.csv", index=False)
    _scatter(both, summary, len(repeats), out_dir)
    print(summary.to_string(index=False))
    return summary


PERCENT = ["time_mape", "time_mape_of_mean", "compute_mape", "real_spread_max"]
SUMMARY_NAMES = {
    "time_mape": "time MAPE (%)",
    "time_mape_of_mean": "time MAPE of the mean (%)",
    "time_mape_each_repeat": "time MAPE of each repeat (%)",
    "compute_mape": "compute MAPE (%)",
    "real_spread_max": "real spread, largest (%)",
    "bytes_exact": "bytes equal",
}


def _shown_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary row as shown: MAPEs and spread in %."""
    each = [" / ".join(f"{100 * float(x):.1f}" for x in v.split()) for v in summary.time_mape_each_repeat]
    return summary.assign(**{c: 100 * summary[c] for c in PERCENT}, time_mape_each_repeat=each).rename(
        columns=SUMMARY_NAMES
    )


def _shown(both: pd.DataFrame) -> pd.DataFrame:
    """The per-configuration table as shown: each column naming its unit (s, %, one byte unit)."""
    from systems.kv_offload.display import byte_unit

    byte_cols = ["h2d_bytes_real", "h2d_bytes_sim", "d2h_bytes_real", "d2h_bytes_sim"]
    unit, size = byte_unit(both[byte_cols].to_numpy().ravel().tolist())
    out = both[KEYS + ["repeats"]].copy()
    for col, name in (
        ("e2e_s_real", "real, fastest (s)"),
        ("e2e_s_real_mean", "real, mean (s)"),
        ("e2e_s_real_max", "real, slowest (s)"),
        ("e2e_s_sim", "simulated (s)"),
    ):
        out[name] = both[col]
    out["error (%)"] = 100 * both.e2e_s_err
    for col, name in (
        ("compute_s_real", "compute real (s)"),
        ("compute_s_sim", "compute sim (s)"),
        ("io_stall_s_real", "I/O stall real (s)"),
        ("io_stall_s_sim", "I/O stall sim (s)"),
    ):
        out[name] = both[col]
    for col, name in zip(byte_cols, ("host->device real", "host->device sim", "device->host real", "device->host sim")):
        out[f"{name} ({unit})"] = both[col] / size
    return out


def _scatter(both: pd.DataFrame, summary: pd.DataFrame, repeats: int, out_dir: Path) -> None:
    """Simulated vs measured end-to-end time, one marker and colour per system (legend), each point
    labelled with its beam count; x error bar from the fastest to the slowest repeat."""
    import matplotlib.pyplot as plt

    from harness.report import save_figure
    from systems.kv_offload.report import MARKER, SYSTEM_NAME, SYSTEM_ORDER, plain_log

    fig, ax = plt.subplots(figsize=(6.2, 4.4), layout="constrained")
    systems = sorted(both.system.unique(), key=lambda x: SYSTEM_ORDER.index(x) if x in SYSTEM_ORDER else 99)
    for i, s in enumerate(systems):
        d = both[both.system == s]
        style = {k: v for k, v in MARKER.get(s, {"marker": "o"}).items() if k != "zorder"}
        eb = ax.errorbar(
            d.e2e_s_real,
            d.e2e_s_sim,
            xerr=[0 * d.e2e_s_real, d.e2e_s_real_max - d.e2e_s_real],
            ls="none",
            label=SYSTEM_NAME.get(s, s),
            **style,
        )
        for r in d.itertuples():
            ax.annotate(
                f"{r.beams} beams",
                (r.e2e_s_real, r.e2e_s_sim),
                xytext=(5, 10 * i - 10),
                textcoords="offset points",
                fontsize=7,
                color=eb[0].get_color(),
            )  # offset per system
    lim = [
        min(both.e2e_s_real.min(), both.e2e_s_sim.min()) * 0.8,
        max(both.e2e_s_real_max.max(), both.e2e_s_sim.max()) * 1.2,
    ]
    ax.plot(lim, lim, "k--", lw=1, label="simulated = measured")
    plain_log(ax, "xy", minor=True)
    ax.tick_params(which="minor", labelsize=6)
    ax.set_xlabel("measured end-to-end (s): real engine on this CPU,\nfastest repeat (bar: to the slowest)")
    ax.set_ylabel("simulated end-to-end (s)")
    ax.legend(fontsize=7, loc="upper left")
    models = ", ".join(sorted(both.model.unique()))
    ax.set_title(
        f"LBS simulator fidelity, {models} (measured vs simulated): time MAPE "
        f"{100 * summary.time_mape[0]:.1f} % ({repeats} repeat{'s' if repeats > 1 else ''})",
        fontsize=9,
    )
    save_figure(fig, out_dir, "fidelity")


if __name__ == "__main__":
    sys.exit(main())
