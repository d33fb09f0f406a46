"""The engine's lean decode path (systems/kv_offload/decoder.py) computes the architecture's
arithmetic: its logits equal transformers' own forward (float64, CPU) for OPT, LLaMA (grouped-query
attention) and Qwen2, token after token, with the K/V it writes through the engine's cache equal too."""

import pytest
import torch
from omegaconf import OmegaConf

from systems.kv_offload.cache import DenseKV, GroupCache
from systems.kv_offload.decoder import lean_decoder
from systems.kv_offload.model import build_model
from tests.conftest import ROOT

SMALL = dict(num_layers=2, hidden_size=64, num_heads=4, head_dim=16, intermediate_size=96, vocab_size=211)


def _model(name: str, **over):
    m = OmegaConf.load(ROOT / f"conf/model/{name}.yaml")
    m.pop("defaults")
    m.update({**SMALL, "num_kv_heads": 2 if name != "tiny-opt" else 4, **over})
    if name == "tiny-opt":
        m.hf_config.word_embed_proj_dim = SMALL["hidden_size"]
    model, geom = build_model(m, seed=3, dtype="float64")
    return model, geom


def _cache(geom, batch: int, cap: int):
    kv = torch.zeros(geom.num_layers, 2, batch, geom.num_kv_heads, cap, geom.head_dim, dtype=torch.float64)
    return GroupCache(DenseKV(kv), geom.num_layers, 0), kv


def prefilled_pair(model, geom):
    """Two caches (with their buffers) of 3 beams, each after transformers' prefill of the same 7
    random tokens, and 3 random next tokens: one side for transformers, one for the path tested."""
    torch.manual_seed(0)
    prompt = torch.randint(0, SMALL["vocab_size"], (3, 7))
    caches = [_cache(geom, 3, 12) for _ in range(2)]
    with torch.no_grad():
        for cache, _ in caches:
            model(input_ids=prompt, past_key_values=cache, use_cache=True)
    return caches, torch.randint(0, SMALL["vocab_size"], (3,))


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "tiny-qwen2"])
def test_lean_decode_gives_transformers_logits_and_kv(name):
    """Prefill 7 tokens of 3 beams through transformers, then 5 decode tokens both ways, each on its
    own cache. Mutations caught: OPT's query scaled after attention instead of before; the learned
    positions without their offset of 2; the rotary embedding at position n + 1; GQA's K/V not
    repeated (a shape error); the MLP residual added twice."""
    model, geom = _model(name)
    dec = lean_decoder(model)
    assert dec is not None
    caches, y = prefilled_pair(model, geom)
    with torch.no_grad():
        for _ in range(5):
            want = model(input_ids=y[:, None], past_key_values=caches[0][0], use_cache=True).logits
            got = dec(y, caches[1][0])
            assert got.shape == want.shape == (3, 1, SMALL["vocab_size"])
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), (got - want).abs().max()
            y = want[:, -1].argmax(-1)
    assert torch.allclose(caches[0][1], caches[1][1], rtol=1e-12, atol=1e-12)
    assert caches[1][0].get_seq_length() == 12


def test_a_post_norm_opt_decodes_through_transformers():
    """OPT-350m's post-norm layout is not the lean path's: None, so the engine keeps transformers'."""
    model, _ = _model("tiny-opt", hf_config={"word_embed_proj_dim": 64, "do_layer_norm_before": False})
    assert lean_decoder(model) is None
