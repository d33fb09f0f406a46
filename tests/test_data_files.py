"""Records tied to their data (issue 39): run.json holds the sha256 of every data file the job read,
resume runs a job again when those files changed, and the serving request-stream cache is keyed by
the files' contents and computed again when its file cannot be read. (Before: swapping the data and
re-running a sweep skipped every job with the old results; an in-place edit that kept a trace's size
and mtime replayed the old stream; a corrupted cache file broke every later run of that workload.)"""

import hashlib
import os
import shutil

import pytest

from harness.run import run
from tests.conftest import ROOT
from workloads import data

TRACE = "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
JOB = (
    "system=vanilla",
    "workload=azure_conv",
    "model=llama-3.1-8b",
    "hardware=a100-80gb",
    "tp=1",
    "pp=1",
    "workload.duration_s=120",
    "backend=sim",
)


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A copy of the fixture trace as the data folder."""
    d = tmp_path / "data"
    (d / TRACE).parent.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fixture_data" / TRACE, d / TRACE)
    monkeypatch.setenv("TTC_DATA_DIR", str(d))
    return d


def _edit_in_place(path):
    """The first request's prompt length changed by one digit (374 -> 975 tokens), keeping the file's
    size and mtime (what the cache once keyed on)."""
    st = path.stat()
    lines = path.read_bytes().split(b"\n")
    ts, ctx, gen = lines[1].split(b",")
    lines[1] = b",".join([ts, b"9" + ctx[1:], gen])
    path.write_bytes(b"\n".join(lines))
    assert path.stat().st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_data_files_hash_a_file_or_every_file_of_a_folder(data_dir):
    f = data_dir / TRACE
    want = hashlib.sha256(f.read_bytes()).hexdigest()
    assert data.data_files({"path": TRACE}) == {str(f): want}
    assert data.data_files({"path": str(f.parent)}) == {str(f): want}
    assert data.data_files({"path": "traces/missing.csv"}) == {} and data.data_files({"kind": "poisson"}) == {}
    _edit_in_place(f)
    assert data.data_files({"path": TRACE})[str(f)] == hashlib.sha256(f.read_bytes()).hexdigest() != want


def test_resume_runs_a_job_again_when_its_data_changed(compose_cfg, data_dir, tmp_path, capsys):
    """(Mutation caught: recorded() without the data comparison: the second run is skipped.)"""
    cfg = lambda: compose_cfg(*JOB, f"results_dir={tmp_path / 'res'}", output_dir=tmp_path / "job")  # noqa: E731
    first = run(cfg())
    assert first["status"] == "ok"
    f = str(data_dir / TRACE)
    assert first["data_files"] == {f: hashlib.sha256((data_dir / TRACE).read_bytes()).hexdigest()}
    capsys.readouterr()
    assert run(cfg())["run_id"] == first["run_id"] and "skipping: valid record" in capsys.readouterr().out
    _edit_in_place(data_dir / TRACE)
    again = run(cfg())
    out = capsys.readouterr().out
    assert "running again: the data differ from the record's" in out
    assert again["data_files"][f] != first["data_files"][f]
    assert again["summary"] != first["summary"]  # the new stream: one prompt 600 tokens longer
    assert not (tmp_path / "job" / "replaced-record").exists()  # the aside record settled


def test_the_stream_cache_follows_the_trace_contents_and_survives_a_corrupt_file(compose_cfg, data_dir, tmp_path):
    """(Mutations caught: the cache keyed by size and mtime again; np.load unguarded.)"""
    from systems.energy_serving import build

    res = tmp_path / "res"
    w = compose_cfg(*JOB, f"results_dir={res}").workload
    first = build._stored_requests("k", w, res / "cache")
    _edit_in_place(data_dir / TRACE)
    second = build._stored_requests("k", w, res / "cache")
    assert (first.input_len[0], second.input_len[0]) == (374, 974)
    for f in (res / "cache").glob("*.npz"):
        f.write_bytes(b"not a zip")
    third = build._stored_requests("k", w, res / "cache")
    assert list(third.input_len) == list(second.input_len)
