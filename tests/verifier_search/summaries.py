"""The records' summaries of the simulated FastTTS main command and of ``experiment=fasttts_ablation``
on three problems: taken once with the code before a speed-up (``python -m tests.verifier_search.summaries``
writes ``tests/verifier_search/data/summaries.json``), compared after it by ``test_same_results.py`` (issue 18:
a faster simulator changes no result). ``python -m tests.verifier_search.summaries --tables`` writes the
digests of the same jobs' tables (iterations, completions: every path's tokens, steps, finish, times
and scores, the survivors' content keys) to ``tests/verifier_search/data/tables.json``, compared the same way."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from itertools import product
from pathlib import Path
from typing import Dict, List, Optional

import yaml

ROOT = Path(__file__).resolve().parents[2]
STORED = Path(__file__).resolve().parent / "data" / "summaries.json"
STORED_TABLES = STORED.with_name("tables.json")
MAIN = ["system=fasttts", "model=qwen2.5-math-1.5b", "verifier=skywork-prm-1.5b", "workload=aime24", "n=64"]
EXPERIMENT = "fasttts_ablation"
PROBLEMS = 3
FULL_DATA = {"main": "math/aime24/"}  # all 30 problems (the sweep's jobs read the first 3: fixture slices)


def jobs() -> Dict[str, List[str]]:
    """Job name -> overrides: the main command and every job of the experiment's sweep."""
    params = yaml.safe_load((ROOT / "conf" / "experiment" / f"{EXPERIMENT}.yaml").read_text())
    params = params["hydra"]["sweeper"]["params"]
    keys = list(params)
    out = {"main": MAIN}
    for values in product(*(str(params[k]).split(",") for k in keys)):
        over = [f"{k}={v}" for k, v in zip(keys, values)]
        out[" ".join(over)] = [f"experiment={EXPERIMENT}", *over, f"workload.num_problems={PROBLEMS}"]
    return out


def table_digest(path: Path) -> str:
    """sha256 of a parquet table's CSV text (floats in repr: exact)."""
    import pandas as pd

    return hashlib.sha256(pd.read_parquet(path).to_csv(index=False).encode()).hexdigest()


def summary(overrides: List[str], tables: Optional[dict] = None) -> dict:
    """Status, message and summary of one simulated job's record (through JSON, as run.json holds them);
    ``tables``: a dict that gets the digest of each of the record's tables by name."""
    from hydra import compose, initialize_config_dir

    from harness.config import register_configs, register_resolvers
    from harness.run import run

    register_resolvers()
    register_configs()
    with tempfile.TemporaryDirectory(prefix="tts_summary_") as tmp:
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose(
                "config",
                overrides=[f"output_dir={tmp}/run", "tracking=none", "progress=false", "backend=sim", *overrides],
            )
        rec = run(cfg)
        if tables is not None:
            tables.update({t: table_digest(Path(tmp) / "run" / f"{t}.parquet") for t in rec.get("tables", [])})
    return json.loads(json.dumps({k: rec.get(k) for k in ("status", "message", "summary")}))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if "--tables" in sys.argv:
        stored = {}
        for name, over in jobs().items():
            summary(over, stored.setdefault(name, {}))
        path = STORED_TABLES
    else:
        stored, path = {name: summary(over) for name, over in jobs().items()}, STORED
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(stored)} jobs' results to {path}")
