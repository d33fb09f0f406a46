"""Simulated backend: the same search and scheduling code, with generator steps and verifier
prefills charged from a hardware profile's roofline (``memory.t_decode``/``t_prefill``).

The simulated engines mimic vLLM V1's scheduler at event granularity: FCFS admission up to
``max_num_seqs`` while KV blocks are free, automatic prefix caching over hashed full blocks with
LRU eviction of unpinned blocks, decode steps for every running sequence, prefill of the uncached
prompt tokens on admission. Tokens are sampled from the same step-length model as the real runs
(geometric step lengths ending in the delimiter or the end token, seeded per request), so search
dynamics match. Approximations (stated in the README): a request reserves KV for its whole step
at admission (no preemption/recompute), a decode interval is charged at its mid-point context,
and the verifier is charged per batch as ceil(tokens / token budget) prefill passes.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from systems.tts.engines import GenOutput, GenRequest, GenResult
from systems.tts.memory import ModelShape, Roofline


class BlockCache:
    """Prefix cache of KV blocks: ``capacity`` blocks; pinned blocks (running requests) are never
    evicted, free cached blocks are evicted least-recently-used first. O(1) per block."""

    def __init__(self, capacity_blocks: int, block: int):
        self.capacity, self.block = int(capacity_blocks), int(block)
        self.ref: Dict[int, int] = {}                        # pinned hash -> pin count
        self.free: "OrderedDict[int, None]" = OrderedDict()  # cached, unpinned, LRU first
        self.reserved = 0                                    # blocks reserved for tokens not yet hashed
        self.queries = self.hits = 0

    def hashes(self, tokens: Sequence[int]) -> List[int]:
        out, h, B = [], 0, self.block
        for j in range(len(tokens) // B):
            h = hash((h, tuple(tokens[j * B:(j + 1) * B])))
            out.append(h)
        return out

    def lookup(self, hs: List[int]) -> int:
        k = 0
        for h in hs:
            if h in self.ref or h in self.free:
                k += 1
            else:
                break
        return k

    def used(self) -> int:
        return len(self.ref) + len(self.free) + self.reserved

    def _evict(self, k: int) -> int:
        n = 0
        while n < k and self.free:
            self.free.popitem(last=False)
            n += 1
        return n

    def try_admit(self, hs: List[int], extra_blocks: int) -> bool:
        """Pin ``hs`` (inserting missing ones) and reserve ``extra_blocks``; evicts free blocks as
        needed. False (nothing changed) when pinned blocks leave no room."""
        uniq = list(dict.fromkeys(hs))
        to_pin = [h for h in uniq if h not in self.ref]
        if len(self.ref) + len(to_pin) + self.reserved + extra_blocks > self.capacity:
            return False
        for h in uniq:
            if h in self.free:
                del self.free[h]
        over = len(self.ref) + len(self.free) + self.reserved + len(to_pin) + extra_blocks - self.capacity
        if over > 0:
            self._evict(over)
        for h in hs:
            self.ref[h] = self.ref.get(h, 0) + 1
        self.reserved += extra_blocks
        return True

    def release(self, pinned: List[int], reserved: int, produced: List[int]) -> None:
        """Unpin ``pinned``, drop the reservation, and cache the blocks filled while decoding."""
        self.reserved -= reserved
        for h in pinned:
            c = self.ref.get(h)
            if c is None:
                continue
            if c <= 1:
                del self.ref[h]
                self.free[h] = None
            else:
                self.ref[h] = c - 1
        for h in produced:
            if h in self.ref:
                continue
            if h in self.free:
                self.free.move_to_end(h)
                continue
            if self.used() >= self.capacity and not self._evict(1):
                break
            self.free[h] = None


@dataclass
class StepModel:
    """Geometric step lengths: per token P(delimiter) = p_delim, P(end) = p_eos."""
    p_delim: float
    p_eos: float
    delimiter_id: int
    eos_id: int
    vocab_size: int

    def sample(self, rng: np.random.Generator, max_tokens: int, stop_at_delimiter: bool) -> List[int]:
        """Tokens up to and including the first boundary (or ``max_tokens`` tokens)."""
        p = self.p_delim + self.p_eos if stop_at_delimiter else self.p_eos
        L = int(rng.geometric(p))
        lo = min(1000, self.vocab_size // 4)              # avoid low ids and the special tokens at the top
        body = rng.integers(lo, self.vocab_size - lo, size=min(L, max_tokens)).tolist()
        if self.vocab_size - 2 * lo < 2000:               # small vocabularies: keep boundaries out of the body
            body = [lo - 1 if t in (self.delimiter_id, self.eos_id) else t for t in body]
        if L <= max_tokens:
            eos = (not stop_at_delimiter) or rng.random() < self.p_eos / (self.p_delim + self.p_eos)
            body[-1] = self.eos_id if eos else self.delimiter_id
        return body


def _t_mixed(m: ModelShape, hw: Roofline, prefill: List[Tuple[int, int]], batch: int, ctx: float) -> float:
    """One engine step: prefill chunks [(new tokens, context before them)] + ``batch`` decodes at
    mean context ``ctx``. Roofline max(FLOPs/P, Bytes/BW) + per-layer launch cost."""
    new = sum(a for a, _ in prefill)
    flops = 2 * m.num_params * (new + batch) + 4 * m.num_layers * m.hidden_size * batch * ctx \
        + sum(2 * m.num_layers * m.hidden_size * a * (2 * c + a) for a, c in prefill)
    byts = m.weight_bytes + (batch * ctx + new) * m.kv_bytes_per_token
    return max(flops / hw.flops, byts / hw.bw) + m.num_layers * hw.launch_per_layer_s


class SimGenerator:
    """Simulated generator engine (see module docstring). ``max_num_seqs`` and ``kv_bytes`` are
    the decode batch cap and KV size given by the memory policy."""

    def __init__(self, model: ModelShape, hw: Roofline, steps: StepModel, *, kv_bytes: int, max_num_seqs: int,
                 block: int = 16):
        self.m, self.hw, self.steps = model, hw, steps
        self.block = block
        self.configure(kv_bytes, max_num_seqs)

    def configure(self, kv_bytes: int, max_num_seqs: int, offload_bw: Optional[float] = None) -> None:
        """Set the KV size and batch cap; ``offload_bw`` (B/s): the §4.3.2 offload extension is on,
        this engine's resident KV is swapped in before and out after every call."""
        cap = int(kv_bytes // (self.m.kv_bytes_per_token * self.block))
        if getattr(self, "cache", None) is None or self.cache.capacity != cap:
            self.cache = BlockCache(cap, self.block)
        self.max_num_seqs = int(max_num_seqs)
        self.offload_bw = offload_bw

    def swap_time(self) -> float:
        """Seconds to move this engine's cached KV out and back in (0 without offload)."""
        if not getattr(self, "offload_bw", None):
            return 0.0
        return 2.0 * self.cache.used() * self.block * self.m.kv_bytes_per_token / self.offload_bw

    def extend(self, requests: List[GenRequest], speculative: bool = False, spec_max_beams: int = 256) -> GenResult:
        from harness.errors import RunOOM
        B = self.block
        queue = list(requests)
        running: Dict[str, dict] = {}
        outputs: Dict[str, GenOutput] = {}
        t, spec_total, steps = 0.0, 0, 0
        while queue or running:
            prefill = []
            while queue and len(running) < self.max_num_seqs:
                r = queue[0]
                rng = np.random.default_rng(r.seed)
                toks = self.steps.sample(rng, r.max_tokens, r.stop_at_delimiter)
                hs = self.cache.hashes(r.prompt_ids)
                hit = self.cache.lookup(hs)
                total = len(r.prompt_ids) + len(toks)
                extra = math.ceil(total / B) - len(hs)
                if not self.cache.try_admit(hs, extra):
                    if not running:
                        raise RunOOM(f"simulated generator KV ({self.cache.capacity} blocks of {B}) cannot hold "
                                     f"one sequence of {total} tokens")
                    break
                queue.pop(0)
                self.cache.queries += len(r.prompt_ids)
                self.cache.hits += hit * B
                new = len(r.prompt_ids) - hit * B
                prefill.append((new, hit * B))
                running[r.uid] = dict(req=r, rng=rng, toks=toks, done=0, ctx=len(r.prompt_ids), hs=hs, extra=extra,
                                      spec=False, cached=hit * B, spec_toks=[])
            standard = [s for s in running.values() if not s["spec"]]
            if not standard:
                for uid, s in list(running.items()):
                    self._finish(uid, s, outputs)
                    del running[uid]
                continue
            k = min(len(s["toks"]) - s["done"] for s in standard)
            batch = len(running)
            ctx = sum(s["ctx"] for s in running.values()) / batch
            t += _t_mixed(self.m, self.hw, prefill, batch, ctx)        # first step (with prefill)
            if k > 1:
                t += (k - 1) * _t_mixed(self.m, self.hw, [], batch, ctx + k / 2.0)
            steps += k
            for uid, s in list(running.items()):
                s["ctx"] += k
                if s["spec"]:
                    while len(s["spec_toks"]) < s["spec_n"] + k:
                        s["spec_toks"].extend(self.steps.sample(s["rng"], 1 << 30, True))
                    s["spec_n"] += k
                    continue
                s["done"] += k
                if s["done"] >= len(s["toks"]):
                    ended_eos = s["toks"][-1] == self.steps.eos_id
                    if speculative and not queue and not ended_eos and s["req"].stop_at_delimiter \
                            and len(s["toks"]) < s["req"].max_tokens:
                        s["spec"], s["spec_n"] = True, 0
                    else:
                        self._finish(uid, s, outputs)
                        del running[uid]
            # preemption / cap: speculative KV must fit in the free blocks
            spec = [(u, s) for u, s in running.items() if s["spec"]]
            if spec:
                need = sum(math.ceil(s["spec_n"] / B) for _, s in spec)
                free = self.cache.capacity - self.cache.used()
                if need > free or len(spec) > spec_max_beams or queue:
                    spec.sort(key=lambda us: us[1]["req"].potential)
                    drop = spec if (need > free or queue) else spec[:len(spec) - spec_max_beams]
                    for u, s in drop:
                        self._finish(u, s, outputs)
                        del running[u]
        spec_total = sum(len(o.tokens) - o.step_len for o in outputs.values())
        return GenResult(outputs, t + self.swap_time(), steps, spec_total)

    def _finish(self, uid: str, s: dict, outputs: Dict[str, GenOutput]) -> None:
        r = s["req"]
        spec = s["spec_toks"][:s.get("spec_n", 0)] if s["spec"] else []
        if self.steps.eos_id in spec:
            spec = spec[:spec.index(self.steps.eos_id) + 1]
        toks = s["toks"] + spec
        finish = "eos" if s["toks"][-1] == self.steps.eos_id else (
            "delimiter" if s["toks"][-1] == self.steps.delimiter_id and len(s["toks"]) <= r.max_tokens else "length")
        if len(s["toks"]) >= r.max_tokens and s["toks"][-1] not in (self.steps.eos_id, self.steps.delimiter_id):
            finish = "length"
        produced = self.cache.hashes(list(r.prompt_ids) + s["toks"])[len(s["hs"]):]
        self.cache.release(s["hs"], s["extra"], produced)
        outputs[uid] = GenOutput(toks, finish, len(s["toks"]), s["cached"], len(r.prompt_ids))


class SimVerifier:
    """Simulated PRM engine: requests in batches of ``max_num_seqs``; each batch's uncached tokens
    are prefilled in passes of at most ``token_budget`` tokens, each charged by the roofline.
    Returns placeholder values (the search uses synthetic scores on the simulated backend)."""

    def __init__(self, model: ModelShape, hw: Roofline, *, kv_bytes: int, max_num_seqs: int, block: int = 16,
                 token_budget: int = 8192, tag_inserted: bool = False, prompts: Optional[Dict[int, List[int]]] = None):
        self.m, self.hw, self.block, self.budget = model, hw, block, token_budget
        self.tag_inserted = tag_inserted
        self.prompts = prompts or {}
        self.configure(kv_bytes, max_num_seqs)

    configure = SimGenerator.configure
    swap_time = SimGenerator.swap_time

    def verify(self, pidx: int, items: List[Tuple[List[int], List[int]]]):
        from harness.errors import RunOOM
        prompt = self.prompts.get(pidx, [])
        t, cached, total = 0.0, 0, 0
        B = self.block
        for i in range(0, len(items), self.max_num_seqs):
            batch = items[i:i + self.max_num_seqs]
            new_tokens, pinned, attn = 0, [], 0.0
            for toks, ends in batch:
                seq = prompt + toks + ([0] * len(ends) if self.tag_inserted else [])
                hs = self.cache.hashes(seq)
                hit = self.cache.lookup(hs)
                extra = math.ceil(len(seq) / B) - len(hs)
                if not self.cache.try_admit(hs, extra):
                    for h, e in pinned:
                        self.cache.release(h, e, [])
                    pinned = []
                    t += self._charge(new_tokens, attn)
                    new_tokens, attn = 0, 0.0
                    if not self.cache.try_admit(hs, extra):
                        raise RunOOM(f"simulated verifier KV ({self.cache.capacity} blocks) cannot hold one "
                                     f"sequence of {len(seq)} tokens")
                pinned.append((hs, extra))
                new = len(seq) - hit * B
                new_tokens += new
                attn += 2 * self.m.num_layers * self.m.hidden_size * new * (len(seq) + hit * B)
                cached += hit * B
                total += len(seq)
            t += self._charge(new_tokens, attn)
            for h, e in pinned:
                self.cache.release(h, e, [])
        self.cache.queries += total
        self.cache.hits += cached
        vals = [[0.5] * len(ends) for _, ends in items]
        return vals, t + self.swap_time(), cached, total

    def _charge(self, new_tokens: int, attn_flops: float) -> float:
        if new_tokens == 0:
            return 0.0
        passes = math.ceil(new_tokens / self.budget)
        flops = 2 * self.m.num_params * new_tokens + attn_flops
        byts = passes * self.m.weight_bytes + new_tokens * self.m.kv_bytes_per_token
        return max(flops / self.hw.flops, byts / self.hw.bw) + passes * self.m.num_layers * self.hw.launch_per_layer_s
