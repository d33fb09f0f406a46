"""Teacher forcing and the divergence report (systems/kv_offload/divergence.py, issue 37 point 3): a
run repeated teacher-forced on another's tree scores the same beams and tokens; the report's
differences, token flips and selection margins are the worked numbers; bad pairs and bad settings
are refused before any work."""

import copy
import json
import math

import pytest
import torch

from harness.errors import ConfigError
from harness.run import run
from systems.kv_offload import divergence
from systems.kv_offload.sampling import draw, draw_margin
from tests.kv_offload.test_torch_engine import BUDGET, MODEL, WORK

pytestmark = pytest.mark.usefixtures("one_thread")


def _doc(cums, kept, flips=None, margins=None, tokens=None):
    """A beam_tree.json with 4 beams (beam size 2, width 2), one beam log entry per step."""
    log = []
    for i, c in enumerate(cums):
        uids = [str(4 * i + k + 1) for k in range(4)]
        entry = {"step": i, "uid": uids, "tokens": tokens or [[k] for k in range(4)], "cum_logprob": c}
        if flips is not None:
            entry["token_flips"], entry["flip_margin"] = flips[i], margins[i]
        log.append(entry)
    return {"beams": 4, "beam_width": 2, "steps": [{"step": 0, "kept": kept}], "beam_log": log}


def test_compare_reports_the_worked_numbers():
    """A kept beams 1 and 2 (-1.0, -1.1 against -1.2, -3.0); B scores beam 2 at -1.25, so B's scores
    keep 1 and 3: two selection flips, margins +0.1 / -0.05 (beam 2) and -0.1 / +0.05 (beam 3); the
    last step differs by 0.3 at most; one token flip, margin 0.002. Mutations caught: margins
    against the k-th kept beam instead of the best beam left out; flips counted from A's log."""
    a = _doc([[-1.0, -1.1, -1.2, -3.0], [-2.0, -2.1, -2.2, -2.3]], ["1", "2"])
    b = _doc(
        [[-1.0, -1.25, -1.2, -3.0], [-2.0, -2.4, -2.2, -2.3]],
        ["1", "2"],
        flips=[[0, 1, 0, 0], [0, 0, 0, 0]],
        margins=[[0, 0.002, 0, 0], [0, 0, 0, 0]],
    )
    out = divergence.compare(a, b)
    assert out["max_abs_cum_logprob_diff"] == pytest.approx(0.3)
    assert [s["max_abs_cum_logprob_diff"] for s in out["steps"]] == pytest.approx([0.15, 0.3])
    assert (out["token_flips"], out["max_flip_margin"], out["selection_flips"]) == (1, 0.002, 2)
    f2, f3 = out["steps"][0]["selection_flips"]
    assert (f2["uid"], f2["kept_by"], f3["uid"], f3["kept_by"]) == ("2", "a", "3", "b")
    assert (f2["margin_a"], f2["margin_b"]) == pytest.approx((0.1, -0.05))
    assert (f3["margin_a"], f3["margin_b"]) == pytest.approx((-0.1, 0.05))
    assert not out["identical"] and divergence.compare(a, copy.deepcopy(a))["identical"]


def test_a_pair_that_is_no_forced_rerun_is_refused(tmp_path):
    a = _doc([[-1.0, -1.1, -1.2, -3.0]], ["1", "2"])
    b = _doc([[-1.0, -1.1, -1.2, -3.0]], ["1", "2"], tokens=[[9], [1], [2], [3]])
    with pytest.raises(divergence.NotAPair, match="did not decode run A's beams and tokens"):
        divergence.compare(a, b)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "beam_tree.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps({"steps": []}))
    assert divergence.main([str(tmp_path / "a"), str(tmp_path / "b.json")]) == 2


def test_draw_margin_is_the_distance_outside_the_forced_tokens_interval():
    """Probabilities 0.5 / 0.3 / 0.2 and u = 0.9 draw token 2; token 0's interval [0, 0.5) is 0.4
    away, token 1's [0.5, 0.8) 0.1, token 2's own 0."""
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * 3, dtype=torch.float64))
    u = torch.tensor([0.9] * 3, dtype=torch.float64)
    assert draw(logp, u).tolist() == [2, 2, 2]
    got = draw_margin(logp, u, torch.tensor([0, 1, 2])).tolist()
    assert got == pytest.approx([0.4, 0.1, 0.0])


def _run(compose_cfg, out, system, *extra):
    over = ["backend=torch", "backend.device=cpu", f"system={system}", *MODEL, *WORK, *extra]
    if system != "in_gpu":
        over.append(f"kv_budget={BUDGET}")
    rec = run(compose_cfg(*over, output_dir=out))
    assert rec["status"] == "ok", rec.get("message")
    return divergence.load(out)


def test_a_teacher_forced_rerun_scores_the_same_tree(compose_cfg, tmp_path):
    """LBS teacher-forced on in_gpu's tree (float64): identical scores, no flips. In float32 through
    transformers' forward instead of the lean path, the same tokens score differently (by less than
    1e-3): what the report measures. A token edited in the forced tree is decoded and counted as a
    flip. Mutations caught: the forced tokens of the next step decoded (``self.forced[i + 1]``, which
    names other beams); the engine's own draws decoded instead of the forced tokens."""
    a = _run(compose_cfg, tmp_path / "a", "in_gpu")
    assert a["decode_path"].startswith("lean") and len(a["beam_log"]) == 4
    forced = ["system.teacher_force=true", f"system.replay_tree={tmp_path / 'a'}"]
    b = _run(compose_cfg, tmp_path / "b", "lbs", *forced)
    out = divergence.compare(a, b)
    assert out["identical"] and out["b"]["scheduler"] == "lbs"
    # forced tokens that are not the engine's own draw are decoded all the same, and counted as flips
    edited = copy.deepcopy(a)
    tok = edited["beam_log"][0]["tokens"][0]
    tok[3] = (tok[3] + 1) % 1000
    (tmp_path / "edited").mkdir()
    (tmp_path / "edited" / "beam_tree.json").write_text(json.dumps(edited))
    e = _run(
        compose_cfg, tmp_path / "e", "lbs", "system.teacher_force=true", f"system.replay_tree={tmp_path / 'edited'}"
    )
    assert e["beam_log"][0]["tokens"] == edited["beam_log"][0]["tokens"]
    flips = e["beam_log"][0]["token_flips"]  # the edited token, and later ones drawn after another context
    assert 1 <= flips[0] <= 5 and flips[1:] == [0] * 7 and e["beam_log"][0]["flip_margin"][0] > 0
    a32 = _run(compose_cfg, tmp_path / "a32", "in_gpu", "model.dtype=float32")
    b32 = _run(
        compose_cfg,
        tmp_path / "b32",
        "lbs",
        "model.dtype=float32",
        "system.decode_path=transformers",
        "system.teacher_force=true",
        f"system.replay_tree={tmp_path / 'a32'}",
    )
    out = divergence.compare(a32, b32)
    assert 0 < out["max_abs_cum_logprob_diff"] < 1e-3 and not math.isnan(out["max_flip_margin"])


def test_teacher_forcing_without_a_tree_or_on_the_simulator_is_bad_input(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match="false unless system.replay_tree names a recorded tree"):
        run(compose_cfg("system=lbs", "backend=torch", *MODEL, *WORK, "system.teacher_force=true", output_dir=tmp_path))
    _run(compose_cfg, tmp_path / "a", "in_gpu")
    forced = ["system.teacher_force=true", f"system.replay_tree={tmp_path / 'a'}"]
    with pytest.raises(ConfigError, match="false on the simulated backend: it decodes no tokens"):
        run(compose_cfg("system=lbs", "backend=sim", *MODEL, *WORK, *forced, output_dir=tmp_path / "sim"))
    assert not (tmp_path / "sim" / "run.json").exists()


def test_forcing_a_tree_without_tokens_is_bad_input(compose_cfg, tmp_path):
    """A simulated run's tree holds kept beams only."""
    sim = ["system=lbs", *MODEL, *WORK, f"kv_budget={BUDGET}"]
    assert run(compose_cfg(*sim, "backend=sim", output_dir=tmp_path / "sim"))["status"] == "ok"
    forced = [
        "backend=torch",
        "backend.device=cpu",
        "system.teacher_force=true",
        f"system.replay_tree={tmp_path / 'sim'}",
    ]
    with pytest.raises(ConfigError, match="holds no tokens"):
        run(compose_cfg(*sim, *forced, output_dir=tmp_path / "forced"))
