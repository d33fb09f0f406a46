"""Records respect the umask (group-readable on a shared cluster) and tests never write into the
user's results/ or W&B folders.

Mutations caught: dropping the fchmod (mkstemp's 0600 stays); results_dir not read from
$TTC_RESULTS_DIR."""

import os
import stat

import pytest

from harness import records


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_record_files_follow_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        records.atomic_write_json(tmp_path / "run.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "run.json").stat().st_mode) == mode


def test_tests_write_to_temporary_folders(compose_cfg):
    cfg = compose_cfg()
    assert cfg.results_dir == os.environ["TTC_RESULTS_DIR"] and "ttc-tests-" in cfg.results_dir
    assert "ttc-tests-" in os.environ["WANDB_DIR"]


def test_columns_and_rows_are_written_without_pandas_as_pandas_writes_them(tmp_path):
    """A table given as a dict of columns or as row dicts is written from Arrow buffers (numbers,
    bools, bools with None, all None, text) in a process that never imports pandas, and reads back
    as the same DataFrame pandas writes itself. Mutations caught: text or flags through
    ``pa.array`` (imports pandas), a bool column's validity bitmap dropped (None read as False),
    string offsets shifted by one."""
    import json
    import subprocess
    import sys

    import numpy as np
    import pandas as pd

    cols = {
        "t": [0.5, np.nan, 2.0],
        "n": [1, 2, 3],
        "ok": [True, None, False],
        "flag": [True, False, True],
        "none": [None, None, None],
        "trigger": ["arrival", "", "décision"],
    }
    code = (
        "import json, sys, numpy as np\nfrom pathlib import Path\nfrom harness import records\n"
        "cols = json.loads(sys.argv[1]); out = Path(sys.argv[2])\n"
        "arrays = {k: (np.array(v, dtype=float) if k == 't' else np.asarray(v)) for k, v in cols.items()}\n"
        "records.atomic_write_parquet(out / 'cols.parquet', arrays)\n"
        "rows = [dict(zip(arrays, r)) for r in zip(*(a.tolist() for a in arrays.values()))]\n"
        "records.atomic_write_parquet(out / 'rows.parquet', rows)\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cols).replace("NaN", "null"), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=str(records.Path(records.__file__).parent.parent),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    want = pd.DataFrame({**cols, "t": np.array(cols["t"], dtype=float)})
    want.to_parquet(tmp_path / "pandas.parquet", index=False)
    expect = pd.read_parquet(tmp_path / "pandas.parquet")
    for name in ("cols", "rows"):
        got = pd.read_parquet(tmp_path / f"{name}.parquet")
        pd.testing.assert_frame_equal(got, expect)


def test_tables_read_back_as_written_with_pyarrows_defaults(tmp_path):
    """records.write_parquet dictionary-encodes only text columns (faster on number columns); every
    table reads back equal (values, types, schema metadata) to the same table written with
    ``pyarrow.parquet.write_table``'s defaults, and a DataFrame to what ``DataFrame.to_parquet``
    writes. Mutations caught: parquet format version 1.0 (a uint32 column reads back as int64);
    the DataFrame path keeping its index (an extra column)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n = 5000
    cols = {
        "t": rng.uniform(0, 1, n),
        "n": rng.integers(0, 5, n),
        "u": np.arange(n, dtype=np.uint32),
        "f": np.where(rng.uniform(size=n) < 0.1, np.nan, 1.0),
        "ok": rng.uniform(size=n) < 0.5,
        "trigger": np.array(["arrival", "finish", "décision"])[rng.integers(0, 3, n)],
        "none": [None] * n,
    }
    tb = records._arrow_columns(cols)
    tb = tb.append_column("label", pa.array(["a", "b"] * (n // 2)).dictionary_encode())
    records.write_parquet(tb, tmp_path / "ours.parquet")
    pq.write_table(tb, tmp_path / "default.parquet")
    got, want = pq.read_table(tmp_path / "ours.parquet"), pq.read_table(tmp_path / "default.parquet")
    assert _same_table(got, want) and got.schema.field("u").type == pa.uint32()
    df = pd.DataFrame({k: v for k, v in cols.items() if k != "none"}, index=np.arange(n) + 7)
    records.atomic_write_parquet(tmp_path / "df.parquet", df)
    df.to_parquet(tmp_path / "df_pandas.parquet", index=False)
    assert _same_table(pq.read_table(tmp_path / "df.parquet"), pq.read_table(tmp_path / "df_pandas.parquet"))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "df.parquet"), df.reset_index(drop=True))


def _same_table(a, b) -> bool:
    """Same schema (types, metadata) and values, NaN equal to NaN (Arrow's ``equals`` says NaN != NaN)."""
    return a.schema.equals(b.schema, check_metadata=True) and all(
        [repr(v) for v in a[c].to_pylist()] == [repr(v) for v in b[c].to_pylist()] for c in a.column_names
    )


@pytest.mark.parametrize(
    "overrides,source",
    [
        (["system=lbs", "beams=4"], "simulated"),
        (["system=fasttts", "n=4", "workload.num_problems=1"], "simulated"),
        (["system=beam", "workload.duration_s=30"], "simulated"),
    ],
)
def test_every_table_says_in_its_metadata_what_it_is(compose_cfg, tmp_path, overrides, source):
    """A table copied away from its run.json still says it is simulated (parquet schema metadata),
    with the backend, hardware, system and model. Mutation caught: the run's tables written without
    the metadata (a newcomer's report: nothing in steps.parquet said it was simulated)."""
    import pyarrow.parquet as pq

    from harness.run import run

    outdir = tmp_path / "r"
    rec = run(compose_cfg(*overrides, "backend=sim", output_dir=outdir), multirun=False, overrides=[])
    assert rec["tables"]
    for name in rec["tables"]:
        meta = pq.read_schema(outdir / f"{name}.parquet").metadata
        assert meta[b"ttc.source"] == source.encode(), name
        assert meta[b"ttc.system"] == rec["config"]["system"]["name"].encode()
        assert meta[b"ttc.hardware"] == rec["config"]["hardware"]["name"].encode()
        assert meta[b"ttc.model"] == rec["config"]["model"]["name"].encode()
        assert meta[b"ttc.backend"] == b"sim"


def test_a_write_that_dies_before_its_rename_leaves_the_old_record_whole(tmp_path, monkeypatch):
    """atomic_write_json writes a temp file and renames it: a crash before the rename (here the rename
    itself fails) leaves the previous run.json byte for byte and no temp file. Issue 39: a plain
    write passed every test. Mutation caught: writing straight into the target."""
    import os

    from harness import records

    path = tmp_path / "run.json"
    records.atomic_write_json(path, {"status": "ok", "summary": {"e2e_s": 1.0}})
    before = path.read_bytes()

    def crash(src, dst):
        raise OSError("killed between the write and the rename")

    monkeypatch.setattr(records.os, "replace", crash)
    with pytest.raises(OSError, match="killed between"):
        records.atomic_write_json(path, {"status": "error", "summary": {}})
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["run.json"]


def test_a_record_of_another_config_is_not_taken_for_the_jobs_own(tmp_path):
    """Resume skips a job only when its folder holds a valid record of the same config hash. Issue
    39: resume without the hash check passed every test. Mutation caught: the hash not compared."""
    from harness import records

    rec = {"record_version": records.RECORD_VERSION, "status": "ok", "config_hash": "aaa", "summary": {}}
    records.atomic_write_json(tmp_path / "run.json", rec)
    assert records.load_valid_record(tmp_path, "aaa") is not None
    assert records.load_valid_record(tmp_path, "bbb") is None


def test_a_record_whose_table_does_not_read_back_is_run_again(compose_cfg, tmp_path, capsys):
    """A truncated steps.parquet beside a valid run.json counted as recorded (issue 39). run.json now
    holds each table's sha256; resume runs the job again when a table differs, and the re-run's
    table is whole. (Mutation caught: load_valid_record without tables_intact.)"""
    import hashlib

    from harness.run import run

    cfg = lambda: compose_cfg("system=lbs", "backend=sim", output_dir=tmp_path / "job")  # noqa: E731
    first = run(cfg())
    steps = tmp_path / "job" / "steps.parquet"
    assert first["table_sha256"]["steps.parquet"] == hashlib.sha256(steps.read_bytes()).hexdigest()
    assert records.load_valid_record(tmp_path / "job") is not None
    steps.write_bytes(steps.read_bytes()[:100])
    assert records.load_valid_record(tmp_path / "job") is None
    capsys.readouterr()
    again = run(cfg())
    assert "skipping" not in capsys.readouterr().out and again["status"] == "ok"
    assert hashlib.sha256(steps.read_bytes()).hexdigest() == again["table_sha256"]["steps.parquet"]


def test_a_table_that_cannot_be_written_leaves_no_ok_record(compose_cfg, tmp_path, monkeypatch):
    """A failed table write kept status ok, which resume skipped (issue 39): the record is now an
    error naming the table, its summary kept, and a re-run is not skipped. (Mutation caught: the
    table error recorded beside status ok, as before.)"""
    from harness.run import exit_code, run

    write = records.atomic_write_parquet

    def failing(path, table, metadata=None):
        if path.name == "groups.parquet":
            raise OSError(28, "No space left on device")
        return write(path, table, metadata)

    monkeypatch.setattr(records, "atomic_write_parquet", failing)
    rec = run(compose_cfg("system=lbs", "backend=sim", "kv_budget=2GiB", output_dir=tmp_path / "job"))
    assert rec["status"] == "error" and rec["status_before_table_error"] == "ok" and exit_code(rec) == 1
    assert "table groups.parquet could not be written (OSError: [Errno 28] No space left on device)" in rec["message"]
    assert rec["summary"]["e2e_s"] > 0 and "groups.parquet" not in rec["table_sha256"]
    assert records.load_valid_record(tmp_path / "job") is None


def test_an_older_records_renamed_summary_key_reads_under_its_current_name(tmp_path):
    """FastTTS's ``goodput_tok_s`` became ``precise_goodput_tok_s`` (issue 40: not vLLM's goodput):
    a record written before is read (sweep rows, compare) under the new name, its headline too; a
    record holding both keeps the new one's value. Mutation caught: record_row flattening the
    summary as written (the old column name)."""
    from harness.records import current_summary
    from harness.report import record_row

    old = {"status": "ok", "summary": {"goodput_tok_s": 41.5, "latency_s": 2.0}, "headline": {"key": "goodput_tok_s"}}
    row = record_row(old, tmp_path)
    assert row["summary.precise_goodput_tok_s"] == 41.5 and "summary.goodput_tok_s" not in row
    assert row["headline"] == "precise_goodput_tok_s" and row["summary.latency_s"] == 2.0
    assert current_summary({"goodput_tok_s": 1.0, "precise_goodput_tok_s": 2.0}) == {"precise_goodput_tok_s": 2.0}
