"""Report of ``experiment=lbs_energy`` (issue 16.1): the energy cost of KV offloading, in-GPU vs
layer-wise vs LBS, a study no paper has (LBS reports latency only; BEAM energy but no offloading).

``lbs_energy(sweep_dir, runs, cfg)`` writes ``lbs_energy.png`` (J per generated token and average power
over beams, one column per hardware profile, solid / dashed lines for the two step lengths, OOM
written where in-GPU does not fit) and ``lbs_energy.md`` (every job, plus each LBS job's energy and
time as a ratio to layer-wise's at the same hardware, step and beams). The note lists, per profile,
where each power-model parameter comes from (its ``sources`` entry: a fit to a named data file, or an
assumption) and the clock the energy is charged at. No paper value exists, so none is shown.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.report import save_figure, source_of, title_label, write_markdown
from systems.kv_offload.report import MARKER, SYSTEM_NAME, _beam_axis, no_layerwise_note, tidy

SYSTEMS = ("in_gpu", "layerwise", "lbs")
COLOR = {"in_gpu": "tab:gray", "layerwise": "tab:blue", "lbs": "tab:red"}
STEP_STYLE = {32: "-", 128: "--"}
ENERGY = ("energy_j", "energy_io_stall_j", "energy_per_token_j", "avg_power_w")


def energy_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`systems.kv_offload.report.tidy` plus the energy fields, the energy's source and the I/O-stall
    share of the energy; ``lbs_vs_layerwise_energy`` / ``_time``: an LBS job's J per token and
    end-to-end time over layer-wise's at the same hardware, step and beams (NaN elsewhere)."""
    job = ["hardware", "model", "system", "step", "beams"]
    df = tidy(runs)
    energy = pd.DataFrame(
        {
            "hardware": runs["hardware"],
            "model": runs["model"],
            "system": runs["system"],
            "step": runs["config.workload.step"].astype(int),
            "beams": runs["config.workload.beams"].astype(int),
            "energy_source": runs.get("summary.energy_source"),
        }
    )
    for k in ENERGY:
        col = f"summary.{k}"
        energy[k] = pd.to_numeric(runs[col], errors="coerce") if col in runs else np.nan
    df = df.merge(energy, on=job, how="left", validate="one_to_one")
    share = df.energy_io_stall_j / df.energy_j
    df["stall_energy_share"] = share.mask(share.abs() < 1e-9, 0.0)  # float residue of a subtraction
    key = ["hardware", "step", "beams"]
    lw = df[df.system == "layerwise"].set_index(key)
    idx = pd.MultiIndex.from_frame(df[key])
    df["lbs_vs_layerwise_energy"] = np.where(
        df.system == "lbs", df.energy_per_token_j.to_numpy() / lw.energy_per_token_j.reindex(idx).to_numpy(), np.nan
    )
    df["lbs_vs_layerwise_time"] = np.where(
        df.system == "lbs", df.e2e_s.to_numpy() / lw.e2e_s.reindex(idx).to_numpy(), np.nan
    )
    return df


def power_note(runs: pd.DataFrame, hardware) -> str:
    """Per profile: the power parameters' sources (measured fit or assumption) from its record."""
    lines = []
    for hw in hardware:
        row = runs[runs["hardware"] == hw].iloc[0]
        src = {
            c.split("config.hardware.sources.", 1)[1]: row[c]
            for c in runs.columns
            if c.startswith("config.hardware.sources.") and isinstance(row[c], str)
        }
        keys = [k for k in src if k.startswith("power.") or k in ("idle_w", "clock_default_mhz")]
        lines.append(f"- **{hw}**: " + "; ".join(f"`{k}`: {src[k]}" for k in sorted(keys)))
    return "\n".join(lines)


def energy_sources(df: pd.DataFrame, hardware) -> str:
    """How each profile's energy was charged, one clause per profile in ``hardware``'s order:
    "rtx4090: simulated power model at 2,520 MHz; a100-80gb: ..." ('no power model' for none)."""
    parts = [
        f"{hw}: {' / '.join(src)}"
        for hw in hardware
        if (src := sorted(df.loc[df.hardware == hw, "energy_source"].dropna().unique()))
    ]
    return "; ".join(parts) or "no power model"


def lbs_energy(sweep_dir, runs, cfg):
    """Figure and table of the energy study (module docstring)."""
    import matplotlib.pyplot as plt

    sweep_dir = Path(sweep_dir)
    df = energy_frame(runs)
    hws = sorted(set(df.hardware), key=lambda h: (h != "rtx4090", h))  # the LBS paper's GPU first
    fig, axes = plt.subplots(2, len(hws), figsize=(5.2 * len(hws), 7), layout="constrained", squeeze=False)
    for j, hw in enumerate(hws):
        d = df[df.hardware == hw]
        src = source_of(d.simulated)
        for i, (col, ylabel) in enumerate(
            (
                ("energy_per_token_j", f"J per generated token ({src})"),
                ("avg_power_w", f"average power, W per GPU ({src})"),
            )
        ):
            ax = axes[i, j]
            for sys_ in SYSTEMS:
                for step, ls in STEP_STYLE.items():
                    r = d[(d.system == sys_) & (d.step == step)].sort_values("beams")
                    ok = r[r.status == "ok"]
                    if len(ok):
                        ax.plot(
                            ok.beams,
                            ok[col],
                            ls,
                            color=COLOR[sys_],
                            label=f"{SYSTEM_NAME[sys_]}, step {step}",
                            **{"ms": 5, **MARKER[sys_]},
                        )
                    for b in r[r.status == "oom"].beams:
                        ax.annotate(
                            "in-GPU OOM" if step == 32 else "",
                            (b, 0),
                            xycoords=("data", "axes fraction"),
                            xytext=(0, 4),
                            textcoords="offset points",
                            ha="center",
                            fontsize=7,
                            color=COLOR[sys_],
                        )
            _beam_axis(ax, d.beams)
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            if i == 0:
                ax.set_title(
                    f"{hw}, {', '.join(sorted(d.model.unique()))}, KV budget "
                    f"{d.kv_budget_bytes.iloc[0] / 2**30:.0f} GiB"
                )
                ax.legend(fontsize=7)
    fig.suptitle(title_label("Energy of KV offloading: in-GPU vs layer-wise vs LBS", df.simulated))
    save_figure(fig, sweep_dir, "lbs_energy")

    out = pd.DataFrame(
        {
            "hardware": df.hardware,
            "step": df.step,
            "beams": df.beams,
            "system": df.system.map(SYSTEM_NAME),
            "status": df.status,
            "end-to-end (s)": df.e2e_s,
            "I/O share (%)": 100 * df.io_share,
            "energy (kJ)": df.energy_j / 1e3,
            "J / token": df.energy_per_token_j,
            "avg power (W)": df.avg_power_w,
            "I/O-stall energy (%)": 100 * df.stall_energy_share,
            "LBS / layer-wise J per token": df.lbs_vs_layerwise_energy,
            "LBS / layer-wise time": df.lbs_vs_layerwise_time,
            "source": df.source,
        }
    ).sort_values(["hardware", "step", "beams", "system"])
    notes = (
        f"Energy charged by {energy_sources(df, hws)} (systems/kv_offload/sim.py): kernels at "
        f"P_busy(f, r) with r their compute-bound share, launch gaps and I/O stalls (waiting on PCIe) "
        f"at P_idle(f) (systems/common/gpu_model.py). No paper reports these numbers; there is "
        f"nothing to compare with. Where the power parameters come from:\n\n{power_note(runs, hws)}"
    )
    write_markdown(
        out,
        sweep_dir / "lbs_energy.md",
        title=title_label("Energy of KV offloading (lbs_energy)", df.simulated),
        notes=no_layerwise_note(df, "the LBS / layer-wise columns") + notes,
        floatfmt=",.3g",
    )
    return out
