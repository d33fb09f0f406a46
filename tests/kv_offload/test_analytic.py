"""LBS paper Eq.1-5 (Table 1) against the paper's worked numbers (Fig.7)."""

import pytest

from systems.kv_offload.analytic import dm_layerwise, dm_lbs, kv_per_token_layer, layers_in_gpu

GiB = 2**30
OPT67 = dict(num_layers=32, num_beams=64, kv=kv_per_token_layer(32, 128, 2), prompt_len=128, gen_len=1920)


def test_kv_of_opt_6_7b_is_16_kib():
    assert OPT67["kv"] == 16 * 1024


def test_eq1_3_layerwise_53012_gib():
    v = dm_layerwise(mem_gpu=7 * GiB, **OPT67) / GiB
    assert v == pytest.approx(53012, rel=1e-3)
    assert v == pytest.approx(53012.453125, abs=1e-6)


@pytest.mark.parametrize("step,lo,hi,paper", [(32, 2010, 2070, 2052), (64, 990, 1050, 1044), (128, 480, 540, 540)])
def test_eq4_5_lbs_ranges(step, lo, hi, paper):
    start = dm_lbs(step=step, **OPT67) / GiB
    end = dm_lbs(step=step, at_step_end=True, **OPT67) / GiB
    assert start == pytest.approx(lo)
    assert end == pytest.approx(hi)
    assert lo <= paper <= hi


def test_eq1_whole_layers():
    # 7 GiB / (64 beams * 1024 tokens * 16 KiB = 1 GiB) -> 7 layers resident; short contexts -> all 32
    assert int(layers_in_gpu(1024, num_layers=32, num_beams=64, kv=16384, mem_gpu=7 * GiB)) == 7
    assert int(layers_in_gpu(16, num_layers=32, num_beams=64, kv=16384, mem_gpu=7 * GiB)) == 32


def test_normalised_volume_matches_fig10a():
    base = dm_layerwise(mem_gpu=7 * GiB, **OPT67)
    shares = [dm_lbs(step=s, **OPT67) / base for s in (32, 64, 128)]
    # paper Fig.10a: 3.7 % / 1.8 % / 0.9 %
    assert [round(100 * x, 1) for x in shares] == pytest.approx([3.8, 1.9, 0.9], abs=0.15)


def test_eq5_counts_the_last_partial_step():
    """gen_len = 100 with step = 32: ceil(100/32) = 4 steps starting at 8, 40, 72, 104 tokens (prompt 8),
    the last one partial. Eq.5 at the step's start: N_beam * N_layer * KV * (8 + 40 + 72 + 104); at its
    end: the steps end at 40, 72, 104 and 108 (capped at prompt + gen). Issue 39: Eq.5 with floor
    instead of ceil passed every test (every test had gen_len a multiple of step). Mutation caught:
    floor; the cap at prompt + gen_len dropped."""
    kw = dict(num_layers=2, num_beams=3, kv=5, prompt_len=8, gen_len=100, step=32)
    assert dm_lbs(**kw) == 3 * 2 * 5 * (8 + 40 + 72 + 104)
    assert dm_lbs(**kw, at_step_end=True) == 3 * 2 * 5 * (40 + 72 + 104 + 108)
