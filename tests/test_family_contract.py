"""The family contract (harness.family), with the worked example of docs/adding_a_family.md: a toy
family whose ``run`` "decodes" ``beams`` x ``gen_len`` tokens at a fixed simulated rate.

It is registered the way systems/families.py registers the real ones (here by replacing the list
for the test) and runs through the harness as any family does: validated before any work, the
backend resolved from its ``real_engine``, its RunResult recorded (status, summary, tables, the
printed table's rows), its ``RunOOM`` a recorded ``oom``.
"""

import json

import pytest

from harness import family as F
from harness.errors import ConfigError, RunOOM, bad
from harness.family import Family, RunResult

TOKENS_PER_S = 1000.0  # the toy's simulated decode rate


def toy_validate(cfg) -> None:
    if cfg.workload.beams > 1024:
        raise bad("beams", cfg.workload.beams, "at most 1024 for the toy family")


def toy_run(cfg, ctx) -> RunResult:
    tokens = int(cfg.workload.beams) * int(cfg.workload.gen_len)
    if tokens > 100_000:
        raise RunOOM(f"{tokens} tokens do not fit the toy's memory (100,000)")
    steps = [{"step": i, "tokens": int(cfg.workload.beams)} for i in range(int(cfg.workload.gen_len))]
    return RunResult(
        summary={"e2e_s": tokens / TOKENS_PER_S, "tokens": tokens},
        display=[("end-to-end time", "e2e_s", lambda v: f"{v:.3f} s"), ("tokens", "tokens", str)],
        tables={"steps": steps},
    )


TOY = Family(name="toy", validate=toy_validate, run=toy_run, register_configs=lambda cs: None)


@pytest.fixture
def toy_registered(monkeypatch):
    """The toy family in the registry, and ``system=lbs`` pointed at it (a toy of one's own would have
    its conf/system/<name>.yaml with ``family: toy``)."""
    real = F.families()
    monkeypatch.setattr(F, "families", lambda: {**real, "toy": TOY})
    return lambda compose_cfg, *over, **kw: compose_cfg("system=lbs", "system.family=toy", *over, **kw)


def test_a_family_runs_through_the_harness_and_is_recorded(toy_registered, compose_cfg, tmp_path):
    """Mutations caught: the family's summary or tables not recorded; its name not in the record;
    the backend resolved without its real_engine (a real engine for a simulated-only family)."""
    from harness.run import run

    rec = run(toy_registered(compose_cfg, "beams=8", "gen_len=64", output_dir=tmp_path / "toy"))
    assert rec["status"] == "ok" and rec["family"] == "toy" and rec["backend"]["simulated"]
    assert rec["summary"] == {"e2e_s": 8 * 64 / TOKENS_PER_S, "tokens": 512}
    assert rec["headline"] == {"label": "end-to-end time", "key": "e2e_s"}
    import pandas as pd

    steps = pd.read_parquet(tmp_path / "toy" / "steps.parquet")
    assert len(steps) == 64 and steps.tokens.sum() == 512
    assert json.loads((tmp_path / "toy" / "run.json").read_text())["tables"] == ["steps"]


def test_a_familys_checks_run_before_any_work_and_its_oom_is_a_result(toy_registered, compose_cfg, tmp_path):
    from harness.run import run

    with pytest.raises(ConfigError, match=r"beams=2048 is not allowed: at most 1024 for the toy family"):
        run(toy_registered(compose_cfg, "beams=2048", output_dir=tmp_path / "bad"))
    assert not (tmp_path / "bad" / "run.json").exists()
    rec = run(toy_registered(compose_cfg, "beams=1024", "gen_len=128", output_dir=tmp_path / "oom"))
    assert rec["status"] == "oom" and "do not fit the toy's memory" in rec["message"]


def test_a_family_name_that_is_no_family_is_refused_naming_the_families(compose_cfg):
    from harness.run import validate

    with pytest.raises(ConfigError, match=r"names family 'nosuch', which is not a family: one of kv_offload, "):
        validate(compose_cfg("system=lbs", "system.family=nosuch"))


def test_a_records_former_family_name_maps_to_the_current_one():
    """Records written before the families were renamed say ttc / tts / serving."""
    assert [F.current_name(n) for n in ("ttc", "tts", "serving", "kv_offload", "other")] == [
        "kv_offload",
        "verifier_search",
        "energy_serving",
        "kv_offload",
        "other",
    ]


def test_a_record_written_before_the_rename_is_read_with_its_family_as_named_now(tmp_path):
    """A run.json of the LBS family from before the rename (``family: ttc``, ``system.family: ttc``)
    is gathered like any other, its family read as kv_offload. Mutation caught: record_row taking
    the family as written."""
    from harness.report import gather_runs

    old = {
        "status": "ok",
        "system": "lbs",
        "family": "ttc",
        "model": "opt-6.7b",
        "backend": {"simulated": True},
        "config": {"system": {"name": "lbs", "family": "ttc"}},
        "summary": {"e2e_s": 1.5},
    }
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "run.json").write_text(json.dumps(old))
    runs = gather_runs(tmp_path)
    assert list(runs.family) == ["kv_offload"] and list(runs["summary.e2e_s"]) == [1.5]
