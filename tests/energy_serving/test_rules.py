"""BEAM's rules on small constructed inputs, values worked by hand (issue 39): S1 (Alg. 1), Window-DVFS
(its 5 s period and its load) and the DVFS actuation delay. Each bug named below was caught only by
the golden summaries (``test_same_results.py``), which accept any change once retaken; these tests
assert the rule itself."""

import math

import numpy as np
import pytest

from systems.energy_serving.controllers import TableSearch, WindowDVFS, make_controller, s1_search
from systems.energy_serving.driver import Driver
from systems.energy_serving.profiler import LatencyEnergyTable
from systems.energy_serving.protocol import Decision, EngineState, WindowStats
from systems.energy_serving.sim import SimExecutor
from workloads.serving import Requests

CLOCKS = [600.0, 900.0, 1200.0]  # MHz
IDLE_W = [50.0, 60.0, 80.0]  # P_idle(f), W per GPU


def s1_table():
    """Rows n = 6 (chunk 4 + d = 2 decode tokens) and n = 10 (chunk 8 + 2) by hand; every other row
    takes 1 s at every clock (never within an SLO below)."""
    L, E = np.full((13, 3), 1.0), np.full((13, 3), 100.0)
    L[6], E[6] = [0.040, 0.030, 0.020], [1.0, 1.1, 1.8]
    L[10], E[10] = [0.060, 0.045, 0.030], [1.5, 1.8, 2.7]
    return LatencyEnergyTable(np.array(CLOCKS), L, E, np.array(IDLE_W))


# p = 2 stages of g = 2 GPUs, m = 2 microbatches, D = 3 decodes: d = ceil(3 / 2) = 2 decode tokens per
# iteration; chunk candidates 4 and 8. For 12 waiting prompt tokens: k = ceil(12/4) = 3 and ceil(12/8) = 2.
# Energy objective per clock, k E + (p - 1) P_idle L (Eq. 1 / (g p)):
#   chunk 4 (n = 6):  3 x [1.0, 1.1, 1.8] + [50 x .04, 60 x .03, 80 x .02] = [5.0, 5.1, 7.0]
#   chunk 8 (n = 10): 2 x [1.5, 1.8, 2.7] + [50 x .06, 60 x .045, 80 x .03] = [6.0, 6.3, 7.8]
#   Eq. 1 energy = g p x objective = 4 x objective (J).
# TTFT of the newest request (waited 0 s) = (k + p - 1) L: chunk 4: 4 L = [0.16, 0.12, 0.08] s;
#   chunk 8: 3 L = [0.18, 0.135, 0.09] s. TBT of the decodes = max(m, p) L = 2 L.
def s1(waiting, slo_ttft, slo_tbt):
    return s1_search(TableSearch(s1_table()), waiting, 3, 2, 2, 2, (4, 8), slo_ttft, slo_tbt)


def assert_decision(d, chunk, clock, ttft, tbt, energy):
    assert (d.chunk, d.microbatches, d.clock_mhz, d.trigger, d.feasible) == (chunk, 2, clock, "s1", True)
    assert (d.pred_ttft_s, d.pred_tbt_s, d.pred_energy_j) == pytest.approx((ttft, tbt, energy))


def test_s1_ttft_slo_met_exactly_picks_chunk_4_at_900_mhz():
    """TTFT SLO 0.12 s, TBT SLO loose (1 s). Per-stage latency bound: chunk 4: 0.12 / (3 + 2 - 1) =
    0.03 s, met from 900 MHz (L = 0.03 exactly: TTFT = SLO is feasible); chunk 8: 0.12 / (2 + 1) =
    0.04 s, met at 1200 MHz only. Minimum objective: chunk 4 at 900 MHz (5.1 < 7.0, 7.8): energy
    4 x 5.1 = 20.4 J, TTFT 4 x 0.03 = 0.12 s, TBT 2 x 0.03 = 0.06 s.

    Mutations caught (S1 off by one): k = floor(tokens / c) in both places (chunk 8 at 600 MHz: k = 1,
    bound 0.06), k = tokens // c + 1 (chunk 8 at 1200), the pipeline fill k + p instead of k + p - 1
    (chunk 4 at 1200), bisect_right in first_ok (L = bound excluded: chunk 4 at 1200), the suffix
    minimum from j0 + 1 (chunk 4 at 1200 / IndexError), the suffix-minimum cache built from F - 2 (the top clock's
    entry left at 0 J: chunk 8), d = floor(D / m) (rows 5 and 9: infeasible), the idle term x p
    instead of x (p - 1) (energy 4 x 6.9)."""
    assert_decision(s1([(0.0, 12)], 0.12, 1.0), 4, 900.0, 0.12, 0.06, 20.4)


def test_s1_a_partial_chunk_counts_as_a_whole_chunk():
    """TTFT SLO 0.1 s, TBT SLO loose. 12 tokens in chunks of 8 are k = 2 chunks (the second partial):
    chunk 8: bound 0.1 / (2 + 1) = 0.033 s (1200 MHz only, 7.8); chunk 4: 0.1 / 4 = 0.025 s (1200 MHz,
    7.0): chunk 4 at 1200 MHz, 28.0 J, TTFT 4 x 0.02 = 0.08 s, TBT 0.04 s.

    Mutations caught (S1 off by one): k = floor(12 / 8) = 1 in the TTFT bound (0.1 / 2 = 0.05:
    chunk 8 at 900 MHz, 6.3), in the energy (chunk 8 at 1200 MHz: 2.7 + 2.4 = 5.1)."""
    assert_decision(s1([(0.0, 12)], 0.1, 1.0), 4, 1200.0, 0.08, 0.04, 28.0)


def test_s1_tbt_slo_alone_excludes_the_lowest_clock():
    """TTFT SLO loose (10 s): alone it allows chunk 4 at 600 MHz, the minimum objective (5.0). TBT SLO
    70 ms: the decodes' TBT max(m, p) L = 2 x 0.04 = 80 ms at 600 MHz misses it; bound 0.035 s leaves
    chunk 4 from 900 MHz (5.1) and chunk 8 at 1200 MHz (7.8): chunk 4 at 900 MHz, 20.4 J, TBT 60 ms.

    Mutation caught: S1's TBT constraint dropped (600 MHz, 20.0 J, TBT 80 ms over the SLO)."""
    assert_decision(s1([(0.0, 12)], 10.0, 0.07), 4, 900.0, 0.12, 0.06, 20.4)


def test_s1_every_waiting_request_counts_the_tokens_queued_ahead_of_it():
    """TTFT SLO 0.12 s. Waiting FCFS (waited s, tokens): (0.2, 4) has missed the SLO (no constraint);
    (0.04, 4) has 0.08 s left and 8 tokens up to and including it: chunk 4: 0.08 / (2 + 1) = 0.0267 s
    (1200 MHz only), chunk 8: 0.08 / (1 + 1) = 0.04 s; the newest (0.0, 4), 12 tokens: chunk 4: 0.03,
    chunk 8: 0.04. Bounds: chunk 4 0.0267 (1200 MHz, 7.0), chunk 8 0.04 (1200 MHz, 7.8): chunk 4 at
    1200 MHz, 28.0 J, TTFT of the newest 4 x 0.02 = 0.08 s.

    Mutations caught: a request's own tokens instead of those up to it (0.08 / 2 = 0.04: 900 MHz),
    only the newest request constrained (900 MHz), a request past its SLO kept as a constraint
    (negative slack: infeasible)."""
    assert_decision(s1([(0.2, 4), (0.04, 4), (0.0, 4)], 0.12, 1.0), 4, 1200.0, 0.08, 0.04, 28.0)


def test_s1_energy_counts_the_pipeline_bubbles_at_p_idle():
    """Both SLOs loose: every option is feasible; minimum objective chunk 4 at 600 MHz: 3 x 1.0 +
    (2 - 1) x 50 x 0.04 = 5.0, energy 20.0 J, TTFT 0.16 s, TBT 0.08 s.

    Mutations caught: the idle term dropped (energy 12.0 J), weighted p instead of p - 1 (objective
    [7.0, 6.9, 8.6]: 900 MHz)."""
    assert_decision(s1([(0.0, 12)], 10.0, 1.0), 4, 600.0, 0.16, 0.08, 20.0)


# Window-DVFS's offline load profile: P90 TTFT / TBT (s) at each (load in prompt tokens/s, clock).
PROFILE = {
    "loads": np.array([100.0, 200.0, 400.0]),
    "clocks": np.array(CLOCKS),
    "ttft_p90": np.array([[0.8, 0.6, 0.5], [1.5, 0.9, 0.7], [0.5, 0.4, 0.3]]),
    "tbt_p90": np.array([[0.09, 0.07, 0.05], [0.09, 0.07, 0.05], [0.2, 0.15, 0.08]]),
}


def window_dvfs(period_s=5.0):
    return WindowDVFS(
        table=s1_table(),
        p=2,
        g=2,
        slo_ttft=1.0,
        slo_tbt=0.1,
        default_chunk=256,
        period_s=period_s,
        load_profile=PROFILE,
    )


@pytest.mark.parametrize(
    "tokens, waiting, window_s, want",
    [
        # (400 + 350 + 250) / 5 = 200 tok/s: the 200 load (first >= it); 600 MHz misses TTFT (1.5 s)
        (400, [(1.0, 350), (0.2, 250)], 5.0, Decision(256, 2, 900.0, "window", True, 0.9, 0.07)),
        # 400 / 5 = 80 tok/s -> the 100 load: 600 MHz meets both
        (400, [], 5.0, Decision(256, 2, 600.0, "window", True, 0.8, 0.09)),
        # a 2.5 s window: (200 + 300) / 2.5 = 200 tok/s (over 5 s it would be 100: 600 MHz)
        (200, [(0.5, 300)], 2.5, Decision(256, 2, 900.0, "window", True, 0.9, 0.07)),
        # (1500 + 500) / 5 = 400 tok/s: TTFT met at every clock, TBT (0.1 s) only at 1200 MHz
        (1500, [(0.5, 500)], 5.0, Decision(256, 2, 1200.0, "window", True, 0.3, 0.08)),
        # (2000 + 100) / 5 = 420 tok/s: above the profile -> max clock, infeasible
        (2000, [(0.5, 100)], 5.0, Decision(256, 2, 1200.0, "window", False)),
    ],
)
def test_window_dvfs_load_is_window_and_queued_prompt_tokens_per_second(tokens, waiting, window_s, want):
    """Window-DVFS's load: the window's prompt tokens plus those still queued at its end, per second
    of window; the clock: the lowest meeting both SLOs (TTFT 1 s, TBT 0.1 s) at the first profiled
    load >= it. Chunk (256) and m (= p = 2) never change.

    Mutations caught: the queued tokens left out (80 tok/s: 600 MHz), arrivals instead of tokens,
    the load looked up with side='right' (200 -> the 400 load: 1200 MHz), the TBT check dropped
    (400 tok/s: 600 MHz), the load divided by a fixed 5 s instead of the window's length."""
    st = EngineState(10.0, waiting, 4, 256, 2, 1200.0)
    win = WindowStats(arrivals=3, input_tokens=tokens, mean_decodes=4.0, duration_s=window_s)
    assert window_dvfs(window_s).on_tick(st, win) == want


class FastCost:
    """n tokens: 10 us per token, 1 mJ per token per GPU; idle 10 W."""

    has_energy = True
    follows_clock = True

    def step1(self, n, f, ctx_tokens=0.0, attn_pairs=0.0, seqs=1):
        return 1e-5 * n, 1e-3 * n

    def idle1(self, f):
        return 10.0


def test_window_dvfs_decides_every_5_s_from_the_previous_windows_load(compose_cfg):
    """system=window_dvfs builds a controller with BEAM's 5 s period (BEAM §2.6: "every 5 s window").
    Requests (prompt tokens): 500 at 1 s; 1000 at 6 s and 7 s; 1000 at 12 s; 10 at 15.5 s (the run
    lasts past 15 s). Ticks at 5, 10, 15 s see 500 / 5 = 100 tok/s (600 MHz), 2000 / 5 = 400 tok/s
    (1200 MHz; TBT), 1000 / 5 = 200 tok/s (900 MHz); nothing is queued at a tick (10 us a token).

    Mutations caught: window_s 5 -> 4 in conf/system/window_dvfs.yaml (ticks at 4, 8, 12 s), the
    default period of make_controller or WindowDVFS changed, system.window_s not handed to the
    controller (2.5 s ignored), the driver's next tick a period too late."""
    from systems.energy_serving.build import controller_for

    cfg = compose_cfg("system=window_dvfs", "workload.slo_ttft_s=1.0", "workload.slo_tbt_s=0.1")
    ctl = controller_for(cfg, s1_table())
    assert isinstance(ctl, WindowDVFS) and ctl.period_s == 5.0
    assert controller_for(compose_cfg("system=window_dvfs", "system.window_s=2.5"), s1_table()).period_s == 2.5
    common = dict(table=s1_table(), p=2, g=2, slo_ttft=1.0, slo_tbt=0.1, default_chunk=256)
    assert make_controller("window_dvfs", **common).period_s == 5.0
    assert WindowDVFS(**common).period_s == 5.0
    ctl.load_profile = PROFILE
    req = Requests(
        np.array([1.0, 6.0, 7.0, 12.0, 15.5]), np.array([500, 1000, 1000, 1000, 10]), np.array([1, 1, 1, 1, 1])
    )
    res = Driver(ctl, req).run(SimExecutor(FastCost(), ctl.p, ctl.g))
    d = res.decisions
    tick = np.asarray(d["trigger"]) == "tick"
    assert np.asarray(d["time_s"])[tick].tolist() == [5.0, 10.0, 15.0]
    assert np.asarray(d["clock_mhz"])[tick].tolist() == [600.0, 1200.0, 900.0]


class ClockCost:
    """An iteration of n tokens takes n / 1024 s at 1000 MHz, scaled by 1000 / f, and n f / 1000 J per
    GPU; a waiting GPU draws f / 100 W (times in powers of two: exact in floating point)."""

    has_energy = True
    follows_clock = True

    def step1(self, n, f, ctx_tokens=0.0, attn_pairs=0.0, seqs=1):
        return n / 1024 * 1000 / f, n * f / 1000

    def idle1(self, f):
        return f / 100


def test_a_clock_change_takes_effect_delay_s_after_the_decision():
    """One stage of one GPU, chunk 4, delay 1/128 s (7.8 ms, BEAM's 7-10 ms). The clock is 1000 MHz
    from 0 s; at 1 s a request of 20 prompt tokens arrives and 500 MHz is decided. Its 5 chunks launch
    at 1, 1 + 1/256 (4 tokens at 1000 MHz: 1/256 s each) and 1 + 2/256 = 1 + 1/128 s, when 500 MHz takes
    effect (exactly delay_s after the decision: in force from then on): 1000, 1000, 500, 500, 500 MHz,
    latencies 1/256, 1/256, 1/128, 1/128, 1/128 s. First token at 1 + 2/256 + 3/128 = 1.03125 s.
    Energy: 4 + 4 + 2 + 2 + 2 = 14 J busy, plus the stage idle 0-1 s at 10 W = 10 J: 24 J.

    Mutations caught: the delay dropped (every chunk at 500 MHz, 5 + 10 J), the new clock in force
    only after t + delay (< instead of <=: three chunks at 1000 MHz), the delay doubled."""
    ex = SimExecutor(ClockCost(), p=1, g=1, delay_s=1 / 128)
    ex.apply(Decision(4, 1, 1000.0), 0.0)
    assert ex.advance(1.0) is None and ex.now == 1.0  # idle until the arrival, as the driver runs it
    ex.apply(Decision(4, 1, 500.0), 1.0)
    ex.add(0, 20, 1, 1.0)
    its = []
    while (it := ex.advance(math.inf)) is not None:
        its.append(it)
    assert [it.clock_mhz for it in its] == [1000.0, 1000.0, 500.0, 500.0, 500.0]
    assert [it.latency_s for it in its] == [1 / 256, 1 / 256, 1 / 128, 1 / 128, 1 / 128]
    assert [it.t_end for it in its] == [1 + 1 / 256, 1 + 1 / 128, 1 + 2 / 128, 1 + 3 / 128, 1 + 4 / 128]
    assert [it.energy_j for it in its] == pytest.approx([10 + 4, 4, 2, 2, 2])  # the first pays the idle
    assert its[-1].emitted == [0]
    totals = ex.close(ex.now)
    assert totals.energy_j == pytest.approx(24.0)
    assert totals.clock_log == [(0.0, 1000.0), (1 + 1 / 128, 500.0)]


def test_the_simulated_backend_applies_the_configured_dvfs_delay(compose_cfg):
    """system.dvfs.delay_s (default 8.5 ms, BEAM Tab. 2: 7-10 ms) reaches the simulated executor.
    Mutation caught: the delay not handed to SimExecutor (its own default, 8.5 ms, for 20 ms)."""
    from systems.energy_serving.runner import SimServing

    assert compose_cfg("system=beam").system.dvfs.delay_s == 0.0085
    backend = SimServing(compose_cfg("system=beam", "system.dvfs.delay_s=0.02"), None)
    backend.kv_cap = math.inf
    assert backend.executor(None).delay_s == 0.02
