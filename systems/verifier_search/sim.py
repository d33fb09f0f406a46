"""Simulated backend: the same search, speculation policy and memory plan as on vLLM, with
generator steps and verifier prefills charged from a roofline (``memory.Roofline``; a GPU's
datasheet profile, or a profile measured on this CPU by ``systems.verifier_search.calibrate``).

The simulated engines mimic vLLM's scheduler at event granularity, as ``system.scheduler`` says
(``vllm_v0``, the rules and their sources): FCFS admission up to ``max_num_seqs`` while KV blocks are
free and the step's token budget (``max_num_batched_tokens``; chunked prefill off, as on the real
generator) holds the uncached prompt; automatic prefix caching over hashed full blocks with LRU
eviction of unpinned blocks, a prompt hitting at most ``len - 1`` tokens (vLLM recomputes the last
one); one decode token per running sequence per step. ``v0`` (vLLM 0.9.2's V0, as the FastTTS
artifact ran it): a step that admits runs prefills only; blocks are taken as tokens are written, and a
decode step without a free block preempts the last admitted sequence by recompute (re-prefilled
whole: prompt + what it had generated). ``v1`` (V1, the real backend's engine): a step mixes the
admissions' prefills with the running decodes, and a request reserves KV for its whole step at
admission (no preemption; speculative tokens beyond free blocks count as memory pressure). Every
speculative decision is the :class:`~systems.verifier_search.speculation.SpeculationPolicy`'s.

Tokens come from a :class:`TokenSource`: sampled from the step-length model (``workload.step_model``:
the fitted, not memoryless ``step_lengths`` models, or the geometric steps of the real random-weight
runs; steps end at the delimiter or the end token, seeded per request), or
replayed from a real run's recorded outputs (``system.replay_tokens``), so that simulator and
engine search the same tree. Approximations (stated in docs/verifier_search.md): the decode steps
between two events are charged at their mid-point context, and the verifier is charged per batch as
prefill passes (``v0``: whole inputs packed first come first served, :func:`pack_passes`; ``v1``:
ceil(tokens / token budget)). Offload (``_Engine.configure``): ``swap`` charges the engine's cached KV
out and back per call, ``sleep`` (vLLM sleep mode level 1) its weights, and empties its prefix cache.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from operator import attrgetter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from harness.errors import RunOOM
from systems.verifier_search.artifact import CUT, mark_cut
from systems.verifier_search.beams import _prm_hasher, _read_scores
from systems.verifier_search.memory import ModelShape, Roofline
from systems.verifier_search.protocol import GenOutput, GenRequest, GenResult, VerifierOutput
from systems.verifier_search.seeding import generators
from systems.verifier_search.speculation import SPECULATE, SpeculationPolicy
from systems.verifier_search.vllm_v0 import WATERMARK, blocks, reprefill_tokens, sleep_s


# ------------------------------------------------------------------------------- by path
class Lineage:
    """Values kept by path name, problem-qualified (``GenRequest.path``: ``"3/0.1.2"``, whose parent
    is ``"3/0.1"``): :meth:`get` returns the entry of the path or of its nearest ancestor that has
    one. Everything is forgotten when the problem changes. For work a path can extend from its
    parent's (block hashes, the synthetic PRM's hash): callers check the entry still applies."""

    def __init__(self):
        self.problem, self.seen = None, {}  # problem: the current problem's prefix ("3/")

    def get(self, path: str):
        if self.problem is None or not path.startswith(self.problem):
            self.problem, self.seen = path.partition("/")[0] + "/", {}
        seen = self.seen
        while path not in seen:
            path = path.rpartition(".")[0]  # the parent's name ("3/0.1" -> "3/0")
            if "/" not in path:  # past the root path ("3/0" -> ""): no ancestor has one
                return None
        return seen[path]

    def put(self, path: str, value) -> None:
        if path and self.problem is not None and path.startswith(self.problem):
            self.seen[path] = value


class SyntheticPrm:
    """``beams.synthetic_prm_values`` for the items of one problem after another (the simulated
    verifier's), hashing each path's tokens once: the hash state at a path's last scored step is
    kept by path (:class:`Lineage`) and a child's scores continue it (when the child's tokens start
    with the ones hashed; else from the start). The values are ``synthetic_prm_values``'s."""

    def __init__(self, seed: int):
        self.seed, self.memo = seed, Lineage()

    def values(
        self, problem: int, tokens: Sequence[int], step_ends: Sequence[int], computed: Sequence[bool], path: str = ""
    ) -> List[Optional[float]]:
        wanted = [e for e, c in zip(step_ends, computed) if c]
        if not wanted:
            return [None] * len(step_ends)
        base = self.memo.get(path) if path else None
        if base is not None and base[1] <= wanted[0] and starts_with(tokens, base[1], base[0]):
            h, at = base[2].copy(), base[1]
        else:
            h, at = _prm_hasher(self.seed, problem), 0
        got = _read_scores(h, tokens, at, wanted)
        self.memo.put(path, (tokens, wanted[-1], h))
        return [got[e] if c else None for e, c in zip(step_ends, computed)]


def starts_with(tokens: Sequence[int], n: int, base: Sequence[int], tail: Sequence[int] = ()) -> bool:
    """Whether the first ``n`` of ``tokens`` are the first ``n`` of ``base`` followed by ``tail`` (lists;
    ``n`` at most both lengths). A list holding exactly the tokens compared is compared as it is: no
    slice (a path's tokens are compared with its parent's on every call of the simulated engines and
    the synthetic PRM)."""
    p = len(base)
    if n <= p:
        return (tokens if len(tokens) == n else tokens[:n]) == (base if n == p else base[:n])
    return tokens[:p] == base and tokens[p:n] == tail[: n - p]


# ------------------------------------------------------------------------------- prefix cache
def block_hashes(
    tokens: List[int], block: int, base: List[int] = (), base_hashes: Sequence[int] = (), base_tail: List[int] = ()
) -> List[int]:
    """Chained hashes of the full ``block``-token blocks of ``tokens`` (block j's covers blocks 0..j,
    as vLLM's prefix-cache keys). ``base`` (followed by ``base_tail``) / ``base_hashes``: a token
    list hashed before and its hashes; the leading blocks ``tokens`` shares with it (compared, not
    assumed) keep their hashes and only the blocks after them are hashed: a path's hashes extend its
    parent's."""
    B = block
    k = min(len(tokens) // B, len(base_hashes))
    if k and not starts_with(tokens, k * B, base, base_tail):  # not a plain extension: the shared blocks
        lo, hi = 0, k - 1  # their count lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts_with(tokens, mid * B, base, base_tail):
                lo = mid
            else:
                hi = mid - 1
        k = lo
    return extend_hashes(tokens, block, base_hashes[:k])


def extend_hashes(tokens: Sequence[int], block: int, hashes: Sequence[int]) -> List[int]:
    """:func:`block_hashes` of ``tokens`` given ``hashes``, those of its leading blocks (assumed, not
    compared): only the blocks after them are hashed."""
    return [*hashes, *chain_hashes(hashes[-1] if hashes else 0, tokens, len(hashes) * block, block)]


def chain_hashes(h: int, tokens: Sequence[int], start: int, block: int) -> List[int]:
    """Hashes of the full ``block``-token blocks of ``tokens[start:]``, chained from ``h`` (the hash of
    the blocks before ``start``; 0 at the root)."""
    out = []
    for blk in zip(*[iter(tokens[start:] if start else tokens)] * block):  # the full blocks, as tuples
        h = hash((h, blk))
        out.append(h)
    return out


class PathHashes:
    """The token lists a simulated engine hashed, by path name (``GenRequest.path``, a
    :class:`Lineage`): :meth:`hashes` of a path's new list extends the hashes of the path's own or
    its nearest ancestor's last list (:func:`block_hashes` compares the tokens, so a wrong hint costs
    time, never a different hash). The lists are kept, not copied: their owners never change them
    (a request's ``prompt_ids``, an output's tokens, a verifier input built for the call)."""

    def __init__(self, block: int):
        self.block, self.memo = block, Lineage()

    def hashes(self, tokens: List[int], path: str = "") -> List[int]:
        base, hs, tail = (self.memo.get(path) if path else None) or ((), (), ())
        return block_hashes(tokens, self.block, base, hs, tail)

    def remember(self, path: str, tokens: List[int], hs: List[int], tail: List[int] = ()) -> None:
        """Keep ``hs``, the block hashes of ``tokens + tail``, as ``path``'s."""
        self.memo.put(path, (tokens, hs, tail))


class BlockCache:
    """Prefix cache of KV blocks: ``capacity`` blocks; pinned blocks (running requests) are never
    evicted, free cached blocks are evicted least-recently-used first (``ref`` and ``free`` are
    disjoint).

    A request pins a chain (:func:`block_hashes`: block j's parent is block j - 1, block 0 at the
    root), so pinned blocks are closed under ancestors and ``ref[h]`` counts the chains ending at h
    plus h's pinned children: pinning or releasing a chain costs the blocks it pins or frees (and a
    binary search), not its length. The pins, free order and answers are those of counting every
    block of every chain (tested), barring a 64-bit collision of two blocks' hashes, which the cache
    assumes away anyway."""

    def __init__(self, capacity_blocks: int, block: int):
        self.capacity, self.block = int(capacity_blocks), int(block)
        self.ref: Dict[int, int] = {}  # pinned hash -> chains ending there + pinned children
        self.free: "OrderedDict[int, None]" = OrderedDict()  # cached, unpinned, LRU first
        self.reserved = 0  # blocks reserved for tokens not yet hashed

    def hit_tokens(self, hs: List[int], length: int) -> int:
        """Tokens of a ``length``-token prompt with block hashes ``hs`` served from the cache: the
        cached leading full blocks, at most ``length - 1`` tokens (vLLM recomputes the last token).
        The pinned ones lead (:meth:`pinned_prefix`); free cached ones may follow."""
        n = min((length - 1) // self.block, len(hs))
        k = self.pinned_prefix(hs, n)
        while k < n and hs[k] in self.free:
            k += 1
        return k * self.block

    def used(self) -> int:
        return len(self.ref) + len(self.free) + self.reserved

    def _evict(self, k: int) -> int:
        n = min(k, len(self.free))
        for _ in range(n):
            self.free.popitem(last=False)
        return n

    def pinned_prefix(self, hs: List[int], upto: Optional[int] = None) -> int:
        """How many leading blocks of the chain ``hs`` (of its first ``upto`` <= len(hs)) are pinned (a
        pinned block's ancestors are)."""
        ref, lo, hi = self.ref, 0, len(hs) if upto is None else upto
        while lo < hi:
            mid = (lo + hi) // 2
            if hs[mid] in ref:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def try_admit(self, hs: List[int], extra_blocks: int) -> bool:
        """Pin the chain ``hs`` (inserting missing blocks) and reserve ``extra_blocks``; evicts free
        blocks as needed. False (nothing changed) when pinned blocks leave no room."""
        ref, free = self.ref, self.free
        k = self.pinned_prefix(hs)
        new = hs[k:]  # to pin: free cached ones or missing
        if len(ref) + len(new) + self.reserved + extra_blocks > self.capacity:
            return False
        if free:
            for h in new:
                free.pop(h, None)
            over = len(ref) + len(free) + self.reserved + len(new) + extra_blocks - self.capacity
            if over > 0:
                self._evict(over)
        ref.update(dict.fromkeys(new, 1))  # each: one pinned child, or (the last) the chain's end
        if k:  # the deepest pinned block: a new child, or the end again
            ref[hs[k - 1]] += 1
        self.reserved += extra_blocks
        return True

    def release(self, pinned: List[int], reserved: int, produced: List[int]) -> None:
        """Unpin the chain ``pinned``, drop the reservation, and cache the blocks filled while
        decoding. The blocks no other chain holds are freed, root first."""
        ref, free = self.ref, self.free
        self.reserved -= reserved
        j = len(pinned) - 1
        while j >= 0:
            c = ref[pinned[j]] - 1
            if c:
                ref[pinned[j]] = c
                break
            del ref[pinned[j]]
            j -= 1
        for h in pinned[j + 1 :]:
            free[h] = None
        room = self.capacity - len(ref) - len(free) - self.reserved
        for h in produced:
            if h in ref:
                continue
            if h in free:
                free.move_to_end(h)
                continue
            if room > 0:
                room -= 1
            elif free:  # full: the LRU free block makes room
                free.popitem(last=False)
            else:
                break
            free[h] = None


# ------------------------------------------------------------------------------------- tokens
@dataclass
class StepModel:
    """Geometric step lengths of the random-weight runs: per token P(delimiter) = p_delim,
    P(end token) = p_eos; body tokens uniform over the vocabulary away from the special ids."""

    p_delim: float
    p_eos: float
    delimiter_id: int
    eos_id: int
    vocab_size: int

    def __post_init__(self):
        self.p_boundary = self.p_delim + self.p_eos
        self.eos_share = self.p_eos / self.p_boundary
        self.lo = min(1000, self.vocab_size // 4)  # avoid low ids and the special tokens at the top
        self.small = self.vocab_size - 2 * self.lo < 2000  # small vocabularies: keep boundaries out of the body

    def chunk(self, rng: np.random.Generator) -> Tuple[int, bool]:
        """(tokens up to and including the next boundary, whether that boundary is the end token)."""
        return int(rng.geometric(self.p_boundary)), bool(rng.random() < self.eos_share)

    def body(self, rng: np.random.Generator, n: int) -> List[int]:
        out = rng.integers(self.lo, self.vocab_size - self.lo, size=n).tolist()
        if self.small:
            out = [self.lo - 1 if t in (self.delimiter_id, self.eos_id) else t for t in out]
        return out


class TokenStream:
    """The tokens one request samples, position 0 = its first generated token: ``recorded``
    tokens first (replay), then chunks of the step model, each ending at a boundary. Chunk
    lengths are drawn ahead (cheap) and body tokens only when read, from ``rng_len`` and ``rng_body``
    (``np.random.default_rng([seed, 0])`` and ``([seed, 1])`` of the request's seed:
    :meth:`TokenSource.prepare`), so a stream is the same however far it is read.

    ``ends[i]`` / ``is_eos[i]``: the exclusive end of boundary i and whether it is the end token;
    the first ``materialised`` of them are in ``tokens``, the rest drawn ahead. ``chunk``: where the
    chunk lengths come from, ``model.chunk`` (geometric, memoryless) unless given (a
    ``step_lengths.Chunker`` of the request: ``workload.step_model`` other than geometric)."""

    def __init__(
        self,
        model: StepModel,
        rng_len: np.random.Generator,
        rng_body: np.random.Generator,
        recorded: Sequence[int] = (),
        chunk=None,
    ):
        self.m, self.rng_len, self.rng_body = model, rng_len, rng_body
        self.chunk = chunk or model.chunk  # (rng) -> (tokens to the next boundary, end token?)
        self.tokens: List[int] = list(recorded)  # materialised tokens
        self.ends: List[int] = []  # exclusive end of every boundary token
        self.is_eos: List[bool] = []
        for i, t in enumerate(self.tokens):
            if t in (model.delimiter_id, model.eos_id):
                self.ends.append(i + 1)
                self.is_eos.append(t == model.eos_id)
        self.length = len(self.tokens)  # positions decided (materialised or drawn)
        self.materialised = len(self.ends)

    def _draw(self) -> None:
        n, eos = self.chunk(self.rng_len)
        self.length += n
        self.ends.append(self.length)
        self.is_eos.append(eos)

    def scan(self, i: int, limit: int, eos_only: bool) -> Tuple[int, Optional[str]]:
        """Look at boundary ``i`` (drawn if needed) for the end of a step that has not ended before
        it: (its end, "eos" | "delimiter") when it ends the step (only the end token does, if
        ``eos_only``); (``limit``, "length") when it lies past ``limit`` (or none can be drawn
        before it); (its end, None) when it does not end the step, which then ends later."""
        if i >= len(self.ends):
            if self.length >= limit:
                return limit, "length"
            self._draw()
        end = self.ends[i]
        if end > limit:
            return limit, "length"
        if self.is_eos[i]:
            return end, "eos"
        return end, (None if eos_only else "delimiter")

    def boundary(self, start: int, limit: int, eos_only: bool) -> Tuple[int, str]:
        """End of the step starting at position ``start``: (exclusive end, finish) for the first
        boundary (the end token only, if ``eos_only``) ending at or before ``limit``, finish =
        "eos" | "delimiter"; (limit, "length") when there is none."""
        i = bisect.bisect_right(self.ends, start)
        while True:
            end, finish = self.scan(i, limit, eos_only)
            if finish is not None:
                return end, finish
            i += 1

    def read(self, n: int) -> List[int]:
        """The first ``n`` tokens. The body tokens of every chunk to materialise are drawn in one
        call: ``integers(size=a)`` then ``integers(size=b)`` is ``integers(size=a + b)``, state included
        (numpy's bounded integers keep no buffer between calls; tested)."""
        toks = self.tokens
        if len(toks) < n:
            while self.length < n:
                self._draw()
            ends, is_eos, m = self.ends, self.is_eos, self.m
            first = self.materialised
            last = bisect.bisect_left(ends, n, first)  # the chunk holding position n - 1
            body = m.body(self.rng_body, ends[last] - len(toks) - (last + 1 - first))
            at = 0
            for i in range(first, last + 1):
                k = ends[i] - len(toks) - 1
                toks.extend(body[at : at + k])
                toks.append(m.eos_id if is_eos[i] else m.delimiter_id)
                at += k
            self.materialised = last + 1
        return toks[:n]


class TokenSource:
    """Token streams of requests: sampled from ``model`` with each request's seed, or, for uids in
    ``recorded`` (uid -> tokens a real engine produced), those tokens first. :meth:`prepare` builds
    the streams of a batch of requests together (their generators' seeding vectorised); :meth:`stream`
    hands each out once, or builds one not prepared. ``lengths``: a ``step_lengths.StepLengths``
    (``workload.step_model`` other than geometric) that draws each stream's chunk lengths, given the
    request's problem, its path's steps and its current step's head start (``GenRequest.step_age``,
    ``path_steps``); None: ``model``'s geometric chunks."""

    def __init__(
        self, model: StepModel, recorded: Optional[Dict[str, Sequence[int]]] = None, lengths: Optional[object] = None
    ):
        self.model, self.recorded, self.lengths = model, recorded or {}, lengths
        self.ready: Dict[str, TokenStream] = {}

    def _chunk(self, r: GenRequest, rec: Sequence[int]):
        """The chunk source of ``r``'s stream (None: the model's geometric one)."""
        if self.lengths is None:
            return None
        from systems.verifier_search.step_lengths import head_start, problem_of

        m = self.model
        steps, age = head_start(rec, frozenset((m.delimiter_id, m.eos_id)), r.step_age, r.path_steps)
        return self.lengths.chunker(problem_of(r.path), steps, age).chunk

    def _new(self, r: GenRequest, g_len, g_body) -> TokenStream:
        rec = self.recorded.get(r.uid, ())
        return TokenStream(self.model, g_len, g_body, rec, self._chunk(r, rec))

    def prepare(self, requests: Sequence[GenRequest]) -> None:
        gens = generators([e for r in requests for e in ([r.seed, 0], [r.seed, 1])])
        self.ready = {r.uid: self._new(r, gens[2 * i], gens[2 * i + 1]) for i, r in enumerate(requests)}

    def stream(self, r: GenRequest) -> TokenStream:
        s = self.ready.pop(r.uid, None)
        return s if s is not None else self._new(r, *generators([[r.seed, 0], [r.seed, 1]]))


# ------------------------------------------------------------------------------------- costs
def step_terms(m: ModelShape, prefill: List[Tuple[int, int]], decodes: int, ctx: float) -> Tuple[float, float, int]:
    """(FLOPs, bytes, sampled sequences) of one generator engine step: prefill chunks [(new
    tokens, context before them)] + ``decodes`` decode tokens at mean context ``ctx``. Every
    position multiplies the body parameters; the vocabulary projection runs once per sampled
    sequence (each decode, and the last prompt token of each prefill); weights are read once
    (``ModelShape.read_bytes``)."""
    new = sum(a for a, _ in prefill) if prefill else 0
    sampled = decodes + len(prefill)
    flops = (
        2 * m.body_params * (new + decodes)
        + 2 * m.head_params * sampled
        + 4 * m.num_layers * m.hidden_size * decodes * ctx
        + (sum(2 * m.num_layers * m.hidden_size * a * (2 * c + a) for a, c in prefill) if prefill else 0)
    )
    return flops, m.read_bytes + (decodes * ctx + new) * m.kv_bytes_per_token, sampled


def _t_step(m: ModelShape, hw: Roofline, prefill: List[Tuple[int, int]], decodes: int, ctx: float) -> float:
    """Seconds of one generator engine step (:func:`step_terms`): roofline (``Roofline.busy_s``)
    + per-layer, per-step and per-sampled-sequence costs."""
    flops, byts, sampled = step_terms(m, prefill, decodes, ctx)
    return hw.busy_s(flops, byts) + hw.fixed_s(m) + hw.seq_s * sampled


def prefill_terms(
    m: ModelShape, new_tokens: int, attn_flops: float, budget: int, passes: Optional[int] = None
) -> Tuple[float, float, int]:
    """(FLOPs, bytes, passes) of a verifier batch prefilling ``new_tokens`` uncached tokens (plus
    ``attn_flops`` of attention) in passes of at most ``budget`` tokens (``passes`` given, else
    ceil(new_tokens / budget): chunked prefill), weights read once per pass. A PRM scores every
    position: no vocabulary projection, its head is in the body."""
    if passes is None:
        passes = math.ceil(new_tokens / budget)
    return (
        2 * m.body_params * new_tokens + attn_flops,
        passes * m.read_bytes + new_tokens * m.kv_bytes_per_token,
        passes,
    )


def pack_passes(news: Sequence[int], budget: int) -> int:
    """Prefill passes of inputs of ``news`` new tokens each without chunked prefill (vLLM 0.9.2 V0
    ``Scheduler._schedule_prefills``: whole prompts, first come first served, while the step's
    ``max_num_batched_tokens`` = ``budget`` holds them; an input that does not fit waits for the next
    step). [3000, 2000, 1000] at 4096 -> 2 passes ([3000], [2000, 1000]); inputs of 0 new tokens
    take no room."""
    passes, fill = 0, 0
    for n in news:
        if n <= 0:
            continue
        if passes == 0 or fill + n > budget:
            passes, fill = passes + 1, n
        else:
            fill += n
    return passes


class _Engine:
    """KV size and batch cap of a simulated engine, set (and re-set) by the memory plan."""

    m: ModelShape
    block: int

    def configure(
        self, kv_bytes: int, max_num_seqs: int, offload_bw: Optional[float] = None, offload_mode: str = "swap"
    ) -> None:
        """Set the KV size and batch cap; ``offload_bw`` (B/s, the host link): the engine is offloaded
        between its calls, as ``offload_mode`` (``vllm_v0.OFFLOAD_MODES``) says: ``swap`` (§4.3.2: its
        resident KV swapped out after and in before every call, :meth:`swap_time`) or ``sleep`` (the
        FastTTS artifact's vLLM sleep mode level 1: its weights moved out and back around every call,
        its KV discarded, :meth:`offload_s`)."""
        cap = int(kv_bytes // (self.m.kv_bytes_per_token * self.block))
        if getattr(self, "cache", None) is None or self.cache.capacity != cap:
            self.cache = BlockCache(cap, self.block)
        self.max_num_seqs = int(max_num_seqs)
        self.offload_bw = offload_bw
        self.offload_mode = offload_mode

    def swap_time(self) -> float:
        """Seconds to move this engine's cached KV out and back in (0 without offload)."""
        if not self.offload_bw:
            return 0.0
        return 2.0 * self.cache.used() * self.block * self.m.kv_bytes_per_token / self.offload_bw

    def offload_s(self) -> float:
        """Seconds the offload charges at the end of a call (0 without offload): ``swap``:
        :meth:`swap_time`; ``sleep``: ``vllm_v0.sleep_s`` of the weights, and the prefix cache is
        emptied (level 1 discards the KV: the next call finds nothing cached)."""
        if not self.offload_bw:
            return 0.0
        if self.offload_mode == "sleep":
            self.cache = BlockCache(self.cache.capacity, self.block)
            return sleep_s(self.m.weight_bytes, self.offload_bw)
        return self.swap_time()


class _Seq:
    """A running request: its token stream, step end, KV pins, the engine step it was admitted at
    (``admitted``: its decoded tokens are the engine steps since), its admission number (``order``)
    and the engine step at which its step or speculation ends (``end``). A speculation's end is
    found lazily (``speculating``: it decodes past its step): while ``tentative``, ``end`` is a lower
    bound, the end of boundary ``scan - 1``, which did not end it; :meth:`resolve` looks further."""

    __slots__ = (
        "r",
        "stream",
        "step_len",
        "finish",
        "hs",
        "extra",
        "cached",
        "admitted",
        "order",
        "end",
        "speculating",
        "cap",
        "scan",
        "tentative",
    )

    def __init__(self, r, stream, step_len, finish, hs, extra, cached, admitted):
        self.r, self.stream, self.step_len, self.finish = r, stream, step_len, finish
        self.hs, self.extra, self.cached = hs, extra, cached
        self.admitted, self.end, self.order = admitted, admitted + step_len, 0
        self.speculating = self.tentative = False

    def speculate(self, cap: int) -> None:
        """Decode on past the step, to the end token or ``cap`` tokens (``TokenStream.boundary`` from
        the step's end, looked at one boundary at a time by :meth:`resolve`)."""
        self.speculating, self.cap = True, cap
        self.scan = bisect.bisect_right(self.stream.ends, self.step_len)
        self.resolve()

    def resolve(self) -> None:
        """Look at the next boundary for the speculation's end; ``end`` and ``tentative`` follow."""
        end, finish = self.stream.scan(self.scan, self.cap, eos_only=True)
        self.scan += 1
        self.end, self.tentative = self.admitted + end, finish is None


def _first_end(ends: List[Tuple[int, int, str]], run: Dict[str, _Seq], upto: float) -> Optional[_Seq]:
    """The running sequence (``run``, by uid) whose end comes first in the heap ``ends`` of (end step,
    admission number, uid), if at or before step ``upto``: stale heap entries (finished or re-timed)
    dropped, lazy speculation ends looked at until the first is exact (a lower bound at the top
    bounds every other end)."""
    while ends:
        end, order, uid = ends[0]
        s = run.get(uid)
        if s is None or s.end != end or s.order != order:  # finished, re-timed or preempted and admitted again
            heapq.heappop(ends)
        elif end > upto:
            return None
        elif s.tentative:
            s.resolve()
            heapq.heapreplace(ends, (s.end, s.order, uid))
        else:
            return s
    return None


class SimGenerator(_Engine):
    """Simulated generator engine (see module docstring). ``kv_bytes`` and ``max_num_seqs`` (the
    decode batch B_dec) come from the memory plan; ``block`` tokens per KV block and
    ``token_budget`` tokens per step are the real engine's ``block_size`` / ``max_num_batched_tokens``;
    no sequence grows past ``max_model_len`` tokens. ``scheduler`` (``vllm_v0.SCHEDULERS``): ``v1``
    mixes prefills and decodes in a step and reserves a request's whole step at admission; ``v0``
    (the artifact's vLLM 0.9.2, ``vllm_v0``) runs prefill-only steps, allocates KV blocks as tokens
    are written and preempts by recompute.

    Time advances from event to event (a step end, a speculation end, an admission; under ``v0``
    also a step without a free block): the running sequences and their context are kept as totals
    and a heap of end steps, so an event costs the sequences it ends, not all that run (under
    ``v0`` the block growth of every running sequence is counted at each event)."""

    def __init__(
        self,
        model: ModelShape,
        hw: Roofline,
        tokens: TokenSource,
        *,
        kv_bytes: int,
        max_num_seqs: int,
        block: int,
        token_budget: int,
        max_model_len: int,
        scheduler: str = "v1",
    ):
        self.m, self.hw, self.tokens = model, hw, tokens
        self.block, self.token_budget, self.max_model_len = int(block), int(token_budget), int(max_model_len)
        self.v0 = scheduler == "v0"
        self.paths = PathHashes(self.block)
        self._head = None  # (queue head, its block hashes, stream, step end, finish)
        self.resumed: Dict[str, Tuple] = {}  # v0: preempted uid -> (stream, step end, finish, generated, cached)
        self.preemptions = self.reprefilled = 0  # v0: preemptions, and the tokens their re-prefills computed
        self.configure(kv_bytes, max_num_seqs)

    def _admit(self, queue: deque, run: Dict[str, _Seq], now: int) -> Tuple[List[Tuple[int, int]], List[_Seq], bool]:
        """Admit queued requests at engine step ``now``. Returns (prefill chunks, the sequences admitted,
        whether admission stopped at the token budget, so the next step admits again). ``v0``: the step
        holds prefills only (the whole token budget), a request reserves the blocks of the tokens it
        prefills, and one preempted earlier (``resumed``) prefills its prompt and what it generated
        (``vllm_v0.reprefill_tokens``); its first sampled token comes from the prefill."""
        B, prefill, new_seqs = self.block, [], []
        budget = self.token_budget - (0 if self.v0 else len(run))  # v1: running sequences decode one token each
        wm = int(WATERMARK * self.cache.capacity) if self.v0 else 0  # v0: blocks an admission leaves free
        while queue and len(run) < self.max_num_seqs:
            r = queue[0]
            back = self.resumed.get(r.uid)
            if self._head is None or self._head[0] is not r:  # a request that waits keeps its hashes and stream
                if back is None:
                    stream = self.tokens.stream(r)
                    self._head = (
                        r,
                        self.paths.hashes(r.prompt_ids, r.path),
                        stream,
                        *stream.boundary(0, r.max_tokens, eos_only=not r.stop_at_delimiter),
                    )
                else:
                    stream, step_len, finish, gen, _ = back
                    self._head = (
                        r,
                        self.paths.hashes(r.prompt_ids + stream.read(gen), r.path),
                        stream,
                        step_len,
                        finish,
                    )
            _, hs, stream, step_len, finish = self._head
            gen = back[3] if back is not None else 0
            length = reprefill_tokens(len(r.prompt_ids), gen)
            hit = self.cache.hit_tokens(hs, length)
            new = length - hit
            if new > budget:
                return prefill, new_seqs, True
            extra = blocks(length if self.v0 else len(r.prompt_ids) + step_len, B) - len(hs)
            if not self.cache.try_admit(hs, extra + wm):
                if not run:
                    raise RunOOM(
                        f"simulated generator KV ({self.cache.capacity} blocks of {B}) cannot hold one "
                        f"sequence of {len(r.prompt_ids) + step_len} tokens"
                    )
                return prefill, new_seqs, False
            self.cache.reserved -= wm
            queue.popleft()
            budget -= new
            prefill.append((new, hit))
            if back is None:
                s = _Seq(r, stream, step_len, finish, hs, extra, hit, now - 1 if self.v0 else now)
            else:  # v0: its decoded count goes on from the tokens it had, plus the one this prefill samples
                del self.resumed[r.uid]
                self.reprefilled += new
                s = _Seq(r, stream, step_len, finish, hs, extra, back[4], now - 1 - gen)
            run[r.uid] = s
            new_seqs.append(s)
        return prefill, new_seqs, False

    def extend(self, requests: List[GenRequest], policy: SpeculationPolicy) -> GenResult:
        """Run the requests to the end of their steps (list order = admission order); the
        ``policy`` decides every speculative step. ``time_s`` is the charged (simulated) time."""
        if self.v0:
            return self._extend_v0(requests, policy)
        B = self.block
        self.tokens.prepare(requests)
        queue = deque(requests)
        run: Dict[str, _Seq] = {}  # admission order
        spec: Dict[str, _Seq] = {}  # the running sequences that speculate
        potential: Dict[str, int] = {}  # their potentials (the policy's input)
        ends: List[Tuple[int, int, str]] = []  # heap of (end step, admission number, uid)
        admitted = 0
        outputs: Dict[str, GenOutput] = {}
        t, steps, ctx = 0.0, 0, 0  # ctx: the running sequences' context tokens, summed
        while queue or run:
            decodes = len(run)
            dec_ctx = ctx / decodes if decodes else 0.0
            prefill, new_seqs, more = self._admit(queue, run, steps)
            if not run:
                raise RuntimeError(
                    f"simulated generator: request {queue[0].uid} ({len(queue[0].prompt_ids)} prompt "
                    f"tokens) exceeds the step's token budget ({self.token_budget})"
                )
            for s in new_seqs:
                s.order = admitted
                admitted += 1
                ctx += len(s.r.prompt_ids)
                heapq.heappush(ends, (s.end, s.order, s.r.uid))
            k = 1 if more else _first_end(ends, run, math.inf).end - steps
            t += _t_step(self.m, self.hw, prefill, decodes, dec_ctx)  # first step (with prefill)
            if k > 1:
                t += (k - 1) * _t_step(self.m, self.hw, [], len(run), ctx / len(run) + k / 2.0)
            steps += k
            ctx += k * len(run)
            ctx -= self._settle(steps, ends, run, spec, potential, outputs, policy, len(queue))
            if spec:
                need = sum(
                    [
                        -((s.admitted - len(s.r.prompt_ids) - steps) // B) - len(s.hs) - s.extra  # ceil(tokens / B)
                        for s in spec.values()
                    ]
                )
                pressure = need > self.cache.capacity - self.cache.used()
                for uid in policy.to_abort(len(run) - len(spec), potential, len(queue), pressure):
                    ctx -= self._end(uid, steps, run, spec, potential, outputs)
        spec_total = sum([len(o.tokens) - o.step_len for o in outputs.values()])
        return GenResult(outputs, t + self.offload_s(), steps, spec_total)

    def _settle(self, steps, ends, run, spec, potential, outputs, policy, waiting: int) -> int:
        """End, or turn speculative (the ``policy``'s choice), the running sequences whose step or
        speculation ends at or before engine step ``steps``, in admission order. Returns the context
        tokens the ended ones held."""
        freed = 0
        due = []
        while (s := _first_end(ends, run, steps)) is not None:
            heapq.heappop(ends)
            due.append(s)
        for s in sorted(due, key=attrgetter("order")):  # in admission order
            uid = s.r.uid
            if s.speculating:  # end token or cap: finished
                freed += self._end(uid, steps, run, spec, potential, outputs)
            elif policy.at_step_end(s.r, s.finish, waiting) == SPECULATE:
                s.speculate(min(policy.max_tokens(s.r), self.max_model_len - len(s.r.prompt_ids)))
                if s.end <= steps:
                    freed += self._end(uid, steps, run, spec, potential, outputs)
                else:
                    spec[uid], potential[uid] = s, s.r.potential
                    heapq.heappush(ends, (s.end, s.order, uid))
            else:
                freed += self._end(uid, steps, run, spec, potential, outputs)
        return freed

    # ------------------------------------------------------------------------------- v0
    def _need(self, run: Dict[str, _Seq], clock: int) -> int:
        """Blocks the running sequences need beyond what they hold to run the decode step that takes
        the engine from step ``clock - 1`` to ``clock``: each writes the KV of its token at position
        ``clock - 1 - admitted`` past its prompt (``vllm_v0.blocks`` of prompt + that many tokens)."""
        B = self.block
        return sum(
            [
                max(0, blocks(len(s.r.prompt_ids) + clock - 1 - s.admitted, B) - len(s.hs) - s.extra)
                for s in run.values()
            ]
        )

    def _grow(self, run: Dict[str, _Seq], clock: int) -> None:
        """Reserve the blocks the running sequences filled up to engine step ``clock`` (:meth:`_need`)."""
        B, cache = self.block, self.cache
        for s in run.values():
            k = blocks(len(s.r.prompt_ids) + clock - 1 - s.admitted, B) - len(s.hs) - s.extra
            if k > 0:
                if not cache.try_admit([], k):
                    raise AssertionError("simulated generator: a decode step ran without free blocks")
                s.extra += k

    def _room(self) -> int:
        """Blocks a running sequence may still take: the capacity less the pinned and reserved ones
        (free cached blocks are evicted as needed)."""
        c = self.cache
        return c.capacity - len(c.ref) - c.reserved

    def _preempt(self, run, spec, potential, outputs, steps: int, queue: deque) -> int:
        """Preempt the lowest-priority running sequence (vLLM 0.9.2 ``Scheduler._schedule_running``:
        ``running_queue.pop()``, the last admitted; a speculative one first, as the artifact's SBE
        gives them priority 1e9): a speculative one is aborted with what it decoded (the artifact's
        ``CustomScheduler``), another is preempted by recompute (``vllm_v0``): its KV freed (its full
        blocks cached), it waits at the queue's front. Returns the context tokens it held."""
        victims = spec if spec else run
        uid = max(victims, key=lambda u: victims[u].order)
        if uid in spec:
            return self._end(uid, steps, run, spec, potential, outputs)
        s = run.pop(uid)
        gen = steps - s.admitted  # tokens sampled so far
        prompt = s.r.prompt_ids
        toks = s.stream.read(gen)
        B = self.block
        kv = prompt + toks[:-1]  # the KV written (the last sampled token's is not)
        filled = chain_hashes(s.hs[-1] if s.hs else 0, kv[len(s.hs) * B :], 0, B)
        self.paths.remember(s.r.path, prompt, s.hs + filled, toks)
        self.cache.release(s.hs, s.extra, filled)
        self.resumed[uid] = (s.stream, s.step_len, s.finish, gen, s.cached)
        self.preemptions += 1
        queue.appendleft(s.r)
        self._head = None
        return len(prompt) + gen

    def _extend_v0(self, requests: List[GenRequest], policy: SpeculationPolicy) -> GenResult:
        """:meth:`extend` under vLLM 0.9.2's V0 scheduler (``vllm_v0``): a step that admits runs only
        prefills (charged with no decode), else every running sequence decodes; a decode step without
        the free blocks it needs first preempts (:meth:`_preempt`) until it has them."""
        self.tokens.prepare(requests)
        queue = deque(requests)
        run: Dict[str, _Seq] = {}
        spec: Dict[str, _Seq] = {}
        potential: Dict[str, int] = {}
        ends: List[Tuple[int, int, str]] = []
        admitted = 0
        outputs: Dict[str, GenOutput] = {}
        t, steps, ctx = 0.0, 0, 0  # steps: decode steps (the clock of decoded tokens); ctx as in extend
        prefill_steps = 0
        while queue or run:
            prefill, new_seqs, more = self._admit(queue, run, steps)
            if new_seqs:  # a prefill-only step; each admitted sequence samples its first token
                t += _t_step(self.m, self.hw, prefill, 0, 0.0)
                prefill_steps += 1
                for s in new_seqs:
                    s.order = admitted
                    admitted += 1
                    ctx += len(s.r.prompt_ids) + steps - s.admitted
                    heapq.heappush(ends, (s.end, s.order, s.r.uid))
                ctx -= self._settle(steps, ends, run, spec, potential, outputs, policy, len(queue))
                continue
            if not run:
                raise RuntimeError(
                    f"simulated generator: request {queue[0].uid} ({len(queue[0].prompt_ids)} prompt "
                    f"tokens) exceeds the step's token budget ({self.token_budget})"
                )
            k_end = _first_end(ends, run, math.inf).end - steps
            room = self._room()
            k = k_end
            if len(run) * -(-k // self.block) > room and self._need(run, steps + k) > room:
                lo, hi = 0, k - 1  # the decode steps that fit: the largest k with need <= room
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if self._need(run, steps + mid) <= room:
                        lo = mid
                    else:
                        hi = mid - 1
                k = lo
            if k == 0:  # the next decode step has no free block: preempt until it has, then run it
                while self._need(run, steps + 1) > self._room():
                    if len(run) == 1:
                        raise RunOOM(
                            f"simulated generator KV ({self.cache.capacity} blocks of {self.block}) cannot "
                            f"hold one sequence of {len(next(iter(run.values())).r.prompt_ids) + steps} tokens"
                        )
                    ctx -= self._preempt(run, spec, potential, outputs, steps, queue)
                k = 1
            t += k * _t_step(self.m, self.hw, [], len(run), ctx / len(run) + (k - 1) / 2.0)
            steps += k
            ctx += k * len(run)
            self._grow(run, steps)
            ctx -= self._settle(steps, ends, run, spec, potential, outputs, policy, len(queue))
            if spec:  # memory pressure is the preemption's (speculative sequences are its first victims)
                for uid in policy.to_abort(len(run) - len(spec), potential, len(queue), False):
                    ctx -= self._end(uid, steps, run, spec, potential, outputs)
        spec_total = sum([len(o.tokens) - o.step_len for o in outputs.values()])
        return GenResult(outputs, t + self.offload_s(), steps + prefill_steps, spec_total)

    def _end(
        self,
        uid: str,
        steps: int,
        run: Dict[str, _Seq],
        spec: Dict[str, _Seq],
        potential: Dict[str, int],
        outputs: Dict[str, GenOutput],
    ) -> int:
        """End the running sequence ``uid`` at engine step ``steps`` (:meth:`_finish`); returns the context
        tokens it held."""
        s = run.pop(uid)
        if spec.pop(uid, None) is not None:
            del potential[uid]
        self._finish(s, steps - s.admitted, outputs)
        return len(s.r.prompt_ids) + steps - s.admitted

    def _finish(self, s: _Seq, done: int, outputs: Dict[str, GenOutput]) -> None:
        """End ``s`` after ``done`` decoded tokens: its step, or everything it decoded when it
        speculated; cache the blocks it filled (``hs``: the full blocks of the prompt, or under
        ``v0`` of what a re-prefill computed)."""
        r, hs, prompt = s.r, s.hs, s.r.prompt_ids
        toks = s.stream.read(done if s.speculating else s.step_len)
        at = len(hs) * self.block
        filled = chain_hashes(
            hs[-1] if hs else 0, prompt[at:] + toks if at <= len(prompt) else toks[at - len(prompt) :], 0, self.block
        )
        self.paths.remember(r.path, prompt, hs + filled, toks)  # hs + filled: the full blocks of prompt + toks
        self.cache.release(hs, s.extra, filled)
        outputs[r.uid] = GenOutput(toks, s.finish, s.step_len, s.cached, len(prompt))


class SimVerifier(_Engine):
    """Simulated PRM engine: requests in batches of ``max_num_seqs``; each batch's uncached tokens
    are prefilled in passes of at most ``token_budget`` tokens, each charged by the roofline. The
    verifier input of a path is built by ``token_map`` (as on vLLM: prompt + steps, step tags) and
    its values are the synthetic content-keyed PRM's (``beams.synthetic_prm_values``, ``seed``),
    None where the position was served by the prefix cache (as vLLM's pooling rows), NaN where the
    input truncation cut it away (``artifact.CUT_SCORE``). ``scheduler`` ``v0`` (``vllm_v0``; vLLM 0.9.2's V0
    engine runs chunked prefill off below 32K-token models, ``EngineArgs._set_default_args_v0``): a pass
    holds whole inputs, FCFS, up to ``token_budget`` tokens (:func:`pack_passes`); ``v1``: a batch's new
    tokens are cut into ceil(tokens / budget) passes (chunked prefill). ``prefix_cache`` False (the FastTTS
    artifact's vLLM 0.9.2 for ALL / STEP pooling, ``artifact.verifier_prefix_cache``): nothing is
    cached, every verification prefills each path's whole input."""

    def __init__(
        self,
        model: ModelShape,
        hw: Roofline,
        *,
        kv_bytes: int,
        max_num_seqs: int,
        block: int,
        token_budget: int,
        token_map,
        prompts: Dict[int, List[int]],
        seed: int,
        prefix_cache: bool = True,
        scheduler: str = "v1",
    ):
        self.m, self.hw, self.block, self.budget = model, hw, int(block), int(token_budget)
        self.map, self.prompts, self.prm = token_map, prompts, SyntheticPrm(seed)
        self.v0 = scheduler == "v0"
        self.prefix_cache = prefix_cache  # off: every input prefilled whole, its blocks its own (artifact.py)
        self.paths = PathHashes(self.block)
        self.configure(kv_bytes, max_num_seqs)

    def verify(
        self, pidx: int, items: Sequence[Tuple[List[int], List[int]]], paths: Optional[Sequence[str]] = None
    ) -> VerifierOutput:
        prompt = self.prompts.get(pidx, [])
        t, cached, total, vals = 0.0, 0, 0, []
        B, cache, build, hashes, remember = (
            self.block,
            self.cache,
            self.map.build,
            self.paths.hashes,
            self.paths.remember,
        )
        attn_per = 2 * self.m.num_layers * self.m.hidden_size  # attention FLOPs per new token x context
        for i in range(0, len(items), self.max_num_seqs):
            batch = items[i : i + self.max_num_seqs]
            new_tokens, pinned, attn, news = 0, [], 0.0, []
            for j, (toks, ends) in enumerate(batch):
                path = paths[i + j] if paths else ""
                seq, pos = build(prompt, toks, ends)
                n = len(seq)
                if self.prefix_cache:
                    hs = hashes(seq, path)
                    remember(path, seq, hs)
                    hit = cache.hit_tokens(hs, n)
                else:  # no shared blocks: the whole input prefilled into blocks of its own
                    hs, hit = [], 0
                extra = -(-n // B) - len(hs)
                if not cache.try_admit(hs, extra):
                    for h, e in pinned:
                        cache.release(h, e, ())
                    pinned = []
                    t += self._charge(new_tokens, attn, news)
                    new_tokens, attn, news = 0, 0.0, []
                    if not cache.try_admit(hs, extra):
                        raise RunOOM(
                            f"simulated verifier KV ({cache.capacity} blocks) cannot hold one sequence of {n} tokens"
                        )
                pinned.append((hs, extra))
                new = n - hit
                new_tokens += new
                news.append(new)
                attn += attn_per * new * (n + hit)
                cached += hit
                total += n
                vs = self.prm.values(pidx, toks, ends, [p >= hit for p in pos], path)
                vals.append(mark_cut(vs, pos) if CUT in pos else vs)
            t += self._charge(new_tokens, attn, news)
            for h, e in pinned:
                cache.release(h, e, ())
        return VerifierOutput(vals, t + self.offload_s(), cached, total)

    def _charge(self, new_tokens: int, attn_flops: float, news: Sequence[int] = ()) -> float:
        """Seconds of prefilling ``new_tokens`` (``news``: each input's) in passes (class docstring)."""
        if new_tokens == 0:
            return 0.0
        passes = pack_passes(news, self.budget) if self.v0 else None
        flops, byts, passes = prefill_terms(self.m, new_tokens, attn_flops, self.budget, passes)
        return self.hw.busy_s(flops, byts) + passes * self.hw.fixed_s(self.m)
