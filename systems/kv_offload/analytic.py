"""Analytic transfer model of the LBS paper (Table 1, Eq. 1-5).

Symbols: ``N_layer`` layers, ``N_beam`` total beams, ``N_step`` tokens per step, ``N_gen``
generated tokens, ``S_prompt`` prompt tokens, ``Mem_GPU`` KV budget (bytes),
``KV = 2 * n_kv_heads * head_dim * bytes`` per layer per beam per token.

- Eq.1 ``L_inGPU(s) = min(N_layer, floor(Mem_GPU / KV_layer(s)))``, ``KV_layer(s) = N_beam*s*KV``
- Eq.2 ``DM_token(s) = (N_layer - L_inGPU(s)) * KV_layer(s)``
- Eq.3 ``DM_req = sum_{i=0}^{N_gen-1} DM_token(i + S_prompt)``              (layer-wise)
- Eq.4 ``DM_step(s) = N_beam * KV_beam(s)``, ``KV_beam(s) = N_layer*s*KV``
- Eq.5 ``DM_req = sum_{i=0}^{ceil(N_gen/N_step)-1} DM_step(i*N_step + S_prompt)``   (LBS)

All results in bytes (host->device). Worked example (OPT-6.7B fp16, 64 beams, 7 GiB): Eq.3 =
53,012.45 GiB; Eq.5 = 2,010 / 990 / 480 GiB for steps 32 / 64 / 128 with s at the step's start
(2,070 / 1,050 / 540 GiB with s at the step's end; the paper's Fig.7 prints 2,052 / 1,044 / 540).
"""

from __future__ import annotations

import math

import numpy as np


def kv_per_token_layer(num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """The paper's KV: bytes per layer, per beam, per token (K and V)."""
    return 2 * num_kv_heads * head_dim * dtype_bytes


def layers_in_gpu(s, *, num_layers: int, num_beams: int, kv: int, mem_gpu: int):
    """Eq.1 (vectorised over s)."""
    kv_layer = num_beams * np.asarray(s, dtype=np.int64) * kv
    return np.minimum(num_layers, mem_gpu // np.maximum(kv_layer, 1))


def dm_layerwise(*, num_layers: int, num_beams: int, kv: int, mem_gpu: int, prompt_len: int, gen_len: int) -> int:
    """Eq.1-3: host->device bytes of a whole request under layer-wise offloading."""
    s = prompt_len + np.arange(gen_len, dtype=np.int64)
    L = layers_in_gpu(s, num_layers=num_layers, num_beams=num_beams, kv=kv, mem_gpu=mem_gpu)
    return _exact_sum((num_layers - L).astype(object) * num_beams * s.astype(object) * kv)


def dm_lbs(
    *, num_layers: int, num_beams: int, kv: int, prompt_len: int, gen_len: int, step: int, at_step_end: bool = False
) -> int:
    """Eq.4-5: host->device bytes of a whole request under LBS (inter-token locality only).

    ``at_step_end`` evaluates KV_beam at the step's end instead of its start (the paper's figure
    lies between the two readings)."""
    n_steps = math.ceil(gen_len / step)
    s = prompt_len + step * np.arange(n_steps, dtype=np.int64)
    if at_step_end:
        s = np.minimum(s + step, prompt_len + gen_len)
    return _exact_sum(num_beams * num_layers * s.astype(object) * kv)


def _exact_sum(terms) -> int:
    """Sum of Python-int terms (an object array): exact at any size (int64 wraps silently past
    2**63 B, 8 EiB, which Eq.3 of 10^8 beams of OPT-6.7B exceeds)."""
    return int(sum(terms.tolist()))


def predict(
    model_cfg, *, num_beams: int, prompt_len: int, gen_len: int, step: int, mem_gpu: int, dtype_bytes: int
) -> dict:
    """Both models for a configuration: ``{'eq3_layerwise_bytes', 'eq5_lbs_bytes'}``."""
    kv = kv_per_token_layer(model_cfg.num_kv_heads, model_cfg.head_dim, dtype_bytes)
    common = dict(num_layers=model_cfg.num_layers, num_beams=num_beams, kv=kv, prompt_len=prompt_len, gen_len=gen_len)
    return {
        "eq3_layerwise_bytes": dm_layerwise(mem_gpu=mem_gpu, **common),
        "eq5_lbs_bytes": dm_lbs(step=step, **common),
    }
