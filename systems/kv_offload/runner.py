"""Runner of the TTC family: validates the config, drives the step-wise beam search, and hands each
step's plan to an executor (``sim.SimExecutor`` or ``torch_engine.TorchExecutor``, both
``systems.kv_offload.protocol.Executor``).

Real runs warm up before the measurement (``system.warmup``; its seconds recorded under
``harness.family.WARMUP_KEY``, excluded from every time); the harness fixes torch's thread count
(``backend.threads``) and records the load average around the run. Times: a step's compute and I/O
stall come from the executor; ``other_s`` is the time of planning the step and of selection +
expansion (real, on the executor's clock: wall on CUDA, the engine thread's CPU time on CPU, recorded
as ``time_basis``), or the simulator's charge.
Energy: the executor's windows (:meth:`systems.kv_offload.protocol.Executor.step_energy`: NVML on a real
GPU, the fitted power model on the simulator), per step in the steps table and summed by
:func:`energy_summary`; unavailable is None with the reason, never 0.
``system.deadline`` (Unix seconds) stops a run between steps, recorded as status ``timeout`` with
the steps done so far (``scripts/gpu_validate.py`` uses it to keep inside a device window).
"""

from __future__ import annotations

import math
import time
from typing import List, Optional, Tuple

import numpy as np

from harness.config import check_number, plain
from harness.errors import RunOOM, bad
from harness.family import WARMUP_KEY, RunContext, RunResult
from harness.model_facts import check_cpu_model, check_weights, kv_reserve_bytes, weight_bytes
from harness.model_facts import kv_budget_bytes as shared_kv_budget
from systems.kv_offload import analytic
from systems.kv_offload.display import display_rows, size_text
from systems.kv_offload.plan import SCHEDULERS, KVGeometry, Scheduler, make_scheduler
from systems.kv_offload.protocol import EnergyWindow, Executor
from systems.kv_offload.replay import FILE as TREE_FILE
from systems.kv_offload.replay import forced_tokens, load_beam_tree, replay_note, tree_record
from systems.kv_offload.sim import SimExecutor
from systems.kv_offload.tree import BeamTree, initial_beams, select_and_expand


def kv_budget_bytes(cfg, *, live: Optional[int] = None) -> int:
    """KV bytes per device (harness.model_facts.kv_budget_bytes): the configured ``kv_budget``; else
    ``live`` on a real GPU; else memory - weights - the hardware's reserve (<= 0 when the weights do
    not fit). Raises ConfigError for a value that is not a size."""
    hw = cfg.hardware
    return shared_kv_budget(cfg.system, hw.memory_bytes, weight_bytes(cfg.model), kv_reserve_bytes(hw), live=live)


def validate(cfg) -> None:
    w, s = cfg.workload, cfg.system
    if w.get("kind") != "ttc_beam":
        raise bad("workload", w.get("name"), "a TTC workload (ttc_beam) for the LBS family systems")
    if s.scheduler not in (*SCHEDULERS, "hf_offload"):  # hf_offload: transformers' own offloading, no plan
        raise bad("system.scheduler", s.scheduler, f"one of {', '.join((*SCHEDULERS, 'hf_offload'))}")
    if w.beam_width < 1:
        raise bad("workload.beam_width", w.beam_width, "an integer >= 1")
    if w.beams < 1 or w.beams % w.beam_width:
        raise bad(
            "beams",
            w.beams,
            f"a positive multiple of beam_width={w.beam_width} (beams = beam size x beam width; the width is "
            f"workload.beam_width)",
        )
    if w.beams > MAX_BEAMS:  # per-beam state is built before any memory model could refuse it
        raise bad("beams", w.beams, f"at most {MAX_BEAMS:,} (the papers' searches use up to 256)")
    if w.prompt_len < 1:
        raise bad("prompt_len", w.prompt_len, "an integer >= 1")
    if w.gen_len < 1:
        raise bad("gen_len", w.gen_len, "an integer >= 1")
    if not 0 < w.step <= w.gen_len:
        raise bad("step", w.step, f"an integer in 1..gen_len={w.gen_len}")
    if w.prompt_len >= cfg.model.max_position:
        raise bad(
            "prompt_len",
            w.prompt_len,
            f"an integer below the model's max_position ({cfg.model.max_position}) "
            f"for {cfg.model.name}, leaving room for gen_len",
        )
    if w.prompt_len + w.gen_len > cfg.model.max_position:
        raise bad(
            "gen_len",
            w.gen_len,
            f"prompt_len + gen_len <= the model's max_position ({cfg.model.max_position}) for {cfg.model.name}",
        )
    if w.scorer not in ("logprob",):
        raise bad("workload.scorer", w.scorer, "logprob")
    check_number(
        "workload.temperature",
        w.temperature,
        "a sampling temperature",
        "> 0",
        "beams are ranked by log-probabilities of the tempered distribution",
    )
    if s.get("deadline") is not None and not isinstance(s.get("deadline"), (int, float)):
        raise bad("system.deadline", s.get("deadline"), "Unix seconds (a number) or null")
    if s.get("deadline") is not None and float(s.deadline) < DEADLINE_FLOOR:
        # a duration such as 600 ("10 minutes") is no date; a past date is the run's
        # own result (a sweep whose deadline passes between jobs), a number this small is no date
        raise bad(
            "system.deadline",
            s.deadline,
            "a time as Unix seconds (e.g. $(date -d '+10 min' +%s)), not a duration: a value before 2020 is none",
        )
    if s.get("replay_tree"):
        _, doc = load_beam_tree(s.replay_tree, cfg)
        if s.get("teacher_force"):
            forced_tokens(doc, s.replay_tree)
    elif s.get("teacher_force"):
        raise bad("system.teacher_force", True, "false unless system.replay_tree names a recorded tree to force")
    budget = kv_budget_bytes(cfg)
    if s.get("kv_budget") is not None and s.scheduler != "in_gpu":  # a derived budget too small = oom
        one_beam = (w.prompt_len + w.gen_len) * KVGeometry.from_model(cfg.model).kv_token
        if budget < one_beam:
            raise bad(
                "kv_budget",
                s.get("kv_budget"),
                f"at least one beam's KV at full length: {one_beam} B ({one_beam / 2**20:.2f} MiB) "
                f"for {cfg.model.name} at {w.prompt_len + w.gen_len} tokens; got {budget} B "
                f"({budget / 2**20:.2f} MiB)",
            )


def validate_backend(cfg, backend) -> None:
    if backend.name == "torch" and cfg.system.scheduler == "hf_offload":
        from systems.kv_offload.hf_offload import validate_hf_offload

        validate_hf_offload(backend)  # transformers' offloaded cache needs a CUDA GPU
        return
    if backend.simulated and cfg.system.scheduler == "hf_offload":
        given = cfg.backend.name  # auto resolves to the simulator without a CUDA GPU
        raise bad(
            "backend",
            given,
            "torch for system=hf_offload (it runs transformers' own offloaded cache, "
            "on a CUDA GPU)"
            + ("; backend=auto picks the simulator here: no CUDA GPU found" if given == "auto" else ""),
        )
    if cfg.system.get("teacher_force") and backend.simulated:
        raise bad("system.teacher_force", True, "false on the simulated backend: it decodes no tokens (backend=torch)")
    if backend.name == "torch":  # a wrong path is bad input, not an error record after the model is built
        check_weights(cfg.model)
        check_decode_path(cfg, backend.device)
    if backend.name == "torch" and backend.device == "cpu":
        check_cpu_model(cfg.model, "torch")


def check_decode_path(cfg, device: str) -> None:
    """``system.decode_path`` and ``system.batch_invariant`` against the model and the device (the
    torch engine only; :func:`systems.kv_offload.decoder.decode_path_problem`)."""
    from systems.kv_offload.decoder import decode_path_problem, lean_supported

    s, m = cfg.system, cfg.model
    problem = decode_path_problem(
        s.get("decode_path", "auto"),
        lean_supported(m.hf_model_type, m.get("hf_config")),
        device == "cuda",
        bool(s.get("batch_invariant")),
        f"{m.name} ({m.hf_model_type})",
    )
    if problem:
        raise bad(f"system.{problem[0]}", problem[1], problem[2])


def _executor(cfg, ctx: RunContext, budget) -> Executor:
    if ctx.backend.simulated:
        return SimExecutor(cfg.hardware, cfg.model, cfg.seed)
    from systems.kv_offload.torch_engine import TorchExecutor

    w = cfg.workload
    return TorchExecutor(
        cfg.model,
        device=ctx.backend.device,
        budget_bytes=budget,
        seed=cfg.seed,
        scheduler=cfg.system.scheduler,
        record_tree=cfg.system.get("record_tree", False),
        temperature=w.temperature,
        max_len=w.prompt_len + w.gen_len,
        decode_path=cfg.system.get("decode_path", "auto"),
        max_beams=w.beams,
        batch_invariant=bool(cfg.system.get("batch_invariant", False)),
    )


def _live_budget(ctx: RunContext) -> Optional[int]:
    if ctx.backend.device != "cuda":
        return None
    import torch

    free, _ = torch.cuda.mem_get_info()
    return int(free * 0.9)


def available_host_memory() -> Optional[int]:
    """Host memory available now (bytes): :func:`harness.machine.available_memory`."""
    from harness.machine import available_memory

    return available_memory()


def host_memory(cfg, ctx: RunContext) -> Tuple[Optional[int], str]:
    """(bytes the host can hold for offloaded KV, what that number is): on the simulator the
    profile's ``hardware.host_memory_bytes`` (None = unknown, not checked); on a real engine the
    machine's available memory now (:func:`available_host_memory`)."""
    if ctx.backend.simulated:
        return cfg.hardware.get("host_memory_bytes"), f"hardware.host_memory_bytes of {cfg.hardware.name}"
    return available_host_memory(), "MemAvailable of this machine (/proc/meminfo) at the run's start"


def energy_summary(windows: List[EnergyWindow], e2e_s: float, tokens: int, source: Optional[str]) -> dict:
    """The run's energy fields from its windows (prefill, then one per step done):

    ``energy_j`` (J, their sum; None if any window was not measured), ``energy_io_stall_j`` (J drawn
    waiting on PCIe; simulator only), ``energy_per_token_j`` (J per generated token: ``tokens`` =
    beams x tokens decoded), ``avg_power_w`` (energy / end-to-end seconds), ``energy_source``, and
    ``energy_unavailable_reason`` (None when measured)."""
    missing = next((w.reason for w in windows if w.energy_j is None), None)
    energy = None if missing is not None else sum(w.energy_j for w in windows)
    stall = None if energy is None or any(w.io_stall_j is None for w in windows) else sum(w.io_stall_j for w in windows)
    return {
        "energy_j": energy,
        "energy_io_stall_j": stall,
        "energy_per_token_j": energy / tokens if energy is not None and tokens else None,
        "avg_power_w": energy / e2e_s if energy is not None and e2e_s > 0 else None,
        "energy_source": source if energy is not None else None,
        "energy_unavailable_reason": missing,
    }


_now = time.time  # the deadline's clock (tests replace it)
MAX_BEAMS = 1 << 20  # beams a run may ask for: far beyond any paper's, well inside int64 arithmetic
DEADLINE_FLOOR = 1577836800.0  # 2020-01-01 UTC: a system.deadline below it is a duration or a typo, not a time


class DeadlineReached(Exception):
    """``system.deadline`` (Unix seconds) passed between two steps; the run stops, recorded as timeout."""


def run(cfg, ctx: RunContext) -> RunResult:
    """prepare (KV budget, scheduler, the analytic prediction, the ooms predicted before any
    per-beam state) -> prefill -> per step: plan -> execute -> select + expand -> summarize."""
    cfg = plain(cfg)  # resolved plain dicts: no OmegaConf lookups in hot loops
    if cfg.system.scheduler == "hf_offload":
        from systems.kv_offload.hf_offload import run_hf_offload

        return run_hf_offload(cfg, ctx)
    scheduler, summary, predicted_oom = prepare(cfg, ctx)
    if predicted_oom:
        return RunResult(
            status="oom", summary=summary, display=display_rows(summary, cfg.system), message=predicted_oom
        )
    return StepwiseSearch(cfg, ctx, scheduler, summary).run()


def prepare(cfg, ctx: RunContext) -> Tuple[Scheduler, dict, str]:
    """The run's scheduler, the summary's first keys (budget, shape, the Eq.1-5 prediction) and, when
    the configuration cannot run, why (an oom predicted from the device KV budget or the host memory,
    before any per-beam state exists; '' otherwise). Raises RunOOM when the budget holds less than
    one beam's KV."""
    w, sysc = cfg.workload, cfg.system
    geom = KVGeometry.from_model(cfg.model)
    budget = kv_budget_bytes(cfg, live=None if ctx.backend.simulated else _live_budget(ctx))
    one_beam = (w.prompt_len + w.gen_len) * geom.kv_token
    if sysc.scheduler != "in_gpu" and budget < one_beam:  # derived from memory - weights - reserve
        raise RunOOM(
            f"{cfg.model.name} on {cfg.hardware.name}: the KV budget (memory - weights - reserve = "
            f"{size_text(budget)}) holds less than one beam's KV at full length "
            f"({size_text(one_beam)})"
        )
    scheduler = make_scheduler(
        sysc.scheduler,
        geom,
        budget,
        inter_beam=sysc.inter_beam,
        prefetch=sysc.prefetch,
        prompt_len=w.prompt_len,
        gen_len=w.gen_len,
        list_blocks=not ctx.backend.simulated,
    )  # the simulator counts bytes only
    n_beams, beam_size = w.beams, w.beams // w.beam_width
    pred = analytic.predict(
        cfg.model,
        num_beams=n_beams,
        prompt_len=w.prompt_len,
        gen_len=w.gen_len,
        step=w.step,
        mem_gpu=budget or 0,
        dtype_bytes=geom.dtype_bytes,
    )
    summary = {
        "kv_budget_bytes": budget,
        "beams": n_beams,
        "step": w.step,
        "gen_len": w.gen_len,
        "prompt_len": w.prompt_len,
        "full_kv_bytes": scheduler.full_kv_bytes(n_beams),
        **pred,
    }
    # Eq.4-5 count LBS's loads with the KV offloaded; a request that fits the budget stays resident and
    # moves nothing (as Eq.1-3 give 0 for layer-wise then), so its prediction is 0, not Eq.5
    lbs_moves = sysc.scheduler == "lbs" and not scheduler.fits_whole_request(n_beams)
    summary["eq_prediction_bytes"] = (
        pred["eq3_layerwise_bytes"] if sysc.scheduler == "layerwise" else pred["eq5_lbs_bytes"] if lbs_moves else 0
    )
    if sysc.scheduler == "in_gpu" and not scheduler.fits_whole_request(n_beams):
        # predicted from the budget, never run: on a real engine too nothing was measured
        summary["oom"] = summary["oom_predicted"] = True
        return (
            scheduler,
            summary,
            f"in_gpu: KV of {n_beams} beams at {w.prompt_len + w.gen_len} tokens "
            f"({size_text(scheduler.full_kv_bytes(n_beams))}) exceeds the KV "
            f"budget ({size_text(budget)}): predicted from the budget, not run",
        )
    # the offloaded KV lives in host memory: a run that needs more is a predicted oom (10^5 beams need
    # ~47 TiB), checked before any per-beam state (10^8 beams would exhaust this process's memory)
    host_kv = scheduler.host_kv_bytes(n_beams, beam_size, w.step)
    host_mem, host_what = host_memory(cfg, ctx) if host_kv else (None, "")
    if host_mem is not None and host_kv > host_mem:
        summary.update({"host_kv_bytes": host_kv, "host_memory_bytes": host_mem, "oom": True, "oom_predicted": True})
        return (
            scheduler,
            summary,
            f"{sysc.scheduler}: the KV offloaded to the host, {size_text(host_kv)} at its peak "
            f"({n_beams} beams at up to {w.prompt_len + w.gen_len} tokens), exceeds the "
            f"host memory ({size_text(host_mem)}, {host_what}): "
            f"predicted from the host memory, not run",
        )
    return scheduler, summary, ""


STEP_TOTALS = ("compute_s", "io_stall_s", "h2d_bytes", "d2h_bytes")


class StepwiseSearch:
    """One run's step-wise beam search on an executor: the prompt's prefill, then per step the
    scheduler's plan, the executor carrying it out, and selection + expansion of the beam tree; the
    steps' rows, totals and energy windows, summarized at the end. Time on the executor's clock."""

    def __init__(self, cfg, ctx: RunContext, scheduler: Scheduler, summary: dict):
        w, sysc = cfg.workload, cfg.system
        self.cfg, self.ctx, self.scheduler, self.summary = cfg, ctx, scheduler, summary
        self.n_beams, self.beam_size = w.beams, w.beams // w.beam_width
        self.replay, self.recorded = load_beam_tree(sysc.replay_tree, cfg) if sysc.get("replay_tree") else (None, None)
        self.real = not ctx.backend.simulated
        self.forced = forced_tokens(self.recorded, sysc.replay_tree) if sysc.get("teacher_force") else None
        self.beam_log: list = []  # real runs recording their tree: every beam's tokens and score per step
        self.ex = _executor(cfg, ctx, summary["kv_budget_bytes"])
        self.clock = self.ex.clock
        if self.real:
            summary["time_basis"] = self.ex.time_basis
            summary["decode_path"] = self.ex.decode_path
        rng = np.random.default_rng(cfg.seed)
        self.prompt = rng.integers(0, cfg.model.vocab_size, size=w.prompt_len).tolist()
        self.tree = BeamTree(w.prompt_len)
        self.n_steps = math.ceil(w.gen_len / w.step)
        self.rows, self.group_rows, self.kept_log, self.windows = [], [], [], []
        self.totals = dict.fromkeys((*STEP_TOTALS, "other_s"), 0.0)
        self.peak = self.peak_phys = 0
        self.beams = []

    def run(self) -> RunResult:
        sysc = self.cfg.system
        deadline = sysc.get("deadline")
        status, message = "ok", ""
        try:
            self.prefill()
            bar = self.ctx.progress(self.n_steps, f"{sysc.name} steps")
            for i in range(self.n_steps):
                if deadline is not None and _now() > float(deadline):
                    raise DeadlineReached(f"system.deadline passed after {i} of {self.n_steps} steps")
                self.step(i)
                bar.update(1)
            bar.close()
        except DeadlineReached as e:
            status, message = "timeout", str(e)
        finally:
            if self.real:
                self.summary.update(self.ex.memory_peaks())
            self.ex.close()
        if not self.rows:
            return RunResult(
                status=status, message=message, summary=self.summary, display=display_rows(self.summary, sysc)
            )
        return self.summarize(status, message)

    def prefill(self) -> None:
        if self.cfg.system.get("warmup", True):
            self.summary[WARMUP_KEY] = self.ex.warmup(self.prompt, self.n_beams)  # excluded from every time below
        pre = self.ex.prefill(self.tree, self.prompt, offload=self.scheduler.prefill_offload(self.n_beams))
        self.windows.append(self.ex.step_energy())  # the prefill's; then one per step
        for k in STEP_TOTALS:
            self.totals[k] = getattr(pre, k)
        self.peak, self.peak_phys = pre.peak_device_bytes, pre.peak_physical_bytes
        self.beams = initial_beams(self.tree, self.n_beams, self.cfg.seed)

    def step(self, i: int) -> None:
        """Step ``i``: plan -> execute -> select + expand (not after the last step) -> account."""
        w, clock = self.cfg.workload, self.clock
        t_plan = clock()
        tokens = min(w.step, w.gen_len - i * w.step)
        plan = self.scheduler.plan(i, self.tree, self.beams, tokens)
        t_plan = clock() - t_plan
        if self.forced is not None:
            self.ex.force(self.forced[i])
        o = self.ex.execute_step(plan, self.tree, self.beams)
        for k, (b, delta) in enumerate(zip(self.beams, o.logprob_delta.tolist())):
            b.cum_logprob += delta
            if o.tokens is not None:
                b.tokens.extend(o.tokens[k])
            self.tree.segments[b.leaf].length = tokens
        if self.real and self.cfg.system.get("record_tree"):
            self.log_beams(i, o)
        other = t_plan if self.real else 0.0  # the simulator charges no planning time
        if i + 1 < self.n_steps:
            other += self.select_and_expand(i, plan)
        self.windows.append(self.ex.step_energy())
        self.account(i, plan, o, tokens, other)

    def log_beams(self, i: int, o) -> None:
        """Step ``i``'s beams for beam_tree.json (``systems.kv_offload.replay.tree_record``)."""
        entry = {
            "step": i,
            "uid": [str(b.uid) for b in self.beams],
            "parent": [None if b.parent_uid is None else str(b.parent_uid) for b in self.beams],
            "tokens": o.tokens,
            "cum_logprob": [b.cum_logprob for b in self.beams],
        }
        if o.token_flips is not None:
            entry["token_flips"] = [f for f, _ in o.token_flips]
            entry["flip_margin"] = [m for _, m in o.token_flips]
        self.beam_log.append(entry)

    def select_and_expand(self, i: int, plan) -> float:
        """Keep the best beams, expand them, and lay the kept parents' KV out for their children;
        returns its seconds (real: the executor's clock; simulated: the executor's charge)."""
        w = self.cfg.workload
        t0 = self.clock()
        keep = self.replay[i] if self.replay is not None else None
        new = select_and_expand(self.tree, self.beams, self.beam_size, w.beam_width, keep_uids=keep)
        exp = self.ex.expand(plan, self.tree, self.beams, new)
        seconds = self.clock() - t0 if self.real else exp
        if self.cfg.system.get("record_tree"):
            self.kept_log.append({"step": i, "kept": [str(u) for u in dict.fromkeys(b.parent_uid for b in new)]})
        self.beams = new
        return seconds

    def account(self, i: int, plan, o, tokens: int, other: float) -> None:
        for k in STEP_TOTALS:
            self.totals[k] += getattr(o, k)
        self.totals["other_s"] += other
        self.peak, self.peak_phys = max(self.peak, o.peak_device_bytes), max(self.peak_phys, o.peak_physical_bytes)
        self.rows.append(
            {
                "step": i,
                "start_tokens": plan.start,
                "tokens": tokens,
                "groups": plan.num_groups,
                "capacity": plan.capacity,
                "compute_s": o.compute_s,
                "io_stall_s": o.io_stall_s,
                "other_s": other,
                "latency_s": o.compute_s + o.io_stall_s + other,
                "h2d_bytes": o.h2d_bytes,
                "d2h_bytes": o.d2h_bytes,
                "plan_h2d_bytes": plan.h2d_bytes,
                "plan_d2h_bytes": plan.d2h_bytes,
                "peak_device_bytes": o.peak_device_bytes,
                "plan_device_bytes": plan.device_bytes,
                "peak_physical_bytes": o.peak_physical_bytes,
                "staging_bytes": plan.staging_bytes,
                "energy_j": self.windows[-1].energy_j,
                "io_stall_energy_j": self.windows[-1].io_stall_j,
            }
        )
        self.group_rows.extend(o.group_rows)

    def summarize(self, status: str, message: str) -> RunResult:
        cfg, w, sysc, rows, tot = self.cfg, self.cfg.workload, self.cfg.system, self.rows, self.totals
        e2e = tot["compute_s"] + tot["io_stall_s"] + tot["other_s"]
        best = max(self.beams, key=lambda b: (b.cum_logprob, -b.uid))
        summary = self.summary
        summary.update(
            {
                "e2e_s": e2e,
                "compute_s": tot["compute_s"],
                "io_stall_s": tot["io_stall_s"],
                "other_s": tot["other_s"],
                "io_share": tot["io_stall_s"] / e2e if e2e > 0 else 0.0,
                "h2d_bytes": tot["h2d_bytes"],
                "d2h_bytes": tot["d2h_bytes"],
                "plan_h2d_bytes": sum(r["plan_h2d_bytes"] for r in rows),
                "plan_d2h_bytes": sum(r["plan_d2h_bytes"] for r in rows),
                "groups_per_step": sum(r["groups"] for r in rows) / len(rows),
                "peak_device_kv_bytes": self.peak,
                "peak_device_physical_bytes": self.peak_phys if self.real else None,
                "max_staging_bytes": max(r["staging_bytes"] for r in rows),
                "steps_done": len(rows),
                "tokens_per_s": self.n_beams * w.gen_len / e2e if e2e > 0 and status == "ok" else None,
                "best_cum_logprob": best.cum_logprob,
                "best_uid": str(best.uid),
            }
        )
        tokens = self.n_beams * sum(r["tokens"] for r in rows)
        summary.update(energy_summary(self.windows, e2e, tokens, self.ex.energy_source))
        tables = {"steps": rows}  # row dicts: written with pyarrow, no pandas import
        if self.group_rows:
            tables["groups"] = self.group_rows
        extra = {}
        if sysc.get("record_tree"):
            from harness.records import atomic_write_json

            atomic_write_json(
                self.ctx.outdir / TREE_FILE,
                tree_record(cfg, self.ctx.backend, self.kept_log, self.beam_log, summary.get("decode_path")),
            )
            extra["beam_tree_file"] = str(self.ctx.outdir / TREE_FILE)
        if self.replay is not None:
            extra["replayed_tree"] = str(sysc.replay_tree)
            note = replay_note(sysc.replay_tree, self.recorded, cfg, self.ctx.backend)
            message = "; ".join(m for m in (message, note) if m)
        if self.real:  # the real engine's best path (token ids) for inspection
            extra["best_tokens"] = best.tokens
        elif cfg.hardware.get("mem_bw_by_rows"):  # a rows table replaces mem_bw for weight reads
            rows = sorted(int(r) for r in cfg.hardware.mem_bw_by_rows)
            note = (
                f"simulated weight reads at hardware.mem_bw_by_rows (rows {', '.join(map(str, rows))}, "
                f"interpolated; below and above them the first and last rows' rates), not mem_bw"
            )
            message = "; ".join(m for m in (message, note) if m)
        display = display_rows(summary, sysc)
        return RunResult(status=status, message=message, summary=summary, display=display, tables=tables, extra=extra)
