"""``system=hf_offload``: transformers' own offloaded KV cache (``DynamicCache(offloading=True)``)
running the same step-wise beam search on the same model, as an external reference point for the
layer-wise baseline (LBS paper: "the scheme of HF transformers").

What transformers 5.x does per decode token (``Cache.update``): before layer ``i`` the compute stream
waits for the prefetch stream, layer ``i+1`` is prefetched (its **whole** K/V, host->device), layer
``i`` appends by ``torch.cat``, then layer ``i`` is offloaded (its whole K/V, device->host). Beam
selection reorders the cache with ``reorder_cache(beam_idx)`` (index_select, on the CPU for the
offloaded layers). So roughly two layers are on the device and every token moves every layer's KV
both ways; there is no KV budget to respect (it is not a scheduler).

Measured like ours: bytes are counted at each layer's ``prefetch``/``offload`` from the tensors it
moves; the I/O stall is the compute stream's wait on the prefetch stream (CUDA events around
transformers' own wait); compute = the rest of the decode time; other = selection + cache reorder.
Sampling and selection are the torch executor's (noise keyed by seed, beam uid, position), so the
search is the same as ``in_gpu``'s. transformers' offloading uses CUDA streams
(``torch.cuda.default_stream``): it needs a CUDA GPU (``validate_hf_offload``).
"""

from __future__ import annotations

import math
import time
from typing import Dict, List

import numpy as np
import pandas as pd
import torch
from transformers import DynamicCache

from harness.errors import ConfigError
from harness.family import RunContext, RunResult
from systems.kv_offload import analytic
from systems.kv_offload.display import display_rows
from systems.kv_offload.model import shared_model
from systems.kv_offload.sampling import beam_keys, sample
from systems.kv_offload.torch_engine import log_probs, resolve_device
from systems.kv_offload.tree import BeamTree, initial_beams, select_and_expand


def validate_hf_offload(backend) -> None:
    """Raise ConfigError unless the run is on a CUDA device (before any work)."""
    if backend.device != "cuda":
        raise ConfigError(
            f"system=hf_offload is not allowed with backend.device={backend.device!r}: "
            f"transformers' offloaded DynamicCache uses CUDA streams "
            f"(torch.cuda.default_stream) and needs a CUDA GPU; use backend=torch on a GPU"
        )


class CountingOffloadedCache(DynamicCache):
    """``DynamicCache(offloading=True)`` that counts the bytes its layers move and times the compute
    stream's wait on the prefetch stream. ``offloading=False`` gives the plain cache (same search
    loop, no transfers; used to test the loop on CPU)."""

    def __init__(self, config, offloading: bool = True):
        super().__init__(config=config, offloading=offloading)
        self.h2d_bytes = self.d2h_bytes = 0
        self.on_device = 0  # KV bytes currently on the device
        self.peak_on_device = 0
        self._events: List[tuple] = []
        for layer in self.layers:
            self._instrument(layer)

    def _instrument(self, layer) -> None:
        cache = self
        prefetch, offload = layer.prefetch, layer.offload

        def counted_prefetch():
            if layer.is_initialized and layer.keys.device != layer.device:
                n = layer.keys.numel() * layer.keys.element_size() * 2
                cache.h2d_bytes += n
                cache.on_device += n
                cache.peak_on_device = max(cache.peak_on_device, cache.on_device)
            prefetch()

        def counted_offload():
            if layer.is_initialized and layer.keys.device.type != "cpu":
                n = layer.keys.numel() * layer.keys.element_size() * 2
                cache.d2h_bytes += n
                cache.on_device -= n
            offload()

        layer.prefetch, layer.offload = counted_prefetch, counted_offload

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # transformers 5.19 ``Cache.update``, with CUDA events around its wait on the prefetch stream
        if self.offloading:
            dev_stream = torch.cuda.default_stream(key_states.device)
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record(dev_stream)
            dev_stream.wait_stream(self.prefetch_stream)
            b.record(dev_stream)
            self._events.append((a, b))
            self.prefetch(layer_idx + 1, self.only_non_sliding)
        keys, values = self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)
        if self.offloading:
            n = (key_states.numel() + value_states.numel()) * key_states.element_size()
            self.on_device += n  # the appended token, until offload() moves the layer
            self.peak_on_device = max(self.peak_on_device, self.on_device)
            self.offload(layer_idx, self.only_non_sliding)
        elif keys.device.type != "cpu":
            self.recount()
        return keys, values

    def recount(self) -> None:
        """Recompute the KV bytes on the device (after batch repeat / reorder)."""
        self.on_device = sum(
            layer.keys.numel() * layer.keys.element_size() * 2
            for layer in self.layers
            if layer.is_initialized and layer.keys is not None and layer.keys.device.type != "cpu"
        )
        self.peak_on_device = max(self.peak_on_device, self.on_device)

    def take_stall_s(self) -> float:
        """Seconds the compute stream waited for prefetches since the last call (synchronises)."""
        if not self._events:
            return 0.0
        torch.cuda.synchronize()
        s = sum(a.elapsed_time(b) for a, b in self._events) / 1e3
        self._events.clear()
        return s


def hf_beam_search(
    model,
    *,
    seed: int,
    prompt: List[int],
    beams: int,
    beam_width: int,
    gen_len: int,
    step: int,
    temperature: float = 1.0,
    offloading: bool = True,
    progress=None,
    deadline: float | None = None,
) -> Dict:
    """Step-wise beam search (LBS Sec. 2) on ``model`` through ``CountingOffloadedCache``.

    All beams decode token by token in one batch; at each step boundary the top ``beams //
    beam_width`` by cumulative log-probability are kept and each spawns ``beam_width`` children
    (``systems.kv_offload.tree``), and the cache is reordered with ``reorder_cache``. Returns a dict with
    ``beams`` (final live beams), ``kept`` (per step, parent uids kept), ``rows`` (per-step
    measurements: seconds, bytes) and ``prefill`` (its seconds and bytes). ``deadline`` (Unix
    seconds): stop between steps once it has passed (``timed_out`` in the result)."""
    device = next(model.parameters()).device
    dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    P, beam_size = len(prompt), beams // beam_width
    tree = BeamTree(P)
    cache = CountingOffloadedCache(model.config, offloading=offloading)
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        root = log_probs(out.logits[0, -1], temperature, dtype)
        sync()  # the offloaded layers' copies back to the host have landed
        cache.batch_repeat_interleave(beams)
        cache.recount()
    sync()
    prefill = {
        "time_s": time.perf_counter() - t0,
        "io_stall_s": cache.take_stall_s() if cuda else 0.0,
        "h2d_bytes": cache.h2d_bytes,
        "d2h_bytes": cache.d2h_bytes,
    }
    live = initial_beams(tree, beams, seed)
    logp = root.expand(beams, -1)
    rows, kept = [], []
    n_steps = math.ceil(gen_len / step)
    for i in range(n_steps):
        if deadline is not None and time.time() > deadline:
            return {"beams": live, "kept": kept, "rows": rows, "prefill": prefill, "timed_out": True}
        T = min(step, gen_len - i * step)
        start = tree.prefix_tokens(live[0])
        h0, d0 = cache.h2d_bytes, cache.d2h_bytes
        cache.peak_on_device = cache.on_device
        uids = [b.uid for b in live]
        toks = torch.empty(beams, T, dtype=torch.long, device=device)
        lps = torch.empty(beams, T, dtype=dtype, device=device)
        sync()
        t0 = time.perf_counter()
        keys = beam_keys(seed, uids, device)
        with torch.no_grad():
            for k in range(T):
                y = sample(logp, keys, start + k)
                toks[:, k] = y
                lps[:, k] = logp.gather(1, y[:, None])[:, 0]
                out = model(input_ids=y[:, None], past_key_values=cache, use_cache=True)
                logp = log_probs(out.logits[:, -1], temperature, dtype)
        sync()
        dec_s = time.perf_counter() - t0
        stall = cache.take_stall_s() if cuda else 0.0
        delta = lps.double().sum(1).cpu().numpy()
        tl = toks.cpu().tolist()
        for j, b in enumerate(live):
            b.cum_logprob += float(delta[j])
            b.tokens.extend(tl[j])
            tree.segments[b.leaf].length = T
        other = 0.0
        if i + 1 < n_steps:
            t1 = time.perf_counter()
            new = select_and_expand(tree, live, beam_size, beam_width)
            idx = {b.uid: j for j, b in enumerate(live)}
            beam_idx = torch.tensor([idx[b.parent_uid] for b in new], device=device)
            cache.reorder_cache(beam_idx)
            cache.recount()
            logp = logp.index_select(0, beam_idx)
            sync()
            other = time.perf_counter() - t1
            kept.append({"step": i, "kept": [str(u) for u in dict.fromkeys(b.parent_uid for b in new)]})
            live = new
        rows.append(
            {
                "step": i,
                "start_tokens": start,
                "tokens": T,
                "groups": 1,
                "capacity": beams,
                "compute_s": dec_s - stall,
                "io_stall_s": stall,
                "other_s": other,
                "latency_s": dec_s + other,
                "h2d_bytes": cache.h2d_bytes - h0,
                "d2h_bytes": cache.d2h_bytes - d0,
                "peak_device_bytes": cache.peak_on_device,
            }
        )
        if progress is not None:
            progress.update(1)
    return {"beams": live, "kept": kept, "rows": rows, "prefill": prefill, "timed_out": False}


def run_hf_offload(cfg, ctx: RunContext) -> RunResult:
    """Runner entry for ``system=hf_offload`` (called by ``systems.kv_offload.runner.run``)."""
    w = cfg.workload
    validate_hf_offload(ctx.backend)
    device = resolve_device(ctx.backend.device)
    model, geom = shared_model(cfg.model, device, cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    prompt = rng.integers(0, cfg.model.vocab_size, size=w.prompt_len).tolist()
    bar = ctx.progress(math.ceil(w.gen_len / w.step), f"{cfg.system.name} steps")
    res = hf_beam_search(
        model,
        seed=cfg.seed,
        prompt=prompt,
        beams=w.beams,
        beam_width=w.beam_width,
        gen_len=w.gen_len,
        step=w.step,
        temperature=w.temperature,
        offloading=True,
        progress=bar,
        deadline=cfg.system.get("deadline"),
    )
    bar.close()
    if not res["rows"]:
        return RunResult(
            status="timeout",
            message="system.deadline passed before the first step",
            display=display_rows({}, cfg.system),
        )
    df = pd.DataFrame(res["rows"])
    pre = res["prefill"]
    compute = float(df.compute_s.sum()) + pre["time_s"] - pre["io_stall_s"]
    stall = float(df.io_stall_s.sum()) + pre["io_stall_s"]
    other = float(df.other_s.sum())
    e2e = compute + stall + other
    best = max(res["beams"], key=lambda b: (b.cum_logprob, -b.uid))
    pred = analytic.predict(
        cfg.model,
        num_beams=w.beams,
        prompt_len=w.prompt_len,
        gen_len=w.gen_len,
        step=w.step,
        mem_gpu=0,
        dtype_bytes=geom.dtype_bytes,
    )
    summary = {
        "kv_budget_bytes": None,
        "beams": w.beams,
        "step": w.step,
        "gen_len": w.gen_len,
        "prompt_len": w.prompt_len,
        **pred,
        "eq_prediction_bytes": None,
        "e2e_s": e2e,
        "compute_s": compute,
        "io_stall_s": stall,
        "other_s": other,
        "io_share": stall / e2e if e2e > 0 else 0.0,
        "h2d_bytes": int(df.h2d_bytes.sum()) + pre["h2d_bytes"],
        "d2h_bytes": int(df.d2h_bytes.sum()) + pre["d2h_bytes"],
        "groups_per_step": 1.0,
        "peak_device_kv_bytes": int(df.peak_device_bytes.max()),
        "tokens_per_s": w.beams * w.gen_len / e2e if e2e > 0 else None,
        "best_cum_logprob": best.cum_logprob,
        "best_uid": str(best.uid),
        "energy_j": None,
        "energy_unavailable_reason": "not measured per step for hf_offload (gpu_energy_j: the run "
        "window's NVML energy)",
    }
    summary["steps_done"] = len(df)
    return RunResult(
        status="timeout" if res["timed_out"] else "ok",
        summary=summary,
        display=display_rows(summary, cfg.system),
        tables={"steps": df},
        extra={"best_tokens": best.tokens, "hf_offload_kept": res["kept"]},
        message="system.deadline passed" if res["timed_out"] else "",
    )
