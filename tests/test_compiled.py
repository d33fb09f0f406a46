"""Compiled twins (systems/compiled.py, setup.py): built and current after the install, never used
when stale, and giving the same results as the pure-Python modules, bit for bit.

The stored-summary tests (tests/*/test_same_results.py) run whatever the runner picks (the twins,
after scripts/install.sh); the tests here run the pure-Python path against the same stored
summaries and digests, so both paths are pinned to the results from before any speed-up."""
import json
import os

import pytest

from systems import compiled
from tests.conftest import marked_full_data
from tests.serving.summaries import FULL_DATA as SERVING_FULL_DATA
from tests.tts.summaries import FULL_DATA as FASTTTS_FULL_DATA

PURE = os.environ.get(compiled.PURE_ENV) == "1"
needs_twins = pytest.mark.skipif(PURE, reason=f"{compiled.PURE_ENV}=1: the pure-Python modules are tested on purpose")


@needs_twins
@pytest.mark.parametrize("module", compiled.MODULES)
def test_every_twin_is_built_from_the_source_on_disk(module):
    """scripts/install.sh (pip install -e .) builds them; after editing a module or its .pxd:
    `.venv/bin/python setup.py build_ext --inplace`. Set TTC_PURE_PYTHON=1 to test without them."""
    assert compiled.status(module) == "compiled", f"{module}: {compiled.status(module)}"


@needs_twins
def test_a_twin_built_from_another_source_is_not_used(monkeypatch, capsys):
    """Mutations caught: the hash not compared (the stale twin ran), the note said every time."""
    module = "systems.serving.simulator"
    real = compiled.file_sha256
    monkeypatch.setattr(compiled, "file_sha256", lambda root, m: "0" * 64 if m == module else real(root, m))
    monkeypatch.setattr(compiled, "_said", set())
    monkeypatch.setattr(compiled, "LOADED", {})                 # what earlier tests in this process ran
    assert compiled.status(module).startswith("built from another version")
    for _ in range(2):
        mod = compiled.twin(module)
        assert mod.__name__ == module and compiled.LOADED[module] == "pure"
    assert capsys.readouterr().err.count("compiled twin is built from another version") == 1
    assert compiled.twin("systems.serving.driver").__name__ == compiled.twin_name("systems.serving.driver")


def test_pure_python_on_request(monkeypatch, capsys):
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    monkeypatch.setattr(compiled, "LOADED", {})
    for module in compiled.MODULES:
        assert compiled.twin(module).__name__ == module and compiled.LOADED[module] == "pure"
    assert capsys.readouterr().err == ""                         # asked for: no note
    with pytest.raises(ValueError, match="has no compiled twin"):
        compiled.twin("systems.serving.metrics")


def test_a_missing_twin_is_said_once_and_a_module_run_both_ways_is_recorded_so(monkeypatch, capsys):
    """Mutations caught: no note when a twin is not built (a failed build went unnoticed), the
    last kind recorded instead of both."""
    module = "systems.serving.simulator"
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    monkeypatch.setattr(compiled, "LOADED", {})
    monkeypatch.setattr(compiled, "_said", set())
    real = compiled.twin_name
    monkeypatch.setattr(compiled, "twin_name", lambda m: "systems.serving._no_such_twin" if m == module else real(m))
    for _ in range(2):
        assert compiled.twin(module).__name__ == module
    err = capsys.readouterr().err
    assert err.count("compiled twin is not built") == 1 and "setup.py build_ext --inplace" in err
    assert compiled.LOADED[module] == "pure"
    monkeypatch.setattr(compiled, "twin_name", real)
    compiled.twin("systems.serving.driver", compiled=False)
    assert compiled.LOADED["systems.serving.driver"] == "pure"
    if compiled.status("systems.serving.driver") == "compiled":
        compiled.twin("systems.serving.driver")
        assert compiled.LOADED["systems.serving.driver"] == "compiled and pure"


def test_the_hash_covers_the_source_and_its_pxd(tmp_path):
    """An edit of either file makes a built twin stale."""
    src = tmp_path / "systems" / "serving"
    src.mkdir(parents=True)
    (src / "simulator.py").write_text("x = 1\n")
    (src / "simulator.pxd").write_text("cdef int y\n")
    h0 = compiled.file_sha256(tmp_path, "systems.serving.simulator")
    (src / "simulator.pxd").write_text("cdef long y\n")
    h1 = compiled.file_sha256(tmp_path, "systems.serving.simulator")
    (src / "simulator.py").write_text("x = 2\n")
    assert len({h0, h1, compiled.file_sha256(tmp_path, "systems.serving.simulator")}) == 3


# the jobs of tests/serving/test_same_results.py that reach most of the serving simulator: BEAM's
# knob changes (chunk, m, clock), Window-DVFS's ticks, KV preemption
SERVING_JOBS = ["main", "beam_fig8 system=window_dvfs workload=burst", "kv preemption"]


@pytest.mark.parametrize("name", marked_full_data(SERVING_JOBS, SERVING_FULL_DATA))
def test_the_pure_python_serving_simulator_gives_the_stored_results(name, monkeypatch):
    """The same stored summaries and table digests as tests/serving/test_same_results.py, with the
    pure-Python modules (that test runs the twins). Mutations caught (with the twin built):
    ``e_it`` typed float in simulator.pxd (test_same_results)."""
    from tests.serving.summaries import STORED, jobs, summary
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    want = json.loads(STORED.read_text())[name]
    got = summary(jobs()[name])
    assert got["summary"] == want["summary"] and got["tables"] == want["tables"]


def test_the_record_says_which_modules_ran_compiled(compose_cfg, tmp_path, monkeypatch):
    from harness.run import run
    rec = run(compose_cfg("system=beam", "workload=ablation", "workload.duration_s=5", output_dir=tmp_path / "a"))
    kind = "pure" if PURE else "compiled"
    assert {m: rec["compiled"][m] for m in compiled.MODULES if m.startswith("systems.serving.")} == \
        {m: kind for m in compiled.MODULES if m.startswith("systems.serving.")}
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    rec = run(compose_cfg("system=beam", "workload=ablation", "workload.duration_s=5", output_dir=tmp_path / "b"))
    assert rec["compiled"]["systems.serving.simulator"] == "pure"


# FastTTS jobs of tests/tts/test_same_results.py, pure Python: the main command (S, P and the memory
# plan) and a Math-Shepherd job (its step tags inserted by the token map)
FASTTTS_JOBS = ["main", "system=vllm_tts n=64 model=qwen2.5-math-1.5b verifier=math-shepherd-7b workload=aime24"]


@pytest.mark.parametrize("name", marked_full_data(FASTTTS_JOBS, FASTTTS_FULL_DATA))
def test_the_pure_python_fasttts_simulator_gives_the_stored_results(name, monkeypatch):
    """The same stored summaries and table digests as tests/tts/test_same_results.py, with the
    pure-Python modules (that test runs the twin). Mutations caught (with the twin built, by
    test_same_results): extend's ``t`` typed float and verify's ``hit`` unsigned char in sim.pxd
    (TTC_SAME_RESULTS=all also: ``_Seq.order`` unsigned char)."""
    from tests.tts.summaries import STORED, STORED_TABLES, jobs, summary
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    tables: dict = {}
    assert summary(jobs()[name], tables) == json.loads(STORED.read_text())[name]
    assert tables == json.loads(STORED_TABLES.read_text())[name]
