"""Search policies, duplication order, speculative truncation; P and S on the simulated backend."""

import numpy as np
import pytest

from harness.backend import Backend
from systems.verifier_search import runner
from systems.verifier_search.beams import Beam, request_seed, stable_hash, step_logit_biases
from systems.verifier_search.search import Search, duplicate, select_survivors
from systems.verifier_search.speculation import copy_keeps, speculative_potential, truncate_keep

SIM = Backend("sim", "sim", True, "test")


def _beams(scores):
    return [Beam(str(i), tokens=[i], step_ends=[1], scores=[s]) for i, s in enumerate(scores)]


def test_beam_search_keeps_global_top_and_refills_n():
    sel = select_survivors("beam_search", _beams([0.1, 0.9, 0.5, 0.7, 0.3, 0.8, 0.2, 0.6]), 8, 4, "last")
    assert [(b.uid, c) for b, c in sel] == [("1", 4), ("5", 4)]
    sel = select_survivors("beam_search", _beams([0.1, 0.9, 0.5]), 16, 4, "last")  # fewer active than n/4
    assert [(b.uid, c) for b, c in sel] == [("1", 6), ("2", 5), ("0", 5)]


def test_selection_independent_of_candidate_order():
    bs = _beams([0.5, 0.5, 0.9, 0.1, 0.5, 0.3, 0.7, 0.5])
    a = select_survivors("beam_search", bs, 8, 4, "last")
    b = select_survivors("beam_search", bs[::-1], 8, 4, "last")
    assert [x.uid for x, _ in a] == [x.uid for x, _ in b] == ["2", "6"]


def test_dvts_argmax_per_subtree():
    sel = select_survivors("dvts", _beams([0.1, 0.9, 0.5, 0.7, 0.3, 0.8, 0.95, 0.6]), 8, 4, "last")
    assert [(b.uid, c) for b, c in sel] == [("1", 4), ("6", 4)]


def test_dynamic_branching_largest_remainder():
    bs = _beams([0.9, 0.6, 0.3, 0.0] + [0.0] * 12)
    sel = select_survivors("dynamic_branching", bs, 16, 4, "last")
    counts = {b.uid: c for b, c in sel}
    assert sum(counts.values()) == 16
    assert counts["0"] == 8 and counts["1"] == 5 and counts["2"] == 3  # 9:6:3 of 16 -> 8, 5.33, 2.67


def test_aggregations():
    b = Beam("0", tokens=[1, 2], step_ends=[1, 2], scores=[0.5, 0.8])
    assert select_survivors("beam_search", [b], 4, 4, "min")[0][0] is b
    from systems.verifier_search.beams import aggregate

    assert aggregate([0.5, 0.8], "prod") == pytest.approx(0.4)
    assert aggregate([0.5, 0.8], "mean") == pytest.approx(0.65)


def test_duplicate_orders_and_names():
    a, b = Beam("a", spec=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), Beam("b")
    base = duplicate([(a, 2), (b, 2)], False, True, 0.85, 0.1, 0, 0, 0)
    pa = duplicate([(a, 2), (b, 2)], True, True, 0.85, 0.1, 0, 0, 0)
    assert [x.uid for x in base] == ["a.0", "b.0", "a.1", "b.1"]
    assert [x.uid for x in pa] == ["a.0", "a.1", "b.0", "b.1"]
    assert sorted((x.uid, tuple(x.spec)) for x in base) == sorted((x.uid, tuple(x.spec)) for x in pa)
    d = {x.uid: x for x in pa}
    assert d["a.0"].spec == a.spec  # the original keeps all speculative tokens
    assert 1 <= len(d["a.1"].spec) <= 9 and d["a.1"].spec == a.spec[: len(d["a.1"].spec)]
    no_s = duplicate([(a, 2)], True, False, 0.85, 0.1, 0, 0, 0)
    assert no_s[1].spec == []


def test_truncation_bounds_and_potential():
    assert truncate_keep(1, 0.9) == 0
    assert truncate_keep(10, 1.0) == 9 and truncate_keep(10, 0.0) == 1 and truncate_keep(10, 0.85) == 8
    assert speculative_potential([0.1, 0.9, 0.5, 0.7], 4) == [1, 4, 2, 3]
    assert speculative_potential([0.2, 0.8], 4) == [2, 4]


def test_copies_keep_a_fraction_r_of_mean_R_and_std_sigma():
    """R's rule (FastTTS §4.1, AE: R = 0.85, sigma = 0.1): a copy keeps round(r x its speculative
    tokens), r ~ N(R, sigma) clipped to [0, 1]. With sigma = 0, r = R: 20, 12 and 7 tokens keep
    round(17.0) = 17, round(10.2) = 10, round(5.95) = 6. With R = 0.3, sigma = 0.05 over 2,000 copies
    of 100 tokens: keeps of mean 30 and standard deviation 5 (sampled: 30.16, 4.91).
    Mutations caught: R's mean and std swapped in the draw (keeps [6, 2, 6]; mean 15.4, std 18.9),
    sigma ignored (std 0)."""
    assert copy_keeps([20, 12, 7], 0.85, 0.0, [1, 2, 3]) == [17, 10, 6]
    keeps = np.array(copy_keeps([100] * 2000, 0.3, 0.05, list(range(2000))))
    assert keeps.mean() == pytest.approx(30, abs=0.5) and keeps.std() == pytest.approx(5, abs=0.4)


def test_the_configured_R_reaches_every_copys_draw_sim(compose_cfg, monkeypatch):
    """system.spec_truncation_ratio is R's mean and system.spec_truncation_std its std, from the
    config through the search settings and Search to each draw of copy_keeps; with sigma = 0 a copy of
    a parent with 10 speculative tokens keeps exactly 0.5 x 10 = 5 of them.
    Mutations caught: mean and std swapped in runner.settings, in Search's call of duplicate, in
    duplicate's call of copy_keeps."""
    import systems.verifier_search.search as search_mod

    seen, orig = [], search_mod.copy_keeps

    def spy(lengths, r_mean, r_std, keys):
        seen.append((r_mean, r_std))
        return orig(lengths, r_mean, r_std, keys)

    monkeypatch.setattr(search_mod, "copy_keeps", spy)
    _sim_search(compose_cfg, "fasttts_s", "system.spec_truncation_ratio=0.5", "system.spec_truncation_std=0")
    assert seen and set(seen) == {(0.5, 0.0)}
    a = Beam("a", spec=list(range(10)))
    kids = duplicate([(a, 3)], True, True, 0.5, 0.0, 0, 0, 0)
    assert [k.spec for k in kids] == [a.spec, a.spec[:5], a.spec[:5]]  # the original keeps all 10


def test_step_bias_gives_wanted_probability():
    """A step ends (delimiter or end token) with probability 1/16 per token, 1/4 of the ends are the
    end token. Mutation caught: the old rule (delimiter at 1/mean on top of the end token: steps of
    89 instead of 100 tokens and 9 instead of 8 steps per path at the paper's 100 / 8)."""
    import math

    V, T = 151936, 0.8
    bd, be = step_logit_biases(V, T, 16, 4)
    wd, we = math.exp(bd / T), math.exp(be / T)
    assert wd / (V - 2 + wd + we) == pytest.approx(3 / 64) and we / (V - 2 + wd + we) == pytest.approx(1 / 64)


def test_simulated_step_model_has_the_configured_means():
    """The simulator's step model (the same probabilities as vLLM's logit biases): steps of
    step_tokens_mean = 100 tokens and paths of steps_per_answer_mean = 8 steps on average."""
    import numpy as np

    from systems.verifier_search.beams import step_probabilities
    from systems.verifier_search.sim import StepModel

    m = StepModel(*step_probabilities(100, 8), 271, 151643, 151936)
    rng = np.random.default_rng(0)
    draws = [m.chunk(rng) for _ in range(40000)]
    assert np.mean([n for n, _ in draws]) == pytest.approx(100, rel=0.02)
    assert 1 / np.mean([e for _, e in draws]) == pytest.approx(8, rel=0.05)


def _sim_search(compose_cfg, system, *extra):
    cfg = compose_cfg(f"system={system}", "backend=sim", "n=16", "workload.num_problems=2", *extra)
    runner.validate(cfg)
    st, problems, prompts, gen, ver, hook, alloc, *_ = runner.build(cfg, SIM, None)
    recs = []
    s = Search(st, gen, ver, on_iteration=recs.append, before_iteration=hook)
    results = [s.run_problem(p.index, prompts[p.index]) for p in problems]
    return recs, results


def test_prefix_aware_order_never_changes_decisions_sim(compose_cfg):
    """P reorders the paths, never the decisions; the scores are distinct (content-keyed synthetic
    PRM), so a score attached to the wrong path would change them. Mutation caught: pairing the
    verifier's values with the owners rotated by one (reversed pairing maps P's order onto the
    baseline's the same way; the next test catches it)."""
    base, rb = _sim_search(compose_cfg, "vllm_tts")
    p, rp = _sim_search(compose_cfg, "fasttts_p")
    assert len(base) == len(p) > 4
    assert [(r.selected, r.selected_keys) for r in base] == [(r.selected, r.selected_keys) for r in p]
    assert [sorted((b.uid, tuple(b.tokens)) for b in r.completions) for r in rb] == [
        sorted((b.uid, tuple(b.tokens)) for b in r.completions) for r in rp
    ]
    last = [b.scores[-1] for r in rb for b in r.completions]
    assert len(set(last)) > len(last) // 2  # distinct scores, not ties


@pytest.mark.parametrize("system", ["vllm_tts", "fasttts_s"])
def test_each_path_carries_its_own_steps_scores_sim(compose_cfg, system):
    """Every completed path's score of step k is the content-keyed PRM score of its own tokens up to
    the end of step k (a causal PRM), with and without S (look-ahead verification sends a whole
    speculative step in the same request). Mutations caught: pairing values with the wrong owners;
    a step end that lets the speculative tokens after it into the scored prefix (look-ahead's
    ``ends.append``, or the verifier scoring its whole input)."""
    from systems.verifier_search.beams import synthetic_prm_score

    recs, results = _sim_search(compose_cfg, system)
    checked = 0
    for r in results:
        for b in r.completions:
            assert b.scores == [synthetic_prm_score(0, r.problem, b.tokens[:e]) for e in b.step_ends]
            checked += len(b.scores)
    assert checked > 50 and (system == "vllm_tts" or sum(x.gen_skipped for x in recs) > 0)


def test_speculation_changes_later_steps_not_first_step_sim(compose_cfg):
    base, _ = _sim_search(compose_cfg, "vllm_tts")
    spec, _ = _sim_search(compose_cfg, "fasttts_s")
    # iteration 0 has no speculative head start: same survivors; later steps carry speculative
    # tokens (sampled in the parent's request, truncated for copies), so paths diverge
    assert base[0].selected == spec[0].selected and base[0].selected_keys == spec[0].selected_keys
    assert sum(r.spec_generated for r in spec) > 0 and sum(r.gen_skipped for r in spec) > 0
    assert any(a.selected_keys != b.selected_keys for a, b in zip(base, spec))


def test_stable_hash_values_as_stored():
    """Content keys and request seeds reach the results (seeds pick the tokens, keys are in the
    iterations table): their values as computed before issue 18's one-update hashing. Mutations
    caught: the trailing separator dropped, the separator added with no parts, str() for repr()."""
    assert stable_hash("req", 0, 1, 2, "3.0") == 18306322195692595194
    assert stable_hash(17, (1, 2, 3)) == 10686136272415888061
    assert stable_hash() == 13020603013274838756
    assert stable_hash("\u00fc") == 18412191626741870818
    assert request_seed(3, 0, 0, "5") == 1138947524


def test_recorded_keys_chain_the_survivors_steps_sim(compose_cfg):
    """``selected_keys`` (the iterations table) holds each survivor's stable content key: the
    ``stable_hash`` chain over its committed steps from the problem's root key, whatever cheaper key
    the score cache uses. A survivor's first child (``uid.0``) starts the next iteration with its
    parent's steps. Mutations caught: recording the score cache's key (``keys[uid][-1]``); chaining
    the survivor's whole tokens instead of its last step; a child not inheriting its parent's key."""
    cfg = compose_cfg("system=fasttts", "backend=sim", "n=16", "workload.num_problems=2")
    runner.validate(cfg)
    st, problems, prompts, gen, ver, hook, *_ = runner.build(cfg, SIM, None)
    starts, recs = {}, []

    def before(it, active, prompt_len):
        starts.update({(it, b.uid): (list(b.tokens), list(b.step_ends)) for b in active})
        if hook:
            hook(it, active, prompt_len)

    s = Search(st, gen, ver, on_iteration=recs.append, before_iteration=before)
    problem = problems[0].index
    s.run_problem(problem, prompts[problem])
    checked = 0
    for r in recs[:-1]:
        for uid, key in zip(r.selected.split(";"), r.selected_keys.split(";")):
            tokens, ends = starts[(r.iteration + 1, f"{uid}.0")]
            want = stable_hash("problem", problem, tuple(prompts[problem]))
            for a, b in zip([0, *ends], ends):
                want = stable_hash(want, tuple(tokens[a:b]))
            assert int(key) == want
            checked += 1
    assert checked >= 3 * 4 and len(ends) >= 3


def test_lineage_returns_the_nearest_ancestors_entry_of_the_current_problem():
    """Mutations caught: the problem change not forgetting the entries; the search stopping at the
    path itself (no ancestors)."""
    from systems.verifier_search.sim import Lineage

    lin = Lineage()
    assert lin.get("3/0.1") is None
    lin.put("3/0", "a")
    lin.put("3/0.1", "b")
    assert [lin.get(p) for p in ("3/0.1.2.0", "3/0.1", "3/0.2", "3/1", "3/10.1")] == ["b", "b", "a", None, None]
    assert lin.get("4/0.1") is None and lin.get("3/0.1") is None  # a new problem forgets the old one's
    lin.put("3/0", "stale")  # not the current problem: not kept
    assert lin.get("4/0") is None


def test_synthetic_prm_continues_from_the_parents_state_when_it_applies(monkeypatch):
    """SyntheticPrm's values are synthetic_prm_values' whatever the path hint: a child continues its
    nearest ancestor's hash state only when its tokens start with the ones hashed and it wants no
    score before them (a grandchild does), else it hashes from the start (a child leaving its
    parent's tokens before the parent's last scored end; a sibling wanting an earlier step).
    Mutations caught: the tokens not compared (continuing past a different prefix); always hashing
    from the start."""
    from systems.verifier_search import sim
    from systems.verifier_search.beams import synthetic_prm_values

    prm = sim.SyntheticPrm(7)
    parent = list(range(100, 130))
    child = parent[:20] + list(range(500, 515))
    grandchild = child + list(range(900, 905))
    cases = [
        (parent, [10, 20, 30], [True] * 3, "1/0"),
        (child, [10, 20, 32, 35], [False, False, True, True], "1/0.2"),
        (grandchild, [10, 20, 32, 35, 40], [False, False, False, False, True], "1/0.2.1"),
        (grandchild, [10, 20, 32, 35, 40], [False, True, True, True, True], "1/0.2.3"),
    ]
    want = [synthetic_prm_values(7, 1, tokens, ends, computed) for tokens, ends, computed, _ in cases]
    starts = []
    read = sim._read_scores
    monkeypatch.setattr(sim, "_read_scores", lambda h, t, at, *a: starts.append(at) or read(h, t, at, *a))
    assert [prm.values(1, *case) for case in cases] == want
    assert starts == [0, 0, 35, 0]


def test_synthetic_prm_values_as_stored():
    """The synthetic PRM's scores reach the results (selection, completions' scores): their values as
    computed when the token ids were packed by ``array("q")``. Mutations caught: big-endian ids
    (``>q``); the ids from the hashed position + 1."""
    from systems.verifier_search.beams import synthetic_prm_values

    assert synthetic_prm_values(3, 2, [5, 151643, 271, 70000, 1], [2, 3, 5], [True, False, True]) == [
        0.4302103007807099,
        None,
        0.8390267005762568,
    ]


def test_batched_stable_hashes_are_stable_hash():
    """Request seeds and truncation keys hashed with their shared parts once are the one-at-a-time
    values. Mutations caught: the last part's separator dropped; the shared parts' trailing separator
    dropped."""
    from systems.verifier_search.beams import request_seeds, stable_hashes

    uids = ["0", "3.1", "12.0.2", "\u00fc"]
    assert stable_hashes(("trunc", 0, 1, 2), uids) == [stable_hash("trunc", 0, 1, 2, u) for u in uids]
    assert stable_hashes((), [5]) == [stable_hash(5)]
    assert request_seeds(3, 0, 0, ["5", "1.2"]) == [request_seed(3, 0, 0, "5"), request_seed(3, 0, 0, "1.2")]
    assert request_seeds(3, 0, 0, ["5"]) == [1138947524]


def _lookahead_copies(compose_cfg, monkeypatch, *extra):
    """Copies (child c >= 1) of survivors sent to the verifier with a look-ahead step, in the iteration
    after (not the last): (copy uid, whether the verifier got it, its score, the survivor's
    look-ahead score, whether its step is the survivor's look-ahead step, its own PRM score, whether
    the survivor's own step was scored first in that call: look-ahead-scored as the artifact has it)."""
    import systems.verifier_search.search as search_mod
    from systems.verifier_search.beams import synthetic_prm_score

    cfg = compose_cfg("system=fasttts_s", "backend=sim", "n=64", "workload.num_problems=3", *extra)
    runner.validate(cfg)
    st, problems, prompts, gen, ver, hook, *_ = runner.build(cfg, SIM, None)
    iters, cur, scored = [], {"verified": {}, "cands": {}}, set()
    real_verify, real_select = ver.verify, search_mod.select_survivors

    def verify(pidx, items, paths=None):
        out = real_verify(pidx, items, paths)
        for (toks, ends), path in zip(items, paths):  # path "p/uid"
            # the artifact's look-ahead-scored path: its step was first scored now, with the next one
            new = len(ends) > 1 and (pidx, tuple(toks[: ends[-2]])) not in scored
            cur["verified"][path.split("/")[1]] = (toks, ends, new)
        scored.update((pidx, tuple(toks[:e])) for toks, ends in items for e in ends)
        return out

    def select(policy, cands, *a):
        cur["cands"] = {b.uid: b for b in cands}
        return real_select(policy, cands, *a)

    def on_iteration(rec):
        iters.append((rec, dict(cur)))
        cur.update(verified={}, cands={})

    monkeypatch.setattr(ver, "verify", verify)
    monkeypatch.setattr(search_mod, "select_survivors", select)
    s = Search(st, gen, ver, on_iteration=on_iteration, before_iteration=hook)
    for p in problems:
        s.run_problem(p.index, prompts[p.index])
    out = []
    for (rec, now), (nxt, after) in zip(iters, iters[1:]):
        if nxt.problem != rec.problem or nxt.iteration == st.num_iterations - 1:
            continue
        for uid in rec.selected.split(";"):
            toks, ends, new = now["verified"].get(uid, ([], [], False))
            if len(ends) != rec.iteration + 2:  # no look-ahead in this iteration
                continue
            la = toks[: ends[-1]]
            la_score = synthetic_prm_score(int(cfg.seed), rec.problem, la)
            for cuid, b in after["cands"].items():
                if cuid.rsplit(".", 1)[0] == uid and not cuid.endswith(".0"):
                    own = synthetic_prm_score(int(cfg.seed), rec.problem, b.tokens)
                    out.append((cuid, cuid in after["verified"], b.scores[-1], la_score, b.tokens == la, own, new))
    return out


def test_ae_compat_lookahead_copies_inherit_the_survivors_score_sim(compose_cfg, monkeypatch):
    """system.ae_compat_lookahead (the FastTTS artifact's behaviour, off by default): on, every copy
    of a look-ahead-scored survivor makes no verifier call in the next iteration and carries the
    survivor's look-ahead score, also when it generated a different step; off, a copy with a
    different step is verified and carries its own step's score. Mutations caught: the setting not
    passed by runner.settings (or ignored by the search: no copy inherits); the copies sent to the
    verifier all the same; the inherited score not put on the copy (its own, or none); copies of a
    survivor whose own step was scored before (only its look-ahead sent) inheriting too."""
    on = _lookahead_copies(compose_cfg, monkeypatch, "system.ae_compat_lookahead=true")
    inherit, other = [c for c in on if c[6]], [c for c in on if not c[6] and not c[4]]
    assert len([c for c in inherit if not c[4]]) >= 10 and len(other) >= 5
    assert all(not verified and score == la for _, verified, score, la, *_ in inherit)
    assert all(own != la for _, _, _, la, same, own, _ in inherit if not same)  # not their own score
    # a survivor whose step was scored before (the artifact skips its verifier call): no inheritance
    assert all(verified and score == own for _, verified, score, _, _, own, _ in other)
    off = _lookahead_copies(compose_cfg, monkeypatch)
    differ = [c for c in off if not c[4]]
    assert len(differ) >= 10
    assert all(verified and score == own != la for _, verified, score, la, _, own, _ in differ)
