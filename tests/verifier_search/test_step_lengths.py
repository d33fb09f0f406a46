"""The simulated workload's step and answer lengths (issue 38, item 9; ``systems/verifier_search/step_lengths.py``,
``workloads/step_fit.py``): the fitted models are not memoryless, geometric is, the fit reproduces, the setting
is checked before any work."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from harness.errors import ConfigError
from harness.run import validate
from systems.verifier_search.beams import step_probabilities
from systems.verifier_search.protocol import GenRequest
from systems.verifier_search.sim import StepModel, TokenSource
from systems.verifier_search.step_lengths import STEP_MODELS, StepLengths, head_start, load_params
from workloads import step_fit

ROOT = Path(__file__).resolve().parents[2]
DELIM, EOS, VOCAB = 271, 151643, 151936
PARAMS = {  # round numbers, so that the closed forms below are worked by hand
    "step": {"sigma": 1.0, "quantiles": [0.0, 0.5, 1.5]},
    "answer": {"sigma_between": 0.0, "sigma_within": 0.5},
}


def first_steps(lengths, age: int, path_steps: int = 0, count: int = 4000, second: bool = False):
    """(mean length of the first step, share ending in the end token) of ``count`` requests' streams
    (seeds 0..count-1) whose current step already holds ``age`` tokens, through ``TokenSource``;
    ``second``: the mean length of the step after it instead (a whole step)."""
    src = TokenSource(StepModel(*step_probabilities(100, 8), DELIM, EOS, VOCAB), None, lengths)
    out, eos = [], 0
    for seed in range(count):
        s = src.stream(GenRequest(f"r{seed}", [1, 2], 100000, seed, path="0/0", path_steps=path_steps, step_age=age))
        end, finish = s.boundary(0, 10**9, eos_only=False)
        if second:
            end = s.boundary(end, 10**9, eos_only=False)[0] - end
        out.append(end)
        eos += finish == "eos"
    return float(np.mean(out)), eos / count


def test_lognormal_remaining_length_is_the_closed_form_given_the_steps_age():
    """E[L - a | L > a] of the log-normal step (mu, sigma) is e^(mu + sigma^2/2) Phi(sigma - z) /
    Phi(-z) - a with z = (ln a - mu) / sigma, plus about 1/2 for L = ceil(X). With sigma = 1 and the
    mean step at 100 tokens (mu = 4.1002): 99.5 at a = 0, 123.7 at a = 100, 199.4 at a = 300 (grows with age).
    Mutation: ``remaining`` drawing u ~ U(0, 1) whatever the age (the step restarted: memoryless)
    fails this."""
    m = StepLengths("lognormal", 100, 8, PARAMS)
    assert m.sigma == 1.0 and abs(m._mean_lognormal(m.mu, 1.0) - 100) < 1e-6
    phi = NormalDist().cdf
    for a in (0, 100, 300):
        mean_x = math.exp(m.mu + 0.5)
        exact = mean_x if a == 0 else mean_x * phi(1 - (math.log(a) - m.mu)) / phi(-(math.log(a) - m.mu)) - a
        assert abs(m.expected_remaining(a) - (exact + 0.5)) < 1.5, (a, m.expected_remaining(a), exact)
    assert 122 < m.expected_remaining(100) < 126 and 198 < m.expected_remaining(300) < 202


def test_a_head_start_changes_the_remaining_step_under_lognormal_not_geometric():
    """Through ``TokenSource`` (what the simulated generator draws): a request whose step already
    holds 200 tokens (``GenRequest.step_age``) finishes it in ~200 more tokens under the fitted
    log-normal (E[L - 200 | L > 200] of the fitted sigma 1.12, mean 100: 200.2) but ~100 at age 0;
    under geometric both are 1/p = 100 (4000 seeds each: the standard error is ~1.6 tokens).
    The step after it is a whole one again (~100). Mutations: ``TokenSource._chunk`` passing age 0
    instead of the request's step_age; ``Chunker`` keeping the age for the next step; each fails this."""
    ln = StepLengths("lognormal", 100, 8)
    fresh, _ = first_steps(ln, 0)
    late, _ = first_steps(ln, 200)
    assert abs(fresh - 100) < 6 and abs(late - ln.expected_remaining(200)) < 12 and late > fresh + 60
    assert abs(first_steps(ln, 200, second=True)[0] - 100) < 6  # the next step starts afresh
    g0, _ = first_steps(None, 0)
    g1, _ = first_steps(None, 200)
    assert abs(g0 - 100) < 6 and abs(g1 - 100) < 6
    # empirical: bounded support, the remaining length does not grow (it shrinks toward the top)
    emp = StepLengths("empirical", 100, 8)
    assert emp.expected_remaining(300) < emp.expected_remaining(0) + 1


def test_the_path_length_hazard_follows_the_step_index_and_the_problem():
    """h_p(k) = P(K = k | K >= k), log K ~ N(mu_p, 0.5), K rounded: with sigma_between = 0, mu_p =
    mu_K for every problem, and P(K > k) = Phi(-(ln(k + 1/2) - mu_K) / 0.5). A request whose path has
    7 steps ends with its next step at h(8), one at the root at h(1). Mutation: ``TokenSource._chunk``
    ignoring ``path_steps`` (every request at step 1) fails this."""
    m = StepLengths("lognormal", 100, 8, PARAMS)
    surv = lambda k: 1.0 if k == 0 else NormalDist().cdf(-(math.log(k + 0.5) - m.mu_k) / 0.5)  # noqa: E731
    for k in (1, 4, 8, 12):
        assert m.hazard(0, k) == pytest.approx(1 - surv(k) / surv(k - 1), abs=1e-9)
        assert m.hazard(3, k) == m.hazard(0, k)  # no per-problem spread here
    assert m._mean_steps(m.mu_k, 0.5) == pytest.approx(8, abs=1e-6)
    _, e1 = first_steps(m, 0, 0)
    _, e8 = first_steps(m, 0, 7)
    assert abs(e1 - m.hazard(0, 1)) < 0.01 and abs(e8 - m.hazard(0, 8)) < 0.03 and e8 > e1 + 0.1
    fitted = StepLengths("lognormal", 100, 8)  # the fitted between-problem spread: problems differ
    assert len({round(fitted.problem_mu(p), 6) for p in range(5)}) == 5


def test_head_start_counts_the_steps_and_the_age_of_the_speculative_tail():
    b = frozenset((DELIM, EOS))
    assert head_start([], b, 0, 3) == (3, 0)
    assert head_start([5, 6, 7], b, 0, 3) == (3, 3)
    assert head_start([5, DELIM, 6, 7], b, 0, 3) == (4, 2)
    assert head_start([5, DELIM, 6, DELIM], b, 4, 0) == (2, 0)
    assert head_start([5, 6], b, 4, 0) == (0, 6)


def test_a_lognormal_stream_is_the_same_however_far_it_is_read():
    """The stream of a seed under the fitted model, read in pieces after boundaries were drawn ahead,
    equals one read at once (two ``random()`` draws per step from the length generator)."""
    ln = StepLengths("lognormal_heavy", 100, 8)
    r = GenRequest("r", [1], 100, 9, path="2/0.1", path_steps=3, step_age=40)
    a, b = TokenSource(StepModel(0.01, 0.001, DELIM, EOS, VOCAB), None, ln), None
    b = TokenSource(StepModel(0.01, 0.001, DELIM, EOS, VOCAB), None, ln)
    s1, s2 = a.stream(r), b.stream(r)
    s1.boundary(0, 5000, eos_only=True)
    parts = [s1.read(n) for n in (3, 50, 700, 3000)][-1]
    assert parts == s2.read(3000) and s1.ends[: len(s2.ends)] == s2.ends[: len(s1.ends)]


def test_fit_of_hand_made_solutions():
    """Three solutions of 4, 8 | 12 | 4, (blank), 4, 13 bytes (tokens ceil(bytes / 4): 1, 2 | 3 | 1, 1, 4):
    log-normal mu = mean(ln L), sigma = their std; step counts 2, 1, 3, in groups (a, 1), (a, 1),
    (b, 2): within variance ((ln2 - ln2/2)^2 * 2 + 0) / 3, total var of (ln2, 0, ln3).
    Mutations: floor instead of ceil in ``step_tokens``, characters counted instead of bytes, the within variance not centred per group
    each fail this."""
    rows = [
        {"solution": "aaaa\n\nbbbbbbbb", "subject": "a", "level": 1},
        {"solution": "c" * 12, "subject": "a", "level": 1},
        {"solution": "dddd\n\n  \n\neeee\n\n" + "é" * 4 + "f" * 5, "subject": "b", "level": 2},
    ]
    assert step_fit.step_tokens("é" * 4 + "f" * 5) == 4 and step_fit.step_tokens("") == 1  # 13 bytes, 9 characters
    p = step_fit.fit(rows)
    lens = [1, 2, 3, 1, 1, 4]
    x = np.log(lens)
    assert p["solutions"] == 3 and p["step"]["count"] == 6
    assert p["step"]["mu"] == pytest.approx(x.mean(), abs=1e-6) and p["step"]["sigma"] == pytest.approx(
        x.std(), abs=1e-6
    )
    assert p["step"]["quantiles"][0] == pytest.approx(1 / 2, abs=1e-6) and p["step"]["quantiles"][-1] == pytest.approx(
        2
    )
    lk = np.log([2, 1, 3])
    within = 2 * (math.log(2) / 2) ** 2 / 3
    assert p["answer"]["sigma_within"] == pytest.approx(math.sqrt(within), abs=1e-6)
    assert p["answer"]["sigma_between"] == pytest.approx(math.sqrt(lk.var() - within), abs=1e-6)


def test_the_fit_script_on_the_fixture_slice(tmp_path):
    """``python -m workloads.step_fit`` on the MATH-500 fixture slice (its first 5 solutions) writes
    what ``fit`` gives for them: 5 solutions, the 5 + 2 blank-line breaks of their text."""
    from tests.conftest import FIXTURE_DATA

    src = FIXTURE_DATA / "math" / "math500" / "test.jsonl"
    out = tmp_path / "p.json"
    assert step_fit.main(["--data", str(src), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    rows = step_fit.read_rows(src)
    assert got == step_fit.fit(rows) and got["solutions"] == 5
    assert got["step"]["count"] == sum(len(step_fit.split_steps(r["solution"])) for r in rows)


@pytest.mark.full_data("math/")
def test_the_committed_parameters_reproduce_from_math500(full_data, tmp_path):
    """workloads/step_lengths.json is what the fit gives for the full MATH-500 (500 solutions)."""
    got = step_fit.fit(step_fit.read_rows(full_data / "math" / "math500" / "test.jsonl"))
    assert got == load_params() and got["solutions"] == 500


def test_step_model_is_checked_before_any_work(compose_cfg):
    """A bad ``workload.step_model``: ConfigError naming the allowed models; run.py exits 2 with it.
    Mutation: the check dropped from ``runner.validate`` fails this."""
    for m in STEP_MODELS:
        validate(compose_cfg("system=fasttts", "backend=sim", f"workload.step_model={m}"))
    with pytest.raises(ConfigError, match="workload.step_model='weibull' is not allowed: one of lognormal, geometric"):
        validate(compose_cfg("system=fasttts", "backend=sim", "workload.step_model=weibull"))
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "system=fasttts",
            "backend=sim",
            "workload.step_model=weibull",
            "tracking=none",
            "progress=false",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, WANDB_MODE="disabled"),
    )
    assert out.returncode == 2 and "workload.step_model='weibull' is not allowed" in out.stderr, out.stderr[-2000:]
    assert "empirical, lognormal_heavy" in out.stderr


def test_geometric_draws_no_lengths_model(compose_cfg):
    """``workload.step_model=geometric`` builds no ``StepLengths``: the streams are ``StepModel``'s
    geometric chunks, as before the setting (the golden summaries pass with it forced). The default
    of the math workloads is the fitted log-normal. Mutation: the runner building a StepLengths for
    geometric (ValueError) or defaulting to geometric fails this."""
    from systems.verifier_search.runner import step_lengths

    assert step_lengths(compose_cfg("system=fasttts", "workload.step_model=geometric"), 100.0) is None
    cfg = compose_cfg("system=fasttts")
    assert cfg.workload.step_model == "lognormal" and step_lengths(cfg, 100.0).kind == "lognormal"


def test_the_search_tells_the_generator_each_paths_steps_and_head_start(compose_cfg):
    """Every generator request of a simulated FastTTS search (S on: speculative head starts) carries
    ``path_steps`` = the boundary tokens in its prompt past the problem's prompt (every step ended
    at one here: no step reached the 2048-token cap) and ``step_age`` = the tokens after the last of
    them; some requests start with a head start. Mutation: ``Search`` sending step_age=0 (or
    path_steps=0) fails this."""
    from harness.backend import Backend
    from systems.verifier_search import runner
    from systems.verifier_search.search import Search

    cfg = compose_cfg("system=fasttts", "backend=sim", "n=16", "workload.num_problems=1")
    runner.validate(cfg)
    st, problems, prompts, gen, ver, hook, *_ = runner.build(cfg, Backend("sim", "sim", True, "test"), None)
    seen = []
    extend = gen.extend

    def spy(reqs, policy):
        seen.extend((r.prompt_ids, r.path_steps, r.step_age) for r in reqs)
        return extend(reqs, policy)

    gen.extend = spy
    p = problems[0].index
    Search(st, gen, ver, before_iteration=hook).run_problem(p, prompts[p])
    n = len(prompts[p])
    with_head = 0
    for ids, steps, age in seen:
        tail = ids[n:]
        ends = [i for i, t in enumerate(tail) if t in (DELIM, EOS)]
        assert steps == len(ends) and age == len(tail) - (ends[-1] + 1 if ends else 0)
        with_head += age > 0
    assert with_head >= 3 and max(s for _, s, _ in seen) >= 3


def _record(system, model, n, goodput):
    return {
        "status": "ok",
        "system": system,
        "simulated": True,
        "summary.precise_goodput_tok_s": goodput,
        "summary.latency_s": 1.0,
        "summary.gen_latency_s": 0.5,
        "summary.ver_latency_s": 0.5,
        "config.model.name": "qwen2.5-math-1.5b",
        "config.verifier.name": "skywork-prm-1.5b",
        "config.workload.name": "aime24",
        "config.workload.n": n,
        "config.workload.step_model": model,
        "config.system.spec_truncation_ratio": 0.85,
        "config.system.search": "beam_search",
        "config.hardware.name": "rtx4090",
    }


def test_sensitivity_report_judges_fig12_once_per_workload_model(tmp_path):
    """Hand-made records at Fig. 12's 1.5B+1.5B AIME n=8 point (paper: vllm_tts 88, fasttts 107 tok/s):
    geometric 88 / 107 (both reproduced, gain 107/88 = 1.216x), lognormal 44 / 110 (vllm_tts half the
    paper's: not reproduced; fasttts within 15 %: reproduced; gain 2.5x); a record without the key is
    geometric's (older records). Verdicts go to workload_verdicts.csv, never to verdicts.csv.
    Mutations: the report ignoring the records' step_model (one group), or writing verdicts.csv, fail this."""
    import pandas as pd

    from systems.verifier_search.workload_report import report_workload_sensitivity

    old = _record("vllm_tts", None, 8, 88.0)
    del old["config.workload.step_model"]
    runs = pd.DataFrame(
        [
            old,
            _record("fasttts", "geometric", 8, 107.0),
            _record("vllm_tts", "lognormal", 8, 44.0),
            _record("fasttts", "lognormal", 8, 110.0),
        ]
    )
    t = report_workload_sensitivity(tmp_path, runs).set_index("step_model")
    assert list(t.index) == ["geometric", "lognormal"]
    assert t.loc["geometric", "fasttts/base (sim)"] == pytest.approx(107 / 88)
    assert t.loc["lognormal", "fasttts/base (sim)"] == pytest.approx(2.5)
    assert t.loc["lognormal", "paper fasttts/base"] == pytest.approx(107 / 88)
    assert list(t["verdict vllm_tts (sim)"]) == ["reproduced", "not reproduced"]
    assert list(t["verdict fasttts (sim)"]) == ["reproduced", "reproduced"]
    v = pd.read_csv(tmp_path / "workload_verdicts.csv")
    assert sorted(zip(v.step_model, v.verdict)) == [
        ("geometric", "reproduced"),
        ("geometric", "reproduced"),
        ("lognormal", "not reproduced"),
        ("lognormal", "reproduced"),
    ]
    assert not (tmp_path / "verdicts.csv").exists()
    md = (tmp_path / "workload_sensitivity.md").read_text()
    assert re.search(r"\| lognormal +\| +1 \| +0 \| +1 \| +0 \|", md)  # counts: reproduced, partly, not, none
    assert (tmp_path / "workload_sensitivity.png").exists()


def test_sensitivity_experiment_runs_on_a_small_cut(compose_cfg, tmp_path):
    """``experiment=fasttts_workload_sensitivity`` composes (4 workload models x 2 systems, first 3
    problems), is not a paper experiment of harness.reproduce, and its jobs cut to n=8 and one problem
    run under every model and report: 2 paper numbers judged per model, a gain per model."""
    from harness.report import gather_runs
    from harness.reproduce import paper_experiments
    from harness.run import run
    from systems.verifier_search.workload_report import report_workload_sensitivity

    cfg = compose_cfg("experiment=fasttts_workload_sensitivity")
    assert cfg.report == "systems.verifier_search.workload_report.report_workload_sensitivity"
    assert cfg.workload.num_problems == 3 and "fasttts_workload_sensitivity" not in paper_experiments()
    validate(cfg)
    sweep = tmp_path / "sweep"
    for model in STEP_MODELS:
        for system in ("vllm_tts", "fasttts"):
            over = [f"system={system}", "backend=sim", "n=8", "workload.num_problems=1", f"workload.step_model={model}"]
            rec = run(compose_cfg(*over, output_dir=sweep / f"{model}-{system}"))
            assert rec["status"] == "ok", rec["message"]
    t = report_workload_sensitivity(sweep, gather_runs(sweep))
    assert sorted(t["step_model"]) == sorted(STEP_MODELS) and (t["fasttts/base (sim)"] > 0).all()
    v = __import__("pandas").read_csv(sweep / "workload_verdicts.csv")
    assert v.groupby("step_model").size().to_dict() == dict.fromkeys(STEP_MODELS, 2)


def test_step_fit_refuses_a_file_it_cannot_read(tmp_path, capsys):
    """``python -m workloads.step_fit`` reads its solutions through harness.inputs (the rule for every
    user-given file): a line that is not JSON or a missing file exits 2 naming it, before any fit.
    Mutation: read_rows opening the file itself again (a JSONDecodeError traceback) fails this."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"solution": "a"}\nnot json\n')
    assert step_fit.main(["--data", str(bad), "--out", str(tmp_path / "o.json")]) == 2
    assert "line 2 is not JSON" in capsys.readouterr().err
    assert step_fit.main(["--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o.json")]) == 2
    assert not (tmp_path / "o.json").exists()
