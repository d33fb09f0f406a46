"""scripts/gpu_engine.py's CPU dry run (issue 37's device script): every section on a tiny model through
the same shell wrapper as the device call, and what its summary says checked against its rows."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_measures_every_decode_path_search_and_reproducibility(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, SCRIPT="gpu_engine", TINY="1", OUT=str(out), PY=sys.executable, DEADLINE_S="300")
    p = subprocess.run(
        ["bash", "scripts/gpu_validate.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    names = {f.name for f in out.iterdir()}
    assert all(f.is_file() for f in out.iterdir()) and len(names) <= 8  # what a device call returns
    assert {"decode.csv", "results.csv", "summary.json", "runs.tar.gz", "log.txt", "gpu_state.txt"} <= names
    with tarfile.open(out / "outputs.tar.gz") as tf:
        assert {"decode.csv", "repro.json", "ceilings.json", "groups_bw.csv", "cpu-measured.yaml"} <= set(tf.getnames())
        tf.extractall(out / "x")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished"
    # 1. decode: the limit, the whole step and each decode path, the first round discarded
    dec = pd.read_csv(out / "decode.csv")
    whats = set(dec.what)
    assert "limit" in whats and "whole step, eager" in whats
    assert {w.split(", ", 1)[1].split(" ")[0] for w in whats if w.startswith("engine")} == {
        "transformers",
        "lean",
        "piecewise",
    }
    rounds = dec[dec.what != "limit"]
    assert set(rounds[rounds.discarded]["round"]) == {0} and not rounds[rounds["round"] > 0].discarded.any()
    for what, row in summary["decode"].items():
        if what != "limit_ms":
            kept = rounds[(rounds.what == what) & ~rounds.discarded]
            assert row["ms_per_token"] == kept.ms_per_token.median()
            assert row["over_limit"] == row["ms_per_token"] / summary["decode"]["limit_ms"]
    # 2. search: three schedulers, two rounds (the first discarded), bytes equal to the replay's
    res = pd.read_csv(out / "results.csv")
    assert set(res.system) == {"in_gpu", "layerwise", "lbs"} and set(res["round"]) == {0, 1}
    assert (res.status == "ok").all() and (res.h2d_real == res.h2d_sim).all() and (res.d2h_real == res.d2h_sim).all()
    search = summary["search"]
    lw, lbs = search["layerwise-b8-s8-g16"], search["lbs-b8-s8-g16"]
    assert search["lbs over layerwise, gen 16"] == lw["real_s"] / lbs["real_s"]
    assert all(v["bytes_equal"] for k, v in search.items() if isinstance(v, dict))
    # 3. reproducibility: on a CPU every pair of runs keeps the same beams at every selection step
    repro = json.loads((out / "x" / "repro.json").read_text())
    assert repro == summary["reproducibility"]
    assert repro["status"]["process"] == "ok" and "every group padded to 8" in repro["status"]["lbs-invariant"]
    assert set(repro["kept_in_common"]) == {
        "first vs again",
        "first vs process",
        "first vs lbs",
        "invariant vs lbs-invariant",
        "first vs invariant",
    }
    assert all(v == [repro["beam_size"]] * 2 for v in repro["kept_in_common"].values()), repro
    # teacher-forced: in float32 on a CPU, another batch size rounds differently (but flips nothing);
    # padded to one batch size, LBS scores in_gpu's tree bit for bit
    forced = repro["teacher_forced"]
    assert set(forced) == {"lbs-forced-on-first", "first-forced-on-lbs", "lbs-invariant-forced-on-invariant"}
    for d in forced.values():
        assert d["max_abs_cum_logprob_diff"] < 1e-4 and d["token_flips"] == d["selection_flips"] == 0
    assert forced["lbs-invariant-forced-on-invariant"]["identical"]
    t = repro["e2e_s"]
    assert repro["lbs-invariant / lbs time"] == t["lbs-invariant"] / t["lbs"] and t["invariant"] > 0


def test_kept_overlap_counts_the_beams_two_trees_keep_in_common(tmp_path):
    """(Mutation caught: the count of run a's kept beams returned, whatever run b kept.)"""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_engine

    for name, steps in (("a", [["1", "2"], ["5", "6"]]), ("b", [["2", "1"], ["5", "7"]])):
        (tmp_path / name).mkdir()
        tree = {"steps": [{"step": i, "kept": k} for i, k in enumerate(steps)]}
        (tmp_path / name / "beam_tree.json").write_text(json.dumps(tree))
    assert gpu_engine.kept_overlap(tmp_path / "a", tmp_path / "b") == [2, 1]
