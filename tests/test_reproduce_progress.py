"""harness.reproduce's progress: before each command ``[k/N] experiment NAME (elapsed X, ~Y left)``,
the estimate from the seconds per job so far (per family once one of its experiments ran), the
first one "estimate unknown"; ``--quick`` runs one small experiment per family into its own folder
and its page says it is not the reproduction. The runner is faked: no experiment runs."""

import pytest

from harness import reproduce as R

JOBS = {"beam_a": 2, "beam_b": 4, "lbs_c": 3, "lbs_d": 1}
SECONDS = {"beam_a": 10.0, "beam_b": 8.0, "lbs_c": 30.0, "lbs_d": 5.0, "systems.x.fidelity": 100.0}


@pytest.fixture
def fake(monkeypatch):
    """A fake clock, and a runner that advances it by each command's SECONDS; returns the commands run."""
    now = [1000.0]
    ran = []

    def run(cmd, log, timeout_s):
        what = next((c.split("=", 1)[1] for c in cmd if c.startswith("experiment=")), cmd[2])
        ran.append(what)
        now[0] += SECONDS[what]
        return {"rc": 0, "wall_s": SECONDS[what], "log": str(log)}

    monkeypatch.setattr(R, "_clock", lambda: now[0])
    monkeypatch.setattr(R, "_run", run)
    monkeypatch.setattr(R, "job_count", lambda name, extra=(): JOBS.get(name))
    return ran


def test_progress_lines_and_estimates(fake, tmp_path, capsys):
    """beam_a: 10 s for 2 jobs (5 s/job) -> 8 jobs left ~40 s; then beam 18 s / 6 jobs -> 4 left ~12 s;
    then lbs_c's own 10 s/job (not all families' 48 s / 9 jobs) -> 1 left ~10 s; a real-engine study
    (no job count) is not estimated and said so. Mutations caught: elapsed from each command's own
    start (0s on every line); the family's rate replaced by the overall one (~5s on line 4); the current
    command left out of "left" (~30s on line 2)."""
    runs = R.run_all(list(JOBS), tmp_path, ["systems.x.fidelity"], [], 60)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[") and "/5]" in ln]
    assert lines == [
        "[1/5] experiment beam_a (elapsed 0s, estimate unknown)",
        "[2/5] experiment beam_b (elapsed 10s, ~40s left + 1 not estimated)",
        "[3/5] experiment lbs_c (elapsed 18s, ~12s left + 1 not estimated)",
        "[4/5] experiment lbs_d (elapsed 48s, ~10s left + 1 not estimated)",
        "[5/5] python -m systems.x.fidelity (elapsed 53s, estimate unknown)",
    ]
    assert fake == [*JOBS, "systems.x.fidelity"]
    assert list(runs["rc"]) == [0] * 5


def test_estimate_formats_minutes_and_hours():
    """Mutation caught: seconds shown as minutes below 90 s (0m)."""
    done = [("lbs", 10, 60.0)]  # 6 s a job
    assert R.estimate_left([("lbs", 10)], done) == "~60s left"
    assert R.estimate_left([("lbs", 100)], done) == "~10m left"
    assert R.estimate_left([("beam", 1000)], done) == "~1h40m left"  # no beam yet: every family's rate
    assert R.estimate_left([("lbs", 1)], []) == "estimate unknown"


def test_job_count_reads_the_experiment_and_its_overrides():
    """lbs_fig9 sweeps 3 models x 5 systems x 5 beams x 3 steps; beams=4 makes it 45 (the command
    line replaces the file's sweep, as the sweeper does). Mutation caught: extra overrides ignored."""
    assert R.job_count("lbs_fig9") == 225
    assert R.job_count("lbs_fig9", ["tracking=none", "beams=4"]) == 45
    assert R.job_count("beam_fig1", ["seed=0,1"]) == 2
    assert R.job_count("no_such_experiment") is None


def test_quick_runs_one_experiment_per_family_into_its_own_folder(fake, tmp_path, monkeypatch, capsys):
    """--quick: lbs_fig4, fasttts_memory, beam_fig9 only, into <results>/quick, the page saying it is
    not the reproduction; --quick with --only exits 2. Mutation caught: --quick writing into the
    results folder itself (a full reproduction's REPRODUCTION.md replaced by the quick one)."""
    SECONDS.update({n: 1.0 for n in R.QUICK})
    monkeypatch.setenv("TTC_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(R, "check_overrides", lambda *a, **k: None)
    assert R.main(["--quick"]) == 0
    assert fake == R.QUICK and {n.split("_")[0] for n in R.QUICK} == {"lbs", "fasttts", "beam"}
    out = capsys.readouterr().out
    assert "[reproduce] --quick: 3 small simulated experiments, one per family" in out
    assert "[3/3] experiment beam_fig9" in out
    page = (tmp_path / "quick" / "REPRODUCTION.md").read_text()
    assert "Quick check (`--quick`)" in page and "Not the reproduction" in page
    assert not (tmp_path / "REPRODUCTION.md").exists()
    assert R.main(["--quick", "--only", "lbs_fig9"]) == 2
    assert "error: --quick runs its own experiments" in capsys.readouterr().err
