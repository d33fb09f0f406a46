"""Paper-figure sweeps: a small sweep draws its figure and table; a resumed sweep skips finished jobs;
the beam tree recorded by one run replays in another; calibration writes a dated profile."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.config import HardwareConfig, check_hardware
from harness.run import run

ROOT = Path(__file__).resolve().parents[2]


def _sweep(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "run.py", "-m", *args, "tracking=none", f"results_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_two_job_sweep_draws_figure_and_resume_skips(tmp_path):
    args = ["experiment=lbs_fig4", "hydra.sweeper.params.beams='4,64'", "gen_len=128"]
    out = _sweep(tmp_path, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = tmp_path / "sweeps" / "lbs_fig4"
    for f in ("fig4.png", "fig4.pdf", "fig4.md", "runs.parquet", "verdicts.csv"):
        assert (sweep / f).exists(), f
    table = (sweep / "fig4.md").read_text()
    assert "paper KV share (%)" in table and "KV share verdict" in table and "simulated" in table
    recs = {p: json.loads(p.read_text()) for p in sweep.glob("*/run.json")}
    assert len(recs) == 2
    # interrupt: drop one job's record, then re-run the same sweep
    victim = sorted(recs)[0]
    victim.unlink()
    again = _sweep(tmp_path, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipping: valid record exists") == 1
    for p, rec in recs.items():
        new = json.loads(p.read_text())
        if p == victim:
            assert new["started_at"] != rec["started_at"]
        else:
            assert new["started_at"] == rec["started_at"]  # not re-run


def test_recorded_beam_tree_replays_in_the_simulator(compose_cfg, tmp_path):
    common = ["backend=sim", "system=lbs", "beams=16", "gen_len=256", "step=32", "seed=5"]
    a = run(compose_cfg(*common, "system.record_tree=true", output_dir=tmp_path / "a"))
    tree = json.loads((tmp_path / "a" / "beam_tree.json").read_text())
    assert len(tree["steps"]) == 256 // 32 - 1 and all(len(s["kept"]) == 8 for s in tree["steps"])
    # replay under another seed: the scores differ, but the kept beams follow the recording
    b = run(
        compose_cfg(
            *common[:-1],
            "seed=5",
            f"system.replay_tree={tmp_path / 'a'}",
            "system.record_tree=true",
            output_dir=tmp_path / "b",
        )
    )
    assert json.loads((tmp_path / "b" / "beam_tree.json").read_text())["steps"] == tree["steps"]
    assert b["summary"]["h2d_bytes"] == a["summary"]["h2d_bytes"]


def test_replay_of_a_mismatched_tree_is_rejected(compose_cfg, tmp_path):
    """A replay configured unlike the recording (here 16 beams and another step, model and seed against
    8 beams) is a ConfigError naming each field with its recorded and given value, before any work.
    Mutation caught: checking only the number of steps (the old check; 16 beams then ran, 16 groups at
    step 0 and 8 after); dropping the model from the checked fields."""
    from harness.errors import ConfigError

    run(
        compose_cfg(
            "backend=sim",
            "beams=8",
            "gen_len=128",
            "step=32",
            "seed=1",
            "system.record_tree=true",
            output_dir=tmp_path / "a",
        )
    )
    with pytest.raises(ConfigError) as e:
        run(
            compose_cfg(
                "backend=sim",
                "beams=16",
                "gen_len=128",
                "step=16",
                "seed=2",
                "model=opt-2.7b",
                f"system.replay_tree={tmp_path / 'a'}",
                output_dir=tmp_path / "b",
            )
        )
    msg = str(e.value)
    for part in (
        "beams: recorded 8, given 16",
        "step: recorded 32, given 16",
        "seed: recorded 1, given 2",
        "model: recorded 'opt-6.7b', given 'opt-2.7b'",
    ):
        assert part in msg, msg
    assert "gen_len" not in msg.split("(", 1)[1] and not (tmp_path / "b").exists()
    with pytest.raises(ConfigError, match="gen_len: recorded 128, given 256"):
        run(
            compose_cfg(
                "backend=sim",
                "beams=8",
                "gen_len=256",
                "step=32",
                "seed=1",
                f"system.replay_tree={tmp_path / 'a'}",
                output_dir=tmp_path / "c",
            )
        )


def test_replay_says_which_hardware_it_simulates(compose_cfg, tmp_path):
    """The replay's message names where the tree was recorded and the profile it simulates, and says
    the times are not comparable when the profile is not the recorded one's. Mutation caught: the
    comparison inverted (the note on the matching profile instead)."""
    common = ["backend=sim", "beams=8", "gen_len=128", "step=32"]
    run(compose_cfg(*common, "hardware=rtx4090", "system.record_tree=true", output_dir=tmp_path / "a"))
    assert json.loads((tmp_path / "a" / "beam_tree.json").read_text())["hardware_profile"] == "rtx4090"
    other = run(
        compose_cfg(*common, "hardware=a100-80gb", f"system.replay_tree={tmp_path / 'a'}", output_dir=tmp_path / "b")
    )
    assert "recorded on the simulated 'rtx4090' profile" in other["message"]
    assert "simulates the 'a100-80gb' hardware profile" in other["message"]
    assert "not comparable" in other["message"] and "hardware=rtx4090" in other["message"]
    same = run(
        compose_cfg(*common, "hardware=rtx4090", f"system.replay_tree={tmp_path / 'a'}", output_dir=tmp_path / "c")
    )
    assert same["status"] == "ok" and "simulates the 'rtx4090'" in same["message"]
    assert "not comparable" not in same["message"]


def test_calibration_writes_a_dated_measured_profile(tmp_path):
    from harness.calibrate import measure, write_profile

    m = measure("cpu", quick=True)
    for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw"):
        assert m[k] > 1e6, k
    assert 0 < m["launch_overhead_s"] < 0.1
    base = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/hardware/cpu.yaml"))
    out = write_profile(base, m, tmp_path / "cpu-calibrated.yaml")
    prof = OmegaConf.to_container(OmegaConf.load(out))
    assert prof["name"] == "cpu-calibrated" and prof["measured"]["date"]
    assert prof["h2d_bw"] == pytest.approx(m["h2d_bw"]) and prof["datasheet"]["h2d_bw"] == base["h2d_bw"]
    assert "measured by python -m harness.calibrate" in prof["sources"]["peak_flops"]
    rows = prof["mem_bw_by_rows"]  # x @ W.t() of 1 to 64 rows, integer keys
    assert sorted(int(r) for r in rows) == [1, 2, 4, 8, 16, 32, 64] and all(v > 1e6 for v in rows.values())
    assert all(isinstance(r, str) for r in rows)  # text keys: what a command-line override names
    assert "mem_bw_by_rows.*" in prof["sources"]
    prof.pop("defaults")
    check_hardware(OmegaConf.merge(OmegaConf.structured(HardwareConfig), prof))  # passes the schema and the checks


def test_fidelity_sweep_bytes_match_exactly(tmp_path):
    """lbs_fidelity: a real CPU run, its beam tree replayed on the simulated backend; same bytes."""
    out = _sweep(
        tmp_path,
        "experiment=lbs_fidelity",
        "hydra.sweeper.params.system='lbs,layerwise'",
        "hydra.sweeper.params.beams=4",
        "gen_len=32",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    import pandas as pd

    sweep = tmp_path / "sweeps" / "lbs_fidelity"
    summary = pd.read_csv(sweep / "fidelity_summary.csv")
    assert int(summary.pairs[0]) == 2 and bool(summary.bytes_exact[0])
    assert (sweep / "fidelity.png").exists() and (sweep / "fidelity.md").exists()


def test_gpu_calibration_sets_efficiencies_to_one(tmp_path, monkeypatch):
    """A GPU-calibrated profile's ceilings are measured (achieved) rates: its efficiencies are 1.0,
    not the datasheet profile's, so the simulator does not discount them twice. The device and the
    measurement are faked. (Mutation caught: resetting efficiencies only for kind=cpu profiles.)"""
    import torch

    from harness import calibrate

    fake = {
        "peak_flops": 7.0e14,
        "mem_bw": 4.1e12,
        "stream_bw": 4.3e12,
        "h2d_bw": 5.3e10,
        "d2h_bw": 5.1e10,
        "launch_overhead_s": 6e-5,
        "kernel_launch_s": 4e-6,
        "gemv_bytes": 512 << 20,
        "gemv_per_window": 50,
        "device": "cuda",
        "threads": 1,
    }
    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        calibrate, "measure", lambda device, quick, threads, **kw: seen.update(device=device) or dict(fake)
    )
    base = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/hardware/h100.yaml"))  # a datasheet profile
    assert base["flops_efficiency"] < 1.0 and base["mem_efficiency"] < 1.0
    assert calibrate.main(["hardware=h100", f"out={tmp_path / 'h100-calibrated.yaml'}"]) == 0
    prof = OmegaConf.to_container(OmegaConf.load(tmp_path / "h100-calibrated.yaml"))
    assert seen["device"] == "cuda"
    assert prof["flops_efficiency"] == 1.0 and prof["mem_efficiency"] == 1.0
    assert prof["mem_bw"] == fake["mem_bw"] and prof["datasheet"]["mem_bw"] == base["mem_bw"]
    assert "measured" in prof["sources"]["mem_efficiency"]
    assert prof["measured"]["kernel_launch_s"] == fake["kernel_launch_s"]


def test_fidelity_over_repeats_aggregates_each_configuration(compose_cfg, tmp_path, monkeypatch):
    """systems.kv_offload.fidelity: repeats of the real runs, the first repeat's trees replayed once on the
    simulated backend; per configuration the mean, min and max real time, the MAPE of the mean and
    of each repeat, bytes exact in every repeat. The scatter says which point is which: one legend
    entry per system, each point labelled with its beam count. (Mutation caught: one unlabelled
    errorbar series for all points, the scatter before this change.)"""
    from harness import report as harness_report
    from harness.report import gather_runs

    figs = {}
    real_save = harness_report.save_figure
    monkeypatch.setattr(
        harness_report, "save_figure", lambda fig, d, name: figs.setdefault(name, fig) and real_save(fig, d, name)
    )
    from systems.kv_offload.fidelity import main, report_repeats

    common = [
        "backend=torch",
        "backend.device=cpu",
        "model=tiny-opt",
        "model.num_layers=2",
        "model.vocab_size=500",
        "beams=4",
        "prompt_len=8",
        "gen_len=8",
        "step=4",
        "kv_budget=96KiB",
        "hardware=cpu",
        "system.record_tree=true",
    ]
    reps = []
    for i in range(2):
        for s in ("layerwise", "lbs"):
            assert run(compose_cfg(*common, f"system={s}", output_dir=tmp_path / f"rep{i}" / s))["status"] == "ok"
        reps.append(gather_runs(tmp_path / f"rep{i}"))
    summary = report_repeats(tmp_path, reps)
    row = summary.iloc[0]
    assert row.pairs == 2 and row.repeats == 2 and bool(row.bytes_exact)
    assert len(row.time_mape_each_repeat.split()) == 2 and row.time_mape >= 0 and row.real_spread_max >= 0
    assert row.time_mape_of_mean >= 0
    text = (tmp_path / "fidelity.md").read_text()
    assert "real, mean (s)" in text and "real, slowest (s)" in text and "host->device real (KiB)" in text
    assert len(list((tmp_path / "sim_replay").glob("*/run.json"))) == 2  # one replay per configuration
    ax = figs["fidelity"].axes[0]
    assert {"layer-wise", "LBS (full)"} <= set(ax.get_legend_handles_labels()[1])
    assert sorted(t.get_text() for t in ax.texts) == ["4 beams", "4 beams"]
    assert "measured" in ax.get_xlabel() and "simulated" in ax.get_ylabel()
    assert main(["repeats=0"]) == 2


def test_calibrate_unknown_hardware_exits_2_listing_the_profiles(capsys):
    """``python -m harness.calibrate hardware=h300``: exit 2 before measuring, naming the profiles
    (harness.cli.check_group_options, the rule the command line uses; schemas not listed).
    Mutation caught: the check dropped (KeyError/None profile later)."""
    from harness import calibrate

    assert calibrate.main(["hardware=h300"]) == 2
    err = capsys.readouterr().err
    assert "hardware='h300' is not allowed: one of a100-80gb, cpu," in err and "_hardware_schema" not in err


def test_calibrate_measures_the_decode_bandwidth_at_the_working_set_given(monkeypatch, tmp_path, capsys):
    """``gemv_bytes=64MiB`` sizes the decode-GEMV matrix (the fidelity tool passes the model's weight
    bytes); a size that is none, or outside 1 MiB..16 GiB, exits 2 before measuring. (Mutation
    caught: the option parsed but not passed to the measurement.)"""
    from harness import calibrate

    sizes = []
    monkeypatch.setattr(calibrate, "gemv_bandwidth", lambda device, dt, nbytes, per, sync: sizes.append(nbytes) or 1e10)
    monkeypatch.setattr(calibrate, "_layer_launch_overhead", lambda *a: 1e-4)
    m = calibrate.measure("cpu", quick=True, gemv_bytes=32 << 20)
    assert sizes == [32 << 20] and m["gemv_bytes"] == 32 << 20
    calibrate.measure("cpu", quick=True)
    assert sizes[-1] == calibrate.GEMV_BYTES >> 3
    seen = {}
    monkeypatch.setattr(
        calibrate, "measure", lambda *a, **kw: seen.update(kw) or calibrate._measure("cpu", True, 1 << 20)
    )
    assert calibrate.main(["hardware=cpu", "gemv_bytes=2MiB", f"out={tmp_path / 'p.yaml'}"]) == 0
    assert seen["gemv_bytes"] == 2 << 20
    for bad in ("1KiB", "lots", "64GiB"):
        assert calibrate.main(["hardware=cpu", f"gemv_bytes={bad}"]) == 2
        assert "gemv_bytes=" in capsys.readouterr().err


def test_the_fidelity_tool_calibrates_at_its_models_weight_bytes():
    """tiny-opt (4 layers of hidden 256, FFN 1024, vocabulary 50,272, float32): 66,215,936 bytes of
    weights (harness.model_facts.weight_bytes), and a model override changes them."""
    from systems.kv_offload.fidelity import model_weight_bytes

    assert model_weight_bytes([]) == 66_215_936
    assert model_weight_bytes(["model.vocab_size=1000", "beams=8"]) < 66_215_936 / 4


def test_the_rows_table_times_the_engines_layout_and_a_profile_is_named_after_its_file(monkeypatch, tmp_path):
    """mem_bw_by_rows times ``x @ W.t()`` (F.linear's layout, the engine's projections and LM head:
    a transposed weight view), mem_bw the plain ``v @ W``; a profile written to ``mine.yaml`` is
    ``hardware=mine``. (Mutations caught: the table timed on ``x @ W``; the name taken from the base
    profile.)"""
    import torch

    from harness import calibrate

    layouts = {}

    def one_call(fn, sync, **kw):  # record the weight operand's layout instead of timing
        from torch.utils._python_dispatch import TorchDispatchMode

        class Spy(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten.mm.default:
                    layouts.setdefault("calls", []).append((args[0].shape[0], args[1].is_contiguous()))
                return func(*args, **(kwargs or {}))

        with Spy():
            fn()
        return 1.0

    monkeypatch.setattr(calibrate, "_timeit", one_call)
    calibrate.gemv_bandwidth("cpu", torch.float32, 1 << 20, 1, lambda: None)
    assert layouts.pop("calls") == [(4, True)]  # v @ W: the weight as stored
    rows = calibrate.decode_bandwidth_by_rows("cpu", torch.float32, 1 << 20, 1, lambda: None, rows=(1, 8))
    assert sorted(rows) == [1, 8] and layouts["calls"] == [(1, False), (8, False)]  # x @ W.t(): a transposed view
    base = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/hardware/cpu.yaml"))
    m = {k: 1e9 for k in ("peak_flops", "mem_bw", "h2d_bw", "d2h_bw")} | {"launch_overhead_s": 1e-4}
    out = calibrate.write_profile(base, m, tmp_path / "mine.yaml")
    assert OmegaConf.load(out).name == "mine"
