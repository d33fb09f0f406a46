"""Record a real run's generated tokens and replay them in the simulator (``systems.verifier_search.fidelity``).

``system.record_tokens=true``: every generator request's tokens (step + speculative) are kept in
the run's ``gen_tokens.parquet`` (columns uid, tokens). ``system.replay_tokens=<run dir>`` (simulated
backend): the simulated generator reads each request's tokens from that table (by request uid,
which names the path in the search tree) before sampling its own, so simulator and engine search
the same tree with the same step lengths and the simulator's error is its cost model's alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from systems.verifier_search.protocol import GenRequest, GenResult

TABLE = "gen_tokens"


class TokenRecorder:
    """A generator that records every request's output tokens (see module docstring)."""

    def __init__(self, gen):
        self.gen = gen
        self.rows: List[dict] = []

    def extend(self, requests: List[GenRequest], policy) -> GenResult:
        res = self.gen.extend(requests, policy)
        self.rows.extend({"uid": uid, "tokens": list(o.tokens)} for uid, o in res.outputs.items())
        return res

    def __getattr__(self, name):  # configure, shutdown, ...: the wrapped generator's
        return getattr(self.gen, name)


def table_path(run_dir) -> Path:
    return Path(str(run_dir)).expanduser() / f"{TABLE}.parquet"


def load(run_dir) -> Dict[str, List[int]]:
    """uid -> tokens recorded by a run (``gen_tokens.parquet`` in ``run_dir``)."""
    import pandas as pd

    df = pd.read_parquet(table_path(run_dir))
    return {u: [int(t) for t in ts] for u, ts in zip(df["uid"], df["tokens"])}
