"""The piecewise decode path (systems/kv_offload/piecewise.py): the pieces a GPU captures as CUDA graphs,
run eagerly on the CPU, compute the architecture's arithmetic at a padded batch size; padded rows
never reach a beam's; every scheduler searches the same tree through it; bad settings exit before any
work. (The graphs themselves need a CUDA GPU: scripts/gpu_engine.py measures them.)"""

import pytest
import torch

from harness.errors import ConfigError
from harness.run import run
from systems.kv_offload.decoder import lean_decoder
from systems.kv_offload.piecewise import PiecewiseDecoder, capture_sizes
from tests.kv_offload.test_decoder import SMALL, _cache, _model, prefilled_pair
from tests.kv_offload.test_torch_engine import BUDGET, MODEL, WORK

pytestmark = pytest.mark.usefixtures("one_thread")


def _logp(logits):
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "tiny-qwen2"])
def test_piecewise_gives_transformers_log_probs_and_kv_at_a_padded_size(name):
    """3 beams run at the captured size 4, 5 tokens after a 7-token prefill: log-probs and K/V equal
    transformers' own forward (float64). Mutations caught: a piece reading the previous layer's
    attention output (``o[i - 2]``); the position not advanced (``pos`` filled once); the K/V of the
    padded rows written to the cache (a shape error); the last piece without its final norm."""
    model, geom = _model(name)
    pw = PiecewiseDecoder(lean_decoder(model), 4, _logp, graphs=False)
    assert pw.padded(3) == 4
    caches, y = prefilled_pair(model, geom)
    with torch.no_grad():
        for _ in range(5):
            want = _logp(model(input_ids=y[:, None], past_key_values=caches[0][0], use_cache=True).logits[:, -1])
            got = pw(y, caches[1][0])
            assert got.shape == want.shape == (3, SMALL["vocab_size"])
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), (got - want).abs().max()
            y = want.argmax(-1)
    assert torch.allclose(caches[0][1], caches[1][1], rtol=1e-12, atol=1e-12)


def test_padded_rows_never_reach_a_beams_row():
    """The same 3 beams at size 4 and padded to 8, whose padded rows hold other tokens: identical
    log-probs, bit for bit. (Mutation caught: the token ids copied whole instead of ``[:B]``, which
    fails on the shape; LayerNorm over the batch instead of the hidden size would mix rows.)"""
    model, geom = _model("tiny-llama")
    dec = lean_decoder(model)
    a, b = PiecewiseDecoder(dec, 4, _logp, graphs=False), PiecewiseDecoder(dec, 3, _logp, graphs=False, pad_to=8)
    assert b.sizes == [8] and b.padded(1) == 8
    b.pieces(3).ids.copy_(torch.arange(100, 108))  # what an earlier, larger group left
    ca, cb = _cache(geom, 3, 6)[0], _cache(geom, 3, 6)[0]
    y = torch.tensor([5, 17, 42])
    for _ in range(4):
        la, lb = a(y, ca).clone(), b(y, cb).clone()
        assert torch.equal(la, lb)
        y = la.argmax(-1)


def test_capture_sizes_and_a_batch_beyond_them():
    assert capture_sizes(1) == [1]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    model, _ = _model("tiny-opt")
    pw = PiecewiseDecoder(lean_decoder(model), 6, _logp, graphs=False)
    with pytest.raises(ValueError, match="a batch of 7 beams exceeds the largest captured size 6"):
        pw.padded(7)
    with pytest.raises(ValueError, match="pad_to=4 is below the largest batch 6"):
        PiecewiseDecoder(lean_decoder(model), 6, _logp, graphs=False, pad_to=4)


def _record(compose_cfg, tmp_path, system, *extra):
    over = ["backend=torch", "backend.device=cpu", f"system={system}", *MODEL, *WORK, f"kv_budget={BUDGET}", *extra]
    rec = run(compose_cfg(*over, output_dir=tmp_path / f"{system}{len(list(tmp_path.iterdir()))}"))
    assert rec["status"] == "ok", rec.get("message")
    return rec


@pytest.mark.parametrize("system", ["layerwise", "lbs"])
def test_every_scheduler_searches_the_same_tree_through_the_piecewise_path(compose_cfg, tmp_path, system):
    """The lean path and the piecewise path (and its batch-invariant mode, LBS groups of 2 to 4 beams
    all padded to 8) give the same tokens, the same best path and the same bytes, and the record
    names the path taken."""
    lean = _record(compose_cfg, tmp_path, system, "system.decode_path=lean")
    assert lean["summary"]["decode_path"].startswith("lean")
    runs = [_record(compose_cfg, tmp_path, system, "system.decode_path=piecewise")]
    if system == "lbs":
        runs.append(
            _record(compose_cfg, tmp_path, system, "system.decode_path=piecewise", "system.batch_invariant=true")
        )
        assert "every group padded to 8" in runs[-1]["summary"]["decode_path"]
    for r in runs:
        assert r["summary"]["decode_path"].startswith("piecewise (systems/kv_offload/piecewise.py: eager")
        assert r["best_tokens"] == lean["best_tokens"]
        assert r["summary"]["best_cum_logprob"] == pytest.approx(lean["summary"]["best_cum_logprob"], abs=1e-9)
        for key in ("h2d_bytes", "d2h_bytes"):
            assert r["summary"][key] == lean["summary"][key], key


@pytest.mark.parametrize(
    "extra,message",
    [
        (["system.decode_path=graphs"], "system.decode_path='graphs' is not allowed: auto | lean | piecewise"),
        (
            ["system.decode_path=piecewise", "model.hf_config.do_layer_norm_before=false"],
            "auto or transformers for tiny-opt",
        ),
        (["system.batch_invariant=true"], "false unless decode_path=piecewise"),
        (["system.decode_path=lean", "system.batch_invariant=true"], "false unless decode_path=piecewise"),
    ],
)
def test_a_decode_setting_the_model_or_device_cannot_take_exits_before_any_work(compose_cfg, tmp_path, extra, message):
    """backend.device=cpu: ``auto`` is the lean path there, so batch_invariant alone has nothing to pad."""
    cfg = compose_cfg("system=lbs", "backend=torch", "backend.device=cpu", *MODEL, *WORK, *extra, output_dir=tmp_path)
    with pytest.raises(ConfigError, match=message):
        run(cfg)
    assert not (tmp_path / "run.json").exists()


def test_the_engine_refuses_what_the_runner_refuses():
    """The engine's constructor and the runner's check share one rule
    (``decoder.decode_path_problem``): the same settings fail both, with the same words."""
    from systems.kv_offload.torch_engine import TorchExecutor

    model, geom = _model("tiny-opt")
    for kw, message in (
        (dict(decode_path="graphs"), "decode_path='graphs' is not allowed: auto | lean | piecewise | transformers"),
        (dict(decode_path="lean", batch_invariant=True), "batch_invariant=True is not allowed: false unless"),
    ):
        with pytest.raises(ValueError, match=message):
            TorchExecutor(None, "cpu", model=(model, geom), max_beams=4, **kw)
