"""The LBS family's simulated cost of a decode launch (systems/kv_offload/sim.py, CostModel): the
weight-read rate of a launch of b beams from the measured table ``hardware.mem_bw_by_rows``, and the
sampling's passes over each beam's vocabulary row, on worked numbers. (Mutations caught: the weight
time growing with the rows beyond the table; bandwidth, not seconds per byte, interpolated; the
sampling term dropped, counted once per launch instead of per beam, hidden under the LM head's
compute, or without the float16 logits' cast; the table applied to the KV read as well as the
weights; a key of 0 rows accepted; the engine sampling in a dtype of its own.)"""

import pytest
from omegaconf import OmegaConf

from harness.config import HardwareConfig, check_hardware
from harness.errors import ConfigError
from systems.kv_offload.plan import SAMPLING_PASSES, sampling_dtype
from systems.kv_offload.sim import CostModel

GB = 1e9


def hardware(**kw):
    base = dict(
        name="t",
        memory_bytes=1 << 30,
        peak_flops=1e17,  # compute never binds at these sizes: times below are the bytes' alone
        mem_bw=10 * GB,
        h2d_bw=1 * GB,
        d2h_bw=1 * GB,
        launch_overhead_s=0.0,
        flops_efficiency=1.0,
        mem_efficiency=1.0,
    )
    base.update(kw)
    return OmegaConf.merge(OmegaConf.structured(HardwareConfig), base)


def model(**kw):
    m = dict(
        num_layers=2,
        hidden_size=100,
        num_heads=2,
        num_kv_heads=2,
        head_dim=50,
        intermediate_size=400,
        vocab_size=1000,
        dtype="float32",
        hf_model_type="opt",
        num_params=None,
    )
    m.update(kw)
    return OmegaConf.create(m)


def test_weight_rate_interpolates_seconds_per_byte_and_grows_beyond_the_table():
    cm = CostModel(hardware(mem_bw_by_rows={1: 20 * GB, 4: 5 * GB}), model())
    assert cm.weight_bw(1) == pytest.approx(20 * GB)
    assert cm.weight_bw(4) == pytest.approx(5 * GB)
    # 2 rows: a third of the way from 1/20 to 1/5 ns per byte: 0.05 + 0.05 = 0.1 ns/B = 10 GB/s
    assert cm.weight_bw(2) == pytest.approx(10 * GB)
    assert cm.weight_bw(8) == pytest.approx(5 * GB)  # beyond the table: its last rate (compute then binds)
    assert CostModel(hardware(), model()).weight_bw(8) == 10 * GB  # no table: mem_bw at every batch


def test_a_table_read_from_a_records_json_has_text_keys():
    hw = OmegaConf.create({**OmegaConf.to_container(hardware()), "mem_bw_by_rows": {"1": 20 * GB, "4": 5 * GB}})
    cm = CostModel(hw, model())
    assert cm.weight_bw(2) == pytest.approx(10 * GB)


def test_head_charges_the_lm_head_at_the_batchs_rate_and_the_sampling_per_beam():
    m = model()
    cm = CostModel(hardware(mem_bw_by_rows={1: 20 * GB, 4: 5 * GB}), m)
    head_bytes = 100 * 1000 * 4  # hidden x vocabulary, float32
    for b, rate in ((1, 20 * GB), (2, 10 * GB), (4, 5 * GB)):
        sampling = 8 * b * 1000 * 4 / (10 * GB)  # 8 passes over each beam's [V] row at mem_bw
        assert float(cm.head(b)[0]) == pytest.approx(head_bytes / rate + sampling)
    assert SAMPLING_PASSES == 8
    # a float64 model samples in float64: twice the sampling bytes
    cm64 = CostModel(hardware(), model(dtype="float64"))
    assert float(cm64.head(3)[0]) == pytest.approx((100 * 1000 * 8 + 8 * 3 * 1000 * 8) / (10 * GB))
    # a float16 model's logits are cast to float32 first (read 2 + write 4 bytes each)
    cm16 = CostModel(hardware(), model(dtype="float16"))
    assert float(cm16.head(3)[0]) == pytest.approx((100 * 1000 * 2 + 3 * 1000 * (2 + 4) + 8 * 3 * 1000 * 4) / (10 * GB))


def test_the_sampling_is_not_hidden_under_the_lm_heads_compute():
    """A compute-bound LM head (1 GFLOP/s) still pays the sampling's memory passes after it."""
    cm = CostModel(hardware(peak_flops=1e9), model())
    flops = 2 * 2 * 100 * 1000
    assert float(cm.head(2)[0]) == pytest.approx(flops / 1e9 + 8 * 2 * 1000 * 4 / (10 * GB))


def test_layer_reads_weights_at_the_batchs_rate_and_kv_at_mem_bw():
    m = model()
    cm = CostModel(hardware(mem_bw_by_rows={1: 20 * GB, 4: 5 * GB}), m)
    kv_layer_token = 2 * 2 * 50 * 4
    t = float(cm.layer_decode(4, 9)[0])
    assert t == pytest.approx(cm.P * 4 / (5 * GB) + 4 * 10 * kv_layer_token / (10 * GB))


@pytest.mark.parametrize("dtype, sampled", [("float64", "float64"), ("float32", "float32"), ("bfloat16", "float32")])
def test_the_engine_samples_in_the_dtype_the_simulator_charges(dtype, sampled):
    import torch

    from harness.config import ModelConfig
    from systems.kv_offload.torch_engine import TorchExecutor

    assert sampling_dtype(dtype) == sampled
    conf = OmegaConf.load("conf/model/tiny-opt.yaml")
    conf.pop("defaults")
    m = OmegaConf.merge(OmegaConf.structured(ModelConfig), conf)
    m.num_layers, m.hidden_size, m.intermediate_size, m.vocab_size = 1, 32, 64, 100
    m.num_heads = m.num_kv_heads = 2
    m.head_dim = 16
    m.hf_config.word_embed_proj_dim = 32
    ex = TorchExecutor(m, "cpu", None, seed=0, dtype=dtype)
    assert ex.sample_dtype == getattr(torch, sampled)
    ex.close()


def test_a_rows_table_can_be_given_on_the_command_line(compose_cfg):
    cfg = compose_cfg(
        "system=lbs", "hardware=rtx4090", "+hardware.mem_bw_by_rows.4=1e11", "+hardware.mem_bw_by_rows.1=4e11"
    )
    check_hardware(cfg.hardware)
    cm = CostModel(cfg.hardware, cfg.model)
    assert cm.weight_bw(2) == pytest.approx(1 / (1 / 4e11 + (1 / 1e11 - 1 / 4e11) / 3))


@pytest.mark.parametrize(
    "table, message",
    [
        ({0: 1e9}, "a count of rows (an integer >= 1)"),
        ({"x": 1e9}, "a count of rows (an integer >= 1)"),
        ({4: -1.0}, "a bandwidth in bytes/s from 1e+08 to 1e+14 > 0"),
        ({4: 1e9, "4": 2e9}, "row 4 is given twice"),
        ({4: 1e20}, "a bandwidth in bytes/s from"),
    ],
)
def test_a_bad_rows_table_is_refused_naming_it(table, message):
    with pytest.raises(ConfigError, match="mem_bw_by_rows") as e:
        check_hardware(OmegaConf.create({**OmegaConf.to_container(hardware()), "mem_bw_by_rows": table}))
    assert message in str(e.value)


def test_a_row_the_profile_holds_is_overridden_without_plus_a_new_one_needs_it(tmp_path):
    """The pre-flight check of a key inside an open mapping (harness.cli.check_mapping_key), on a
    profile holding a table with text keys as harness.calibrate writes them: its row 4 may be
    overridden plainly; row 3 needs '+' (else Hydra's "not in struct", exit 1)."""
    import shutil
    from pathlib import Path

    from harness.cli import check_mapping_key

    root = Path(__file__).resolve().parents[2]
    conf = tmp_path / "conf"
    shutil.copytree(root / "conf", conf)
    prof = OmegaConf.load(root / "conf/hardware/cpu.yaml")
    prof.mem_bw_by_rows = {"1": 8e9, "4": 4e9}
    OmegaConf.save(prof, conf / "hardware/t-rows.yaml")
    check_mapping_key("hardware.mem_bw_by_rows.4", "2e9", ["hardware=t-rows"], conf)
    with pytest.raises(ConfigError, match=r"holds 1, 4\); add it with \+hardware.mem_bw_by_rows.3=2e9"):
        check_mapping_key("hardware.mem_bw_by_rows.3", "2e9", ["hardware=t-rows"], conf)
    check_mapping_key("hardware.mem_bw_by_rows.3", "2e9", ["experiment=lbs_fig9"], conf)  # Hydra decides


def test_a_simulated_run_says_a_rows_table_is_in_force(tmp_path):
    """A one-row table changes every launch's weight reads: the status line says so."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "system=lbs",
            "model=opt-6.7b",
            "beams=64",
            "+hardware.mem_bw_by_rows.4=4e11",
            "+hardware.mem_bw_by_rows.1=8e11",
            "tracking=none",
            f"results_dir={tmp_path}",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-1500:]
    assert "simulated weight reads at hardware.mem_bw_by_rows (rows 1, 4, interpolated" in out.stdout + out.stderr
