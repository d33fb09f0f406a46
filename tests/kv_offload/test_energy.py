"""Energy of LBS-family runs (issue 16.1): the simulator's charges from the serving family's power
model, computed by hand; the run's energy fields; energy unavailable = None with the reason."""

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from harness.config import AttrDict, plain
from harness.model_facts import dtype_bytes, layer_params
from harness.run import run
from systems.kv_offload.display import display_rows
from systems.kv_offload.plan import GroupPlan, KVGeometry, StepPlan
from systems.kv_offload.protocol import EnergyWindow
from systems.kv_offload.runner import energy_summary
from systems.kv_offload.sim import SimExecutor

# A GPU with round numbers: at f = 1000 of f_max = 2000 MHz,
#   P_act  = 100 + 200 (1000/2000)^2           = 150 W
#   P_idle = 20 + (40 - 20) * 1000/2000        = 30 W      (launch gaps, waiting on PCIe)
#   P_busy(r) = 20 + (150 - 20) (0.5 + 0.5 r)  = 85 .. 150 W
HAND_HW = AttrDict(
    name="hand",
    kind="gpu",
    peak_flops=1e12,
    flops_efficiency=1.0,
    mem_bw=1e11,
    mem_efficiency=1.0,
    h2d_bw=1e9,
    d2h_bw=1e9,
    launch_overhead_s=1e-5,
    interconnect_bw=0.0,
    idle_w=20.0,
    clock_min_mhz=500,
    clock_max_mhz=2000,
    clock_default_mhz=1000,
    power=AttrDict(
        act_a_w=100.0,
        act_b_w=200.0,
        act_alpha=2.0,
        mem_beta=0.5,
        blocking_w=40.0,
        mem_knee_frac=0.5,
        limit_w=1000.0,
        tile_tokens=64,
    ),
)
P_IDLE = 30.0


def p_busy(r: float) -> float:
    return 20.0 + 130.0 * (0.5 + 0.5 * r)


def kernel_j(t_flops: float, t_bytes: float) -> float:
    """A kernel's energy by hand: max(t_flops, t_bytes) at P_busy(r = t_flops / max)."""
    t = max(t_flops, t_bytes)
    return p_busy(t_flops / t) * t


def test_lbs_group_energy_by_hand(compose_cfg):
    """One LBS group of 4 beams decodes 1 token at 100 cached tokens after loading 20 MB over PCIe
    (20 ms of I/O stall). Compute: per layer a decode kernel + one launch gap, then the LM head +
    one launch gap, then the sampling's passes (a memory-bound kernel, no gap); stall at P_idle. Mutations caught: the I/O stall charged at busy power
    (P_busy(0) or P_busy(1) instead of P_idle); P_idle dropped from the launch gaps or the stall;
    r taken as the memory-bound share (t_bytes / t) instead of t_flops / t."""
    m = plain(compose_cfg("model=tiny-opt").model)
    b, s, load = 4, 100, 20_000_000
    P, db, L = layer_params(m), dtype_bytes(m.dtype), m.num_layers
    kvl = KVGeometry.from_model(m).kv_layer_token
    qd = m.num_heads * m.head_dim
    layer = kernel_j((2 * b * P + 4 * b * s * qd) / 1e12, (P * db + b * (s + 1) * kvl) / 1e11) + P_IDLE * 1e-5
    hv = m.hidden_size * m.vocab_size
    sampling = 8 * b * m.vocab_size * 4  # 8 passes over each beam's float32 vocabulary row: memory-bound
    head = kernel_j(2 * b * hv / 1e12, hv * db / 1e11) + P_IDLE * 1e-5 + kernel_j(0.0, sampling / 1e11)
    stall_s = load / 1e9
    expect_compute = L * layer + head

    ex = SimExecutor(HAND_HW, m, seed=0)
    plan = StepPlan(
        step=0,
        start=s,
        tokens=1,
        scheduler="lbs",
        num_beams=b,
        groups=[GroupPlan(beams=list(range(b)), load_blocks=None, load_bytes=load, writeback_bytes=0)],
    )
    out = ex.execute_step(plan, None, [SimpleNamespace(uid=i) for i in range(b)])
    w = ex.step_energy()
    assert out.io_stall_s == pytest.approx(stall_s, rel=1e-12)
    assert w.io_stall_j == pytest.approx(P_IDLE * stall_s, rel=1e-12)  # 0.6 J
    assert w.energy_j == pytest.approx(expect_compute + P_IDLE * stall_s, rel=1e-12)
    assert ex.step_energy().energy_j == 0.0  # the window was closed


def test_run_energy_fields_follow_the_windows(compose_cfg, tmp_path):
    """Layer-wise at 16 beams (I/O-bound) on the RTX 4090 profile: the summary's energy is the sum of
    the steps table's windows plus the prefill's; the stall part is P_idle(f) x the stall seconds;
    J per token = energy / (beams x gen_len); average power = energy / end-to-end time; labelled
    simulated in the printed table. Mutations caught: per-token energy divided by the end-to-end time;
    average power divided by the tokens; the prefill window dropped from the sum."""
    rec = run(
        compose_cfg(
            "backend=sim", "system=layerwise", "model=opt-6.7b", "beams=16", "gen_len=256", output_dir=tmp_path / "lw"
        )
    )
    s = rec["summary"]
    steps = pd.read_parquet(Path(rec["config"]["output_dir"]) / "steps.parquet")
    hw = compose_cfg("hardware=rtx4090").hardware
    p_idle = hw.idle_w + (hw.power.blocking_w - hw.idle_w) * hw.clock_default_mhz / hw.clock_max_mhz
    assert s["energy_io_stall_j"] == pytest.approx(p_idle * s["io_stall_s"], rel=1e-9)
    assert s["energy_j"] > steps.energy_j.sum() > 0  # + the prefill's window
    assert s["energy_per_token_j"] == pytest.approx(s["energy_j"] / (16 * 256), rel=1e-12)
    assert s["avg_power_w"] == pytest.approx(s["energy_j"] / s["e2e_s"], rel=1e-12)
    assert p_idle < s["avg_power_w"] < hw.power.limit_w
    assert s["energy_source"] == "simulated power model at 2,520 MHz"
    labels = [lbl for lbl, *_ in display_rows(s, {"scheduler": "layerwise"})]
    assert "energy (simulated power model at 2,520 MHz)" in labels


def test_no_power_model_is_unavailable_not_zero(compose_cfg, tmp_path):
    """A profile without ``power:`` (rtx3080ti) records energy None with the reason, in the summary
    and in every step row. Mutation caught: the executor returning 0 J without a power model."""
    rec = run(
        compose_cfg(
            "backend=sim",
            "hardware=rtx3080ti",
            "model=opt-2.7b",
            "system=lbs",
            "beams=8",
            "gen_len=64",
            output_dir=tmp_path / "r",
        )
    )
    s = rec["summary"]
    assert rec["status"] == "ok"
    assert s["energy_j"] is None and s["energy_per_token_j"] is None and s["avg_power_w"] is None
    assert "rtx3080ti has no fitted power model" in s["energy_unavailable_reason"]
    steps = pd.read_parquet(Path(rec["config"]["output_dir"]) / "steps.parquet")
    assert steps.energy_j.isna().all()


def test_one_unmeasured_window_makes_the_run_unmeasured():
    """Mutation caught: summing the measured windows and skipping None ones (a partial sum that
    reads as the run's energy)."""
    got = energy_summary([EnergyWindow(5.0, 1.0), EnergyWindow(None, None, "NVML lost")], 2.0, 10, "x")
    assert got["energy_j"] is None and got["energy_unavailable_reason"] == "NVML lost"
    ok = energy_summary([EnergyWindow(5.0, 1.0), EnergyWindow(3.0, 0.5)], 2.0, 10, "x")
    assert ok == {
        "energy_j": 8.0,
        "energy_io_stall_j": 1.5,
        "energy_per_token_j": 0.8,
        "avg_power_w": 4.0,
        "energy_source": "x",
        "energy_unavailable_reason": None,
    }


def test_lbs_energy_experiment_draws_figure_table_and_sources(tmp_path):
    """``experiment=lbs_energy`` cut to 16 beams, step 128, 256 tokens, 1 GiB KV budget (6 jobs, all
    offloading): figure and table written; each LBS row's ratio to layer-wise equals the records' J
    per token ratio; the note names the measured data file behind the A100's power fit and marks the
    RTX 4090's as assumptions.
    Mutations caught: the ratio inverted (layer-wise / LBS); energy columns taken in the records'
    order instead of matched by job (rows misaligned after tidy's sort); the clocks listed without
    their profile (the note read 'simulated power model at 1,410 MHz; simulated power model at 2,520 MHz')."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "experiment=lbs_energy",
            "hydra.sweeper.params.beams=16",
            "hydra.sweeper.params.step=128",
            "gen_len=256",
            "kv_budget=1GiB",
            "tracking=none",
            f"results_dir={tmp_path}",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    from harness.reproduce import paper_experiments

    assert "lbs_energy" not in paper_experiments()  # a cross-paper study: no paper numbers, no verdicts
    sweep = tmp_path / "sweeps" / "lbs_energy"
    for f in ("lbs_energy.png", "lbs_energy.pdf", "lbs_energy.md"):
        assert (sweep / f).exists(), f
    recs = [json.loads(p.read_text()) for p in sweep.glob("*/run.json")]
    assert len(recs) == 6
    per_token = {
        (r["config"]["hardware"]["name"], r["config"]["system"]["name"], r["config"]["workload"]["beams"]): r[
            "summary"
        ].get("energy_per_token_j")
        for r in recs
    }
    text = (sweep / "lbs_energy.md").read_text()
    assert text.startswith("# Energy of KV offloading (lbs_energy) (simulated)")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    head, body = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(head)}
    for hw in ("rtx4090", "a100-80gb"):
        r = next(
            b for b in body if b[col["hardware"]] == hw and b[col["beams"]] == "16" and b[col["system"]] == "LBS (full)"
        )
        ratio = per_token[(hw, "lbs", 16)] / per_token[(hw, "layerwise", 16)]
        assert abs(ratio - 1) > 0.1 and float(r[col["LBS / layer-wise J per token"]]) == pytest.approx(ratio, rel=5e-3)
        assert float(r[col["J / token"]]) == pytest.approx(per_token[(hw, "lbs", 16)], rel=5e-3)
    assert (
        "Energy charged by rtx4090: simulated power model at 2,520 MHz; a100-80gb: simulated power "
        "model at 1,410 MHz (systems/kv_offload/sim.py)"
    ) in text  # each profile's clock named with it
    note = text.split("Where the power parameters come from:", 1)[1]
    a100, rtx = (next(line for line in note.splitlines() if f"**{hw}**" in line) for hw in ("a100-80gb", "rtx4090"))
    assert "perseus_a100_sxm" in a100 and "least-squares fit" in a100
    assert "assumption (no public RTX 4090 clock sweep)" in rtx


def test_real_engine_reads_one_nvml_window_per_step(compose_cfg, fake_nvml, monkeypatch, one_thread):
    """The torch engine (tiny-opt on this CPU) given a fake NVML whose counter advances 1 J per read:
    a window for the prefill and one per step (each 1 J: one read at its start, one at its end),
    summed into the run's energy; no I/O-stall split (NVML does not give one). Mutations caught: the
    runner reading only the prefill's window; a step window that is not reopened (the next step's
    end finds no window)."""
    from harness.meters import EnergyMeter
    from systems.kv_offload import runner

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = fake_nvml([("GPU-a", "00000000:1A:00.0", "NVIDIA GeForce RTX 4090", 1000)])
    make = runner._executor

    def with_meter(cfg, ctx, budget):  # what the engine does on a CUDA device, with the fake
        ex = make(cfg, ctx, budget)
        ex._energy, ex.energy_source = EnergyMeter(nvml=nvml), "measured by NVML, one window per step"
        return ex

    monkeypatch.setattr(runner, "_executor", with_meter)
    rec = run(
        compose_cfg(
            "backend=torch",
            "system=lbs",
            "model=tiny-opt",
            "beams=4",
            "gen_len=8",
            "step=4",
            "prompt_len=16",
            "kv_budget=256KiB",
            "system.warmup=false",
        )
    )
    s = rec["summary"]
    steps = pd.read_parquet(Path(rec["config"]["output_dir"]) / "steps.parquet")
    assert rec["status"] == "ok" and steps.energy_j.tolist() == [1.0, 1.0]
    assert s["energy_j"] == 3.0 and s["energy_per_token_j"] == 3.0 / (4 * 8)
    assert s["energy_io_stall_j"] is None and s["energy_source"].startswith("measured by NVML")
