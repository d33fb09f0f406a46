"""Speed work changes no result: the LBS main command, LBS Fig.7 and a slice of Fig.9 (every
scheduler) on the simulated backend give records whose summaries and tables equal, bit for bit, the
ones stored in ``golden_summaries.json`` (taken with the code before the simulator's incremental
bookkeeping, commit ca25943).

Regenerate only for an intended change of results, and say so in the commit:
``python -m tests.kv_offload.test_same_results --write`` (from the repository root).
(Mutations caught: the simulator reusing one group's compute time for groups of another size;
children's uids hashed from c instead of c + 1; inter-beam loads counted as inter-token ones.)"""

import hashlib
import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).with_name("golden_summaries.json")

# name -> overrides (backend=sim: the main command as it runs on a machine without a CUDA GPU)
JOBS = {"main": ["system=lbs", "model=opt-6.7b", "beams=64"]}
JOBS.update(
    {
        f"fig7-{s}-step{t}": ["experiment=lbs_fig7", f"system={s}", f"step={t}"]
        for s in ("layerwise", "lbs_intertoken")
        for t in (32, 64, 128)
    }
)
JOBS.update(
    {
        f"fig9-qwen-7b-{s}-b32-step64": ["experiment=lbs_fig9", "model=qwen-7b", f"system={s}", "beams=32", "step=64"]
        for s in ("in_gpu", "layerwise", "lbs_intertoken", "lbs_interbeam", "lbs")
    }
)
JOBS["long-llama-3.1-8b-b128-4096"] = ["system=lbs", "model=llama-3.1-8b", "beams=128", "gen_len=4096"]


def table_digest(path: Path) -> str:
    """sha256 of a parquet table's CSV text (floats in repr: exact)."""
    import pandas as pd

    return hashlib.sha256(pd.read_parquet(path).to_csv(index=False).encode()).hexdigest()


def results(compose, outdir: Path) -> dict:
    """name -> {status, summary, table digests} of every job, run in this process."""
    from harness.run import run

    out = {}
    for name, overrides in JOBS.items():
        rec = run(compose("backend=sim", *overrides, output_dir=outdir / name), multirun=False, overrides=[])
        out[name] = {
            "status": rec["status"],
            "summary": rec["summary"],
            "tables": {t: table_digest(outdir / name / f"{t}.parquet") for t in rec["tables"]},
        }
    return json.loads(json.dumps(out))  # the JSON round trip the stored file went through


def test_summaries_equal_the_stored_ones(compose_cfg, tmp_path):
    golden = json.loads(GOLDEN.read_text())
    got = results(compose_cfg, tmp_path)
    assert sorted(got) == sorted(golden)
    for name in golden:
        assert got[name] == golden[name], name


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    from hydra import compose, initialize_config_dir

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from harness.config import register_configs, register_resolvers

    register_resolvers()
    register_configs()
    conf = str(Path(__file__).resolve().parents[2] / "conf")

    def _compose(*overrides, output_dir):
        with initialize_config_dir(version_base="1.3", config_dir=conf):
            return compose(
                "config", overrides=[f"output_dir={output_dir}", "tracking=none", "progress=false", *overrides]
            )

    with tempfile.TemporaryDirectory() as d:
        GOLDEN.write_text(json.dumps(results(_compose, Path(d)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
