"""One home for model facts: parameter counts, weight and KV bytes, dtype bytes, the HF config.

Every family and both backends ask this module (never their own arithmetic). A model is any
object with the fields of :class:`harness.config.ModelConfig` (a DictConfig, an AttrDict or the
dataclass): ``hf_model_type``, ``num_layers``, ``hidden_size``, ``num_heads``, ``num_kv_heads``,
``head_dim``, ``intermediate_size``, ``vocab_size``, ``max_position``, ``dtype``, ``hf_config``;
a verifier additionally has ``prm_kind`` (``head``: a process reward model with a 2-label head
instead of the LM head, vLLM's ``Qwen2ForProcessRewardModel``; ``lm``: a causal LM).

Parameter counts are exact: they equal transformers' ``sum(p.numel() for p in model.parameters())``
of the model built from :func:`hf_config_dict` (tests/test_model_facts.py builds every
``conf/model/*.yaml`` on the meta device and compares). They count biases, norms, OPT's learned
positions and tied embeddings once. No torch import here (simulated runs stay torch-free).

Units: parameters (count), bytes.
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, Optional

from harness.errors import ConfigError, bad
from harness.units import size_setting

DTYPE_BYTES: Dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
SUPPORTED_TYPES = ("opt", "llama", "qwen2", "mistral")
CAUSAL_LM = {
    "opt": "OPTForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
PRM_HEAD_ARCH = "Qwen2ForProcessRewardModel"
PRM_LABELS = 2
OPT_POSITION_OFFSET = 2  # transformers' OPTLearnedPositionalEmbedding adds 2 rows


def _get(m, key, default=None):
    if hasattr(m, "keys") and key not in m.keys():
        # a missing key asked of a structured config raises inside OmegaConf, and the exception's
        # traceback keeps the callers' frames and their locals (a whole simulated run) alive in a
        # reference cycle until the cyclic collector runs
        return default
    try:
        v = m.get(key, default) if hasattr(m, "get") else getattr(m, key, default)
    except Exception:
        v = getattr(m, key, default)
    return default if v is None else v


def _extra(m) -> Dict[str, Any]:
    return dict(_get(m, "hf_config", {}) or {})


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (float16, bfloat16, float32, float64). Raises ValueError."""
    try:
        return DTYPE_BYTES[str(dtype)]
    except KeyError:
        raise ValueError(f"model.dtype={dtype!r} is not allowed: one of {', '.join(DTYPE_BYTES)}") from None


def _check_type(m) -> str:
    t = str(_get(m, "hf_model_type", ""))
    if t not in SUPPORTED_TYPES:
        raise ValueError(f"model.hf_model_type={t!r} is not allowed: one of {', '.join(SUPPORTED_TYPES)}")
    return t


# The shape fields every model has: positive integers (counts; max_position in tokens).
SHAPE_COUNTS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position",
)
ROTARY_TYPES = ("llama", "qwen2", "mistral")  # rotary position embeddings: rotate pairs of head dims
TYPE_NAMES = {"opt": "OPT", "llama": "LLaMA", "qwen2": "Qwen2", "mistral": "Mistral"}
# transformers' default padding-token id per type (OPTConfig: 1; LlamaConfig, MistralConfig and
# Qwen2Config: none): the input embedding's padding_idx, which must be a token of the vocabulary
DEFAULT_PAD_ID = {"opt": 1, "llama": None, "mistral": None, "qwen2": None}
# Why head_dim must be hidden_size / num_heads for the types whose engines derive it.
DERIVED_HEAD_DIM = {
    "opt": "OPT has no head_dim setting: transformers and vLLM derive it as hidden_size / num_heads",
    "qwen2": "Qwen2 has no head_dim setting: vLLM derives it as hidden_size / num_heads, so another "
    "head_dim would run a model whose KV bytes differ from the ones counted",
}


def check_model_shapes(m, role: str = "model") -> None:
    """The one rule for a model's shapes, on every family and backend (harness.config.validate_common
    calls it for ``model`` and ``verifier``; :func:`hf_config_dict` again before an engine builds it).
    ``role`` is the config key named in the message (``model``, ``verifier``). Raises ConfigError
    (exit 2, before any work) naming the field, the value and what is allowed:

    - ``hf_model_type`` one of :data:`SUPPORTED_TYPES`;
    - each of :data:`SHAPE_COUNTS` an integer > 0 (layers, sizes and heads are counts;
      ``max_position`` and ``vocab_size`` at least 1);
    - ``num_kv_heads`` divides ``num_heads`` (grouped-query attention; equal for multi-head);
    - OPT: ``num_kv_heads == num_heads`` (multi-head attention only) and ``head_dim * num_heads ==
      hidden_size`` (transformers' and vLLM's OPT derive head_dim = hidden_size / num_heads);
    - LLaMA: ``num_heads`` divides ``hidden_size`` (transformers' LlamaConfig refuses otherwise, also
      with an explicit head_dim);
    - Qwen2: ``head_dim * num_heads == hidden_size`` (Qwen2Config has no head_dim: vLLM's Qwen2
      derives it as hidden_size / num_heads, so another head_dim ran a model with other KV bytes
      than the ones counted);
    - ``vocab_size`` above the padding-token id (:data:`DEFAULT_PAD_ID`, or ``hf_config.pad_token_id``):
      the input embedding's padding_idx;
    - rotary types (:data:`ROTARY_TYPES`): ``head_dim`` even (the rotary embedding rotates pairs of
      dimensions; transformers' RoPE check refused an odd head_dim as the engine started).
    """
    t = str(_get(m, "hf_model_type", ""))
    if t not in SUPPORTED_TYPES:
        raise bad(f"{role}.hf_model_type", t, f"one of {', '.join(SUPPORTED_TYPES)}")
    for key in SHAPE_COUNTS:
        v = _get(m, key)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise bad(f"{role}.{key}", v, "a token count > 0" if key == "max_position" else "a count > 0")
    hidden, heads, kv, head_dim = (_get(m, k) for k in ("hidden_size", "num_heads", "num_kv_heads", "head_dim"))
    if heads % kv:
        raise bad(f"{role}.num_kv_heads", kv, f"a divisor of {role}.num_heads={heads} (grouped-query attention)")
    if t == "opt" and kv != heads:
        raise bad(f"{role}.num_kv_heads", kv, f"equal to {role}.num_heads={heads} (OPT has multi-head attention only)")
    if t in ("opt", "llama", "qwen2") and hidden % heads:
        raise bad(
            f"{role}.num_heads",
            heads,
            f"a divisor of {role}.hidden_size={hidden} ({TYPE_NAMES[t]} splits the hidden size among its heads)",
        )
    if t in DERIVED_HEAD_DIM and head_dim * heads != hidden:
        raise bad(
            f"{role}.head_dim",
            head_dim,
            f"{role}.hidden_size / {role}.num_heads = {hidden // heads} ({DERIVED_HEAD_DIM[t]})",
        )
    pad = _extra(m).get("pad_token_id", DEFAULT_PAD_ID[t])
    if pad is not None and _get(m, "vocab_size") <= int(pad):
        raise bad(
            f"{role}.vocab_size",
            _get(m, "vocab_size"),
            f"more than {int(pad)}, the padding-token id of this {TYPE_NAMES[t]} config: the input embedding's "
            f"padding_idx must be a token of the vocabulary (OPT with vocab_size=1 ended in transformers' "
            f"'Padding_idx must be within num_embeddings' after the engine started)",
        )
    if t in ROTARY_TYPES and head_dim % 2:
        raise bad(
            f"{role}.head_dim",
            head_dim,
            f"an even count ({TYPE_NAMES[t]}'s rotary position embedding rotates pairs of dimensions)",
        )


def is_prm_head(m) -> bool:
    """True for a verifier read through a 2-label PRM head (``prm_kind: head``)."""
    return _get(m, "prm_kind", None) == "head" and bool(_get(m, "num_layers", 0))


def tied_embeddings(m) -> bool:
    """Whether the LM head shares the input embedding (transformers' default per model type:
    OPT ties, LLaMA/Qwen2/Mistral do not; ``hf_config.tie_word_embeddings`` overrides)."""
    t = _check_type(m)
    return bool(_extra(m).get("tie_word_embeddings", t == "opt"))


def layer_params(m) -> int:
    """Parameters of one decoder layer: attention (with its biases), MLP, norms."""
    t = _check_type(m)
    h, hq, hkv, d, i = (
        int(_get(m, k)) for k in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")
    )
    x = _extra(m)
    q, kv = hq * d, hkv * d
    if t == "opt":
        bias = bool(x.get("enable_bias", True))
        affine = bool(x.get("layer_norm_elementwise_affine", True))
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv + h if bias else 0)
        mlp = 2 * h * i + (i + h if bias else 0)
        norms = 2 * (2 * h if affine else 0)
        return attn + mlp + norms
    attn = h * q + 2 * h * kv + q * h
    if t == "qwen2":
        attn += q + 2 * kv  # q/k/v biases, o_proj without
    elif bool(x.get("attention_bias", False)):
        attn += q + 2 * kv + h
    mlp = 3 * h * i + (2 * i + h if bool(x.get("mlp_bias", False)) else 0)
    return attn + mlp + 2 * h  # input + post-attention RMSNorm


def embedding_params(m) -> int:
    """Everything outside the decoder layers: token (and OPT position) embeddings, projections,
    the final norm, and the output head (the LM head unless tied, or a PRM's 2-label head)."""
    t = _check_type(m)
    h, V = int(_get(m, "hidden_size")), int(_get(m, "vocab_size"))
    x = _extra(m)
    if t == "opt":
        e = int(x.get("word_embed_proj_dim", h))
        n = V * e + (int(_get(m, "max_position")) + OPT_POSITION_OFFSET) * h
        if e != h:
            n += 2 * h * e  # project_in / project_out (no bias)
        if x.get("do_layer_norm_before", True) and not x.get("_remove_final_layer_norm", False):
            n += 2 * h if x.get("layer_norm_elementwise_affine", True) else 0
        head_in = e
    else:
        n = V * h + h  # embed_tokens + final RMSNorm
        head_in = h
    if is_prm_head(m):
        n += h * h + h + h * PRM_LABELS + PRM_LABELS  # Linear(h, h) -> ReLU -> Linear(h, 2)
    elif not tied_embeddings(m):
        n += V * head_in
    return n


def num_params(m) -> int:
    """Total parameter count (exact; see the module docstring). ``model.num_params``, when set,
    overrides the count derived from the shapes."""
    override = _get(m, "num_params", None)
    if override:
        return int(override)
    return int(_get(m, "num_layers")) * layer_params(m) + embedding_params(m)


def forward_params(m) -> int:
    """Parameters a forward pass multiplies with, per token: all but the input embedding tables,
    which are row lookups (the token embedding when the LM head is a separate matrix, OPT's learned
    positions). FLOPs per token ~ 2 x this; the bytes a decode step streams ~ this x dtype bytes."""
    t = _check_type(m)
    h, V = int(_get(m, "hidden_size")), int(_get(m, "vocab_size"))
    x = _extra(m)
    lookups = (
        0
        if (tied_embeddings(m) and not is_prm_head(m))
        else V * int(x.get("word_embed_proj_dim", h) if t == "opt" else h)
    )
    if t == "opt":
        lookups += (int(_get(m, "max_position")) + OPT_POSITION_OFFSET) * h
    return num_params(m) - lookups


def lm_head_params(m) -> int:
    """Parameters of the projection to the vocabulary (tied or not), which an engine applies only
    at the positions it samples from (one per sequence per step), not to every prefilled token;
    0 for a PRM head (its small head runs at every position). Part of :func:`forward_params`."""
    if is_prm_head(m):
        return 0
    h = int(_get(m, "hidden_size"))
    e = int(_extra(m).get("word_embed_proj_dim", h)) if _check_type(m) == "opt" else h
    return int(_get(m, "vocab_size")) * e


def weight_bytes(m) -> int:
    """Bytes of all weights in the model's dtype."""
    return num_params(m) * dtype_bytes(_get(m, "dtype"))


# The largest random-weight model a real engine runs on a CPU: 2 GiB of weights. The tiny-* models
# (0.06-0.16 GiB) show a schedule in seconds; random weights of a paper-size model measure nothing
# more and load for minutes, then search for hours on a 2-core machine. A local checkpoint
# (``weights: /dir``) is the user's choice and is not limited.
CPU_MAX_WEIGHT_BYTES = 2 << 30


def check_cpu_model(m, engine: str, role: str = "model") -> None:
    """One rule for every real engine on a CPU (LBS on torch, FastTTS and BEAM on vLLM): raise
    ConfigError, before any work, for a random-weight model whose weights exceed
    :data:`CPU_MAX_WEIGHT_BYTES`. ``engine`` names the engine in the message (``vLLM``, ``torch``);
    ``role`` the config key (``model``, ``verifier``)."""
    if str(_get(m, "weights") or "random") != "random":
        return
    need = weight_bytes(m)
    if need > CPU_MAX_WEIGHT_BYTES:
        raise ConfigError(
            f"{role}={m.name!r} with random weights ({need / 2**30:.1f} GiB) is not allowed for "
            f"{engine} on CPU: use a tiny-* model (<= {CPU_MAX_WEIGHT_BYTES >> 30} GiB of weights), "
            f"backend=sim, a CUDA GPU, or {role}.weights=/dir (a local checkpoint)"
        )


WEIGHT_FILES = ("*.safetensors", "*.bin")  # what transformers' from_pretrained and vLLM load


def check_weights(m, role: str = "model") -> None:
    """``<role>.weights`` must be ``random`` or a local checkpoint directory holding a valid
    config.json and weight files (:data:`WEIGHT_FILES`; nothing is fetched from a hub); ConfigError
    before any work otherwise (an LBS weights folder without weights ended in a ValueError record).
    One rule for the real engines that load weights (LBS on torch, BEAM on vLLM; FastTTS inspects
    its checkpoints further: tokenizer, architecture, shapes)."""
    import json
    from pathlib import Path

    weights = str(_get(m, "weights") or "random")
    if weights == "random":
        return
    path = Path(weights).expanduser()
    where = f"{role}.weights={weights!r} is not allowed"
    allowed = "random or a local checkpoint directory (config.json and weights; nothing is fetched from a hub)"
    if not path.is_dir():
        raise ConfigError(f"{where}: no such directory; allowed: {allowed}")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{where}: the directory has no config.json; allowed: {allowed}")
    try:
        json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where}: its config.json is not valid JSON ({e})") from None
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_FILES):
        raise ConfigError(
            f"{where}: no weights in the directory (none of {', '.join(WEIGHT_FILES)}); allowed: {allowed}"
        )


def kv_bytes_per_token_layer(m) -> int:
    """KV bytes of one token in one layer: 2 (K and V) x KV heads x head dim x dtype bytes
    (the LBS paper's ``KV``; OPT-6.7B fp16: 16 KiB)."""
    return 2 * int(_get(m, "num_kv_heads")) * int(_get(m, "head_dim")) * dtype_bytes(_get(m, "dtype"))


def kv_bytes_per_token(m) -> int:
    """KV bytes of one token over all layers (OPT-6.7B fp16: 512 KiB)."""
    return int(_get(m, "num_layers")) * kv_bytes_per_token_layer(m)


# --- the KV budget --------------------------------------------------------------------------------
# One meaning everywhere: ``kv_budget`` = bytes of KV cache per device (per GPU). Overridable with
# the top-level ``kv_budget=7GiB`` (bytes or a size with a unit); otherwise derived from the model and
# the hardware as  memory - weights on the device - a reserve  (:func:`default_kv_budget`), with
# each family stating its reserve:
#   LBS family, serving family: the hardware profile's ``kv_reserve_bytes`` (CUDA context,
#       activations, allocator slack); null = 10 % of the device memory (vLLM's default
#       gpu_memory_utilization of 0.9). rtx4090.yaml states the reserve the LBS paper implies.
#   FastTTS family: the engines may use ``system.memory_fraction`` of the memory (the paper's
#       setting), less each engine's activation reserve: the activation peak of vLLM's start-up
#       profiling pass (harness/vllm_memory.py; ``system.kv_accounting=vllm``, default) or 5 % of
#       that share (``flat``) (systems/verifier_search/memory_plan.py activation_reserve).
DEFAULT_RESERVE_FRACTION = 0.10


def kv_reserve_bytes(hw) -> int:
    """The hardware profile's reserve per device (bytes): ``kv_reserve_bytes``, or 10 % of
    ``memory_bytes`` when null."""
    r = _get(hw, "kv_reserve_bytes", None)
    return int(r) if r is not None else int(DEFAULT_RESERVE_FRACTION * float(_get(hw, "memory_bytes")))


def default_kv_budget(memory_bytes: float, weight_bytes_per_device: float, reserve_bytes: float) -> int:
    """KV bytes per device = memory - weights held on the device - reserve (may be <= 0: the
    weights do not fit, which callers record as ``oom``)."""
    return int(float(memory_bytes) - float(weight_bytes_per_device) - float(reserve_bytes))


def configured_kv_budget(system) -> Optional[int]:
    """``system.kv_budget`` (the top-level ``kv_budget`` lands there) in bytes, None when unset.
    Raises ConfigError for a value that is not a size."""
    val = system.get("kv_budget")
    return None if val in (None, "None") else size_setting(val, "kv_budget")


def kv_budget_bytes(
    system,
    memory_bytes: float,
    weight_bytes_per_device: float,
    reserve_bytes: float,
    *,
    on_cpu: bool = False,
    live: Optional[int] = None,
) -> int:
    """KV bytes per device, the one meaning of ``kv_budget`` in every family: ``system.kv_budget`` when
    set; else, for an engine whose KV is committed up front in a CPU's shared memory (``on_cpu``),
    ``system.cpu_kv_budget``; else ``live`` (free device memory, ``torch.cuda.mem_get_info``: LBS
    Alg. 1's get_budget) when the caller measured it; else :func:`default_kv_budget` of the memory, the
    weights on the device and the reserve the family states (the table above). Raises ConfigError
    for a setting that is not a size."""
    configured = configured_kv_budget(system)
    if configured is not None:
        return configured
    if on_cpu:
        return size_setting(system.get("cpu_kv_budget"), "system.cpu_kv_budget")
    if live is not None:
        return live
    return default_kv_budget(memory_bytes, weight_bytes_per_device, reserve_bytes)


def architecture(m) -> str:
    """The transformers/vLLM architecture class name of the model in its role."""
    return PRM_HEAD_ARCH if is_prm_head(m) else CAUSAL_LM[_check_type(m)]


def hf_config_dict(m, extra: Optional[Dict[str, Any]] = None, role: str = "model") -> Dict[str, Any]:
    """A transformers ``config.json`` dict with the model's exact shapes (what vLLM reads for
    random weights, and what transformers' ``AutoConfig.for_model(**d)`` builds). ``hf_config``
    fields of the model config are added, except ``tokenizer`` (ours, not transformers');
    ``extra`` last. Raises ConfigError (a ValueError) for shapes :func:`check_model_shapes` refuses
    (``role`` names the config key in the message: ``model``, ``verifier``)."""
    check_model_shapes(m, role)
    t = _check_type(m)
    dt = str(_get(m, "dtype"))
    d: Dict[str, Any] = {
        "architectures": [architecture(m)],
        "model_type": t,
        "hidden_size": int(_get(m, "hidden_size")),
        "num_hidden_layers": int(_get(m, "num_layers")),
        "num_attention_heads": int(_get(m, "num_heads")),
        "vocab_size": int(_get(m, "vocab_size")),
        "max_position_embeddings": int(_get(m, "max_position")),
        "torch_dtype": "float32" if dt == "float64" else dt,  # vLLM has no float64 kernels
    }
    if t == "opt":
        d.update(
            ffn_dim=int(_get(m, "intermediate_size")),
            word_embed_proj_dim=int(_get(m, "hidden_size")),
            do_layer_norm_before=True,
            activation_function="relu",
        )
    else:
        d.update(
            num_key_value_heads=int(_get(m, "num_kv_heads")),
            head_dim=int(_get(m, "head_dim")),
            intermediate_size=int(_get(m, "intermediate_size")),
            hidden_act="silu",
        )
    if is_prm_head(m):
        d["num_labels"] = PRM_LABELS
    d.update({k: v for k, v in _extra(m).items() if k != "tokenizer"})
    d.update(extra or {})
    return d


__all__ = [
    "DTYPE_BYTES",
    "dtype_bytes",
    "num_params",
    "layer_params",
    "embedding_params",
    "weight_bytes",
    "kv_bytes_per_token",
    "kv_bytes_per_token_layer",
    "forward_params",
    "lm_head_params",
    "tied_embeddings",
    "hf_config_dict",
    "check_model_shapes",
    "architecture",
    "is_prm_head",
    "SUPPORTED_TYPES",
    "default_kv_budget",
    "kv_reserve_bytes",
]
