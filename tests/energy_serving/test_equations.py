"""BEAM Eq.1 / Eq.2 on hand-computed cases; S1 / S2 equal a brute-force scan of small tables."""

import itertools
import math

import numpy as np
import pytest

from systems.energy_serving.controllers import (
    Beam,
    EngineState,
    TableSearch,
    eq1_prefill,
    eq2_decode,
    s1_search,
    s2_search,
)
from systems.energy_serving.profiler import LatencyEnergyTable


def test_eq1_hand_computed():
    # p=4 stages of g=2 GPUs, m=4; chunk iteration l=0.05 s, e=20 J per GPU; P_idle=80 W; X=1000, c=256
    k = math.ceil(1000 / 256)  # 4 chunks
    ttft, tbt, energy = eq1_prefill(0.05, 20.0, 80.0, k, p=4, g=2, m=4, t_queue=0.1)
    assert ttft == pytest.approx(0.1 + (4 + 4 - 1) * 0.05)  # 0.45 s
    assert tbt == pytest.approx(4 * 0.05)  # 0.2 s
    # g * (k p e + P_idle p (p-1) l) = 2 * (4*4*20 + 80*4*3*0.05) = 2 * (320 + 48) = 736 J
    assert energy == pytest.approx(736.0)


def test_eq2_hand_computed():
    # D=10 decodes, m=2 microbatches (b=5), p=4, g=2, l=0.012 s, e=3 J, P_idle=70 W
    tbt, e_round, e_tok = eq2_decode(0.012, 3.0, 70.0, 10, 2, p=4, g=2)
    assert tbt == pytest.approx(4 * 0.012)  # max(m, p) l: m < p waits in bubbles
    # g (p m e + P_idle p (max(m,p) - m) l) = 2 (4*2*3 + 70*4*2*0.012) = 2 (24 + 6.72) = 61.44 J
    assert e_round == pytest.approx(61.44)
    assert e_tok == pytest.approx(6.144)
    tbt6, e6, _ = eq2_decode(0.012, 3.0, 70.0, 10, 6, p=4, g=2)
    assert tbt6 == pytest.approx(6 * 0.012) and e6 == pytest.approx(2 * 4 * 6 * 3.0)  # no bubbles


def random_table(rng, n_max=64, F=9):
    """A small table with latency non-increasing in the clock and a U-shaped energy."""
    clocks = np.linspace(300, 1400, F)
    n = np.arange(n_max + 1)[:, None]
    L = (0.004 + 0.0005 * n) * (1400 / clocks[None, :]) ** rng.uniform(0.3, 1.0, (n_max + 1, 1))
    L = L * rng.uniform(1.0, 1.05, L.shape)
    L = np.maximum.accumulate(L[:, ::-1], axis=1)[:, ::-1]
    P = 100 + 250 * (clocks / 1400) ** 4
    E = L * P[None, :] * rng.uniform(0.9, 1.1, L.shape)
    return LatencyEnergyTable(clocks, L, E, 60 + 20 * clocks / 1400)


def brute_s1(T, waiting, D, m, p, g, chunks, slo_ttft, slo_tbt):
    d = -(-D // m) if D > 0 else 0
    tot = sum(t for _, t in waiting)
    best = None
    for c, j in itertools.product(chunks, range(len(T.clocks))):
        lat, e = T.L[c + d, j], T.E[c + d, j]
        cum, ok = 0, True
        for w, t in waiting:
            cum += t
            if w < slo_ttft and w + (math.ceil(cum / c) + p - 1) * lat > slo_ttft + 1e-12:
                ok = False
        if D > 0 and max(m, p) * lat > slo_tbt + 1e-12:
            ok = False
        if ok:
            _, _, en = eq1_prefill(lat, e, T.idle_w[j], math.ceil(tot / c), p, g, m)
            if best is None or en < best[0] - 1e-12:
                best = (en, c, T.clocks[j])
    return best


def brute_s2(T, D, p, g, ms, slo_tbt):
    best = None
    for m, j in itertools.product([mm for mm in ms if mm <= max(D, 1)], range(len(T.clocks))):
        b = -(-max(D, 1) // m)
        tbt, _, et = eq2_decode(T.L[b, j], T.E[b, j], T.idle_w[j], max(D, 1), m, p, g)
        if tbt <= slo_tbt + 1e-12 and (best is None or et < best[0] - 1e-12):
            best = (et, m, T.clocks[j])
    return best


@pytest.mark.parametrize("seed", range(12))
def test_s1_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    T = random_table(rng)
    S = TableSearch(T)
    p, g = int(rng.integers(1, 5)), 2
    waiting = [(float(rng.uniform(0, 0.5)), int(rng.integers(1, 60))) for _ in range(int(rng.integers(1, 5)))]
    waiting.sort(key=lambda x: -x[0])  # FCFS: oldest (longest wait) first
    D, chunks = int(rng.integers(0, 12)), [4, 8, 16, 32]
    slo_ttft, slo_tbt = float(rng.uniform(0.2, 1.5)), float(rng.uniform(0.02, 0.3))
    dec = s1_search(S, waiting, D, p, p, g, chunks, slo_ttft, slo_tbt)
    bf = brute_s1(T, waiting, D, p, p, g, chunks, slo_ttft, slo_tbt)
    if bf is None:
        assert not dec.feasible and dec.clock_mhz == T.clocks[-1] and dec.chunk == max(chunks)
    else:
        assert dec.feasible
        assert (dec.chunk, dec.clock_mhz) == (bf[1], bf[2])
        assert dec.pred_energy_j == pytest.approx(bf[0])


@pytest.mark.parametrize("seed", range(12))
def test_s2_equals_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    T = random_table(rng)
    p, g = int(rng.integers(1, 5)), 2
    D, slo_tbt = int(rng.integers(0, 40)), float(rng.uniform(0.01, 0.2))
    ms = list(range(1, 2 * p + 1))
    dec = s2_search(TableSearch(T), D, p, g, ms, slo_tbt, chunk=16)
    bf = brute_s2(T, D, p, g, ms, slo_tbt)
    if bf is None:
        assert not dec.feasible and dec.clock_mhz == T.clocks[-1]
    else:
        assert dec.feasible and (dec.microbatches, dec.clock_mhz) == (bf[1], bf[2])
        assert dec.pred_energy_j == pytest.approx(bf[0])


def test_infeasible_slo_falls_back_to_max_clock():
    T = random_table(np.random.default_rng(0))
    ctl = Beam(table=T, p=2, g=2, slo_ttft=1e-4, slo_tbt=1e-4, default_chunk=32, chunks=(8, 16, 32))
    d = ctl.on_arrival(EngineState(0.0, [(0.0, 50)], 3, 32, 2, 300.0))
    assert not d.feasible and d.clock_mhz == T.clocks[-1] and d.chunk == 32
    d2 = ctl.on_decode_only(EngineState(0.0, [], 3, 32, 2, 300.0))
    assert not d2.feasible and d2.clock_mhz == T.clocks[-1]


def test_ablation_flags_restrict_the_search():
    T = random_table(np.random.default_rng(1))
    st = EngineState(0.0, [(0.0, 40)], 6, 32, 2, 1400.0)
    only = Beam(
        table=T,
        p=2,
        g=2,
        slo_ttft=2.0,
        slo_tbt=0.5,
        default_chunk=32,
        chunks=(4, 8, 16, 32),
        search_chunk=False,
        search_microbatch=False,
    )
    assert only.on_arrival(st).chunk == 32
    assert only.on_decode_only(EngineState(0.0, [], 6, 32, 2, 1400.0)).microbatches == 2


def test_beam_s2_decisions_equal_a_fresh_search_when_repeated():
    """Issue 18: Beam keeps S2's decisions per argument set; a repeated state gets the decision a
    fresh s2_search gives. Mutations caught: the memo keyed without the chunk (a repeated D with
    another chunk kept the old chunk), without the TBT SLO (a changed SLO kept the old clock)."""
    T = random_table(np.random.default_rng(3))
    ctl = Beam(table=T, p=2, g=2, slo_ttft=2.0, slo_tbt=0.05, default_chunk=32, chunks=(8, 16, 32))
    for D, chunk, slo in [(5, 32, 0.05), (9, 32, 0.05), (5, 16, 0.05), (5, 32, 0.05), (5, 32, 0.015), (9, 32, 0.05)]:
        ctl.slo_tbt = slo
        got = ctl.on_decode_only(EngineState(0.0, [], D, chunk, 2, 1400.0))
        assert got == s2_search(TableSearch(T), D, 2, 2, ctl.microbatches, slo, chunk)
