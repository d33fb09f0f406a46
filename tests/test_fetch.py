"""workloads.fetch: pinned data files, checksums, a local mirror, and ServeGen's day-1 cut.

The mirror here is tests/fixture_data, pinned by a manifest of its own (the ``fixture_pins``
fixture), so nothing here needs the full data or a network.
Mutations caught: checksum not compared (corrupt file accepted); cut keeping timestamp == 86400;
a failed file written anyway."""

import json
import urllib.error
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_DATA
from workloads import fetch as F
from workloads.data import data_dir, resolve

MIRROR = FIXTURE_DATA


@pytest.fixture
def fixture_pins(monkeypatch, tmp_path_factory):
    """workloads.fetch pins the fixture slices (a manifest written from tests/fixture_data)."""
    monkeypatch.setattr(F, "MANIFEST", tmp_path_factory.mktemp("pins") / "manifest.json")
    F.write_manifest(MIRROR)


def test_mirror_copy_and_check(tmp_path, fixture_pins):
    c = F.fetch(tmp_path, mirror=MIRROR, only="math/", log=lambda *_: None)
    assert c == {"present": 0, "fetched": 3, "failed": 0}
    assert F.fetch(tmp_path, only="math/", check_only=True, log=lambda *_: None)["present"] == 3


def test_every_experiment_file_is_pinned():
    paths = {e["path"] for e in F.load_manifest()}
    for rel in (
        "math/aime24/test.jsonl",
        "math/amc23/test.jsonl",
        "math/math500/test.jsonl",
        "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv",
        "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
        "traces/mooncake/conversation_trace.jsonl",
        "traces/servegen/language/m-large/chunk-0-trace.csv",
    ):
        assert rel in paths
    e = next(e for e in F.load_manifest() if e["path"] == "math/aime24/test.jsonl")
    assert e["sha256"] == "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac"  # shared/data README
    assert e["url"].startswith("https://raw.githubusercontent.com/QwenLM/Qwen2.5-Math/a45202bd")


def test_corrupt_mirror_file_is_refused_and_not_written(tmp_path, fixture_pins):
    mirror = tmp_path / "mirror" / "math" / "aime24"
    mirror.mkdir(parents=True)
    (mirror / "test.jsonl").write_bytes((MIRROR / "math/aime24/test.jsonl").read_bytes() + b"\n")
    dest = tmp_path / "dest"
    with pytest.raises(F.FetchError, match=r"math/aime24/test.jsonl: sha256 .* != pinned"):
        F.fetch(dest, mirror=tmp_path / "mirror", only="math/aime24/", log=lambda *_: None)
    assert not (dest / "math/aime24/test.jsonl").exists()


def test_download_applies_the_day1_cut(tmp_path, monkeypatch, fixture_pins):
    """Upstream m-large spans 14 days; the download is cut to day 1 and then matches the pin."""
    rel_t = "traces/servegen/language/m-large/chunk-0-trace.csv"
    rel_d = "traces/servegen/language/m-large/chunk-0-dataset.json"
    day1_t, day1_d = (MIRROR / rel_t).read_bytes(), (MIRROR / rel_d).read_bytes()
    upstream_t = day1_t + b"86400,1.0,2.0,Gamma,0.5,0.5\r\n90000,0,0,,0,0\r\n"
    d = json.loads(day1_d)
    d["86400"] = d["0"]
    upstream = {rel_t: upstream_t, rel_d: json.dumps(d).encode()}
    monkeypatch.setattr(
        F, "_download", lambda url: upstream[next(r for r in upstream if url.endswith(r.split("servegen/")[1]))]
    )
    c = F.fetch(tmp_path, only="traces/servegen/language/m-large/chunk-0-", log=lambda *_: None)
    assert c["fetched"] == 2
    assert (tmp_path / rel_t).read_bytes() == day1_t and (tmp_path / rel_d).read_bytes() == day1_d


def test_data_dir_order(monkeypatch, tmp_path):
    monkeypatch.setenv("TTC_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path and resolve("math/x.jsonl") == tmp_path / "math/x.jsonl"
    assert resolve("/abs/file") == Path("/abs/file")
    monkeypatch.delenv("TTC_DATA_DIR")
    import workloads.data as D

    assert D.SHARED == D.REPO.parent / "shared" / "data"
    monkeypatch.setattr(D, "SHARED", tmp_path)  # ../shared/data beside the repository, when there
    assert data_dir() == tmp_path
    monkeypatch.setattr(D, "SHARED", tmp_path / "no-shared-mirror")
    assert data_dir() == D.CACHE and D.CACHE.name == "data" and ".cache" in str(D.CACHE)


@pytest.fixture
def team_layout(monkeypatch, tmp_path, fixture_pins):
    """``../shared/data`` exists (with the math files) and wins over an empty cache folder; TTC_DATA_DIR unset."""
    import workloads.data as D

    shared, cache = tmp_path / "shared" / "data", tmp_path / "cache"
    F.fetch(shared, mirror=MIRROR, only="math/", log=lambda *_: None)
    monkeypatch.delenv("TTC_DATA_DIR", raising=False)
    monkeypatch.setattr(D, "SHARED", shared)
    monkeypatch.setattr(D, "CACHE", cache)
    assert data_dir() == shared
    return shared, cache


def test_cli_checks_and_fetches_the_folder_runs_read(team_layout, capsys, monkeypatch):
    """--check and fetch default to data_dir() (before: the cache folder, so --check reported every
    file missing while every run read ../shared/data); each message names the folder; --help says the
    default; the missing-data hint of run errors names it too.
    Mutations caught: main's default back to the cache folder; the error not naming the folder;
    missing_hint naming the cache folder."""
    shared, cache = team_layout
    assert F.main(["--check", "--only", "math/"]) == 0
    assert capsys.readouterr().out == f"data in {shared}: all 3 files present, each with its pinned sha256\n"
    (shared / "math/amc23/test.jsonl").unlink()
    assert F.main(["--check", "--only", "math/"]) == 1
    assert capsys.readouterr().err == (
        f"error: 1 of the data files in {shared} could not be verified:\n  math/amc23/test.jsonl: missing\n"
    )
    assert F.main(["--from", str(MIRROR), "--only", "math/amc23/"]) == 0
    assert capsys.readouterr().out == f"data in {shared}: 0 present (sha256 checked), 1 fetched\n"
    assert (shared / "math/amc23/test.jsonl").is_file() and not cache.exists()
    monkeypatch.setenv("COLUMNS", "1000")  # argparse: one line per option
    with pytest.raises(SystemExit):
        F.main(["--help"])
    help_text = capsys.readouterr().out
    assert (
        f"default: the one runs read: $TTC_DATA_DIR, else ../shared/data beside the repository when it "
        f"exists, else ~/.cache/ttc-sched-bench/data; here {shared})"
    ) in help_text
    from workloads.data import missing_hint

    assert f"downloads the pinned public files into {shared}, the folder runs read;" in missing_hint()


def test_cli_bad_mirror_exits_2(tmp_path, capsys):
    assert F.main(["--from", str(tmp_path / "nope"), "--dest", str(tmp_path)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_math_workloads_read_the_fetched_copy(monkeypatch, tmp_path, compose_cfg):
    """A user outside this team: no ``../shared/data``, TTC_DATA_DIR unset, the files fetched into the
    cache folder. Every math workload's configured path finds its file there (before, the YAML pointed
    at ``../shared/data`` relative to the working directory and ignored the fetch cache).
    Mutation caught: the YAML path back to ``${oc.env:TTC_DATA_DIR,../shared/data}/math/...``."""
    import workloads.data as D
    from systems.verifier_search.runner import _data_path

    cache = tmp_path / "cache"
    monkeypatch.delenv("TTC_DATA_DIR", raising=False)
    monkeypatch.setattr(D, "SHARED", tmp_path / "no-shared-mirror")
    monkeypatch.setattr(D, "CACHE", cache)
    monkeypatch.chdir(tmp_path)
    for name in ("aime24", "amc23", "math500"):
        f = cache / "math" / name / "test.jsonl"
        f.parent.mkdir(parents=True)
        f.write_text('{"problem": "1+1?", "answer": "2"}\n')
        cfg = compose_cfg("system=fasttts", f"workload={name}")
        assert _data_path(cfg.workload.path) == f


@pytest.mark.parametrize(
    "args,message",
    [
        (["--check", "--only", "bogus/"], "--only 'bogus/': no data file under it; a prefix of"),
        (["--dest", "", "--only", "math/"], "--dest '': a folder; leave it out for the folder runs read"),
    ],
)
def test_arguments_that_name_nothing_exit_2(args, message, capsys, monkeypatch, tmp_path):
    """QA: --only matching nothing said 'all 0 files present' (exit 0); --dest '' wrote into the
    current folder. Mutation caught: either check left out."""
    monkeypatch.chdir(tmp_path)
    assert F.main(args) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")
    assert list(tmp_path.iterdir()) == []


def test_without_a_network_the_fetch_stops_at_once_naming_the_mirror_route(tmp_path, monkeypatch, capsys):
    """No network: the first download that cannot reach the host ends the fetch with one message
    naming ``--from DIR`` (it tried all 405 files, 18 s of 'Name or service not known'). An HTTP
    error (the host answered) is the file's own failure and the others go on. Mutations caught: the
    network error treated as the file's (every file tried); an HTTP 404 taken for no network."""
    calls = []

    def offline(url, timeout_s=60.0):
        calls.append(url)
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setattr(F, "_download", offline)
    assert F.main(["--dest", str(tmp_path), "--only", "traces/"]) == 1
    err = capsys.readouterr().err
    assert len(calls) == 1 and "could not reach raw.githubusercontent.com" in err
    assert "Name or service not known" in err and "python -m workloads.fetch --from DIR" in err
    assert list(tmp_path.iterdir()) == []

    def missing(url, timeout_s=60.0):
        calls.append(url)
        raise urllib.error.HTTPError(url, 404, "Not Found", {}, None)

    calls.clear()
    monkeypatch.setattr(F, "_download", missing)
    with pytest.raises(F.FetchError, match=r"(?s)3 of the data files .* HTTP Error 404"):
        F.fetch(tmp_path, only="math/", log=lambda *_: None)
    assert len(calls) == 3


@pytest.mark.full_data
def test_the_fixture_slices_are_cut_from_the_pinned_data_as_their_readme_says(full_data, tmp_path):
    """tests/fixture_data is what tests/cut_fixture_data.py makes from the full data folder, byte
    for byte, and nothing else (besides its README and licence text)."""
    from tests.cut_fixture_data import cut

    made = cut(full_data, tmp_path)
    for rel in made:
        assert (tmp_path / rel).read_bytes() == (MIRROR / rel).read_bytes(), rel
    have = {p.relative_to(MIRROR).as_posix() for p in MIRROR.rglob("*") if p.is_file()}
    assert have == set(made) | {"README.md", "LICENSE-Apache-2.0.txt"}
