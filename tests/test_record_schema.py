"""The record format documented (issue 40, item 4): every summary key, record key and table the
simulated sample runs write is listed in harness/record_schema.py; their run.json files load through
the committed JSON Schema (docs/run.schema.json); the schema and docs/records.md's generated part are
what the module writes now; every sweep writes summary.csv and the docs' pandas example runs.

The samples (harness.record_schema.SAMPLE_RUNS: the three families' main commands and a few more,
simulated) run once for the module, in-process (~5 s)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import record_schema as rs
from harness.family import families
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return rs.run_samples(tmp_path_factory.mktemp("samples"))


def test_every_family_is_documented():
    """Mutation caught: a family in systems.families without an entry in SUMMARY_KEYS, TABLES or
    SAMPLE_RUNS (energy_serving's samples renamed away): its records would go undocumented."""
    for name in families():
        assert name in rs.SUMMARY_KEYS and name in rs.TABLES and rs.SAMPLE_RUNS.get(name), name


def test_every_summary_key_a_run_writes_is_documented(samples):
    """Every summary key of every sample (and of each repeat) is listed for its family, and every key
    listed without a ``when`` is written by some sample of the family. Mutations caught: a summary
    key renamed in a runner (``io_share`` -> ``io_fraction`` in systems/kv_offload/runner.py: the new
    name is not listed, the old one never written), a key dropped from SUMMARY_KEYS."""
    written = {}
    for s in samples:
        assert s.record["status"] in ("ok", "oom"), (s.overrides, s.record.get("message"))
        keys = set(s.record["summary"]).union(*(r["summary"] for r in s.record["repeat_runs"]))
        unlisted = keys - set(rs.family_keys(s.family))
        assert not unlisted, f"{s.overrides}: summary keys not in harness/record_schema.py: {sorted(unlisted)}"
        written.setdefault(s.family, set()).update(keys)
    for fam, keys in rs.SUMMARY_KEYS.items():
        never = {k for k, v in keys.items() if not v.when} - written[fam]
        assert not never, f"{fam}: listed without a 'when' but no sample writes them: {sorted(never)}"


def test_every_table_and_record_key_is_documented(samples):
    """Mutations caught: a table renamed in a runner (``steps`` -> ``step_rows`` in
    systems/kv_offload/runner.py), a record key renamed in the harness (``seeds`` -> ``seed_list`` in
    harness/repeats.py) or dropped from RECORD_KEYS (``tables``)."""
    written = {}
    for s in samples:
        assert set(s.record) <= set(rs.RECORD_KEYS), sorted(set(s.record) - set(rs.RECORD_KEYS))
        tables = set(s.record["tables"])
        assert tables <= set(rs.TABLES[s.family]), sorted(tables - set(rs.TABLES[s.family]))
        written.setdefault(s.family, set()).update(tables)
    for fam, tables in rs.TABLES.items():
        for name, t in tables.items():
            # a table some sample writes has its columns read from the file; the others say theirs
            assert (name in written[fam]) != bool(t.columns), (fam, name)
            assert t.when or name in written[fam], (fam, name)


def test_records_load_through_the_committed_schema(samples):
    """Each sample's run.json (read back from its file) and an error record of a job that never ran
    validate against docs/run.schema.json, which is what ``python -m harness.record_schema`` prints
    now; a record with a renamed summary key or status does not. Mutations caught: a key renamed in
    a runner (the schema's summary allows no other key), the committed schema left stale after
    SUMMARY_KEYS changed (a meaning), the family's branch of the schema not applied to ``summary``
    (the renamed key passes)."""
    committed = json.loads(rs.SCHEMA_PATH.read_text())
    assert rs.SCHEMA_PATH.read_text() == rs.schema_text(), (
        "stale: python -m harness.record_schema > docs/run.schema.json"
    )
    for s in samples:
        rec = json.loads((s.outdir / "run.json").read_text())
        assert rs.validate(rec, committed) == [], s.overrides
    main = json.loads((samples[0].outdir / "run.json").read_text())
    main["summary"]["io_fraction"] = main["summary"].pop("io_share")
    main["status"] = "finished"
    errors = rs.validate(main, committed)
    assert any("'io_fraction' was unexpected" in e for e in errors) and any(e.startswith("status:") for e in errors)


def test_error_record_and_check_command(samples, compose_cfg, tmp_path, monkeypatch):
    """The error record of a job whose process died before writing one (harness.run.error_record)
    validates, also the bare one written when the job's config cannot even name its family; a record
    of status ok without the keys of a job that ran does not; ``--check`` says valid / INVALID and
    exits 0 / 1. Mutations caught: a key only some error records hold made required for every record
    (``family`` in REQUIRED), REQUIRED_RAN not applied to ok records."""
    import harness.run

    cfg = compose_cfg("system=lbs", "beams=4", output_dir=tmp_path / "e")
    rec = harness.run.error_record(cfg, tmp_path / "e", ["system=lbs", "beams=4"], "job process died (signal 9)")
    now = rs.schema()  # the module's (test_records_load_through_the_committed_schema: the file is the same)
    assert rec["family"] == "kv_offload" and rs.validate(rec, now) == []

    def no_header(*args):
        raise ValueError("a value that does not resolve")

    monkeypatch.setattr(harness.run, "record_header", no_header)
    bare = harness.run.error_record(cfg, tmp_path / "e", ["system=lbs"], "invalid configuration: ...")
    assert "family" not in bare and rs.validate(bare, now) == []
    assert any("'family' is a required property" in e for e in rs.validate({**bare, "status": "ok"}, now))
    good = samples[0].outdir
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**bare, "summary_typo": 1}))
    p = subprocess.run(
        [sys.executable, "-m", "harness.record_schema", "--check", str(good), str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1 and f"{good / 'run.json'}: valid" in p.stdout and f"{bad}: INVALID" in p.stdout
    assert "'summary_typo' was unexpected" in p.stdout


def test_docs_generated_part_is_current(samples):
    """docs/records.md's part between the markers is what ``python -m harness.record_schema --docs``
    writes now. Mutations caught: a column dropped from a runner's table (``io_stall_energy_j`` from
    steps.parquet), a summary key's meaning changed in SUMMARY_KEYS, both without regenerating."""
    text = rs.DOCS_PATH.read_text()
    assert rs.committed_section(text) == rs.docs_section(samples), "stale: python -m harness.record_schema --docs"
    assert rs.replace_section(text, rs.docs_section(samples)) == text


def test_every_sweep_writes_summary_csv_and_the_pandas_example_runs(tmp_path):
    """A sweep's summary.csv: one row per job, the swept values, status and every summary key, the
    same values as runs.parquet; the five-line pandas example of docs/records.md runs on the sweep.
    Mutations caught: summary.csv not written by harness.callbacks; summary keys other than e2e_s
    left out; rows not sorted by the swept values (16 before 4)."""
    p = subprocess.run(
        [sys.executable, "run.py", "-m", "system=lbs", "beams=16,4", "gen_len=256", "tracking=none"]
        + [f"results_dir={tmp_path}", "sweep_name=s"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    d = tmp_path / "sweeps" / "s"
    csv, runs = pd.read_csv(d / "summary.csv"), pd.read_parquet(d / "runs.parquet")
    assert list(csv["beams"]) == [4, 16] and list(csv["status"]) == ["ok", "ok"]
    assert list(csv.columns[:2]) == ["beams", "status"] and "summary.e2e_s" in csv and "config.seed" not in csv
    assert {c for c in runs.columns if c.startswith("summary.")} <= set(csv.columns)
    by_dir = runs.set_index("run_dir")
    assert list(csv["summary.e2e_s"]) == [by_dir.at[r, "summary.e2e_s"] for r in csv["run_dir"]]
    code = re.search(r"```python\n(import json, pandas as pd\n.*?)```", rs.DOCS_PATH.read_text(), re.S).group(1)
    assert len([ln for ln in code.splitlines() if ln.strip()]) == 5
    scope = {}
    exec(code.replace("results/sweeps/SWEEP", str(d)), scope)
    assert scope["rec"]["status"] == "ok" and len(scope["steps"]) == 8  # gen_len 256 / step 32


def test_run_json_is_valid_for_a_path_not_sampled(tmp_path, compose_cfg):
    """A timeout record (system.deadline passed before the first step) validates too. Mutation caught:
    a summary key only such a run writes (``stopped_before_step`` set where the kv_offload runner
    returns without a step) and the registry lacks."""
    from harness.run import run

    over = ["system=lbs", "beams=4", "system.deadline=1600000000"]
    rec = run(compose_cfg(*over, output_dir=tmp_path / "t"), multirun=False, overrides=over)
    assert rec["status"] == "timeout"
    assert rs.validate(json.loads((tmp_path / "t" / "run.json").read_text())) == []


def test_schema_cli_prints_the_committed_schema():
    """Mutation caught: ``python -m harness.record_schema`` printing anything besides the schema (a
    sample run's table on stdout would corrupt ``> docs/run.schema.json``)."""
    p = subprocess.run(
        [sys.executable, "-m", "harness.record_schema"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0 and p.stdout == Path(rs.SCHEMA_PATH).read_text()


@pytest.mark.slow
def test_a_real_engine_record_loads_through_the_schema(tmp_path, compose_cfg):
    """The real LBS engine on this CPU (tiny-opt, random weights; ~5 s): its record, with the keys
    only real engines write (time_basis, decode_path, gpu_energy_j, threads, load averages,
    energy_gpus, best_tokens), validates against the committed schema. Mutation caught: a real-only
    summary key renamed (``time_basis`` -> ``seconds_basis`` in systems/kv_offload/runner.py)."""
    from harness.run import run

    over = ["system=layerwise", "backend=torch", "model=tiny-opt", "beams=4", "gen_len=64", "kv_budget=16MiB"]
    rec = run(compose_cfg(*over, output_dir=tmp_path / "real"), multirun=False, overrides=over)
    assert rec["status"] == "ok" and not rec["backend"]["simulated"] and "time_basis" in rec["summary"]
    assert rs.validate(json.loads((tmp_path / "real" / "run.json").read_text())) == []
