"""FastTTS's search with the LBS family's KV scheduling when the generator's KV overflows its share
(``system.kv_overflow=lbs``; simulated backend only). A cross-paper study, not a paper's system.

The default (``kv_overflow=recompute``) is vLLM's behaviour, as the simulated generator mimics it:
requests wait for free KV blocks and the prefix blocks evicted meanwhile are recomputed when a path
is extended again. With ``lbs`` the host holds every path's KV blocks (authoritative, as in the LBS
engine) and each generator call (one step of every active path) is scheduled as LBS schedules a
step (LBS paper Alg.1 + balanced grouping + prefetch, the policy of ``systems.kv_offload.beamset``):

1. order: the requests in depth-first order of their prefixes (lexicographic order of their block
   hash lists: requests sharing a prefix are adjacent, as ``groups.dfs_order`` orders LBS beams);
2. capacity (Alg.1 line 2, ``groups.group_capacity``): ``B = floor(M_gen / per_beam)`` with
   ``per_beam`` = the step's KV per request: the distinct prefix blocks of all requests (shared
   blocks once, as the paged engine stores them) plus each request's expected new tokens, divided
   by the number of requests. The expected step is the configured step model's mean
   (``workload.step_tokens_mean``; a step decoded to the end token: times ``steps_per_answer_mean``),
   capped at the request's ``max_tokens``: the policy never sees a request's real step length;
3. groups: ``groups.group_sizes`` (balanced) consecutive runs of that order
   (``groups.consecutive_groups``); ``B >= N``: one group, everything stays on the device;
4. per group: the prefix blocks the host holds and the device does not are loaded host->device (each
   shared block once per group), the group runs on the simulated vLLM-like engine (its prefix cache
   serves the loaded blocks; a block neither on the device nor on the host, e.g. the problem's prompt
   before its first write-back, is prefilled), and every new full block is written back;
   the next group's first ``groups.prefetch_count`` requests' blocks are prefetched while the
   group computes. A group's time is ``systems.common.groups.group_time`` (the LBS simulator's rule).

Units: bytes, seconds, tokens. Assumptions (stated in docs/cross_paper.md): host memory holds every path's
KV; transfers at the hardware profile's ``h2d_bw`` / ``d2h_bw`` (one copy engine each way); KV moves
in whole blocks, so a path's last, partial block is recomputed (as vLLM's prefix cache does);
S's speculation runs inside each group (its decisions see the group's stragglers and queue only).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from systems.common.groups import consecutive_groups, group_capacity, group_sizes, group_time, prefetch_count
from systems.verifier_search.protocol import GenOutput, GenRequest, GenResult


# ------------------------------------------------------------------------------------- policy
def prefix_order(hash_lists: Sequence[Sequence[int]]) -> List[int]:
    """Indices of the requests in depth-first order of their prefixes: lexicographic order of their
    block hash lists (chained hashes: equal leading hashes = a shared prefix); ties keep list order."""
    return sorted(range(len(hash_lists)), key=lambda i: tuple(hash_lists[i]))


def plan_groups(
    hash_lists: Sequence[Sequence[int]],
    reserve_tokens: Sequence[int],
    budget_bytes: int,
    kv_token_bytes: float,
    block: int,
) -> Tuple[int, List[List[int]]]:
    """LBS groups of one generator call (module docstring, steps 1-3).

    Args: ``hash_lists[i]`` the full-block hashes of request i's prompt (prompt + path so far);
        ``reserve_tokens[i]`` its expected new tokens; ``budget_bytes`` the generator's KV share M_gen;
        ``kv_token_bytes`` KV bytes of one token (all layers); ``block`` tokens per KV block.
    Returns: (capacity B in requests, groups as lists of request indices in DFS order).
    Raises: RunOOM when not even one request's share fits (B < 1)."""
    n = len(hash_lists)
    distinct = len(set().union(*map(set, hash_lists))) if n else 0
    per_beam = (distinct * block + sum(reserve_tokens)) * kv_token_bytes / max(1, n)
    cap = group_capacity(n, int(budget_bytes), int(per_beam) + 1)
    if cap < 1:
        from harness.errors import RunOOM

        raise RunOOM(
            f"kv_overflow=lbs: one request's share of the step's KV ({per_beam / 2**20:.1f} MiB) exceeds "
            f"the generator's KV share ({budget_bytes / 2**20:.1f} MiB)"
        )
    return cap, consecutive_groups(prefix_order(hash_lists), group_sizes(n, cap, balanced=True))


# ------------------------------------------------------------------------------------- executor
class LbsOverflowGenerator:
    """A :class:`~systems.verifier_search.protocol.Generator` that runs each call's requests in LBS groups on a
    simulated generator engine (``inner``, a ``sim.SimGenerator`` sized by the memory plan), with the
    host holding every path's KV (module docstring). Counters (bytes, groups) for the run's summary:
    :meth:`stats`.

    Args: ``inner`` the simulated engine; ``h2d_bw`` / ``d2h_bw`` copy bandwidths (B/s);
        ``step_mean`` expected tokens of a step ended by the delimiter, ``answer_mean`` of a step
        decoded to the end token (the last iteration)."""

    def __init__(
        self, inner, *, h2d_bw: float, d2h_bw: float, step_mean: float, answer_mean: float, overlap: bool = True
    ):
        self.inner, self.h2d_bw, self.d2h_bw = inner, float(h2d_bw), float(d2h_bw)
        self.overlap = overlap  # copies beside compute (systems.common.groups.copies_overlap)
        self.step_mean, self.answer_mean = float(step_mean), float(answer_mean)
        self.block_bytes = inner.block * inner.m.kv_bytes_per_token
        self.host: set = set()  # block hashes whose KV the host holds (current problem)
        self.problem = None
        self.h2d_bytes = self.d2h_bytes = 0
        self.groups = self.calls = self.grouped_calls = 0
        self.io_stall_s = 0.0  # copy time not hidden behind the groups' compute

    def configure(self, kv_bytes: int, max_num_seqs: int, offload_bw=None, offload_mode: str = "swap") -> None:
        """Re-size the engine (``system.replan=per_iteration``); see ``sim._Engine.configure``."""
        self.inner.configure(kv_bytes, max_num_seqs, offload_bw, offload_mode)

    def stats(self) -> Dict[str, float]:
        """The run's summary fields: bytes host->device and device->host, I/O stall (s), LBS groups per
        generator call, calls that needed more than one group."""
        return dict(
            lbs_h2d_bytes=int(self.h2d_bytes),
            lbs_d2h_bytes=int(self.d2h_bytes),
            lbs_io_stall_s=self.io_stall_s,
            lbs_groups_per_call=self.groups / max(1, self.calls),
            lbs_grouped_calls=int(self.grouped_calls),
        )

    def _reserve(self, r: GenRequest) -> int:
        """Tokens a request is expected to add (the step model's mean, capped at its max_tokens)."""
        return int(min(r.max_tokens, self.step_mean if r.stop_at_delimiter else self.answer_mean))

    def extend(self, requests: List[GenRequest], policy) -> GenResult:
        """Run the requests to the end of their steps, group by group (module docstring); ``policy``
        (the speculation policy) decides inside each group. ``time_s``: the groups' simulated seconds,
        copies included (``systems.common.groups.group_time``). Raises RunOOM when no request fits."""
        if not requests:
            return self.inner.extend(requests, policy)
        problem = requests[0].path.partition("/")[0]
        if problem != self.problem:  # a new problem: its paths share nothing with the last one's
            self.problem, self.host = problem, set()
        eng = self.inner
        hs = [eng.paths.hashes(r.prompt_ids, r.path) for r in requests]
        cap, groups = plan_groups(
            hs,
            [self._reserve(r) for r in requests],
            eng.cache.capacity * self.block_bytes,
            eng.m.kv_bytes_per_token,
            eng.block,
        )
        self.calls += 1
        self.groups += len(groups)
        self.grouped_calls += len(groups) > 1
        outputs: Dict[str, GenOutput] = {}
        t, steps, spec, carried = 0.0, 0, 0, 0
        for i, members in enumerate(groups):
            load = self._load([hs[j] for j in members])
            res = eng.extend([requests[j] for j in members], policy)
            written = self._write_back([requests[j] for j in members], [hs[j] for j in members])
            prefetch = 0
            if i + 1 < len(groups):
                k = prefetch_count(cap, len(members), len(groups[i + 1]))
                prefetch = self._missing([hs[j] for j in groups[i + 1][:k]])
            g = group_time(
                max(0, load - carried) / self.h2d_bw,
                res.time_s,
                prefetch / self.h2d_bw,
                written / self.d2h_bw,
                self.overlap,
            )
            t += g
            self.io_stall_s += g - res.time_s
            carried = prefetch
            self.h2d_bytes += load
            self.d2h_bytes += written
            outputs.update(res.outputs)
            steps += res.engine_steps
            spec += res.spec_tokens
        return GenResult(outputs, t, steps, spec)

    def _on_device(self, h: int) -> bool:
        c = self.inner.cache
        return h in c.ref or h in c.free

    def _missing(self, lists: Sequence[Sequence[int]]) -> int:
        """Bytes of the distinct blocks of ``lists`` the host holds and the device does not."""
        need = {h for hl in lists for h in hl if h in self.host and not self._on_device(h)}
        return len(need) * self.block_bytes

    def _load(self, lists: Sequence[Sequence[int]]) -> int:
        """Load a group's prefix blocks into the device's prefix cache (those already there are
        touched, so they are evicted last); returns the bytes copied host->device."""
        union = list(dict.fromkeys(h for hl in lists for h in hl))
        there = [h for h in union if self._on_device(h)]
        need = [h for h in union if h in self.host and not self._on_device(h)]
        self.inner.cache.release([], 0, there + need)
        return len(need) * self.block_bytes

    def _write_back(self, reqs: Sequence[GenRequest], prompt_hs: Sequence[Sequence[int]]) -> int:
        """Record the group's new full blocks (prefilled prompts, decoded tokens) on the host;
        returns the bytes copied device->host."""
        new = set()
        for r, hl in zip(reqs, prompt_hs):
            memo = self.inner.paths.memo.get(r.path)
            new.update(hl)
            if memo is not None:
                new.update(memo[1])
        new -= self.host
        self.host |= new
        return len(new) * self.block_bytes
