"""Fit the GPU power model (:mod:`systems.common.gpu_model`) to measured public data.

* A100 ``P_act(f) = a + b (f/f_max)^alpha`` to the Perseus SOSP'24 A100-SXM4-80GB stage profiles
  (``gpu_power/perseus_a100_sxm/*.csv``: time and energy per forward/backward vs locked SM clock,
  855-1410 MHz). Average power = energy / time per row. Least squares, alpha on a grid, (a, b)
  linear. Also reports how well ``t(f) = c/f + d`` fits the measured times (share of clock-scaled time).
* ``mem_beta`` to ML.ENERGY v3 H100 power vs batch (``llm_configs_flat.csv``, one GPU, dense
  Llama-3.1-8B): ``P = min(limit, P_idle + (P_max - P_idle) (beta + (1 - beta) r(batch)))`` with ``r``
  the compute-bound fraction our latency model gives for that decode batch on the ``h100`` profile
  (grid search over P_max and beta; the measured power saturates at the 700 W limit).

* The scatter of single measured points (:func:`profile_scatter`), the source of the default
  profiling error (``system.profile_error.noise``, systems/energy_serving/config.py).

``python -m systems.energy_serving.power_fit`` prints the parameters and fit quality (MAPE, %) that
``conf/hardware/a100-80gb.yaml`` records under ``power:``, and the scatter, from the data folder's
``gpu_power/`` (``python -m workloads.fetch --only gpu_power/`` brings it; ``--data DIR`` reads another).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict

import numpy as np
import pandas as pd

PERSEUS = ("gpt3-175b+a100_sxm_bf16.csv", "bloom+a100_sxm_bf16.csv")  # the artifact's two A100 profiles
MLENERGY_LLAMA_8B = "mlenergy_leaderboard_v3/meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json"


def perseus_frame(gpu_power_dir: Path) -> pd.DataFrame:
    """The Perseus A100 stage profiles present in ``gpu_power_dir/perseus_a100_sxm`` (of :data:`PERSEUS`,
    in that order), one frame with a ``model`` column. Raises FileNotFoundError naming the folder
    when none is there."""
    d = Path(gpu_power_dir) / "perseus_a100_sxm"
    paths = [d / n for n in PERSEUS if (d / n).is_file()]
    if not paths:
        from workloads.data import missing_hint

        raise FileNotFoundError(f"{d}: none of the Perseus profiles {', '.join(PERSEUS)}; {missing_hint()}")
    return pd.concat([pd.read_csv(p).assign(model=p.name.split("+")[0]) for p in paths], ignore_index=True)


def fit_perseus(gpu_power_dir: Path, f_max: float = 1410.0) -> Dict[str, float]:
    """Fit P_act(f) and t(f) on the two Perseus A100 profiles.

    Returns a dict with act_a_w, act_b_w, act_alpha, power_mape_pct (per-row power error),
    time_mape_pct (t = c/f + d fitted per (model, stage, instruction)), clock_scaled_share
    (median c/f_max / t(f_max)), n_rows. Raises FileNotFoundError if the CSVs are absent.
    """
    df = perseus_frame(gpu_power_dir)
    x = df["frequency"].to_numpy(float) / f_max
    p = (df["energy"] / df["time"]).to_numpy(float)
    best = None
    for alpha in np.arange(1.0, 8.001, 0.05):
        A = np.stack([np.ones_like(x), x**alpha], axis=1)
        coef, *_ = np.linalg.lstsq(A, p, rcond=None)
        err = float(np.mean(np.abs(A @ coef - p) / p))
        if best is None or err < best[0]:
            best = (err, float(coef[0]), float(coef[1]), float(alpha))
    err, a, b, alpha = best
    t_err, shares = [], []
    for _, g in df.groupby(["model", "stage", "instruction"]):
        f = g["frequency"].to_numpy(float)
        t = g["time"].to_numpy(float)
        A = np.stack([1.0 / f, np.ones_like(f)], axis=1)
        (c, dd), *_ = np.linalg.lstsq(A, t, rcond=None)
        t_err.extend(np.abs(A @ np.array([c, dd]) - t) / t)
        shares.append((c / f.max()) / (c / f.max() + dd))
    return {
        "act_a_w": round(a, 2),
        "act_b_w": round(b, 2),
        "act_alpha": round(alpha, 2),
        "power_mape_pct": round(100 * err, 2),
        "time_mape_pct": round(100 * float(np.mean(t_err)), 2),
        "clock_scaled_share": round(float(np.median(shares)), 3),
        "n_rows": int(len(df)),
    }


def profile_scatter(gpu_power_dir: Path) -> Dict[str, float]:
    """How far one measured profile point sits from a smooth curve over the clock, Perseus A100.

    Per (model, stage, instruction) over the 38 locked clocks: time fitted as ``c/f + d``, energy as
    a cubic in f; returns the standard deviation (%) of the relative residuals (time_scatter_pct,
    energy_scatter_pct) and n_rows. It bounds a profile's per-sample noise from above (it also holds
    any misfit of the curves); the artifact's stages 1-6 are copies, so run-to-run spread itself is
    not in the data.
    """
    df = perseus_frame(gpu_power_dir)
    t_res, e_res = [], []
    for _, g in df.groupby(["model", "stage", "instruction"]):
        f, t, e = (g[k].to_numpy(float) for k in ("frequency", "time", "energy"))
        A = np.stack([1.0 / f, np.ones_like(f)], axis=1)
        t_res.extend((A @ np.linalg.lstsq(A, t, rcond=None)[0] - t) / t)
        B = np.stack([np.ones_like(f), f, f**2, f**3], axis=1)
        e_res.extend((B @ np.linalg.lstsq(B, e, rcond=None)[0] - e) / e)
    return {
        "time_scatter_pct": round(100 * float(np.std(t_res)), 2),
        "energy_scatter_pct": round(100 * float(np.std(e_res)), 2),
        "n_rows": int(len(df)),
    }


def fit_mem_beta(gpu_power_dir: Path, model_cfg, h100_cfg, ctx_tokens: float = 512.0) -> Dict[str, float]:
    """Fit ``mem_beta`` on ML.ENERGY v3 H100 single-GPU Llama-3.1-8B lm-arena-chat power vs batch.

    ``model_cfg``/``h100_cfg``: model and hardware configs (attribute access) used to compute the
    compute-bound fraction of a decode step of ``avg_batch_size`` sequences with ``ctx_tokens`` of
    context each. Returns mem_beta, p_max_w, power_mape_pct, itl_mape_pct (our decode-step latency vs
    the measured median ITL), n_configs.
    """
    from systems.common.gpu_model import StageModel

    path = Path(gpu_power_dir) / MLENERGY_LLAMA_8B
    if not path.is_file():
        from workloads.data import missing_hint

        raise FileNotFoundError(f"{path}: no such file; {missing_hint()}")
    df = pd.DataFrame(json.loads(path.read_text())["configurations"])
    df = df[(df.gpu_model == "H100") & (df.num_gpus == 1)].sort_values("avg_batch_size", kind="stable")
    if df.empty:
        raise ValueError(f"{path}: no single-GPU H100 configuration")
    sm = StageModel(model_cfg, h100_cfg, tp=1, pp=1)
    bs = df["avg_batch_size"].to_numpy(float)
    t_sm, t_mem, t_other = sm.parts(bs, sm.f_max, ctx_tokens=bs * ctx_tokens, attn_pairs=bs * ctx_tokens)
    r = t_sm / np.maximum(t_sm, t_mem)
    p = df["avg_power_watts"].to_numpy(float)  # one GPU: the total is the GPU's
    idle, limit = float(h100_cfg.idle_w), float(h100_cfg.power["limit_w"])
    betas = np.arange(0.0, 1.0001, 0.005)[:, None]
    best = None
    for p_max in np.arange(300.0, 1500.0, 2.0):  # busy power of a compute-bound kernel (uncapped)
        pred = np.minimum(limit, idle + (p_max - idle) * (betas + (1 - betas) * r[None, :]))
        err = np.mean(np.abs(pred - p) / p, axis=1)
        i = int(np.argmin(err))
        if best is None or err[i] < best[0]:
            best = (float(err[i]), float(p_max), float(betas[i, 0]))
    err, p_max, beta = best
    itl = (np.maximum(t_sm, t_mem) + t_other) * 1e3
    return {
        "mem_beta": round(beta, 3),
        "p_max_w": round(p_max, 1),
        "power_mape_pct": round(100 * err, 2),
        "itl_mape_pct": round(100 * float(np.mean(np.abs(itl - df["median_itl_ms"]) / df["median_itl_ms"])), 2),
        "n_configs": int(len(df)),
    }


def load_conf(group: str, name: str):
    """A conf/<group>/<name>.yaml composed with its schema (for fitting outside a run)."""
    from hydra import compose, initialize_config_dir

    from harness.config import register_configs, register_resolvers

    root = Path(__file__).resolve().parents[2]
    register_resolvers()
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(root / "conf")):
        cfg = compose("config", overrides=[f"{group}={name}", "tracking=none"])
    return cfg[group]


def main(argv=None) -> int:
    from workloads.data import data_dir

    ap = argparse.ArgumentParser(
        prog="python -m systems.energy_serving.power_fit", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=None,
        help=f"the gpu_power folder (default: the data folder's, here {data_dir() / 'gpu_power'})",
    )
    a = ap.parse_args(argv)
    d = a.data if a.data is not None else data_dir() / "gpu_power"
    try:
        perseus_frame(d)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("perseus A100:", fit_perseus(d))
    print("perseus A100 point scatter (profile_error.noise source):", profile_scatter(d))
    print("ml.energy H100:", fit_mem_beta(d, load_conf("model", "llama-3.1-8b"), load_conf("hardware", "h100")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
