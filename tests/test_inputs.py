"""User-given files are read only when they are regular UTF-8 files of a bounded size
(harness/inputs.py, issue 39): a FIFO given as a latency profile blocked the run before any work, and
a binary problem set or trace ended in a UnicodeDecodeError traceback. Each is now exit 2 (ConfigError)
before any work, naming the setting and the path, in every place a run reads such a file."""

import os
import signal

import pytest

from harness.errors import ConfigError
from harness.inputs import read_text, regular_file
from harness.run import validate_config

BINARY = bytes(range(128, 256)) * 4


@pytest.fixture
def no_hang():
    """A test that would block on a FIFO fails after 20 s instead of hanging the suite."""

    def fail(*_):
        raise TimeoutError("blocked reading a FIFO")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "binary").write_bytes(BINARY)
    (tmp_path / "text").write_text("héllo\n")
    return tmp_path


def test_regular_file_and_read_text(files, no_hang):
    """(Mutations caught: S_ISREG not tested, so the FIFO is opened and blocks; the size bound not
    applied; bytes decoded with errors='replace'.)"""
    assert read_text(files / "text", "f") == "héllo\n"
    with pytest.raises(ConfigError, match=r"f='.*fifo' is not allowed: a file, a regular file \(this is a FIFO\)"):
        read_text(files / "fifo", "f", "a file")
    with pytest.raises(ConfigError, match="not allowed: a file, not a folder"):
        regular_file(files, "f")
    with pytest.raises(ConfigError, match="cannot be read"):
        regular_file(files / "missing", "f")
    with pytest.raises(ConfigError, match=r"of at most 3 bytes \(7 bytes\)"):
        regular_file(files / "text", "f", max_bytes=3)
    with pytest.raises(ConfigError, match="in UTF-8 \\(byte 0 is not: a binary file\\?\\)"):
        read_text(files / "binary", "f")


@pytest.mark.parametrize("name,message", [("fifo", "this is a FIFO"), ("binary", "byte 0 is not")])
def test_a_latency_profile_that_is_no_text_file_exits_before_any_work(compose_cfg, files, no_hang, name, message):
    cfg = compose_cfg(
        "system=beam", "workload=poisson", "tp=1", "pp=1", "model=tiny-llama", f"system.latency_profile={files / name}"
    )
    with pytest.raises(ConfigError, match=f"system.latency_profile=.* is not allowed: .*{message}"):
        validate_config(cfg)


@pytest.mark.parametrize("name,message", [("fifo", "this is a FIFO"), ("binary", "byte 0 is not")])
def test_a_problem_set_that_is_no_text_file_exits_before_any_work(compose_cfg, files, no_hang, name, message):
    over = ("system=fasttts", "model=tiny-qwen2", "verifier=tiny-prm", "workload=aime24", "n=8")
    cfg = compose_cfg(*over, f"workload.path={files / name}")
    with pytest.raises(ConfigError, match=f"workload.path=.* is not allowed: .*{message}"):
        validate_config(cfg)


@pytest.mark.parametrize("name,message", [("fifo", "a regular file"), ("binary", "not a UTF-8 text file")])
def test_a_trace_that_is_no_text_file_exits_before_any_work(compose_cfg, files, no_hang, name, message):
    cfg = compose_cfg("system=vanilla", "workload=azure_conv", "tp=1", "pp=1", f"workload.path={files / name}")
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg)


def test_a_replayed_tree_that_is_a_fifo_exits_before_any_work(compose_cfg, files, no_hang):
    cfg = compose_cfg("system=lbs", "backend=sim", f"system.replay_tree={files / 'fifo'}")
    with pytest.raises(ConfigError, match="system.replay_tree=.* is not allowed: .*this is a FIFO"):
        validate_config(cfg)
