"""Benchmark: one decode step through our cache (GroupCache over a dense device buffer) vs
transformers' DynamicCache, same tiny model (conf/model/tiny-opt.yaml, float32, random weights),
same batch (16 beams) and context (512 cached tokens). Goal: ours <= 1.2x DynamicCache's time.

Run with ``pytest tests/kv_offload/test_torch_bench.py --benchmark-enable``; without it each runs once and
the outputs are still checked against each other."""

import pytest
import torch
from omegaconf import OmegaConf
from transformers import DynamicCache

from systems.kv_offload.cache import DenseKV, GroupCache
from systems.kv_offload.model import build_model
from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")

BATCH, CONTEXT = 16, 512


@pytest.fixture(scope="module")
def setup():
    m = OmegaConf.load(ROOT / "conf/model/tiny-opt.yaml")
    m.pop("defaults")
    model, g = build_model(m, seed=0)
    gen = torch.Generator().manual_seed(0)
    shape = (g.num_layers, 2, BATCH, g.num_kv_heads, CONTEXT, g.head_dim)
    past = torch.randn(shape, generator=gen) * 0.5
    ids = torch.randint(0, m.vocab_size, (BATCH, 1), generator=gen)
    return model, g, past, ids


def _ours(model, g, past, ids):
    buf = torch.empty(*past.shape[:-2], CONTEXT + 1, g.head_dim)
    buf[..., :CONTEXT, :] = past
    cache = GroupCache(DenseKV(buf), g.num_layers, CONTEXT)
    return lambda: model(input_ids=ids, past_key_values=cache, use_cache=True).logits, cache


def _dynamic(model, g, past, ids):
    cache = DynamicCache(config=model.config)
    for layer in range(g.num_layers):
        cache.update(past[layer, 0].clone(), past[layer, 1].clone(), layer)
    return lambda: model(input_ids=ids, past_key_values=cache, use_cache=True).logits, cache


@pytest.mark.benchmark(group="decode-step-16x512")
@pytest.mark.parametrize("which", ["groupcache", "dynamiccache"])
def test_decode_step(benchmark, setup, which):
    model, g, past, ids = setup
    make = _ours if which == "groupcache" else _dynamic

    def fresh():  # a cache holding CONTEXT tokens, not timed
        return (make(model, g, past, ids)[0],), {}

    with torch.no_grad():
        logits = benchmark.pedantic(lambda f: f(), setup=fresh, rounds=20, warmup_rounds=2)
        ref_step, _ = _dynamic(model, g, past, ids)
        torch.testing.assert_close(logits, ref_step(), rtol=1e-5, atol=1e-5)
