"""Build the transformers causal LM the TTC torch executor runs (docs/design.md "The TTC engine").

The architecture comes from our :class:`harness.config.ModelConfig` (``conf/model/*.yaml``): random
weights from a seeded init (``weights: random``), or a local checkpoint directory
(``weights: /path``, loaded with ``from_pretrained``; nothing is fetched from a hub). The built
model's KV geometry (layers, KV heads, head dim) is checked against ours so that the bytes the
analytic model (LBS Eq.1-5) and the plans predict are the bytes the engine moves.
"""

from __future__ import annotations

import os
from typing import Any, Dict

import torch

from systems.kv_offload.plan import KVGeometry

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
SUPPORTED = ("opt", "llama", "qwen2")


class ModelGeometryError(ValueError):
    """The built transformers model's KV geometry differs from the model config's."""


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"model.dtype={name!r} is not allowed: one of {', '.join(DTYPES)}")
    return DTYPES[name]


def hf_config_kwargs(mcfg) -> Dict[str, Any]:
    """transformers config constructor fields for ``mcfg`` (a ModelConfig or DictConfig).

    Raises ValueError for a model type we do not map (allowed: opt, llama, qwen2)."""
    from harness.model_facts import hf_config_dict

    t = mcfg.hf_model_type
    if t not in SUPPORTED:
        raise ValueError(
            f"model.hf_model_type={t!r} is not allowed for the torch engine: one of {', '.join(SUPPORTED)}"
        )
    try:
        d = hf_config_dict(mcfg)
    except ValueError as e:
        raise ModelGeometryError(str(e)) from None
    return {k: v for k, v in d.items() if k not in ("architectures", "model_type", "torch_dtype")}


def kv_geometry_of(model) -> KVGeometry:
    """Read the KV geometry off a built transformers model (its attention modules, not its config)."""
    attns = [m for name, m in model.named_modules() if name.endswith("self_attn") and hasattr(m, "k_proj")]
    if not attns:
        raise ModelGeometryError(f"{type(model).__name__}: no self_attn modules with k_proj found")
    a = attns[0]
    head_dim = int(getattr(a, "head_dim"))
    kv_heads = a.k_proj.out_features // head_dim
    return KVGeometry(len(attns), kv_heads, head_dim, next(model.parameters()).element_size())


def check_geometry(model, mcfg, dtype: torch.dtype) -> KVGeometry:
    """Raise ModelGeometryError unless the built model's layers, KV heads and head dim equal ours."""
    g = kv_geometry_of(model)
    want = KVGeometry(
        int(mcfg.num_layers), int(mcfg.num_kv_heads), int(mcfg.head_dim), torch.empty((), dtype=dtype).element_size()
    )
    if g != want:
        raise ModelGeometryError(
            f"model {mcfg.name}: built {type(model).__name__} has KV geometry (layers={g.num_layers}, "
            f"kv_heads={g.num_kv_heads}, head_dim={g.head_dim}, bytes/elem={g.dtype_bytes}) but "
            f"conf/model says (layers={want.num_layers}, kv_heads={want.num_kv_heads}, "
            f"head_dim={want.head_dim}, bytes/elem={want.dtype_bytes})"
        )
    return g


def build_model(
    mcfg, device: str | torch.device = "cpu", seed: int = 0, dtype: str | None = None, attn_implementation: str = "sdpa"
):
    """Build the causal LM of ``mcfg`` in eval mode on ``device``; returns ``(model, KVGeometry)``
    (``systems.kv_offload.plan.KVGeometry`` read off the built model: ``kv_layer_token`` is LBS's ``KV``).

    ``weights: random`` -> ``AutoModelForCausalLM.from_config`` with its parameters allocated
    directly on ``device`` in ``dtype`` and transformers' own init run there, under
    ``torch.manual_seed(seed)`` (the RNG state of the CPU and of that device is restored afterwards):
    the same seed gives the same weights on the same kind of device. Nothing is built on the CPU and
    moved (OPT-6.7B's init on one CPU thread takes minutes; on a GPU, a second).
    ``weights: <dir>`` -> ``from_pretrained(dir, local_files_only=True)``, then moved to ``device``.
    ``dtype`` overrides ``mcfg.dtype`` (tests use float64).
    Raises ValueError (unsupported type or dtype), FileNotFoundError (missing checkpoint dir),
    ModelGeometryError (built geometry differs from the config).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    dt = torch_dtype(dtype or mcfg.dtype)
    device = torch.device(device)
    weights = mcfg.get("weights", "random") if hasattr(mcfg, "get") else getattr(mcfg, "weights", "random")
    if weights in (None, "", "random"):
        hf_cfg = AutoConfig.for_model(mcfg.hf_model_type, **hf_config_kwargs(mcfg))
        hf_cfg._attn_implementation = attn_implementation
        rng_devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=rng_devices), torch.device(device):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(hf_cfg, dtype=dt, attn_implementation=attn_implementation)
    else:
        if not os.path.isdir(weights):
            raise FileNotFoundError(
                f"model.weights={weights!r}: not a local checkpoint directory "
                f"(use 'random' or a path; nothing is downloaded)"
            )
        model = AutoModelForCausalLM.from_pretrained(
            weights, dtype=dt, local_files_only=True, attn_implementation=attn_implementation
        )
        if model.config.model_type != mcfg.hf_model_type:
            raise ModelGeometryError(
                f"model.weights={weights!r} is a {model.config.model_type!r} checkpoint, "
                f"conf/model says hf_model_type={mcfg.hf_model_type!r}"
            )
    model = model.to(device).eval()
    model.requires_grad_(False)
    geom = check_geometry(model, mcfg, dt)
    return model, geom


_SHARED: Dict[str, Any] = {}
BUILDS = {"count": 0}  # models built by shared_model in this process (tests read it)


def shared_model(mcfg, device: str | torch.device = "cpu", seed: int = 0, dtype: str | None = None):
    """:func:`build_model`, built once per process for a given (model config, device, seed, dtype)
    and shared by every run that asks for it (the torch executor, ``hf_offload``, the runs of
    ``scripts/gpu_validate.py``). One model is kept: asking for another replaces it."""
    import json

    conf = mcfg if isinstance(mcfg, dict) else _plain(mcfg)
    key = json.dumps([conf, str(torch.device(device)), int(seed), dtype], sort_keys=True, default=str)
    if key not in _SHARED:
        _SHARED.clear()  # drop the previous model before building the next
        _SHARED[key] = build_model(mcfg, device, seed, dtype)
        BUILDS["count"] += 1
    return _SHARED[key]


def _plain(mcfg) -> Dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(mcfg, DictConfig):
        return OmegaConf.to_container(mcfg, resolve=True)
    return dict(mcfg)
