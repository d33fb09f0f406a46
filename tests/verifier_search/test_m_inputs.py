"""M's inputs (issue 38, item 10): M plans from a profiled stage table with ``system.profile_error``
and from the step lengths observed so far, never the simulator's roofline or the workload's true
mean step (``systems/verifier_search/memory_plan.py``, ``memory.StageTable``)."""

import numpy as np
import pytest

from harness.backend import Backend
from harness.errors import ConfigError
from harness.run import validate
from systems.verifier_search import runner
from systems.verifier_search.memory import StageTable, search_allocation
from systems.verifier_search.memory_plan import MemoryPlan

SIM = Backend("sim", "sim", True, "test")
RTX = ["system=fasttts", "backend=sim", "hardware=rtx4090", "workload.num_problems=1"]


class Path_:
    """An active path as the search hands it to the planner: generated ids and cumulative step ends."""

    def __init__(self, *steps):
        self.step_ends = list(np.cumsum(steps)) if steps else []
        self.tokens = [0] * (int(self.step_ends[-1]) if steps else 0)


def test_table_is_read_through_the_roofline_in_log_batch_and_log_context():
    """rho(B, S) = profiled / roofline, bilinear in (log2 B, log2 S), held at the edges. Hand-worked:
    rows B = 1, 2, 4, columns S = 16, 64; at S = 32 (half-way in log2) the column is (1, 1.1, 1.5);
    B = 3 lies log2(1.5) = 0.58496 of the way from 2 to 4: 1.1 + 0.4 * 0.58496 = 1.333985.
    Mutation: interpolating linearly in B (1.1 + 0.4 * 0.5 = 1.3) fails this; so does linear in S
    (S = 32 is 1/3 of 16..64: column (1, 1.0667, 1.4667))."""
    r = np.array([[1.0, 1.0], [1.0, 1.2], [1.4, 1.6]])
    t = StageTable(np.array([1.0, 2.0, 4.0]), np.array([16.0, 64.0]), r, r, r, r[::-1])
    got = t.ratio("prefill", np.array([1.0, 3.0, 4.0, 8.0]), 32.0)
    assert got == pytest.approx([1.0, 1.1 + 0.4 * np.log2(1.5), 1.5, 1.5], abs=1e-12)
    assert got[1] == pytest.approx(1.333985, abs=1e-6)
    assert t.ratio("prefill", np.array([4.0]), 4096.0)[0] == 1.6  # held beyond the last context
    assert t.ratio("decode", np.array([1.0]), 16.0)[0] == 1.4  # the decode table is its own


def test_exact_profile_and_the_true_mean_give_the_plan_before_issue_38_bit_for_bit(compose_cfg):
    """profile_error 0 (bias and noise) and observed steps whose mean is the simulator's 100 tokens:
    the plan is the one the search gave before issue 38 (the true roofline, step_tokens_mean = 100),
    every field bit for bit, per run and per iteration. The numbers below were printed by the code
    before this change (commit 64dc8b6, ``MemoryPlan.per_run(n, 173.0, 100.0)`` and
    ``per_iteration(n, 150, 350.0, 100.0)``), 1.5B+1.5B on a simulated RTX 4090 with the roofline's
    batch caps. Mutation: the search reading the table's times interpolated in B at the nearest
    profiled context (instead of the roofline x the interpolated ratio) fails this."""
    got = {}
    for n in (64, 512):
        cfg = compose_cfg(
            *RTX, f"n={n}", "system.m_batch_caps=roofline", "system.profile_error.noise=0", "system.kv_accounting=flat"
        )
        mp = MemoryPlan(cfg, on_cpu=False, real=False)
        mp.observe([100, 100])
        got[n] = (mp.per_run(n, 173.0), mp.per_iteration(0, [Path_(100, 250)] * n, 150))
    want = {
        64: ((64, 64, 2373198516, 1234960384, 1.8830792402741996), (64, 64, 2690654900, 917504000, 1.5391756302394404)),
        512: (
            (32, 128, 2990678708, 617480192, 12.874611319018994),
            (32, 171, 3149406900, 458752000, 9.574472343502826),
        ),
    }
    for n, plans in got.items():
        for a, w in zip(plans, want[n]):
            assert (a.b_pre, a.b_dec, a.gen_kv_bytes, a.ver_kv_bytes, a.t_tot_s) == w
            assert not a.offload


def test_plan_with_a_profiling_error_is_the_erred_tables(compose_cfg):
    """With the default error (noise 0.02) M's plan is the search over the erred table, not over the
    simulator's roofline: at n=64 the roofline gives B_pre = 64 (prefill's cost per sequence is
    nearly flat in the batch, so 2 % noise decides), the table B_pre = 8 and a larger generator
    share. Mutation: MemoryPlan.plan searching the true roofline (``table`` not passed) fails this."""
    cfg = compose_cfg(*RTX, "n=64", "system.m_batch_caps=roofline", "system.kv_accounting=flat")
    mp = MemoryPlan(cfg, on_cpu=False, real=False)
    mp.observe([100])
    a = mp.per_run(64, 173.0)
    ctx = 173.0 + 100.0 * 6
    args = (mp.gen, mp.ver, mp.dec_hw, mp.budget, 64, ctx - 100.0, ctx, 100.0)
    truth = search_allocation(*args, pre_hw=mp.pre_hw)
    erred = search_allocation(*args, pre_hw=mp.pre_hw, table=mp.table)
    assert (truth.b_pre, truth.b_dec) == (64, 64)
    assert (a.b_pre, a.b_dec, a.ver_kv_bytes, a.t_tot_s) == (
        erred.b_pre,
        erred.b_dec,
        erred.ver_kv_bytes,
        erred.t_tot_s,
    )
    assert (a.b_pre, a.b_dec) == (8, 64) and a.gen_kv_bytes > truth.gen_kv_bytes
    # seeded: the same seed, the same table; another seed, another table
    again = MemoryPlan(cfg, on_cpu=False, real=False).table
    other = MemoryPlan(compose_cfg(*RTX, "n=64", "seed=1"), on_cpu=False, real=False).table
    assert np.array_equal(again.pre, mp.table.pre) and not np.array_equal(other.pre, mp.table.pre)


def test_a_real_engine_plans_from_its_measured_profile_without_added_error(compose_cfg):
    """As BEAM's: the profiling error is applied on the simulated backend only; a real engine's
    profile (cpu-tts, measured) is a measurement with its own error. Mutation: applying
    system.profile_error on a real engine too fails this."""
    cfg = compose_cfg("system=fasttts", "backend=vllm", "model=tiny-qwen2", "verifier=tiny-prm", "n=16")
    real = MemoryPlan(cfg, on_cpu=True, real=True).table
    sim = MemoryPlan(cfg, on_cpu=True, real=False).table
    assert np.all(real.pre_ratio == 1.0) and np.all(real.dec_ratio == 1.0)
    assert not np.all(sim.pre_ratio == 1.0)


def test_step_prior_and_running_mean_of_observed_steps(compose_cfg):
    """Before any step: min(max_step_tokens, (max_model_len - prompt) / num_iterations) = min(2048,
    (4096 - 400) / 10) = 369.6 tokens. Per iteration the newest step of each active path joins the
    running mean: iteration 1 sees steps 30 and 50 (mean 40), iteration 2 sees 70 and 70 (mean of
    four: 55); iteration 0 (a new problem) observes nothing. Mutation: observing each path's whole
    length (80 and 120 at iteration 2: mean 70) or the prior from step_tokens_mean fails this."""
    cfg = compose_cfg(*RTX, "n=64")
    mp = MemoryPlan(cfg, on_cpu=False, real=False)
    assert mp.step_prior(400.0) == pytest.approx(369.6)
    assert mp.step_mean(400.0) == pytest.approx(369.6)
    mp.per_run(64, 400.0)
    assert mp.run_step == pytest.approx(369.6)
    mp.per_iteration(0, [Path_(), Path_()], 150)
    assert mp.step_mean(150) == pytest.approx((4096 - 150) / 10)
    mp.per_iteration(1, [Path_(30), Path_(50)], 150)
    assert mp.step_mean(150) == 40.0
    mp.per_iteration(2, [Path_(10, 70), Path_(50, 70)], 150)
    assert mp.step_mean(150) == 55.0
    mp.per_iteration(0, [Path_(), Path_()], 150)  # the next problem: nothing new
    assert mp.step_mean(150) == 55.0


def test_plan_never_reads_the_true_step_mean(compose_cfg):
    """The simulator draws steps of workload.step_tokens_mean; M's plan (per run, built by the runner,
    and per iteration through its hook) is the same whatever that mean is, observations held fixed.
    Mutation: MemoryPlan's prior or the runner's call reading step_tokens_mean (e.g. per_run planning
    with ``mean`` from runner.step_model) fails this."""
    plans = []
    for mean in (100, 37):
        cfg = compose_cfg(*RTX, "n=64", "system.replan=per_iteration", f"workload.step_tokens_mean={mean}")
        b = runner.build(cfg, SIM, None)
        sizes = []
        for it, paths in enumerate(([Path_()] * 64, [Path_(80)] * 64, [Path_(80, 120)] * 64)):
            b.hook(it, paths, 150)
            sizes.append((b.gen.max_num_seqs, b.gen.cache.capacity, b.ver.cache.capacity))
        plans.append((b.alloc, b.planner.run_step, sizes))
    assert plans[0] == plans[1]
    assert 300 < plans[0][1] < 410  # the prior, (4096 - the mean prompt) / 10


def test_a_fixed_step_prior_is_used_until_steps_are_observed(compose_cfg):
    """system.m_step_prior=64: S_dec = 64 tokens before any step, the observed mean after.
    Mutation: the setting ignored (the ``fit`` prior, 369.6 here) fails this."""
    mp = MemoryPlan(compose_cfg(*RTX, "system.m_step_prior=64"), on_cpu=False, real=False)
    assert mp.step_mean(400.0) == 64.0
    mp.observe([30, 50])
    assert mp.step_mean(400.0) == 40.0


@pytest.mark.parametrize(
    "override,match",
    [
        ("system.m_step_prior=0", r"system.m_step_prior=0 is not allowed: fit .* or a token count > 0"),
        ("system.m_step_prior=often", r"system.m_step_prior='often' is not allowed: fit"),
        ("system.profile_error.noise=-0.01", r"system.profile_error.noise=-0.01 is not allowed: .* in \[0, 0.3\]"),
        ("system.profile_error.noise=1.0", r"system.profile_error.noise=1.0 is not allowed: .* in \[0, 0.3\]"),
        ("system.profile_error.bias=1.0", r"system.profile_error.bias=1.0 is not allowed: .* in \[-0.5, 0.5\]"),
        ("system.profile_error.bias=-0.6", r"system.profile_error.bias=-0.6 is not allowed: .* in \[-0.5, 0.5\]"),
    ],
)
def test_profile_error_is_validated_before_work(compose_cfg, override, match):
    """BEAM's ranges (systems/energy_serving/runner.py): ConfigError (exit 2) naming the field.
    Mutation: dropping the check in runner.validate fails this."""
    with pytest.raises(ConfigError, match=match):
        validate(compose_cfg(*RTX, override))
    validate(compose_cfg(*RTX, "system.profile_error.noise=0.3", "system.profile_error.bias=-0.5"))
