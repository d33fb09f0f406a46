"""GroupCache (our cache over dense per-beam device buffers) vs transformers' DynamicCache, and the
model builder's geometry check."""

import pytest
import torch
from omegaconf import OmegaConf
from transformers import DynamicCache

from systems.kv_offload.cache import DenseKV, GroupCache
from systems.kv_offload.model import ModelGeometryError, build_model

pytestmark = pytest.mark.usefixtures("one_thread")

# Small shapes of each supported architecture (float64, vocab 500) so the comparison is exact.
SHAPES = {
    "opt": dict(num_heads=4, num_kv_heads=4, head_dim=16, hf_config={"word_embed_proj_dim": 64}),
    "llama": dict(num_heads=4, num_kv_heads=2, head_dim=16, hf_config={"rms_norm_eps": 1e-5}),  # GQA
    "qwen2": dict(hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32, hf_config={"tie_word_embeddings": True}),
}


def small_cfg(kind: str, **over):
    base = dict(
        name=f"test-{kind}",
        hf_model_type=kind,
        num_layers=3,
        hidden_size=64,
        intermediate_size=128,
        vocab_size=500,
        max_position=512,
        dtype="float64",
        weights="random",
    )
    base.update(SHAPES[kind])
    base.update(over)
    return OmegaConf.create(base)


@pytest.mark.parametrize("kind", ["opt", "llama", "qwen2"])
def test_group_cache_gives_dynamic_cache_logits(kind):
    torch.manual_seed(1)
    model, g = build_model(small_cfg(kind), seed=3)
    B, P, T = 3, 11, 6
    ids = torch.randint(0, 500, (B, P + T))
    with torch.no_grad():
        dc = DynamicCache(config=model.config)
        ref = [model(input_ids=ids[:, :P], past_key_values=dc).logits[:, -1]]
        ref += [model(input_ids=ids[:, P + t : P + t + 1], past_key_values=dc).logits[:, -1] for t in range(T)]
        kv = torch.full((g.num_layers, 2, B, g.num_kv_heads, P + T, g.head_dim), float("nan"), dtype=torch.float64)
        gc = GroupCache(DenseKV(kv), g.num_layers, 0)
        out = [model(input_ids=ids[:, :P], past_key_values=gc).logits[:, -1]]
        out += [model(input_ids=ids[:, P + t : P + t + 1], past_key_values=gc).logits[:, -1] for t in range(T)]
    for a, b in zip(ref, out):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)
    assert gc.get_seq_length() == P + T
    for layer in range(g.num_layers):  # the buffers hold exactly DynamicCache's K/V
        assert torch.equal(kv[layer, 0], dc.layers[layer].keys)
        assert torch.equal(kv[layer, 1], dc.layers[layer].values)


def test_group_cache_from_loaded_prefix_matches_full_recompute():
    """A cache whose first tokens were copied in (as the engine loads them from the host) decodes
    the same logits as one that computed them."""
    model, g = build_model(small_cfg("llama"), seed=0)
    ids = torch.randint(0, 500, (2, 9))
    with torch.no_grad():
        kv = torch.zeros(g.num_layers, 2, 2, g.num_kv_heads, 9, g.head_dim, dtype=torch.float64)
        gc = GroupCache(DenseKV(kv), g.num_layers, 0)
        full = model(input_ids=ids, past_key_values=gc).logits[:, -1]
        kv2 = torch.zeros_like(kv)
        kv2[..., :8, :] = kv[..., :8, :]
        gc2 = GroupCache(DenseKV(kv2), g.num_layers, 8)
        last = model(input_ids=ids[:, 8:], past_key_values=gc2).logits[:, -1]
    torch.testing.assert_close(last, full, rtol=0, atol=1e-12)


def test_group_cache_overflow_raises():
    model, g = build_model(small_cfg("opt"), seed=0)
    kv = torch.zeros(g.num_layers, 2, 1, g.num_kv_heads, 4, g.head_dim, dtype=torch.float64)
    with torch.no_grad(), pytest.raises(RuntimeError, match="exceed the device buffer's capacity 4"):
        model(input_ids=torch.zeros(1, 5, dtype=torch.long), past_key_values=GroupCache(DenseKV(kv), g.num_layers, 0))


def test_build_model_seeded_and_geometry_checked():
    a, ga = build_model(small_cfg("qwen2"), seed=5)
    b, _ = build_model(small_cfg("qwen2"), seed=5)
    c, _ = build_model(small_cfg("qwen2"), seed=6)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert (ga.num_layers, ga.num_kv_heads, ga.head_dim, ga.dtype_bytes) == (3, 2, 32, 8)
    assert ga.kv_layer_token == 2 * 2 * 32 * 8
    # OPT cannot have fewer KV heads than heads: refused, naming the fields
    with pytest.raises(ModelGeometryError, match="num_kv_heads"):
        build_model(small_cfg("opt", num_kv_heads=2))
    # an hf_config extra that changes the built geometry is caught by the check on the built model
    with pytest.raises(ModelGeometryError, match="kv_heads=4"):
        build_model(small_cfg("llama", hf_config={"num_key_value_heads": 4}))
    with pytest.raises(ValueError, match="hf_model_type='gpt2'"):
        build_model(small_cfg("opt", hf_model_type="gpt2"))
    with pytest.raises(FileNotFoundError, match="not a local checkpoint"):
        build_model(small_cfg("opt", weights="/nonexistent/ckpt"))
