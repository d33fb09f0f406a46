"""Generator + verifier test-time search (search-and-learn semantics, FastTTS §1) with the
FastTTS techniques S (speculative beam extension, §4.1) and P (prefix-aware order, §4.2).

Plain Python: the engines (real vLLM in ``vllm_engine.py``, simulated in ``sim.py``) only execute
``GenRequest`` lists and verifier items; every search decision is made here, identically for both.

Per iteration (search-and-learn ``beam_search``): (1) every active path gets one step (a path whose
speculative tokens already hold a complete step consumes it instead: no generator call); (2) the
verifier scores the new step (with look-ahead verification, a complete speculative step is scored
in the same request); (3) paths ending (end token, step cap, max_model_len, last iteration) are
collected; (4) the policy selects survivors among the rest by aggregated score and (5) duplicates
them back to ``n`` paths. The last iteration decodes without the step delimiter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from systems.verifier_search.beams import Beam, aggregate, request_seeds, stable_hash, stable_hashes
from systems.verifier_search.protocol import Generator, GenRequest, Verifier, VerifierOutput
from systems.verifier_search.speculation import SpeculationPolicy, copy_keeps, speculative_potential
from systems.verifier_search.step_lengths import head_start


@dataclass
class SearchSettings:
    """Search knobs (FastTTS §1.4). Token counts in tokens. ``delimiter_ids`` / ``eos_ids``: every
    token id ending a step / a path (a real tokenizer has several "\n\n" tokens); empty = the single
    ``delimiter_id`` / ``eos_id``."""

    search: str = "beam_search"
    n: int = 64
    beam_width: int = 4
    num_iterations: int = 10
    max_step_tokens: int = 2048
    max_model_len: int = 4096
    agg: str = "last"
    seed: int = 0
    speculative: bool = False
    prefix_aware: bool = False
    r_mean: float = 0.85
    r_std: float = 0.1
    spec_max_beams: int = 256
    lookahead: bool = True
    ae_compat_lookahead: bool = False  # the FastTTS artifact's look-ahead score copy (TTSSystem.ae_compat_lookahead)
    vg_short_iterations: int = 3
    vg_short_tokens: int = 64
    # before_verifier: a path's completion time excludes its completing iteration's verifier call
    # (the FastTTS artifact, artifact.py) | after_verifier: includes it
    completion_stamp: str = "before_verifier"
    score_source: str = "synthetic"  # what the verifier's values are (recorded): prm | synthetic
    delimiter_id: int = 271
    eos_id: int = 151643
    delimiter_ids: Tuple[int, ...] = ()
    eos_ids: Tuple[int, ...] = ()

    def __post_init__(self):
        self.delimiter_ids = tuple(self.delimiter_ids) or (self.delimiter_id,)
        self.eos_ids = tuple(self.eos_ids) or (self.eos_id,)


@dataclass
class IterationRecord:
    problem: int
    iteration: int
    active: int
    gen_requests: int
    gen_skipped: int  # paths whose step came from speculation (no generator call)
    ver_requests: int
    gen_time_s: float
    ver_time_s: float
    gen_prompt_tokens: int
    gen_cached_tokens: int
    ver_prompt_tokens: int
    ver_cached_tokens: int
    new_tokens: int  # step tokens committed this iteration (all paths)
    spec_generated: int
    spec_kept: int
    completed: int
    selected: str  # survivors' uids in selection order, ";"-joined
    selected_keys: str  # their content hashes (committed tokens), ";"-joined
    gen_cpu_s: Optional[float] = None  # real engines: process CPU seconds (protocol.GenResult.cpu_s)
    ver_cpu_s: Optional[float] = None


@dataclass
class ProblemResult:
    problem: int
    completions: List[Beam]
    iterations: List[IterationRecord]
    gen_time_s: float
    ver_time_s: float

    @property
    def latency_s(self) -> float:
        return self.gen_time_s + self.ver_time_s


# ---------------------------------------------------------------------------------------- selection
def _by_score(agg: str):
    return lambda b: (-aggregate(b.scores, agg), b.uid)


def _top_k(cands: Sequence[Beam], n: int, beam_width: int, agg: str) -> List[Tuple[Beam, int]]:
    """beam_search / vg_search: global top n // beam_width; children refill n (earliest get the
    remainder, search-and-learn ``(active * (n // k + 1))[:n]``)."""
    top = sorted(cands, key=_by_score(agg))[: max(1, n // beam_width)]
    reps = [n // len(top) + (1 if i < n % len(top) else 0) for i in range(len(top))]
    return list(zip(top, reps))


def _proportional(cands: Sequence[Beam], n: int, beam_width: int, agg: str) -> List[Tuple[Beam, int]]:
    """dynamic_branching: the top-k survivors; children proportional to s - min(s) + 1e-6 with
    largest-remainder rounding to n."""
    top = sorted(cands, key=_by_score(agg))[: max(1, n // beam_width)]
    s = np.array([aggregate(b.scores, agg) for b in top])
    w = s - s.min() + 1e-6
    share = w / w.sum() * n
    base = np.floor(share).astype(int)
    rem = n - int(base.sum())
    order = sorted(range(len(top)), key=lambda i: (-(share[i] - base[i]), i))
    for i in order[:rem]:
        base[i] += 1
    return [(b, int(c)) for b, c in zip(top, base) if c > 0]


def _per_subtree(cands: Sequence[Beam], n: int, beam_width: int, agg: str) -> List[Tuple[Beam, int]]:
    """dvts: subtrees = root index // beam_width; argmax inside each subtree, beam_width children."""
    groups: Dict[int, List[Beam]] = {}
    for b in cands:
        groups.setdefault(int(b.uid.split(".")[0]) // beam_width, []).append(b)
    key = _by_score(agg)
    return [(min(groups[g], key=key), beam_width) for g in sorted(groups)]


# ``system.search`` -> how it picks survivors and their children (best_of_n never selects)
SELECTIONS = {"beam_search": _top_k, "vg_search": _top_k, "dynamic_branching": _proportional, "dvts": _per_subtree}


def select_survivors(policy: str, cands: Sequence[Beam], n: int, beam_width: int, agg: str) -> List[Tuple[Beam, int]]:
    """Pick survivors and their number of children (:data:`SELECTIONS`).

    Args: policy (beam_search | vg_search | dynamic_branching | dvts), ``cands`` the active paths
        (scored), ``n`` paths to refill, ``beam_width`` branching factor, ``agg`` score aggregation.
    Returns: [(survivor, children)] in selection order. Ties in score break by uid, so the result
        does not depend on the order of ``cands``.
    """
    if not cands:
        return []
    return SELECTIONS[policy](cands, n, beam_width, agg)


def duplicate(
    selected: List[Tuple[Beam, int]],
    prefix_aware: bool,
    speculative: bool,
    r_mean: float,
    r_std: float,
    seed: int,
    problem: int,
    iteration: int,
) -> List[Beam]:
    """Children of the survivors, in scheduling order.

    Without P (the vLLM baseline, AE): survivors first, then their copies round by round
    ``[A, B, C, A', B', C', ...]``. With P (§4.2): each survivor's children adjacent ``[A, A', B,
    B', ...]`` so siblings share the prefix cache; parents keep their relative order. Child c of
    parent u is named ``u.c`` in both orders. Child 0 keeps all speculative tokens; with S a copy
    keeps a fraction of them (``speculation.copy_keeps``, §4.1 Alg. 1) drawn with its name as key."""
    if prefix_aware:
        order = [(p, c) for p, cnt in selected for c in range(cnt)]
    else:
        order = [(p, c) for c in range(max((cnt for _, cnt in selected), default=0)) for p, cnt in selected if c < cnt]
    uids = [f"{p.uid}.{c}" for p, c in order]
    cut = [i for i, (p, c) in enumerate(order) if speculative and c > 0 and p.spec]
    keeps = dict(
        zip(
            cut,
            copy_keeps(
                [len(order[i][0].spec) for i in cut],
                r_mean,
                r_std,
                stable_hashes(("trunc", seed, problem, iteration), [uids[i] for i in cut]),
            ),
        )
    )
    out: List[Beam] = []
    for i, ((p, c), uid) in enumerate(zip(order, uids)):
        if c == 0 or not p.spec:
            out.append(p.copy_as(uid))
        else:
            out.append(p.copy_as(uid, spec=p.spec[: keeps[i]] if speculative else []))
    return out


def _first_boundary(tokens: List[int], ends: AbstractSet[int]) -> Optional[int]:
    """Length of the first step in ``tokens`` (through its first delimiter or end token), or None.
    C-level scans, not a Python loop over the tokens (several times faster): ``isdisjoint`` answers
    the common case, no boundary, and else ``list.index`` finds each boundary id present."""
    if ends.isdisjoint(tokens):
        return None
    return min(tokens.index(t) for t in ends if t in tokens) + 1


def _step_key(prev: int, step: Sequence[int]) -> int:
    """The score cache's key of a path after ``step`` given ``prev``, its key before: a Python hash of
    both (the same in every process for int tokens; 64 bits, as the stable key, ``beams.stable_hash``,
    which costs over ten times more: the repr of the step's tokens)."""
    return hash((prev, tuple(step)))


# ---------------------------------------------------------------------------------------- loop
class Search:
    """Runs the search for one problem at a time on a generator and a verifier.

    ``generator`` and ``verifier`` follow ``protocol.Generator`` / ``protocol.Verifier``; the
    generator gets each iteration's :class:`~systems.verifier_search.speculation.SpeculationPolicy`. The score
    cache (content key -> selection score) makes a path whose steps were all scored before skip the
    verifier (look-ahead verification). With ``ae_compat_lookahead`` (the FastTTS artifact's
    behaviour, ``FastTTS-AE/search/beam_search.py``, ``_beam_search``) the copies of a survivor whose
    next step was look-ahead-scored take that score for the step they generate instead (a different
    step: they keep only part of the speculative tokens) and skip the verifier in that iteration.
    """

    def __init__(
        self,
        st: SearchSettings,
        generator: Generator,
        verifier: Verifier,
        on_iteration: Optional[Callable] = None,
        before_iteration: Optional[Callable] = None,
    ):
        self.st, self.gen, self.ver, self.on_iteration = st, generator, verifier, on_iteration
        self.before_iteration = before_iteration  # (iteration, active paths, prompt length) -> None

    def _cap(self, it: int) -> int:
        st = self.st
        if st.search == "vg_search" and it < st.vg_short_iterations:
            return min(st.vg_short_tokens, st.max_step_tokens)
        return st.max_step_tokens

    def _commit(self, b: Beam, step: List[int], keys: Dict[str, List[int]]):
        b.tokens.extend(step)
        b.step_ends.append(len(b.tokens))
        ks = keys[b.uid]
        ks.append(_step_key(ks[-1], step))

    def run_problem(self, pidx: int, prompt: List[int]) -> ProblemResult:
        st = self.st
        bounds, eos = frozenset(st.delimiter_ids) | frozenset(st.eos_ids), frozenset(st.eos_ids)
        root = stable_hash("problem", pidx, tuple(prompt))
        beams = [Beam(str(i)) for i in range(st.n)]
        # content keys: per committed step, a chain of Python hashes (the score cache's keys; a step
        # costs a tuple hash); the recorded key (stable across processes) only for the survivors
        keys: Dict[str, List[int]] = {b.uid: [root] for b in beams}
        recorded: Dict[str, int] = {b.uid: root for b in beams}  # uid -> stable key before its last step
        cache: Dict[int, float] = {}  # step key -> selection score
        completions: List[Beam] = []
        records: List[IterationRecord] = []
        gen_t = ver_t = 0.0
        iters = 1 if st.search == "best_of_n" else st.num_iterations
        prev_potential: Dict[str, int] = {}
        compat = st.ae_compat_lookahead and st.speculative and st.lookahead
        lookahead_key: Dict[str, int] = {}  # compat: uid -> key of its look-ahead-scored step
        inherit: Dict[str, float] = {}  # compat: copy's uid -> its survivor's look-ahead score
        path_prefix = f"{pidx}/"  # + uid: the path's name (GenRequest.path)
        for it in range(iters):
            active = [b for b in beams if not b.done]
            if not active:
                break
            last = it == iters - 1
            cap = self._cap(it)
            if self.before_iteration:
                self.before_iteration(it, active, len(prompt))
            requested, skipped, new_tokens = [], 0, 0
            for b in active:
                cut = None if last else _first_boundary(b.spec, bounds)
                if cut is not None:  # a whole step was produced speculatively
                    step, b.spec = b.spec[:cut], b.spec[cut:]
                    self._commit(b, step, keys)
                    new_tokens += len(step)
                    b.finish = "eos" if step[-1] in eos else "delimiter"
                    skipped += 1
                    continue
                requested.append(b)
            seeds = request_seeds(st.seed, pidx, it, [b.uid for b in requested])
            room = st.max_model_len - len(prompt)  # path tokens the model length leaves
            req_prefix = f"p{pidx}.i{it}."  # + uid: the request's uid
            heads = [head_start(b.spec, bounds, 0, len(b.step_ends)) for b in requested]  # (steps, age)
            reqs = [
                GenRequest(
                    uid=req_prefix + b.uid,
                    prompt_ids=[*prompt, *b.tokens, *b.spec],
                    max_tokens=max(1, min(cap, room - len(b.tokens)) - len(b.spec)),
                    seed=seed,
                    stop_at_delimiter=not last,
                    potential=prev_potential.get(b.uid, 1),
                    path=path_prefix + b.uid,
                    path_steps=steps,
                    step_age=age,
                )
                for b, seed, (steps, age) in zip(requested, seeds, heads)
            ]
            res = self.gen.extend(reqs, SpeculationPolicy(st.speculative and not last, st.spec_max_beams))
            gen_t += res.time_s
            spec_generated = res.spec_tokens
            for r, b in zip(reqs, requested):
                o = res.outputs[r.uid]
                step = b.spec + o.tokens[: o.step_len]
                b.spec = list(o.tokens[o.step_len :])
                self._commit(b, step, keys)
                new_tokens += o.step_len
                b.finish = o.finish
            # ------------------------------------------------ verification (+ look-ahead)
            items, owners, paths = [], [], []
            inherited = inherit if compat and not last else {}  # the artifact verifies the last step
            lookahead_key = {}
            for b in active:
                if b.uid in inherited:  # compat: the survivor's look-ahead score, no verifier call
                    continue
                toks, ends, ks = b.tokens, list(b.step_ends), keys[b.uid][1:]
                if st.speculative and st.lookahead and not last:
                    cut = _first_boundary(b.spec, bounds)
                    if cut is not None:
                        toks = [*b.tokens, *b.spec[:cut]]
                        ends.append(len(toks))
                        ks.append(_step_key(ks[-1], b.spec[:cut]))
                        if compat and ks[-2] not in cache:  # as the artifact: its step needed the verifier
                            lookahead_key[b.uid] = ks[-1]
                if not all(map(cache.__contains__, ks)):  # map: no Python frame per key
                    items.append((toks, ends))
                    owners.append(ks)
                    paths.append(path_prefix + b.uid)
            before_verifier = gen_t + ver_t  # the artifact's completion stamp (artifact.py)
            # no verifier call: 0 CPU s on a real engine, not measured (None) on the simulator
            vo = (
                self.ver.verify(pidx, items, paths)
                if items
                else VerifierOutput([], 0.0, cpu_s=None if res.cpu_s is None else 0.0)
            )
            ver_t += vo.time_s
            for ks, vs in zip(owners, vo.values):
                for k, v in zip(ks, vs):
                    if v is not None and k not in cache:
                        cache[k] = v
            for b in active:
                b.scores = list(map(cache.get, keys[b.uid][1:]))  # a score is a float, never None
                if b.uid in inherited:
                    b.scores[-1] = inherited[b.uid]
                if None in b.scores:
                    raise RuntimeError(f"verifier returned no score for {b.scores.count(None)} step(s) of path {b.uid}")
                if any(v != v for v in b.scores):  # NaN: a step cut away by the input truncation
                    b.scores = [v for v in b.scores if v == v]  # the artifact's shorter score list
            # ------------------------------------------------ completion
            now = before_verifier if st.completion_stamp == "before_verifier" else gen_t + ver_t
            n_done = 0
            for b in active:
                total = len(prompt) + len(b.tokens)
                ended = (
                    b.finish == "eos"
                    or (b.finish == "length" and cap == st.max_step_tokens)
                    or total >= st.max_model_len
                    or last
                )
                if st.search == "vg_search" and b.finish == "length" and cap < st.max_step_tokens:
                    ended = total >= st.max_model_len
                if ended:
                    b.done = True
                    if total >= st.max_model_len and b.finish != "eos":
                        b.finish = "max_len"
                    b.completion_time_s, b.completed_iteration = now, it
                    b.spec = []
                    completions.append(b)
                    n_done += 1
            alive = [b for b in active if not b.done]
            selected = select_survivors(st.search, alive, st.n, st.beam_width, st.agg) if not last else []
            for p, _ in selected:  # every path committed one step this iteration
                last_step = p.tokens[p.step_ends[-2] if len(p.step_ends) > 1 else 0 :]
                recorded[p.uid] = stable_hash(recorded[p.uid], tuple(last_step))
            spec_kept = sum(len(p.spec) for p, _ in selected) if st.speculative else 0
            records.append(
                IterationRecord(
                    pidx,
                    it,
                    len(active),
                    len(reqs),
                    skipped,
                    len(items),
                    res.time_s,
                    vo.time_s,
                    sum(o.prompt_tokens for o in res.outputs.values()),
                    sum(o.cached_tokens for o in res.outputs.values()),
                    vo.prompt_tokens,
                    vo.cached_tokens,
                    new_tokens,
                    spec_generated,
                    spec_kept,
                    n_done,
                    ";".join(p.uid for p, _ in selected),
                    ";".join(str(recorded[p.uid]) for p, _ in selected),
                    res.cpu_s,
                    vo.cpu_s,
                )
            )
            if self.on_iteration:
                self.on_iteration(records[-1])
            if not selected:
                beams = []
                break
            pot = speculative_potential([aggregate(p.scores, st.agg) for p, _ in selected], st.beam_width)
            beams = duplicate(selected, st.prefix_aware, st.speculative, st.r_mean, st.r_std, st.seed, pidx, it)
            prev_potential = {}
            inherit = {}
            for (p, cnt), m in zip(selected, pot):
                if p.uid in lookahead_key:  # compat only: its copies (children 1..) inherit the score
                    v = cache[lookahead_key[p.uid]]
                    inherit.update((f"{p.uid}.{c}", v) for c in range(1, cnt))
                for c in range(cnt):  # child c of p, as duplicate names it
                    uid = f"{p.uid}.{c}"
                    prev_potential[uid] = m
                    keys[uid] = list(keys[p.uid])
                    recorded[uid] = recorded[p.uid]
        for b in beams:  # iteration budget exhausted (not reached with last)
            if not b.done:
                b.done, b.finish = True, "budget"
                b.completion_time_s, b.completed_iteration = gen_t + ver_t, len(records) - 1
                completions.append(b)
        return ProblemResult(pidx, completions, records, gen_t, ver_t)
