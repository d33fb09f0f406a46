"""A sweep's worker (or an isolated job's child) stops as soon as the process that started it is
killed, and writes no record after that (issue 39: orphaned workers outlived a ``kill -9`` of the
driver and could still write a record)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A middle process (the "driver") starts a child (the "worker") and prints its pid; the test kills
# the middle one with SIGKILL. The worker runs CHILD's code.
MIDDLE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
print(child.pid, flush=True)
time.sleep(600)
"""


def _orphan(tmp_path, child_code: str, *args):
    """Start the middle process, wait until the worker says it is ready (a file), kill the middle
    one; return (worker pid, time of the kill, the worker's stderr file)."""
    ready = tmp_path / "ready"
    err = tmp_path / "worker.err"
    mid = subprocess.Popen(
        [sys.executable, "-c", MIDDLE, textwrap.dedent(child_code), str(ready), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=open(err, "w"),
        text=True,
    )
    worker = int(mid.stdout.readline())
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.02)
    assert ready.exists(), err.read_text()
    mid.kill()
    killed = time.time()
    mid.wait()
    return worker, killed, err


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_watched_parents_death_stops_the_worker_at_once(tmp_path):
    """The worker (watch_parent, then a long job) ends within 0.5 s of its parent's SIGKILL, saying
    so (measured here: under 0.01 s, woken by the pidfd). Mutation caught: the watch thread not
    started (the worker runs its 600 s job). The 1 s poll of before fails it about half the time
    (the bound is 0.5 s)."""
    worker, killed, err = _orphan(
        tmp_path,
        """
        import sys, time
        from pathlib import Path
        from harness.process import watch_parent
        watch_parent("the sweep's driver")
        Path(sys.argv[1]).write_text("ready")
        time.sleep(600)
        """,
    )
    while not _ended(worker) and time.time() - killed < 10:
        time.sleep(0.005)
    took = time.time() - killed
    if not _ended(worker):
        os.kill(worker, signal.SIGKILL)
    assert took < 0.5, f"the worker lived {took:.2f} s after its parent was killed"
    assert "the sweep's driver (pid" in err.read_text() and "is gone" in err.read_text()


def test_no_record_is_written_after_the_parent_died(tmp_path):
    """A worker whose job ends after its parent was killed (the watch thread not yet run: here no
    thread, only the parent noted) writes no run.json: write_record exits first. Mutation caught:
    write_record without exit_if_parent_gone (the record written, exit 0)."""
    rec = tmp_path / "run.json"
    worker, killed, err = _orphan(
        tmp_path,
        """
        import os, sys, time
        from pathlib import Path
        import harness.process as hp
        from harness import records
        hp._watched = (os.getppid(), "the sweep's driver")  # as watch_parent notes it, without its thread
        Path(sys.argv[1]).write_text("ready")
        while hp._alive(hp._watched[0]):
            time.sleep(0.01)
        records.write_record(Path(sys.argv[2]), {"status": "ok"})
        sys.exit(0)
        """,
        str(rec),
    )
    deadline = time.time() + 30
    while not _ended(worker) and time.time() < deadline:
        time.sleep(0.01)
    assert _ended(worker)
    assert not rec.exists(), "a record was written after the driver died"
    assert "is gone: process" in err.read_text()
