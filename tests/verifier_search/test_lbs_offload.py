"""FastTTS search with the LBS family's scheduling when the generator's KV overflows
(``system.kv_overflow=lbs``, ``systems/verifier_search/lbs_overflow.py``) and the ``fasttts_offload`` study."""

import pytest

from harness.backend import Backend
from harness.errors import ConfigError, RunOOM
from systems.verifier_search import runner
from systems.verifier_search.lbs_overflow import plan_groups, prefix_order
from systems.verifier_search.search import Search

SIM = Backend("sim", "sim", True, "test")
# tiny models, 32 paths; the generator's share holds one 4096-token sequence (the floor) and little
# more at 40 MiB, everything at 1 GiB
TINY = ["model=tiny-qwen2", "verifier=tiny-prm", "n=32", "workload.num_problems=1", "workload.num_iterations=6"]
# searches without S: S speculates while a step's stragglers run, so what it speculates depends on
# which requests run together (vLLM's overflow changes it too); its paths cannot be schedule-free
SYSTEMS_WITHOUT_S = ["vllm_tts", "fasttts_pm"]
OVERFLOWING = {"vllm_tts": "40MiB", "fasttts_pm": "36MiB"}  # M gives the generator most of it


def _search(compose_cfg, system, *extra):
    """(problem results, generator) of the first problem."""
    b = runner.build(compose_cfg(f"system={system}", *TINY, *extra), SIM, None)
    p = b.problems[0]
    return Search(b.settings, b.gen, b.ver).run_problem(p.index, b.prompts[p.index]), b.gen


def _decisions(res):
    """Everything the search decided: per iteration the survivors (uids, content keys), per completed
    path its tokens, steps, scores and finish."""
    its = [(r.iteration, r.active, r.selected, r.selected_keys, r.new_tokens, r.completed) for r in res.iterations]
    paths = sorted((b.uid, tuple(b.tokens), tuple(b.step_ends), tuple(b.scores), b.finish) for b in res.completions)
    return its, paths


@pytest.fixture(scope="module")
def in_memory(tmp_path_factory):
    """system -> the decisions of its in-memory run (1 GiB, vLLM's scheduler)."""
    from hydra import compose, initialize_config_dir

    from tests.conftest import ROOT

    out = {}
    for system in SYSTEMS_WITHOUT_S:
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose(
                "config",
                overrides=[
                    f"output_dir={tmp_path_factory.mktemp('mem')}",
                    "tracking=none",
                    "progress=false",
                    f"system={system}",
                    *TINY,
                    "kv_budget=1GiB",
                ],
            )
        b = runner.build(cfg, SIM, None)
        p = b.problems[0]
        out[system] = _decisions(Search(b.settings, b.gen, b.ver).run_problem(p.index, b.prompts[p.index]))
    return out


@pytest.mark.parametrize("system", SYSTEMS_WITHOUT_S)
def test_lbs_under_an_overflowing_budget_searches_as_in_memory(compose_cfg, in_memory, system):
    """The same survivors, paths, tokens, steps, scores and finishes with LBS scheduling in 36-40 MiB
    (the steps ran in several groups, KV moved both ways) as with everything in memory (1 GiB,
    vLLM's scheduler), for the baseline and for FastTTS's P + M. Mutations caught: the executor
    dropping a group's last request (KeyError in the search: a request without output), running only
    every other group (the same), reversing the groups' outputs' tokens (different paths), a plan
    whose groups repeat one request and lose another (the same KeyError)."""
    res, gen = _search(compose_cfg, system, f"kv_budget={OVERFLOWING[system]}", "system.kv_overflow=lbs")
    assert _decisions(res) == in_memory[system]
    s = gen.stats()
    assert s["lbs_grouped_calls"] >= 2 and s["lbs_groups_per_call"] > 1
    assert s["lbs_h2d_bytes"] > 0 and s["lbs_d2h_bytes"] > 0


def test_lbs_where_everything_fits_is_one_group_and_loads_nothing(compose_cfg, in_memory):
    """At 1 GiB every call is one group (LBS keeps everything resident): nothing is loaded, and the
    search is the in-memory one. Mutations caught: capacity from the budget in blocks instead of bytes
    (several groups at 1 GiB), loading blocks the host does not hold (the prompt, at the first call)."""
    res, gen = _search(compose_cfg, "vllm_tts", "kv_budget=1GiB", "system.kv_overflow=lbs")
    assert _decisions(res) == in_memory["vllm_tts"]
    s = gen.stats()
    assert s["lbs_groups_per_call"] == 1 and s["lbs_grouped_calls"] == 0 and s["lbs_h2d_bytes"] == 0


def test_groups_follow_shared_prefixes_and_balance():
    """Requests sharing a prefix are adjacent (DFS order of their block hashes); balanced sizes from
    Alg.1's capacity with a shared block counted once. Mutations caught: ordering by list index
    (groups [0, 1], [2, 3] mix prefixes), unbalanced sizes ([3, 1] instead of [2, 2]), counting a
    shared block once per request (capacity 1), a plan repeating one request and losing another."""
    hs = [[1, 10], [2, 20], [1, 11], [2, 21]]  # requests 0 and 2 share block 1, 1 and 3 block 2
    assert prefix_order(hs) == [0, 2, 1, 3]
    cap, groups = plan_groups(hs, [4, 4, 4, 4], budget_bytes=24, kv_token_bytes=1.0, block=4)
    # distinct blocks: 1, 2, 10, 11, 20, 21 = 24 tokens; + 16 reserved = 40 / 4 = 10 B per request
    assert cap == 2 and groups == [[0, 2], [1, 3]]
    cap, groups = plan_groups(hs, [4, 4, 4, 4], budget_bytes=33, kv_token_bytes=1.0, block=4)
    assert cap == 3 and groups == [[0, 2], [1, 3]]  # balanced: 2 + 2, not 3 + 1
    with pytest.raises(RunOOM, match="exceeds the generator's KV share"):
        plan_groups(hs, [4, 4, 4, 4], budget_bytes=5, kv_token_bytes=1.0, block=4)


def test_bad_kv_overflow_is_a_config_error(compose_cfg):
    """A value outside recompute | lbs, and lbs on a real engine, stop before any work."""
    with pytest.raises(ConfigError, match="system.kv_overflow.*recompute, lbs"):
        runner.validate(compose_cfg("system=fasttts", "system.kv_overflow=swap"))
    with pytest.raises(ConfigError, match="system.kv_overflow.*simulated backend only"):
        runner.validate_backend(compose_cfg("system=fasttts_lbs"), Backend("vllm", "cpu", False, "test"))


def test_the_offload_extension_on_a_real_engine_is_noted_not_refused(compose_cfg):
    """``system.offload=true`` on vLLM ran with the §4.3.2 extension silently off (QA); refusing it stopped
    every real job of fasttts_gpus, which opens the option to all jobs. It runs, noted (message, warning,
    ``offload_available=false``; tests/verifier_search/test_vllm.py runs one). Mutations caught: the note on the
    simulated backend; the note without system.memory."""
    vllm = Backend("vllm", "cpu", False, "test")
    tiny = ("model=tiny-qwen2", "verifier=tiny-prm")
    cfg = compose_cfg("system=fasttts_offload", "system.offload_mode=swap", *tiny)
    runner.validate_backend(cfg, vllm)
    assert runner.offload_unavailable(cfg, vllm).startswith(
        "system.offload=true: the §4.3.2 offload extension runs on the simulated backend only; on backend=vllm"
    )
    assert runner.offload_unavailable(compose_cfg("system=fasttts_offload", *tiny), vllm).startswith(
        "system.offload=true: the artifact's vLLM sleep mode (offload_mode=sleep) runs on the simulated backend only"
    )
    assert runner.offload_unavailable(cfg, Backend("sim", "sim", True, "test")) == ""
    assert runner.offload_unavailable(compose_cfg("system=vllm_tts", "system.offload=true", *tiny), vllm) == ""


def test_offload_extension_is_charged_with_a_per_run_plan(compose_cfg):
    """When M's per-run plan chooses the offload extension, both engines swap their KV around every
    call (before, only the per-iteration plan set the swap bandwidth: offload was free). Mutation
    caught: dropping the configure call in runner.build."""
    cfg = compose_cfg(
        "system=fasttts_offload",
        "system.offload_mode=swap",
        "hardware=rtx4070ti",
        "kv_budget=300MiB",
        "n=256",
        "workload.num_problems=1",
    )
    b = runner.build(cfg, SIM, None)
    assert b.alloc.offload
    assert b.gen.offload_bw == b.ver.offload_bw == float(cfg.hardware.h2d_bw)


def test_study_is_not_a_paper_experiment_and_reports(compose_cfg, tmp_path):
    """``fasttts_offload`` composes, is left out of harness.reproduce's paper experiments, and its
    report writes the table (rows in system order, ratios to vllm_tts) and the figure from a sweep's
    records (n=8, one problem, every system of the study, tiny models)."""
    from harness.report import gather_runs
    from harness.reproduce import paper_experiments
    from harness.run import run
    from systems.verifier_search.offload_report import SYSTEMS, report_offload

    assert "fasttts_offload" not in paper_experiments()
    from harness.run import validate

    cfg = compose_cfg("experiment=fasttts_offload")
    assert cfg.report == "systems.verifier_search.offload_report.report_offload" and cfg.workload.num_problems == 2
    validate(cfg)
    sweep = tmp_path / "sweep"
    for system in SYSTEMS:
        rec = run(
            compose_cfg(
                f"system={system}",
                "model=tiny-qwen2",
                "verifier=tiny-prm",
                "backend=sim",
                "n=8",
                "kv_budget=40MiB",
                "workload.num_problems=1",
                "workload.num_iterations=3",
                output_dir=sweep / system,
            )
        )
        assert rec["status"] == "ok", rec["message"]
    t = report_offload(sweep, gather_runs(sweep), None).set_index("system")
    assert list(t.index) == SYSTEMS and (t["values"] == "simulated").all()
    assert t.loc["vllm_tts", "goodput / vllm_tts (x)"] == 1 and t.loc["fasttts_lbs", "goodput / vllm_tts (x)"] > 0
    assert t.loc["fasttts_lbs", "LBS groups per generator call"] >= 1
    assert t.loc["vllm_tts_lbs", "verifier (s)"] == t.loc["vllm_tts", "verifier (s)"]  # the same search
    md = (sweep / "fasttts_offload.md").read_text()
    assert "(simulated)" in md.splitlines()[0] and "no verdicts" in md
    assert (sweep / "fasttts_offload.png").exists() and not (sweep / "verdicts.csv").exists()


def test_group_time_hides_copies_behind_compute():
    """``systems.common.groups.group_time`` (the LBS simulator's rule, shared with kv_overflow=lbs): the
    load is waited for, prefetch and write-back show only beyond the compute. Mutations caught:
    dropping the write-back term (the LBS golden summaries do not see it: their write-backs hide)."""
    from systems.common.groups import group_time

    assert group_time(1.0, 2.0, 3.0, 5.0) == 1.0 + 2.0 + 1.0 + 3.0
    assert group_time(0.5, 2.0, 1.0, 1.5) == 2.5


class _FixedEngine:
    """A stand-in generator engine: block 4 tokens, 1 B of KV per token, every request decodes one
    block of 4 tokens (7s) and every call takes 1 s of compute."""

    block = 4

    def __init__(self, capacity_blocks: int):
        from types import SimpleNamespace

        from systems.verifier_search.sim import BlockCache, PathHashes

        self.m = SimpleNamespace(kv_bytes_per_token=1.0)
        self.cache, self.paths = BlockCache(capacity_blocks, 4), PathHashes(4)

    def extend(self, requests, policy):
        from systems.verifier_search.protocol import GenOutput, GenResult

        out = {}
        for r in requests:
            full = list(r.prompt_ids) + [7] * 4
            self.paths.remember(r.path, full, self.paths.hashes(full, r.path))
            out[r.uid] = GenOutput([7] * 4, "delimiter", 4, 0, len(r.prompt_ids))
        return GenResult(out, 1.0, 4, 0)


def test_loads_prefetch_and_write_backs_are_charged_as_lbs_charges_them():
    """Four requests, two prefixes of 2 blocks each (A: requests 0, 2; B: 1, 3), the host holding
    both, the device empty, capacity 3 requests (7 blocks of 4 B; (4 distinct blocks x 4 + 4 x 4
    reserved) / 4 = 8 B per request) -> groups {0, 2}, {1, 3}; copies at 4 B/s. Group 1 loads A (8 B,
    2 s), computes 1 s while the next group's first request (B, 8 B, 2 s: 1 s beyond the compute) is
    prefetched and its new block (4 B, 1 s) written back: 4 s. Group 2's load was prefetched: 1 s.
    Mutations caught: the prefetched bytes not subtracted from the next load (6 s), prefetching this
    group's blocks instead of the next one's, writing back blocks the host holds (16 B)."""
    from systems.verifier_search.lbs_overflow import LbsOverflowGenerator
    from systems.verifier_search.protocol import GenRequest

    eng = _FixedEngine(capacity_blocks=7)
    gen = LbsOverflowGenerator(eng, h2d_bw=4.0, d2h_bw=4.0, step_mean=4, answer_mean=4)
    A, B = [1] * 8, [2] * 8
    reqs = [GenRequest(f"r{i}", p, max_tokens=4, seed=i, path=f"0/{i}") for i, p in enumerate([A, B, A, B])]
    gen.problem = "0"
    gen.host = set(eng.paths.hashes(A)) | set(eng.paths.hashes(B))
    res = gen.extend(reqs, policy=None)
    assert sorted(res.outputs) == ["r0", "r1", "r2", "r3"]
    assert res.time_s == 5.0
    assert gen.h2d_bytes == 16 and gen.d2h_bytes == 8
    assert gen.stats()["lbs_io_stall_s"] == 3.0 and gen.stats()["lbs_groups_per_call"] == 2
