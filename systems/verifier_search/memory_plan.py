"""The memory plan of the FastTTS family (M, FastTTS §4.3): KV bytes and batch caps of both engines.

One code path for both backends. ``runner.build`` makes the plan once per run, before the engines
exist (``system.replan=per_run``, the default), and both backends size their engines from it; with
``system.replan=per_iteration`` (the paper's "re-run whenever the system state changes") it is made
again before every iteration and applied to the engines, which only the simulator can honour: vLLM
allocates each engine's KV cache once, at start-up, so that setting is refused on vLLM before any
work (exit 2).

KV budget M = bytes of KV cache per device; generator and verifier share the one device. Set by
``kv_budget`` (top-level or ``system.kv_budget``); otherwise derived by
``harness.model_facts.default_kv_budget``: the engines may use ``system.memory_fraction`` of the
device memory (the paper's setting: 0.4 for 1.5B+1.5B, else 0.9), minus both models' weights, minus
each engine's activation reserve (``system.kv_accounting``, :func:`activation_reserve`: ``vllm``, the
default, the activation peak of vLLM's start-up profiling pass, ``harness.vllm_memory``; ``flat``, 5 %
of the memory share, ours until issue 38). A CPU engine commits its KV up front in host memory that other
processes share, so on a CPU (real, or simulated with a CPU profile) the default is
``system.cpu_kv_budget`` instead.

Baseline (M off): a fixed split (the FastTTS artifact's ``gpu_memory_utilization`` pairs for the
paper's model pairs with a derived budget, scaled to ``system.memory_fraction``: on an RTX 4090 at
the paper's fractions exactly the artifact's pairs; else ``gen_memory_share`` of M) and vLLM's
default batch cap ``max_num_seqs``. M on: the roofline search of ``memory.py`` planned with a cost profile (the
hardware profile's rooflines: a GPU's datasheet, or this CPU's profile measured by
``systems.verifier_search.calibrate``, never placeholder numbers), each engine keeping room for one
``max_model_len`` sequence (vLLM refuses to start otherwise); its batch sizes B_dec and B_pre size the
KV split, and cap the engines' batches only with ``system.m_batch_caps=roofline`` (:data:`M_BATCH_CAPS`).

M's inputs (issue 38, item 10): M never plans with the truth. Its stage times come from a profiled
table (:func:`systems.verifier_search.memory.profile_table`): each stage's pass timed over batch
sizes x context lengths on the cost profile, seen through ``system.profile_error`` (BEAM's profiling
error, ``systems.common.profile_error.ProfileError``: bias and Gaussian noise per measurement,
seeded by ``seed``; applied on the simulated backend only, as BEAM's: a real engine's profile is a
measurement with its own error) and interpolated (:class:`~systems.verifier_search.memory.StageTable`).
Its step length S_dec is the running mean of the step lengths observed so far in the run
(:meth:`MemoryPlan.observe`; with ``system.replan=per_iteration`` the newest step of every active
path before each iteration), and before any step completes a fixed prior (:meth:`MemoryPlan.step_prior`):
min(max_step_tokens, (max_model_len - prompt) / num_iterations), the longest mean step with which a
path still fits ``max_model_len`` at the end of the search -- what the limits the planner is given
allow, never ``workload.step_tokens_mean`` (the simulator's truth); ``system.m_step_prior`` may set
a fixed token count instead. A per_run plan is made before any step, so it plans with the prior.

A plan that does not fit the device (weights beyond the memory share, an engine without room for one
``max_model_len`` sequence) raises ``RunOOM``: a recorded result (status oom), never bad input; a
value no configuration could accept (an unparsable or non-positive ``kv_budget``) is a ConfigError.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Tuple

import numpy as np

from harness.errors import ConfigError, RunOOM
from harness.model_facts import default_kv_budget, kv_budget_bytes
from systems.verifier_search.memory import (
    Allocation,
    MemoryTooSmall,
    ModelShape,
    Roofline,
    StageTable,
    profile_table,
    search_allocation,
)
from systems.verifier_search.vllm_v0 import SLEEP_MEMORY_FRACTION, sleeps

REPLANS = ("per_run", "per_iteration")
M_STEP_PRIOR_FIT = "fit"  # system.m_step_prior: the prior from the limits (MemoryPlan.step_prior), or tokens
# M's batch caps (``system.m_batch_caps``). ``artifact`` (default): both engines keep vLLM's batch cap
# ``system.max_num_seqs`` = 256 and M sets only the KV split, as the FastTTS artifact runs them: its
# configs (davidshiao55/TTC 5bf35f5, FastTTS-AE/benchmarks/configs/<pair>/<set>/<variant>/*.yaml) set
# each engine's gpu_memory_utilization only, never max_num_seqs, so vLLM 0.9.2's default applies: 256
# (vllm/engine/arg_utils.py, EngineArgs._set_default_args_v0; the artifact's GeneratorLLMEngine is a
# V0 LLMEngine; V1 also gives 256 below 70 GB of device memory). ``roofline`` (until issue 38): the
# roofline search's B_dec and B_pre also cap the generator's and the verifier's batches.
M_BATCH_CAPS = ("artifact", "roofline")
ACTIVATION_RESERVE = 0.05  # share of the engines' memory kept for activations (FastTTS family)
PROFILE_SEED_TAG = 0xFA575  # M's profiling pass draws from default_rng([seed, tag]) (BEAM's: 0x7AB1E)
# How an engine's activation reserve is counted (``system.kv_accounting``): ``vllm`` (default) = the
# activation peak of vLLM's profiling pass, as vLLM sizes KV (harness/vllm_memory.py; the FastTTS
# artifact ran vLLM 0.9.2 on a GPU: VLLM_092_CUDA); ``flat`` = ACTIVATION_RESERVE of the memory share
KV_ACCOUNTINGS = ("vllm", "flat")
CPU_PROFILE = "cpu-tts"  # conf/hardware/cpu-tts.yaml: this CPU, measured by systems.verifier_search.calibrate
HARDWARE_DIR = Path(__file__).resolve().parents[2] / "conf" / "hardware"
# FastTTS AE fixed gpu_memory_utilization (generator, verifier) per pair for the baseline (§4.4)
AE_SPLITS = {
    ("qwen2.5-math-1.5b", "skywork-prm-1.5b"): (0.20, 0.20),
    ("qwen2.5-math-1.5b", "math-shepherd-7b"): (0.19, 0.71),
    ("qwen2.5-math-7b", "skywork-prm-1.5b"): (0.68, 0.22),
}


def unset(v) -> bool:
    """Whether an optional config value is unset (null, or "None" from the command line)."""
    return v in (None, "None")


def shapes(cfg) -> Tuple[ModelShape, ModelShape]:
    return ModelShape.of(cfg.model), ModelShape.of(cfg.verifier)


def gen_token_budget(cfg) -> int:
    """Tokens per generator engine step (``max_num_batched_tokens``; chunked prefill off): vLLM 0.9.2's
    default without chunked prefill, max(max_model_len, 2048) -> ``max_model_len`` (4096) here."""
    return int(cfg.workload.max_model_len)


def ver_token_budget(cfg) -> int:
    """Tokens per verifier engine step (``max_num_batched_tokens``): at least ``max_model_len`` (an
    input is prefilled whole where chunked prefill is off) and 4096. vLLM 0.9.2's V0 default for a
    pooling model with the budget unset would be 32768 (``_POOLING_MODEL_MAX_NUM_BATCHED_TOKENS``);
    the AE sets VLLM_USE_V1=1 for its verifier, whose V1 default differs, so which one it ran is not
    settled here: kept at 4096 (docs/verifier_search.md)."""
    return max(int(cfg.workload.max_model_len), 4096)


def activation_reserve(cfg, role: str, share_bytes: float) -> float:
    """Bytes the ``role`` engine (``model``: the generator, ``verifier``) keeps off its KV for
    activations, given ``share_bytes`` of device memory (its gpu_memory_utilization x total), by
    ``system.kv_accounting`` (:data:`KV_ACCOUNTINGS`): ``vllm``: the activation peak of vLLM's
    start-up profiling pass (``harness.vllm_memory.activation_peak_bytes``, vLLM 0.9.2 on a GPU as
    the FastTTS artifact ran it) over the engine's ``max_num_batched_tokens`` (:func:`gen_token_budget` /
    :func:`ver_token_budget`) and ``system.max_num_seqs``, the verifier a pooling model (no sampler);
    ``flat``: :data:`ACTIVATION_RESERVE` x ``share_bytes``. Raises ConfigError for another setting."""
    how = str(cfg.system.get("kv_accounting", "vllm"))
    if how == "flat":
        return ACTIVATION_RESERVE * share_bytes  # a float, as before issue 38 (bit for bit)
    if how != "vllm":
        raise ConfigError(f"system.kv_accounting={how!r} is not allowed: one of {', '.join(KV_ACCOUNTINGS)}")
    from harness.vllm_memory import VLLM_092_CUDA, activation_peak_bytes

    gen = role == "model"
    return activation_peak_bytes(
        cfg[role],
        gen_token_budget(cfg) if gen else ver_token_budget(cfg),
        int(cfg.system.max_num_seqs),
        pooling=not gen,
        profile=VLLM_092_CUDA,
    )


def kv_budget(cfg, on_cpu: bool) -> int:
    """KV budget M in bytes (module docstring; harness.model_facts.kv_budget_bytes with this family's
    share and reserve: both engines' :func:`activation_reserve`). Raises RunOOM when the derived
    budget is <= 0 (the weights do not fit: a recorded oom), ConfigError for a bad or non-positive
    setting."""
    s = cfg.system
    gen, ver = shapes(cfg)
    share = float(cfg.hardware.memory_bytes) * float(s.memory_fraction)
    if str(s.get("kv_accounting", "vllm")) == "flat":  # one 5 % of the whole share (ours until issue 38)
        reserve = activation_reserve(cfg, "model", share)
    else:  # each engine's own profiling peak
        reserve = activation_reserve(cfg, "model", share) + activation_reserve(cfg, "verifier", share)
    m = kv_budget_bytes(s, share, gen.weight_bytes + ver.weight_bytes, reserve, on_cpu=on_cpu)
    if m <= 0 and unset(s.kv_budget) and not on_cpu:
        raise RunOOM(
            f"memory_fraction={s.memory_fraction} of {cfg.hardware.name} leaves {m / 2**30:.2f} GiB "
            f"for KV after the weights of {cfg.model.name} + {cfg.verifier.name}"
        )
    if m <= 0:
        raise ConfigError(f"kv_budget={m} bytes is not allowed: a positive size (bytes, or e.g. 2GiB)")
    return int(m)


def step_cap(cfg, on_cpu: bool) -> int:
    """Tokens a generator call may decode per step (its ``max_tokens``): ``cpu_max_step_tokens`` on a
    CPU with random generator weights, else ``max_step_tokens``."""
    from systems.verifier_search.checkpoint import is_local

    w = cfg.workload
    return int(w.cpu_max_step_tokens) if on_cpu and not is_local(cfg.model.weights) else int(w.max_step_tokens)


def one_sequence_kv(cfg, shape: ModelShape) -> int:
    """KV bytes of one ``max_model_len`` sequence plus two blocks (vLLM's start-up check)."""
    return int(shape.kv_bytes_per_token * (cfg.workload.max_model_len + 2 * cfg.system.block_size))


def cost_profile(cfg, real_cpu: bool):
    """The hardware profile M plans with: ``hardware``, except on a real CPU engine given a GPU
    profile, where it is this CPU's measured profile ``conf/hardware/cpu-tts.yaml``. Raises
    ConfigError when that profile holds no measured stage costs (placeholder numbers)."""
    hw = cfg.hardware
    if real_cpu and hw.kind != "cpu":
        from omegaconf import OmegaConf

        path = HARDWARE_DIR / f"{CPU_PROFILE}.yaml"
        hw = OmegaConf.load(path) if path.exists() else OmegaConf.create({"name": CPU_PROFILE})
    if real_cpu and not ((hw.get("measured") or {}).get("tts")):
        raise ConfigError(
            f"hardware={hw.name} is not allowed for M (system.memory=true) on a real CPU engine: it "
            f"holds no measured generator/verifier costs; allowed: hardware={CPU_PROFILE} (measured, "
            f"committed) or a profile measured here by `python -m systems.verifier_search.calibrate` "
            f"(hardware=cpu-tts-calibrated), or system.memory=false"
        )
    return hw


class MemoryPlan:
    """Makes the plan for one run's configuration (see module docstring): ``plan(n, s_ver, s_ctx,
    s_dec)`` for a state, :meth:`per_run` before the engines exist, :meth:`per_iteration` before an
    iteration (``system.replan=per_iteration``). ``on_cpu``: the engines run on (or, simulated,
    model) a CPU; ``real``: they are real engines (vLLM)."""

    def __init__(self, cfg, on_cpu: bool, real: bool):
        s, w = cfg.system, cfg.workload  # never w.step_tokens_mean: the truth (module docstring)
        self.cfg, self.on_cpu = cfg, on_cpu
        self.hw_name = (
            "this CPU" if on_cpu and real else str(cfg.hardware.name)
        )  # a real CPU run's hardware profile is not where it ran
        self.gen, self.ver = shapes(cfg)
        # offload_mode=sleep (the artifact's offload, simulated backend only): each engine its own 0.95 of
        # the device (:meth:`_sleep_split`), so no shared budget from memory_fraction unless kv_budget is
        # set or the engines model a CPU
        self.sleep = not real and sleeps(s)
        shared = not self.sleep or on_cpu or not unset(s.kv_budget)
        self.budget = kv_budget(cfg, on_cpu) if shared else None
        self.memory, self.offload = bool(s.memory), bool(s.offload) and not real
        self.max_model_len, self.num_iterations = int(w.max_model_len), int(w.num_iterations)
        self.floor_g, self.floor_v = one_sequence_kv(cfg, self.gen), one_sequence_kv(cfg, self.ver)
        # M's batch caps (M_BATCH_CAPS): None = the roofline's B_dec / B_pre
        self.batch_cap = int(s.max_num_seqs) if s.get("m_batch_caps", "artifact") == "artifact" else None
        self.step_cap = step_cap(cfg, on_cpu)
        prior = s.get("m_step_prior", M_STEP_PRIOR_FIT)
        self.fixed_prior = None if prior == M_STEP_PRIOR_FIT else float(prior)  # validated: > 0
        self._steps_sum, self._steps_count = 0.0, 0  # step lengths observed so far (observe)
        self.run_step = None  # S_dec of the last per_run plan of M (tokens; None without M)
        if self.sleep:
            self.memory, self.profile = False, None  # the AE's offload configs have no M
            self.fixed = self._sleep_split()
        elif self.memory:
            hw = cost_profile(cfg, on_cpu and real)
            self.profile = str(hw.name)
            self.dec_hw, self.pre_hw = Roofline.of(hw, "decode"), Roofline.of(hw, "prefill")
            self.offload_bw = float(cfg.hardware.h2d_bw)
            self.table = self._profile(cfg, real)
        else:
            self.profile = None
            self.fixed = self._fixed_split()

    def _profile(self, cfg, real: bool) -> StageTable:
        """The stage table M plans from (module docstring): the cost profile's passes over
        ``n`` sequences x ``max_model_len`` tokens, seen through ``system.profile_error`` on the
        simulated backend (seeded by ``seed``), exact on a real engine (its profile is measured)."""
        from systems.common.profile_error import ProfileError

        pe = cfg.system.profile_error
        err = None if real else ProfileError(float(pe.bias), float(pe.noise))
        rng = np.random.default_rng([int(cfg.get("seed") or 0), PROFILE_SEED_TAG])
        return profile_table(
            self.gen, self.ver, self.dec_hw, self.pre_hw, int(cfg.workload.n), self.max_model_len, err, rng
        )

    def _fixed_split(self) -> Allocation:
        cfg, s = self.cfg, self.cfg.system
        pair = AE_SPLITS.get((cfg.model.name, cfg.verifier.name))
        if pair and unset(s.kv_budget) and not self.on_cpu:
            scale = float(s.memory_fraction) / (pair[0] + pair[1])  # 1 at the paper's fractions
            mem = float(cfg.hardware.memory_bytes)
            gm, vm = pair[0] * scale * mem, pair[1] * scale * mem
            g = default_kv_budget(gm, self.gen.weight_bytes, activation_reserve(cfg, "model", gm))
            v = default_kv_budget(vm, self.ver.weight_bytes, activation_reserve(cfg, "verifier", vm))
            self.split = (
                f"the baseline's fixed split ({pair[0] * scale:.2f} / {pair[1] * scale:.2f} of "
                f"{cfg.hardware.name}'s memory, FastTTS AE) minus each model's weights"
            )
        else:
            g = int(self.budget * float(s.gen_memory_share))
            v = self.budget - g
            self.split = f"the baseline's fixed split ({s.gen_memory_share:g} of the KV budget to the generator)"
        return Allocation(int(s.max_num_seqs), int(s.max_num_seqs), g, v, float("nan"))

    def _sleep_split(self) -> Allocation:
        """The plan under ``offload_mode=sleep`` (``offload`` True): both engines keep vLLM's batch cap
        ``system.max_num_seqs`` (the AE sets none) and each gets the KV of its own
        ``vllm_v0.SLEEP_MEMORY_FRACTION`` of the device less its weights and its activation reserve
        (:func:`activation_reserve`), or, where ``kv_budget`` is set or the engines run on (or model)
        a CPU, the whole KV budget each: one engine is awake at a time. Raises RunOOM when an
        engine's weights leave no KV."""
        cfg, s = self.cfg, self.cfg.system
        if self.budget is not None:
            g = v = self.budget
            self.split = (
                f"the artifact's sleep mode: the whole KV budget to each engine ({self.budget / 2**20:.1f} MiB)"
            )
        else:
            share = SLEEP_MEMORY_FRACTION * float(cfg.hardware.memory_bytes)
            g = int(share - self.gen.weight_bytes - activation_reserve(cfg, "model", share))
            v = int(share - self.ver.weight_bytes - activation_reserve(cfg, "verifier", share))
            self.split = (
                f"the artifact's sleep mode: each engine {SLEEP_MEMORY_FRACTION} of {cfg.hardware.name}'s memory "
                f"minus its weights and activation reserve"
            )
            if min(g, v) <= 0:
                raise RunOOM(
                    f"gpu_memory_utilization {SLEEP_MEMORY_FRACTION} of {cfg.hardware.name} leaves no KV after the "
                    f"weights of {cfg.model.name if g <= 0 else cfg.verifier.name} (offload_mode=sleep)"
                )
        cap = int(s.max_num_seqs)
        return Allocation(cap, cap, int(g), int(v), float("nan"), offload=True)

    def plan(self, n: int, s_ver: float, s_ctx: float, s_dec: float) -> Allocation:
        """KV bytes and batch caps for ``n`` paths, verifier inputs of ``s_ver`` tokens, generator
        sequences of ``s_ctx`` tokens decoding ``s_dec`` per step. Raises RunOOM when the budget
        cannot hold one sequence per engine."""
        if not self.memory:
            return self.fixed
        try:
            a = search_allocation(
                self.gen,
                self.ver,
                self.dec_hw,
                self.budget,
                n,
                s_ver,
                s_ctx,
                s_dec,
                offload=self.offload,
                offload_bw=self.offload_bw,
                pre_hw=self.pre_hw,
                table=self.table,
            )
        except MemoryTooSmall as e:
            raise RunOOM(f"KV memory too small for M's plan on {self.hw_name}: {e}") from None
        # the engine short of one max_model_len sequence takes it from the other one's share
        if not a.offload and a.ver_kv_bytes < self.floor_v:
            a = Allocation(a.b_pre, a.b_dec, a.gen_kv_bytes - (self.floor_v - a.ver_kv_bytes), self.floor_v, a.t_tot_s)
        if not a.offload and a.gen_kv_bytes < self.floor_g:
            a = Allocation(a.b_pre, a.b_dec, self.floor_g, a.ver_kv_bytes - (self.floor_g - a.gen_kv_bytes), a.t_tot_s)
        if self.batch_cap is not None:  # the artifact's caps: vLLM's max_num_seqs on both engines
            a = replace(a, b_pre=self.batch_cap, b_dec=self.batch_cap)
        return a

    def observe(self, step_lengths) -> None:
        """Add completed steps' lengths (tokens) to the running mean M plans with (:meth:`step_mean`)."""
        for x in step_lengths:
            self._steps_sum += float(x)
            self._steps_count += 1

    def step_prior(self, prompt_len: float) -> float:
        """S_dec before any step completes (tokens): with ``system.m_step_prior=fit`` (default)
        min(max_tokens per step, (max_model_len - ``prompt_len``) / num_iterations), the longest mean
        step with which a path still fits ``max_model_len`` at the end of the search (module
        docstring), at least 1; else the configured token count."""
        if self.fixed_prior is not None:
            return self.fixed_prior
        room = (self.max_model_len - float(prompt_len)) / max(1, self.num_iterations)
        return max(1.0, min(float(self.step_cap), room))

    def step_mean(self, prompt_len: float) -> float:
        """S_dec M plans with (tokens): the mean of the step lengths observed so far, else
        :meth:`step_prior`."""
        if self._steps_count:
            return self._steps_sum / self._steps_count
        return self.step_prior(prompt_len)

    def per_run(self, n: int, avg_prompt: float) -> Allocation:
        """The plan for a whole run: paths at mid-search length (``avg_prompt`` + half the
        iterations' steps of :meth:`step_mean` tokens; before any step, the prior)."""
        step_mean = self.step_mean(avg_prompt)
        self.run_step = step_mean if self.memory else None
        ctx = min(self.max_model_len, avg_prompt + step_mean * (self.num_iterations / 2 + 1))
        return self.plan(n, ctx - step_mean, ctx, step_mean)

    def per_iteration(self, it: int, paths, prompt_len: int) -> Allocation:
        """The plan for iteration ``it`` of ``paths`` (the active paths: ``tokens``, the generated
        ids, and ``step_ends``, cumulative step ends) of a ``prompt_len``-token prompt: first their
        newest steps (completed in iteration ``it`` - 1) join the observed step lengths, then the plan
        for ``len(paths)`` paths of ``prompt_len`` + their mean length decoding :meth:`step_mean`."""
        if it > 0:
            self.observe(
                p.step_ends[-1] - (p.step_ends[-2] if len(p.step_ends) > 1 else 0) for p in paths if p.step_ends
            )
        step_mean = self.step_mean(prompt_len)
        ctx = prompt_len + sum(len(p.tokens) for p in paths) / len(paths)
        return self.plan(len(paths), ctx, min(self.max_model_len, ctx + step_mean), step_mean)

    def check_fits(self, a: Allocation) -> None:
        """RunOOM (a recorded result) unless each engine holds one ``max_model_len`` sequence."""
        if a.gen_kv_bytes < self.floor_g or a.ver_kv_bytes < self.floor_v:
            how = "M's plan" if self.memory else self.split
            raise RunOOM(
                f"KV memory too small on {self.hw_name} ({how}): generator {a.gen_kv_bytes / 2**20:.1f} MiB "
                f"(needs >= {self.floor_g / 2**20:.1f} MiB for one {self.max_model_len}-token sequence), "
                f"verifier {a.ver_kv_bytes / 2**20:.1f} MiB (needs >= {self.floor_v / 2**20:.1f} MiB); "
                f"raise kv_budget or lower workload.max_model_len"
            )
