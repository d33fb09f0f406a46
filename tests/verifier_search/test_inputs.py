"""Bad inputs give a clear ConfigError before any work; the math workloads read the data folder."""

import json

import pytest

from harness.errors import ConfigError
from harness.run import validate
from workloads.math import load_problems, stand_in_tokens

REAL = ["system=vllm_tts", "backend=vllm", "model=tiny-qwen2", "verifier=tiny-prm", "workload=aime24"]


@pytest.mark.full_data("math/")
@pytest.mark.parametrize("name,count", [("aime24", 30), ("amc23", 40), ("math500", 500)])
def test_problem_sets_load(full_data, name, count):
    probs = load_problems(full_data / "math" / name / "test.jsonl")
    assert len(probs) == count
    assert all(p.text and p.answer for p in probs)


@pytest.mark.parametrize("name", ["aime24", "amc23", "math500"])
def test_the_fixture_slices_load_as_the_sets_first_problems(name):
    """tests/fixture_data holds each set's first 5 problems, read as the full file's are."""
    from tests.conftest import FIXTURE_DATA

    probs = load_problems(FIXTURE_DATA / "math" / name / "test.jsonl")
    assert len(probs) == 5 and all(p.text and p.answer for p in probs)


def test_default_config_reads_the_data_folder(compose_cfg, monkeypatch, tmp_path):
    """The workload's relative path resolves under TTC_DATA_DIR. Mutation caught: the path taken
    relative to the current directory (validate then finds no file)."""
    cfg = compose_cfg("system=fasttts")
    assert cfg.workload.name == "aime24" and cfg.model.name == "qwen2.5-math-1.5b"
    assert cfg.verifier.name == "skywork-prm-1.5b" and cfg.workload.n == 64
    validate(cfg)  # the fixture slice, through TTC_DATA_DIR
    monkeypatch.setenv("TTC_DATA_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match=f"{tmp_path}/math/aime24/test.jsonl"):
        validate(cfg)


def test_n_not_multiple_of_beam_width(compose_cfg):
    with pytest.raises(ConfigError, match=r"n=10 .*multiple of the beam width \(4\)"):
        validate(compose_cfg("system=fasttts", "n=10"))


def test_unknown_dataset_file(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match="no such dataset file"):
        validate(compose_cfg("system=fasttts", f"workload.path={tmp_path}/missing.jsonl"))


def test_malformed_jsonl_names_the_line(compose_cfg, tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": "4"}\n{"problem": oops}\n')
    with pytest.raises(ConfigError, match="line 3 is not valid JSON"):
        validate(compose_cfg("system=fasttts", f"workload.path={p}"))
    p.write_text('{"problem": "1+1?", "answer": "2"}\n{"question_text": "x"}\n')
    with pytest.raises(ConfigError, match="line 2 lacks"):
        load_problems(p)
    # QA: an empty problem or a null answer was accepted (graded against the string "None");
    # a folder read "no such dataset file". Mutations caught: either check left out
    for line in ('{"problem": "", "answer": "2"}', '{"problem": "1+1?", "answer": null}'):
        p.write_text('{"problem": "1+1?", "answer": "2"}\n' + line + "\n")
        with pytest.raises(ConfigError, match="line 2 has an empty 'problem' or a null/empty 'answer'"):
            load_problems(p)
    with pytest.raises(
        ConfigError, match=r"is not allowed: a folder, not a dataset file \(its .jsonl files: bad.jsonl;"
    ):
        validate(compose_cfg("system=fasttts", f"workload.path={tmp_path}"))


def test_step_tag_outside_verifier_vocab(compose_cfg):
    with pytest.raises(ConfigError, match=r"verifier.step_tag_id=200000 .*\[0, 151936\)"):
        validate(compose_cfg(*REAL, "n=8", "verifier.step_tag_id=200000"))


def test_token_spaces_not_matching_step_tag(compose_cfg):
    # math-shepherd (Mistral tokenizer) told to use the Qwen generator's delimiter id as its tag
    with pytest.raises(ConfigError, match="different token spaces"):
        validate(compose_cfg("system=fasttts", "verifier=math-shepherd-7b", "verifier.step_tag_id=271"))
    # its own inserted tag is fine
    validate(compose_cfg("system=fasttts", "verifier=math-shepherd-7b", "backend=sim"))


def test_kv_memory_too_small_is_a_recorded_oom_not_bad_input(compose_cfg, tmp_path):
    """A plan that does not fit the device passes validation (a sweep goes on) and the run is
    recorded as oom naming the engine short of memory; a kv_budget no configuration accepts stays
    bad input. Mutation caught: check_fits raising ConfigError again (the issue-14 sweep abort)."""
    from harness.run import run

    validate(compose_cfg(*REAL, "n=8", "kv_budget=4MiB"))
    # fixed split, M (150 MiB: M's search fits one verifier + one generator sequence at its planned
    # length, ~2400 tokens with the step prior, but not one max_model_len sequence per engine)
    for extra in (["system=vllm_tts", "kv_budget=4MiB"], ["system=fasttts", "kv_budget=150MiB"]):
        rec = run(
            compose_cfg(
                *extra, "backend=sim", "n=8", "workload.num_problems=1", output_dir=tmp_path / extra[0].split("=")[1]
            )
        )
        assert rec["status"] == "oom", rec["message"]
        assert "KV memory too small on rtx4090" in rec["message"] and "generator" in rec["message"]
    for bad_budget in ("0", "lots"):
        with pytest.raises(ConfigError, match="kv_budget"):
            validate(compose_cfg("system=fasttts", f"kv_budget={bad_budget}"))


@pytest.mark.parametrize("key", ["step_tokens_mean", "steps_per_answer_mean", "cpu_step_tokens_mean"])
def test_step_model_means_above_one(compose_cfg, key):
    with pytest.raises(ConfigError, match=rf"workload.{key}=1.0 is not allowed: > 1"):
        validate(compose_cfg("system=fasttts", f"workload.{key}=1.0"))


def test_real_backend_rejects_non_qwen2_prm(compose_cfg):
    with pytest.raises(ConfigError, match="backend=sim"):
        validate(compose_cfg("system=fasttts", "backend=vllm", "verifier=math-shepherd-7b"))


def test_stand_in_tokens_deterministic_and_in_range():
    a = stand_in_tokens("Find $x$ such that 2x+3=7.", 151936)
    assert a == stand_in_tokens("Find $x$ such that 2x+3=7.", 151936)
    assert all(1000 <= t < 151936 - 1000 for t in a) and 10 <= len(a) <= 30


def _long_set(tmp_path):
    p = tmp_path / "set.jsonl"
    lines = [
        '{"problem": "What is 1+1?", "answer": "2"}',
        '{"problem": "What is 2+2?", "answer": "4"}',
        '{"problem": "'
        + "Compute the sum of the numbers below. "
        + " ".join(str(i) for i in range(3000))
        + '", "answer": "1"}',
        '{"problem": "What is 3+3?", "answer": "6"}',
    ]
    p.write_text("\n".join(lines) + "\n")
    return p


def test_prompt_too_long_stops_before_any_work(compose_cfg, tmp_path):
    """A prompt that leaves no room below max_model_len is found before any work, named by file,
    line and token count (it used to surface mid-run, losing the problems searched before it).
    Mutation caught: dropping the check from ``validate`` (the prompt then fails mid-run)."""
    p = _long_set(tmp_path)
    with pytest.raises(
        ConfigError,
        match=rf"{p}: line 3: the generator prompt \(chat template included\) is "
        r"\d+ tokens, which leaves no room below the engines' max_model_len=4096",
    ):
        validate(compose_cfg("system=fasttts", "backend=sim", f"workload.path={p}", "n=8"))
    with pytest.raises(ConfigError, match="workload.on_too_long='sometimes'"):
        validate(compose_cfg("system=fasttts", f"workload.path={p}", "workload.on_too_long=sometimes"))


def test_prompt_too_long_skipped_and_recorded(compose_cfg, tmp_path):
    import pandas as pd

    from harness.run import run

    p = _long_set(tmp_path)
    rec = run(
        compose_cfg(
            "system=vllm_tts",
            "backend=sim",
            f"workload.path={p}",
            "n=8",
            "workload.on_too_long=skip",
            "workload.num_iterations=2",
            output_dir=tmp_path / "run",
        )
    )
    assert rec["status"] == "ok" and rec["summary"]["problems"] == 3 and rec["summary"]["problems_skipped"] == 1
    sk = pd.read_parquet(tmp_path / "run" / "skipped.parquet")
    assert sk[["problem", "line"]].values.tolist() == [[2, 3]] and (sk["gen_prompt_tokens"] >= 4096).all()


def test_failure_mid_run_is_status_error_and_keeps_earlier_problems(compose_cfg, tmp_path, monkeypatch):
    """A failure in problem 2 ends the run with status error (not ok), naming the problem, and the
    problems searched before it stay recorded. Mutation caught: swallowing the exception into ok."""
    import pandas as pd

    from harness.run import run
    from systems.verifier_search.search import Search

    orig = Search.run_problem

    def flaky(self, pidx, prompt):
        if pidx == 1:
            raise RuntimeError("engine died")
        return orig(self, pidx, prompt)

    monkeypatch.setattr(Search, "run_problem", flaky)
    rec = run(
        compose_cfg(
            "system=vllm_tts",
            "backend=sim",
            "n=8",
            "workload.num_problems=3",
            "workload.num_iterations=2",
            output_dir=tmp_path / "run",
        )
    )
    assert rec["status"] == "error" and "problem 1 (line 2): RuntimeError: engine died" in rec["message"]
    assert rec["summary"]["problems"] == 1
    assert set(pd.read_parquet(tmp_path / "run" / "iterations.parquet")["problem"]) == {0}


def test_an_interrupt_mid_run_is_recorded_as_interrupted_with_earlier_problems(compose_cfg, tmp_path, monkeypatch):
    """SIGINT (KeyboardInterrupt) in problem 2: the record is written with status interrupted and the
    problems searched before it, then RunInterrupted (a KeyboardInterrupt) stops the caller.
    Mutations caught: the runner not catching KeyboardInterrupt (no record: the problems are lost);
    harness.run returning the record instead of raising (a sweep would go on after Ctrl-C)."""
    import pandas as pd

    from harness.errors import RunInterrupted
    from harness.run import run
    from systems.verifier_search.search import Search

    orig = Search.run_problem

    def interrupted(self, pidx, prompt):
        if pidx == 1:
            raise KeyboardInterrupt
        return orig(self, pidx, prompt)

    monkeypatch.setattr(Search, "run_problem", interrupted)
    with pytest.raises(RunInterrupted) as e:
        run(
            compose_cfg(
                "system=vllm_tts",
                "backend=sim",
                "n=8",
                "workload.num_problems=3",
                "workload.num_iterations=2",
                output_dir=tmp_path / "run",
            )
        )
    assert e.value.record == str(tmp_path / "run" / "run.json")
    rec = json.loads((tmp_path / "run" / "run.json").read_text())
    assert rec["status"] == "interrupted" and rec["message"].endswith("interrupted in problem 1 (line 2)")
    assert rec["summary"]["problems"] == 1
    assert set(pd.read_parquet(tmp_path / "run" / "iterations.parquet")["problem"]) == {0}


def test_a_sweep_with_a_plan_that_does_not_fit_runs_to_the_end(tmp_path):
    """``run.py -m`` over a KV budget too small for one sequence and one that fits: exit 0, the first
    job recorded as oom with its reason, the second ok (issue 14: fasttts_gpus stopped with exit 2
    before any work). Mutation caught: check_fits raising ConfigError (the sweep's up-front check
    exits 2 and nothing is recorded)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=vllm_tts",
            "kv_budget=4MiB,3GiB",
            "n=8",
            "workload.num_problems=1",
            "tracking=none",
            "progress=false",
            f"results_dir={tmp_path}",
            "sweep_name=fits",
            "hydra.launcher.n_jobs=1",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, WANDB_MODE="disabled"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    recs = {
        r["config"]["system"]["kv_budget"]: r
        for r in (json.loads(p.read_text()) for p in (tmp_path / "sweeps" / "fits").glob("*/run.json"))
    }
    assert recs["4MiB"]["status"] == "oom" and "KV memory too small" in recs["4MiB"]["message"]
    assert recs["3GiB"]["status"] == "ok"


def test_the_baseline_split_follows_memory_fraction(compose_cfg):
    """The baseline's fixed split is the FastTTS artifact's pair scaled to ``system.memory_fraction``:
    the artifact's own 0.20 / 0.20 at the paper's 40 % on an RTX 4090, 0.45 / 0.45 at fasttts_gpus'
    90 % on a 12 GB RTX 4070 Ti (where 0.20 / 0.20 leaves the generator no room after its weights).
    Mutation caught: the unscaled split (the 4070 Ti baseline recorded as oom)."""
    from harness import model_facts as mf
    from systems.verifier_search.memory_plan import ACTIVATION_RESERVE, MemoryPlan

    for hw, frac, share in (("rtx4090", 0.4, 0.2), ("rtx4070ti", 0.9, 0.45)):
        # the flat reserve (system.kv_accounting=flat) keeps this a test of the split alone
        cfg = compose_cfg(
            "system=vllm_tts", f"hardware={hw}", f"system.memory_fraction={frac}", "system.kv_accounting=flat"
        )
        a = MemoryPlan(cfg, on_cpu=False, real=False).fixed
        mem = share * cfg.hardware.memory_bytes
        assert a.gen_kv_bytes == int(mem - mf.weight_bytes(cfg.model) - ACTIVATION_RESERVE * mem)
        assert a.ver_kv_bytes == int(mem - mf.weight_bytes(cfg.verifier) - ACTIVATION_RESERVE * mem)


def test_num_problems_above_the_sets_size_is_a_cap_and_says_so(compose_cfg, capsys):
    """``workload.num_problems`` larger than the file: every problem is searched (a cap, so one value
    serves a sweep over sets of several sizes) and a warning says how many the file holds. Mutation
    caught: the warning dropped."""
    from harness.run import run

    rec = run(
        compose_cfg(
            "system=vllm_tts",
            "backend=sim",
            "n=4",
            "workload=aime24",
            "workload.num_problems=6",
            "workload.num_iterations=1",
        )
    )
    assert rec["status"] == "ok" and rec["summary"]["problems"] == 5  # the fixture slice's 5
    assert (
        "warning: workload.num_problems=6: math/aime24/test.jsonl holds 5 problems; all 5 are used"
        in capsys.readouterr().err
    )


def test_a_generator_without_the_step_ids_names_the_models_that_have_them(compose_cfg):
    """``system=fasttts model=opt-6.7b``: the step delimiter / end token (Qwen2.5 ids) lie outside OPT's
    vocabulary; the error names the model configs whose vocabulary holds them. Mutation caught: the
    vocabulary compared with >= (a model exactly one id short listed)."""
    with pytest.raises(
        ConfigError,
        match=r"vocabulary \[0, 50272\) \(model=opt-6.7b\); generators whose vocabulary "
        r"holds them: qwen-4b, qwen-7b, qwen2.5-32b, qwen2.5-math-1.5b, "
        r"qwen2.5-math-7b, tiny-qwen2 \(or set",
    ):
        validate(compose_cfg("system=fasttts", "model=opt-6.7b"))
    from systems.verifier_search.runner import _models_with_ids

    assert "llama-3.1-8b" in _models_with_ids(128255) and "llama-3.1-8b" not in _models_with_ids(128256)


def test_a_real_cpu_runs_oom_names_this_cpu_not_the_hardware_profile(compose_cfg):
    """vLLM on this CPU short of KV said "... on rtx4090" (the default hardware profile, not where it
    ran; QA); simulated, the profile is where it runs. Mutation caught: hw_name always the profile's."""
    from harness.errors import RunOOM
    from systems.verifier_search.memory_plan import MemoryPlan

    cfg = compose_cfg(*REAL, "n=8", "kv_budget=64KiB")
    for real, where in ((True, "on this CPU"), (False, "on rtx4090")):
        plan = MemoryPlan(cfg, True, real)
        with pytest.raises(RunOOM, match=f"KV memory too small (for M's plan )?{where}"):
            plan.check_fits(plan.per_run(8, 400.0))


@pytest.mark.parametrize(
    "override,message",
    [
        ("system.memory_fraction=1.5", "system.memory_fraction=1.5 is not allowed: a share of device memory in (0, 1]"),
        (
            "system.gen_memory_share=1.5",
            "system.gen_memory_share=1.5 is not allowed: the generator's share of the KV "
            "budget in (0, 1) (the verifier keeps the rest; both need some)",
        ),
        (
            "system.gen_memory_share=0",
            "system.gen_memory_share=0.0 is not allowed: the generator's share of the KV "
            "budget in (0, 1) (the verifier keeps the rest; both need some)",
        ),
        ("system.block_size=0", "system.block_size=0 is not allowed: a KV block size in tokens > 0"),
        ("system.max_num_seqs=0", "system.max_num_seqs=0 is not allowed: a sequence count per engine step > 0"),
        (
            "workload.max_step_tokens=0",
            "workload.max_step_tokens=0 is not allowed: a token count per generator call > 0",
        ),
        (
            "workload.temperature=-1",
            "workload.temperature=-1.0 is not allowed: a sampling temperature >= 0 (0 = greedy)",
        ),
        ("workload.top_p=2", "workload.top_p=2.0 is not allowed: a nucleus sampling mass in (0, 1]"),
        ("workload.top_p=0", "workload.top_p=0.0 is not allowed: a nucleus sampling mass in (0, 1]"),
        ("workload.beam_width=0", "workload.beam_width=0 is not allowed: an integer >= 1"),
        (
            "workload.max_model_len=100000",
            "workload.max_model_len=100000 is not allowed: at most the engines' context, "
            "4096 tokens (model qwen2.5-math-1.5b: 4096, verifier skywork-prm-1.5b: 4096)",
        ),
    ],
)
def test_a_fasttts_number_outside_its_range_stops_before_any_work(compose_cfg, override, message):
    """memory_fraction=1.5 ran with 30 GB of KV on a 24 GB card, gen_memory_share=1.5 gave a negative
    MiB oom, block_size=0 divided by zero mid-run, max_step_tokens=0 and top_p=2 ran (QA). Mutations
    caught: the system table not checked, the workload table not checked, "in (0, 1)" as "in [0, 1]";
    beam_width=0 blamed on n; max_model_len above the models' context accepted (an oom later)."""
    from harness.run import validate_config

    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg("system=fasttts", "workload=aime24", "n=8", override))
    assert str(e.value) == message


def test_a_simulated_run_records_no_cpu_seconds_even_where_no_verifier_call_was_made(compose_cfg, tmp_path):
    """The simulator measures no CPU time: every iteration's gen_cpu_s / ver_cpu_s is null. An iteration
    whose steps were all scored already (no verifier call) recorded ver_cpu_s = 0.0, as if measured (6 of
    300 rows here; QA). Mutation caught: the no-call result's cpu_s back to 0.0."""
    import pandas as pd

    from harness.run import run

    out = tmp_path / "r"
    rec = run(
        compose_cfg(
            "system=fasttts",
            "model=tiny-qwen2",
            "verifier=tiny-prm",
            "workload=aime24",
            "n=16",
            "hardware=cpu-tts",
            output_dir=out,
        )
    )
    assert rec["status"] == "ok"
    it = pd.read_parquet(out / "iterations.parquet")
    assert len(it) >= 50 and it.ver_cpu_s.isna().all() and it.gen_cpu_s.isna().all()


def test_a_search_that_would_not_fit_this_machines_memory_is_refused(compose_cfg, monkeypatch):
    """n had no upper bound: n=100000000 was accepted and ran until the host refused memory (issue
    39). The search's host memory is predicted before any work (runner.check_host_memory): 10
    iterations of 100-token steps make paths of 1,000 tokens (5,500 summed over the iterations), so a
    path needs 48,000 + 7,500 x 10 + 28 x 5,500 = 277,000 B, plus 48 x 1,000 B for each earlier
    problem. With 18,000,000 B available, n=64 on one problem (17,728,000 B) fits; n=68 (18,836,000 B)
    and n=64 on two problems (20,800,000 B) exit 2 naming n. Mutations caught: the check left out of
    validate (n=68 passes); the earlier problems' term left out (two problems pass)."""
    import harness.machine
    from systems.verifier_search import runner

    monkeypatch.setattr(harness.machine, "available_memory", lambda: 18_000_000)
    runner.validate(compose_cfg("system=fasttts", "backend=sim", "n=64", "workload.num_problems=1"))
    for n, problems in ((68, 1), (64, 2)):
        with pytest.raises(
            ConfigError,
            match=rf"n={n} is not allowed: a value whose run fits this machine's memory: {n} paths x "
            rf"{problems} problems \(10 iterations of ~100-token steps, paths of ~1,000 tokens\) need "
            r".*\(MemAvailable\); lower n, workload.num_problems or workload.num_iterations",
        ):
            runner.validate(compose_cfg("system=fasttts", "backend=sim", f"n={n}", f"workload.num_problems={problems}"))
    monkeypatch.setattr(harness.machine, "available_memory", lambda: 1 << 40)  # 1 TiB
    with pytest.raises(ConfigError, match=r"n=100000000 is not allowed: .* need ~25\d\d\d\.\d GiB"):
        runner.validate(compose_cfg("system=fasttts", "backend=sim", "n=100000000", "workload.num_problems=1"))
