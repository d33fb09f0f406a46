"""Issue 18: the FastTTS simulator's speed-ups change no result, import nothing GPU- or torch-related,
and touch no config on the per-iteration path.

The records' summaries were stored with the code before the speed-ups (``python -m tests.verifier_search.summaries``),
their tables' digests with the code before the second round of them (commit 4aa0cb0, ``--tables``):
the main command and a cross-section of ``fasttts_ablation`` (3 problems) must reproduce both exactly.
``TTC_SAME_RESULTS=all`` compares every job of the experiment (113 jobs, minutes).

The iterations digests of 8 jobs were retaken once after a correctness change, not a speed-up: an
iteration without a verifier call recorded ver_cpu_s = 0.0 on the simulator, which measures no CPU
time (now null). Every summary is as before, and each new table is the old one but for that column
on those rows (checked before the retake: the old digest rebuilt from the new table).

All summaries and digests were retaken (2026-12-05, one pass of ``python -m tests.verifier_search.summaries``'s
jobs) when the defaults began to follow the paper's artifact (issue 38: no verifier prefix cache for
ALL/STEP-pooling PRMs, the artifact's verifier input truncation, completion stamped before the
completing iteration's verifier call, M keeping max_num_seqs=256 on both engines) and
``goodput_tok_s`` became ``precise_goodput_tok_s``. Before the retake, with the old behaviour forced
(``system.verifier_prefix_cache=true verifier.input_truncation=none verifier.system_prompt=false
system.completion_stamp=after_verifier system.m_batch_caps=roofline``), the jobs checked reproduced
the stored summaries and digests exactly but for the key's name."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import marked_full_data
from tests.verifier_search.summaries import FULL_DATA, ROOT, STORED, STORED_TABLES, jobs, summary

STORED_SUMMARIES = json.loads(STORED.read_text())
STORED_DIGESTS = json.loads(STORED_TABLES.read_text())
# every system and model pair (the 7B+7B pair: oom) at n = 8 and 64; n = 512 jobs take ~10 s each
QUICK = ["main"] + [name for name in jobs() if name != "main" and (" n=8 " in name or " n=64 " in name)]
JOBS = list(jobs()) if os.environ.get("TTC_SAME_RESULTS") == "all" else QUICK


@pytest.mark.parametrize("name", marked_full_data(JOBS, FULL_DATA))
def test_summary_as_before_the_speedups(name):
    """Mutations caught (each changed the main command's summary): a block hash extended from a
    parent whose tokens differ (no comparison), the synthetic PRM's hash continued past a different
    prefix, the running context total not reduced when a sequence ends. Caught by the tables' digests
    only (not in the summary): the survivors' content keys recorded as their roots' keys."""
    tables: dict = {}
    assert summary(jobs()[name], tables) == STORED_SUMMARIES[name]
    assert tables == STORED_DIGESTS[name]


HEAVY = ("torch", "vllm", "transformers", "triton", "pandas")


def test_a_simulated_run_imports_nothing_gpu_or_torch_related(tmp_path):
    """``python run.py`` for a simulated FastTTS run, in a fresh process: no torch, vLLM,
    transformers, triton or pandas module is loaded by the end (NVML is the harness's: it reads the
    GPU inventory of every run; pandas cost ~0.6 s of start-up: the tables are row dicts). Mutations
    caught: importing vllm at the top of ``systems/verifier_search/vllm_engine.py`` (which the simulated run imports
    for its TokenMap); pandas imported by ``systems/verifier_search/metrics.py``; a str column left to pyarrow's
    inference (``harness.records._arrow_array``), which imports pandas."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['run.py', 'system=fasttts', 'backend=sim', 'n=8', 'workload.num_problems=1', 'tracking=none',\n"
        f"            'progress=false', 'results_dir={tmp_path}']\n"
        "try:\n"
        "    runpy.run_path('run.py', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_per_iteration_replanning_reads_no_config(compose_cfg, monkeypatch):
    """With ``system.replan=per_iteration`` and the offload extension (chosen here: 256 long paths
    in 300 MiB of KV on an RTX 4070 Ti) the hook and the search run with every config read raising:
    they read plain values only (issue 18: an OmegaConf access cost 1.5 ms per iteration).
    Mutation caught: reading ``cfg.hardware.h2d_bw`` inside the hook."""
    from omegaconf import DictConfig

    from harness.backend import Backend
    from systems.verifier_search import runner
    from systems.verifier_search.beams import Beam
    from systems.verifier_search.search import Search

    cfg = compose_cfg(
        "system=fasttts",
        "backend=sim",
        "system.replan=per_iteration",
        "system.offload=true",
        "hardware=rtx4070ti",
        "kv_budget=300MiB",
        "n=256",
        "workload.num_problems=1",
        "workload.num_iterations=2",
    )
    bw = float(cfg.hardware.h2d_bw)
    b = runner.build(cfg, Backend("sim", "sim", True, "test"), None)
    p = b.problems[0]

    def no_config(self, key):
        raise AssertionError(f"config read on the per-iteration path: {key}")

    monkeypatch.setattr(DictConfig, "__getattr__", no_config)
    monkeypatch.setattr(DictConfig, "__getitem__", no_config)
    b.hook(5, [Beam(str(i), tokens=[1000] * 1000) for i in range(256)], len(b.prompts[p.index]))
    assert b.gen.offload_bw == bw and b.ver.offload_bw == bw  # the offload plan was applied
    res = Search(b.settings, b.gen, b.ver, before_iteration=b.hook).run_problem(p.index, b.prompts[p.index])
    assert len(res.iterations) == 2


def test_a_simulated_search_runs_without_the_cyclic_collector(compose_cfg, monkeypatch, tmp_path):
    """The simulated search, and the summaries and tables built from its results, run with Python's
    cyclic GC paused (15-20 % of the search's CPU, 2-8x the tables', was collector passes over the
    live tree) and the collector is on again afterwards, also when the run fails. Mutations caught:
    the collector not paused; on again before the tables; not re-enabled after the run (or after a
    failure)."""
    import gc

    from harness.run import run
    from systems.verifier_search import metrics
    from systems.verifier_search.search import Search

    seen, seen_tables = [], []
    real, real_tables = Search.run_problem, metrics.tables

    def spy(self, *a, **k):
        seen.append(gc.isenabled())
        return real(self, *a, **k)

    def spy_tables(*a, **k):
        seen_tables.append(gc.isenabled())
        return real_tables(*a, **k)

    monkeypatch.setattr(Search, "run_problem", spy)
    monkeypatch.setattr(metrics, "tables", spy_tables)
    assert gc.isenabled()
    try:
        rec = run(compose_cfg("system=fasttts", "backend=sim", "n=8", "workload.num_problems=2"))
        assert rec["status"] == "ok" and seen == [False, False] and seen_tables == [False] and gc.isenabled()

        def boom(self, *a, **k):
            raise RuntimeError("search failed")

        monkeypatch.setattr(Search, "run_problem", boom)
        assert (
            run(
                compose_cfg(
                    "system=fasttts", "backend=sim", "n=8", "workload.num_problems=1", output_dir=tmp_path / "failed"
                )
            )["status"]
            == "error"
        )
        assert gc.isenabled()
    finally:
        gc.enable()  # the rest of the session keeps its collector whatever failed


def test_a_run_leaves_no_temporary_folder(compose_cfg, monkeypatch, tmp_path):
    """A simulated run creates no temporary folder; a real-backend run removes its engines' config
    folder also when the run fails (here: the engines fail to start, after the folder was made).
    /tmp held 3,290 ``tts_models_*`` folders before. Mutations caught: ``mkdtemp`` kept for the
    simulated backend; the folder not removed when ``build`` raises."""
    import tempfile

    from harness.backend import Backend
    from harness.run import run
    from systems.verifier_search import runner

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert run(compose_cfg("system=fasttts", "backend=sim", "n=4", "workload.num_problems=1"))["status"] == "ok"
    assert list(tmp.iterdir()) == []
    seen = []

    def engines_fail(cfg, backend, workdir):
        assert workdir.is_dir() and workdir.parent == tmp
        (workdir / "config.json").write_text("{}")
        seen.append(workdir)
        raise RuntimeError("engine failed to start")

    monkeypatch.setattr(runner, "build", engines_fail)
    ctx = type("Ctx", (), {"backend": Backend("vllm", "cpu", False, "test")})()
    with pytest.raises(RuntimeError, match="engine failed"):
        runner.run(compose_cfg("system=fasttts", "backend=sim"), ctx)
    assert seen and list(tmp.iterdir()) == []
