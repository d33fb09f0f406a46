"""The records' summaries of the simulated BEAM main command, of ``experiment=beam_fig10`` and
``beam_fig8`` (every controller), and of a few jobs that reach the rest of the simulator (KV
preemption, every trace loader): taken once with the code before the issue-18 speed-up
(``python -m tests.energy_serving.summaries`` writes ``tests/energy_serving/data/summaries.json``), compared after
it by ``test_same_results.py`` (a faster simulator changes no result).

Beside each summary, a digest of every table the job wrote (per column, the values as float64 bytes,
or their text), so a changed row shows even where the summary's means hide it. Decision times
(``decision_us*``) are wall-clock measurements of this machine, not results: they are left out of
the stored summaries, digests and the comparison."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from itertools import product
from pathlib import Path
from typing import Dict, List

import yaml

ROOT = Path(__file__).resolve().parents[2]
STORED = Path(__file__).resolve().parent / "data" / "summaries.json"
MAIN = ["system=beam", "model=llama-3.3-70b", "hardware=a100-80gb", "tp=2", "pp=4", "workload=servegen"]
EXPERIMENTS = ("beam_fig10", "beam_fig8")
# the jobs that read a public trace (stored from the full data; skipped where it is absent)
FULL_DATA = {
    "main": "traces/servegen/",
    "kv preemption": "traces/servegen/",
    "azure_code": "traces/azure_llm_2023/",
    "azure_conv": "traces/azure_llm_2023/",
    "mooncake": "traces/mooncake/",
}
EXTRA = {  # what the main command and the experiments do not reach
    "kv preemption": ["system=beam", "workload=servegen", "workload.duration_s=600", "kv_budget=600MiB"],
    "azure_code": ["system=vanilla", "workload=azure_code", "workload.duration_s=300"],
    "azure_conv": ["system=beam", "workload=azure_conv", "workload.duration_s=120"],
    "mooncake": ["system=window_dvfs", "workload=mooncake", "workload.duration_s=300"],
}
TIMINGS = ("decision_us_p50", "decision_us_p99", "decision_us")


def jobs() -> Dict[str, List[str]]:
    """Job name -> overrides: the main command, every job of the experiments' sweeps, the extras."""
    out = {"main": MAIN}
    for exp in EXPERIMENTS:
        params = yaml.safe_load((ROOT / "conf" / "experiment" / f"{exp}.yaml").read_text())
        params = params["hydra"]["sweeper"]["params"]
        keys = list(params)
        for values in product(*(str(params[k]).split(",") for k in keys)):
            over = [f"{k}={v}" for k, v in zip(keys, values)]
            out[f"{exp} " + " ".join(over)] = [f"experiment={exp}", *over]
    out.update(EXTRA)
    return out


def digest(table) -> Dict[str, str]:
    """Column -> sha1 of its values (float64 bytes, NaN for missing; text for other columns)."""
    import numpy as np

    out = {}
    for col in table.columns:
        if col in TIMINGS:
            continue
        try:
            data = np.asarray(table[col].to_numpy(dtype=float, na_value=np.nan), dtype=np.float64).tobytes()
        except (TypeError, ValueError):
            data = "\x1f".join(map(str, table[col].tolist())).encode()
        out[col] = hashlib.sha1(data).hexdigest()
    return out


def summary(overrides: List[str]) -> dict:
    """Status, message, summary (without decision times) and table digests of one simulated job's
    record, through JSON as run.json holds them."""
    import pandas as pd
    from hydra import compose, initialize_config_dir

    from harness.config import register_configs, register_resolvers
    from harness.run import run

    register_resolvers()
    register_configs()
    with tempfile.TemporaryDirectory(prefix="serving_summary_") as tmp:
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose(
                "config",
                overrides=[
                    f"output_dir={tmp}/run",
                    f"results_dir={tmp}",
                    "tracking=none",
                    "progress=false",
                    "backend=sim",
                    *overrides,
                ],
            )
        rec = run(cfg)
        tables = {t: digest(pd.read_parquet(Path(tmp) / "run" / f"{t}.parquet")) for t in rec.get("tables", [])}
    out = json.loads(json.dumps({**{k: rec.get(k) for k in ("status", "message", "summary")}, "tables": tables}))
    for k in TIMINGS:
        out["summary"].pop(k, None)
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    stored = {name: summary(over) for name, over in jobs().items()}
    STORED.parent.mkdir(parents=True, exist_ok=True)
    STORED.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(stored)} summaries to {STORED}")
