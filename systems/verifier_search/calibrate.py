"""Measure this CPU's vLLM generator-decode and verifier-prefill costs into a FastTTS cost profile.

    python -m systems.verifier_search.calibrate [model=tiny-qwen2] [verifier=tiny-prm] [threads=1]
                                    [name=cpu-tts-calibrated] [out=conf/hardware/<name>.yaml]
    python -m systems.verifier_search.calibrate refit=conf/hardware/cpu-tts.yaml name=cpu-tts   # fit stored points again

Builds the two engines as a run does (``vllm_engine.VllmGenerator`` / ``VllmVerifier``, random weights,
torch fixed to ``threads`` threads), warms them up (excluded), then times, in ``ROUNDS`` rounds of
shuffled points (median per point, so a burst of load on a shared machine spreads over points):

- generator engine steps: pure decode steps of B sequences at context C (prompts share a cached
  prefix, so admission is cheap) and prefill steps of B prompts of N fresh tokens after a cached
  prefix of C tokens (C = 0: fresh prompts; C > 0: a search iteration's first step);
- verifier calls: B items of N fresh tokens after a cached prefix of C tokens, in one call.

Times are process CPU seconds (one torch thread: the time on an uncontended core; on a shared
machine the wall time swings with other users' load, the CPU time hardly at all); the wall times
are kept beside them. Each stage is fitted with the simulator's own cost terms (``sim.step_terms`` /
``sim.prefill_terms``): compute P (FLOP/s) and bandwidth BW (B/s) combined as a roofline max or
added (whichever fits better), plus a cost per engine step and per sampled sequence, minimising the
squared relative error. The profile (a ``hardware`` option, kind cpu) keeps every point, each
fit's error, the thread count, the date and the machine's load before and after under
``measured.tts``; ``memory.Roofline.of`` reads it for the simulator and for M on a real CPU engine.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import yaml

from systems.verifier_search.memory import ModelShape, Roofline
from systems.verifier_search.sim import prefill_terms, step_terms
from systems.verifier_search.vllm_engine import Clock

ROOT = Path(__file__).resolve().parents[2]
# (batch, tokens per sequence, cached context before them); decode points decode one token each
DECODE = [
    (1, 1, 128),
    (4, 1, 128),
    (16, 1, 128),
    (64, 1, 128),
    (8, 1, 512),
    (32, 1, 512),
    (1, 1, 1024),
    (4, 1, 1024),
    (16, 1, 1024),
    (64, 1, 1024),
]
GEN_PREFILL = [
    (1, 128, 0),
    (1, 1024, 0),
    (4, 512, 0),
    (16, 128, 0),
    (8, 512, 0),
    (16, 8, 384),
    (16, 32, 384),
    (4, 64, 1024),
]  # a search iteration's first step: cached prefix
VER_PREFILL = [
    (1, 128, 0),
    (1, 1024, 0),
    (4, 512, 0),
    (16, 256, 0),
    (16, 512, 0),
    (64, 128, 0),
    (1, 8, 384),
    (1, 32, 384),
    (16, 8, 384),
    (16, 32, 384),
    (4, 64, 1024),
]
ROUNDS = 3


def loadavg() -> float:
    """The 1-minute load average (0.0 where the system does not say)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


class Probe:
    """Timed engine work on fresh random token ids (ids in [1000, vocab - 1000))."""

    def __init__(self, gen, ver, gen_vocab: int, ver_vocab: int, seed: int = 0):
        self.gen, self.ver, self.gv, self.vv = gen, ver, gen_vocab, ver_vocab
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def _ids(self, n: int, vocab: int) -> List[int]:
        return self.rng.integers(1000, vocab - 1000, size=n).tolist()

    def _add(self, prompt: List[int], max_tokens: int) -> None:
        from vllm import SamplingParams

        self.n += 1
        sp = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.8,
            ignore_eos=True,
            detokenize=False,
            seed=self.n,
            logit_bias=dict(self.gen.bias) if self.gen.bias else None,
        )
        self.gen.eng.add_request(f"cal{self.n}", {"prompt_token_ids": prompt}, sp)

    def _drain(self) -> List[Tuple[float, float]]:
        """(wall, CPU) seconds of every engine step until no request is left."""
        ts = []
        while self.gen.eng.has_unfinished_requests():
            clock = Clock()
            self.gen.eng.step()
            ts.append(clock.read())
        return ts

    def decode(self, b: int, _: int, c: int, steps: int = 6) -> Tuple[float, float]:
        """Median (wall, CPU) seconds of the pure decode steps of ``b`` sequences at context ~``c``
        (prompts share a cached prefix, so admission is cheap; the first two and the last step are
        left out)."""
        shared = self._ids(c - 8, self.gv)
        for _ in range(b):
            self._add(shared + self._ids(8, self.gv), steps + 3)
        ts = self._drain()[2:-1]
        return statistics.median(w for w, _ in ts), statistics.median(c for _, c in ts)

    def gen_prefill(self, b: int, n: int, c: int) -> Tuple[float, float]:
        """(wall, CPU) seconds of the step admitting ``b`` prompts of ``n`` fresh tokens after a cached
        prefix of ``c`` tokens (prefilled, untimed, before)."""
        prefix = self._ids(c, self.gv)
        if c:
            self._add(prefix, 1)
            self._drain()
        for _ in range(b):
            self._add(prefix + self._ids(n, self.gv), 1)
        return self._drain()[0]

    def verify(self, b: int, n: int, c: int) -> Tuple[float, float]:
        """(wall, CPU) seconds of one verifier call scoring ``b`` items of ``n`` fresh tokens after a
        cached prefix of ``c`` tokens (scored, untimed, before)."""
        prefix = self._ids(c, self.vv)
        if c:
            self.ver.score([prefix], [[c - 1]])
        r = self.ver.score([prefix + self._ids(n, self.vv) for _ in range(b)], [[c + n - 1]] * b)
        return r.time_s, r.cpu_s


def measure(probe: Probe, rounds: int = ROUNDS) -> Tuple[List[dict], List[dict]]:
    """(generator points, verifier points): each point timed once per round, points shuffled in
    every round so a burst of load on the shared machine spreads over points; median per point.
    A point: kind, batch, new (tokens per sequence), ctx (cached context before them), seconds
    (process CPU time: with one thread, the time on an uncontended core), wall_s (wall time),
    spread (slowest / fastest round, CPU time)."""
    jobs = (
        [("decode", *x) for x in DECODE]
        + [("prefill", *x) for x in GEN_PREFILL]
        + [("verify", *x) for x in VER_PREFILL]
    )
    fns = {"decode": probe.decode, "prefill": probe.gen_prefill, "verify": probe.verify}
    samples: Dict[tuple, List[float]] = {j: [] for j in jobs}
    for _ in range(rounds):
        for i in probe.rng.permutation(len(jobs)):
            kind, b, n, c = jobs[i]
            samples[jobs[i]].append(fns[kind](b, n, c))
    pts = [
        dict(
            kind=k,
            batch=b,
            new=n,
            ctx=c + 4 if k == "decode" else c,
            seconds=float(statistics.median(cpu for _, cpu in v)),
            wall_s=float(statistics.median(w for w, _ in v)),
            spread=float(max(cpu for _, cpu in v) / min(cpu for _, cpu in v)),
        )
        for (k, b, n, c), v in samples.items()
    ]
    return [p for p in pts if p["kind"] != "verify"], [p for p in pts if p["kind"] == "verify"]


def _terms(points: List[dict], m: ModelShape, budget: int):
    """(FLOPs, bytes, engine steps or passes, sampled sequences) of every point, by the simulator's
    own cost functions (``sim.step_terms`` / ``sim.prefill_terms``)."""
    rows = []
    for p in points:
        b, n, c = p["batch"], p["new"], p["ctx"]
        if p["kind"] == "decode":
            rows.append((*step_terms(m, [], b, c)[:2], 1, b))
        elif p["kind"] == "prefill":
            rows.append((*step_terms(m, [(n, c)] * b, 0, 0.0)[:2], 1, b))
        else:
            attn = 2 * m.num_layers * m.hidden_size * b * n * (2 * c + n)
            rows.append((*prefill_terms(m, b * n, attn, budget), 0))
    return tuple(np.array(col, float) for col in zip(*rows))


def _nonneg_lstsq(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a negative one is fixed at 0, the rest refitted)."""
    free = list(range(A.shape[1]))
    while True:
        x = np.zeros(A.shape[1])
        if free:
            x[free] = np.linalg.lstsq(A[:, free], y, rcond=None)[0]
        neg = [k for k in free if x[k] < 0]
        if not neg:
            return x
        free.remove(neg[0])


def _fit_sum(t, F, By, K, S) -> Dict[str, float]:
    """pred = F/P + By/BW + K * step_s + S * seq_s: least squares of the relative error."""
    x = _nonneg_lstsq(np.stack([F / t, By / t, K / t, S / t], axis=1), np.ones(len(t)))
    return dict(
        form="sum",
        flops=float(1 / max(x[0], 1e-30)),
        bw=float(1 / max(x[1], 1e-30)),
        step_s=float(x[2]),
        seq_s=float(x[3]),
    )


def _fit_max(t, F, By, K, S) -> Dict[str, float]:
    """pred = max(F/P, By/BW) + K * step_s + S * seq_s: P and BW on log grids (refined twice), the
    two linear costs by least squares at the best grid point."""
    lo_p, hi_p, lo_b, hi_b = 8.0, 13.0, 8.0, 12.0
    A = np.stack([K / t, S / t], axis=1)
    for _ in range(3):
        Ps, BWs = 10 ** np.linspace(lo_p, hi_p, 41), 10 ** np.linspace(lo_b, hi_b, 41)
        best = None
        for P in Ps:
            for BW in BWs:
                r = 1 - np.maximum(F / P, By / BW) / t
                x = _nonneg_lstsq(A, r)
                err = float(((A @ x - r) ** 2).sum())
                if best is None or err < best[0]:
                    best = (err, P, BW, x)
        _, P, BW, x = best
        dp, db = (hi_p - lo_p) / 13, (hi_b - lo_b) / 13
        lo_p, hi_p, lo_b, hi_b = np.log10(P) - dp, np.log10(P) + dp, np.log10(BW) - db, np.log10(BW) + db
    return dict(form="max", flops=float(P), bw=float(BW), step_s=float(x[0]), seq_s=float(x[1]))


def fit(points: List[dict], m: ModelShape, budget: int) -> Dict[str, float]:
    """The stage's cost profile: compute P (FLOP/s), bandwidth BW (B/s), a cost per engine step and
    per sampled sequence (s), compute and memory combined as a roofline (``form: max``) or
    additively (``form: sum``), whichever has the smaller relative error over the points.
    Returns form, flops, bw, step_s, seq_s and the fit's mape (%)."""
    t = np.array([p["seconds"] for p in points])
    F, By, K, S = _terms(points, m, budget)
    best = None
    for f in (_fit_max(t, F, By, K, S), _fit_sum(t, F, By, K, S)):
        hw = Roofline(f["flops"], f["bw"], 0.0, f["step_s"], f["form"] == "sum", f["seq_s"])
        f["mape"] = float(100 * np.mean(np.abs((hw.busy_s(F, By) + K * hw.step_s + S * hw.seq_s) / t - 1)))
        if best is None or f["mape"] < best["mape"]:
            best = f
    return best


def calibrate(cfg, threads: int = 1) -> dict:
    """Measure and fit both stages for ``cfg.model`` / ``cfg.verifier`` (random weights).
    Returns the ``measured.tts`` dict of the profile."""
    import torch

    from systems.verifier_search.beams import step_logit_biases
    from systems.verifier_search.memory_plan import gen_token_budget, ver_token_budget
    from systems.verifier_search.vllm_engine import VllmGenerator, VllmVerifier

    torch.set_num_threads(threads)
    w, s, m, v = cfg.workload, cfg.system, cfg.model, cfg.verifier
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="tts_calib_") as tmp:  # the engines' config.json, removed after
        work = Path(tmp)
        bias_d, bias_e = step_logit_biases(
            m.vocab_size, float(w.temperature), float(w.cpu_step_tokens_mean), float(w.steps_per_answer_mean)
        )
        gen = VllmGenerator(
            m,
            work,
            max_model_len=int(w.max_model_len),
            kv_bytes=512 << 20,
            max_num_seqs=256,
            block_size=int(s.block_size),
            seed=0,
            token_budget=gen_token_budget(cfg),
            delimiter_ids=(int(w.step_delimiter_id),),
            eos_ids=(int(w.eos_token_id),),
            logit_bias={int(w.step_delimiter_id): bias_d, int(w.eos_token_id): bias_e},
            temperature=float(w.temperature),
            top_p=float(w.top_p),
        )
        ver = VllmVerifier(
            v,
            work,
            max_model_len=int(w.max_model_len),
            kv_bytes=256 << 20,
            max_num_seqs=256,
            block_size=int(s.block_size),
            seed=0,
            token_budget=ver_token_budget(cfg),
        )
        probe = Probe(gen, ver, m.vocab_size, v.vocab_size)
        try:
            for _ in range(3):  # warm-up, excluded
                probe.decode(16, 1, 512)
                probe.verify(16, 256, 0)
            dec, pre = measure(probe)
        finally:
            gen.shutdown()
            ver.shutdown()
    return fit_stages(
        cfg,
        {
            "models": {"generator": str(m.name), "verifier": str(v.name)},
            "threads": threads,
            "loadavg_before": load_before,
            "loadavg_after": loadavg(),
        },
        dec,
        pre,
    )


def fit_stages(cfg, meta: dict, dec: List[dict], pre: List[dict]) -> dict:
    """The ``measured.tts`` dict: ``meta`` + each stage's fit and points."""
    from systems.verifier_search.memory_plan import gen_token_budget, ver_token_budget

    return {
        **meta,
        "decode": {**fit(dec, ModelShape.of(cfg.model), gen_token_budget(cfg)), "points": dec},
        "prefill": {**fit(pre, ModelShape.of(cfg.verifier), ver_token_budget(cfg)), "points": pre},
    }


def write_profile(tts: dict, out: Path, name: str) -> Path:
    """conf/hardware/cpu.yaml with the decode fit as its roofline and ``measured.tts`` added."""
    base = yaml.safe_load((ROOT / "conf" / "hardware" / "cpu.yaml").read_text())
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    prof = {k: v for k, v in base.items() if k != "defaults"}
    dec = tts["decode"]
    prof.update(
        name=name,
        description=f"this CPU's vLLM costs ({tts['models']['generator']} decode, "
        f"{tts['models']['verifier']} prefill, {tts['threads']} thread(s)) measured by systems.verifier_search.calibrate "
        f"on {date}",
        peak_flops=dec["flops"],
        mem_bw=dec["bw"],
        launch_overhead_s=0.0,
        flops_efficiency=1.0,
        mem_efficiency=1.0,
        measured={"date": date, "tts": tts},
    )
    prof["sources"] = dict(
        base.get("sources", {}),
        peak_flops=f"generator decode fit, systems.verifier_search.calibrate {date}",
        mem_bw=f"generator decode fit, systems.verifier_search.calibrate {date}",
        launch_overhead_s="0: the fits carry a per-step cost (measured.tts.*.step_s) instead",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        "# Generated by python -m systems.verifier_search.calibrate (measured.tts: every point and each stage's fit)\n"
        + yaml.safe_dump({"defaults": ["_hardware_schema", "_self_"], **prof}, sort_keys=False)
    )
    return out


def compose(overrides: List[str]):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    from harness.config import register_configs, register_resolvers

    register_resolvers()
    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        return hcompose(
            "config", overrides=["system=fasttts", "backend=vllm", "model=tiny-qwen2", "verifier=tiny-prm", *overrides]
        )


def main(argv=None) -> int:
    """``refit=<profile.yaml>``: fit that profile's stored points again (after a change of the cost
    terms) instead of measuring."""
    from harness.cli import tool_args

    args = tool_args(
        list(sys.argv[1:] if argv is None else argv), __doc__, ("model", "verifier", "threads", "name", "out", "refit")
    )
    from harness.cli import check_tool_values
    from harness.errors import ConfigError

    try:  # before any measurement (model=nosuch: exit 2, not Hydra's traceback)
        check_tool_values(args, ints=("threads",), groups=("model", "verifier"), files=("out",))
        if "refit" in args and not Path(args["refit"]).is_file():
            raise ConfigError(f"refit={args['refit']!r} is not allowed: a calibrated profile file (none there)")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = args.pop("name", "cpu-tts-calibrated")
    out = Path(args.pop("out", ROOT / "conf" / "hardware" / f"{name}.yaml"))
    threads = int(args.pop("threads", 1))
    refit = args.pop("refit", None)
    if refit:
        old = yaml.safe_load(Path(refit).read_text())["measured"]["tts"]
        cfg = compose([f"model={old['models']['generator']}", f"verifier={old['models']['verifier']}"])
        meta = {k: old[k] for k in ("models", "threads", "loadavg_before", "loadavg_after")}
        tts = fit_stages(cfg, meta, old["decode"]["points"], old["prefill"]["points"])
        threads = tts["threads"]
    else:
        cfg = compose([f"{k}={v}" for k, v in args.items()])
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        tts = calibrate(cfg, threads)
    write_profile(tts, out, name)
    for stage in ("decode", "prefill"):
        f = tts[stage]
        print(
            f"{stage:8s} ({f['form']}) P {f['flops'] / 1e9:8.2f} GFLOP/s  BW {f['bw'] / 1e9:7.2f} GB/s  step "
            f"{f['step_s'] * 1e3:6.2f} ms  per sequence {f['seq_s'] * 1e3:5.2f} ms  fit error {f['mape']:.1f} % "
            f"over {len(f['points'])} points"
        )
    print(f"load average {tts['loadavg_before']:.2f} before, {tts['loadavg_after']:.2f} after; {threads} thread(s)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
