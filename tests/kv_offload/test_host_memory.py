"""Host memory as a modelled resource of the offloading TTC systems (LBS, layer-wise): the KV they
offload must fit the host (``hardware.host_memory_bytes`` on the simulator, the machine's available
memory on a real engine), else the run is a predicted ``oom``, decided before any per-beam state.

QA: ``system=lbs beams=100000`` was simulated as ok with ~47 TiB of host KV on the 128 GiB RTX 4090
host, and ``beams=100000000`` was killed by the kernel's OOM killer (24 GB RSS, no run.json).
Mutations caught: the check removed (7 of these 11 fail); the conservative full KV instead of
the tree's peak (268 beams recorded oom; the real LBS run's bound); the prompt counted per beam; the
layer-wise host KV at the first token's residency instead of the last's (134 beams ok); the beam list
built before the check (10^8 beams: MemoryError under an 8 GB address-space limit); Eq.3/Eq.5
summed in int64; a real run checked against the profile instead of the machine's memory.
"""

import pytest

from harness.run import run
from systems.kv_offload import runner
from systems.kv_offload.analytic import dm_layerwise, dm_lbs

GiB = 2**30
KV_TOKEN = 32 * 16384  # OPT-6.7B fp16: bytes of one token of one beam, all layers


def _run(compose_cfg, tmp_path, name, *overrides):
    return run(compose_cfg("backend=sim", *overrides, output_dir=tmp_path / name))


def test_lbs_over_the_host_memory_is_a_predicted_oom_naming_both_sizes_and_the_field(compose_cfg, tmp_path):
    """270 beams of OPT-6.7B (prompt 128, 1920 generated in steps of 32, beam width 2): at the last
    step the host holds the prompt once, the 135 kept parents' 1888 tokens each and the 270 beams'
    32 new ones: (128 + 135*1888 + 270*32) x 512 KiB = 128.73 GiB > the 128 GiB host."""
    rec = _run(compose_cfg, tmp_path, "lbs270", "system=lbs", "beams=270")
    assert rec["status"] == "oom"
    assert rec["message"] == (
        "lbs: the KV offloaded to the host, 128.73 GiB at its peak (270 beams at up to "
        "2048 tokens), exceeds the host memory (128.00 GiB, hardware.host_memory_bytes "
        "of rtx4090): predicted from the host memory, not run"
    )
    s = rec["summary"]
    assert s["host_kv_bytes"] == (128 + 135 * 1888 + 270 * 32) * KV_TOKEN
    assert s["host_memory_bytes"] == 128 * GiB
    assert s["oom"] is True and s["oom_predicted"] is True
    assert "e2e_s" not in s and not (tmp_path / "lbs270" / "steps.parquet").exists()


@pytest.mark.parametrize("system, fits, over", [("lbs", 268, 270), ("layerwise", 132, 134)])
def test_just_under_the_host_memory_still_runs(compose_cfg, tmp_path, system, fits, over):
    """LBS: 268 beams hold (128 + 134*1888 + 268*32) x 512 KiB = 127.78 GiB (their full KV, 268 GiB,
    would not fit: pruned beams' segments are freed). Layer-wise (7 GiB budget): 1 layer stays
    resident at the last token, the other 31 hold every beam's KV at 2048 tokens on the host:
    31 x 132 x 2048 x 16 KiB = 127.88 GiB fits; 134 beams = 129.81 GiB does not. A run that fits
    records no host field (its summary is unchanged)."""
    ok = _run(compose_cfg, tmp_path, f"{system}{fits}", f"system={system}", f"beams={fits}")
    assert ok["status"] == "ok", ok["message"]
    assert "host_kv_bytes" not in ok["summary"] and "oom" not in ok["summary"]
    assert ok["summary"]["h2d_bytes"] > 0  # it did offload
    no = _run(compose_cfg, tmp_path, f"{system}{over}", f"system={system}", f"beams={over}")
    assert no["status"] == "oom" and "exceeds the host memory" in no["message"]
    if system == "layerwise":
        assert no["summary"]["host_kv_bytes"] == 31 * 134 * 2048 * 16384


@pytest.mark.parametrize("system", ["lbs", "layerwise"])
def test_the_most_beams_allowed_are_recorded_as_oom_not_killed(compose_cfg, tmp_path, system):
    """2**20 beams (the bound; 10**8 was killed at 24 GB RSS before any bound): decided before the
    executor, the beam list or the tree exist. Eq.3/Eq.5 in its summary are exact."""
    rec = _run(compose_cfg, tmp_path, system, f"system={system}", f"beams={2**20}")
    assert rec["status"] == "oom" and "exceeds the host memory" in rec["message"]
    s = rec["summary"]
    assert s["eq3_layerwise_bytes"] == dm_layerwise(
        num_layers=32, num_beams=2**20, kv=16384, mem_gpu=7 * GiB, prompt_len=128, gen_len=1920
    )
    assert s["eq5_lbs_bytes"] == 2**20 * 32 * 16384 * sum(128 + 32 * i for i in range(60))


def test_eq3_and_eq5_are_exact_past_int64():
    n = 10**8
    assert dm_lbs(num_layers=32, num_beams=n, kv=16384, prompt_len=128, gen_len=1920, step=32) == sum(
        n * 32 * (128 + 32 * i) * 16384 for i in range(60)
    )
    # 10^8 beams: no layer fits a 7 GiB budget, every token loads all 32 layers
    assert dm_layerwise(num_layers=32, num_beams=n, kv=16384, mem_gpu=7 * GiB, prompt_len=128, gen_len=1920) == sum(
        32 * n * s * 16384 for s in range(128, 2048)
    )


def test_a_profile_without_host_memory_is_not_checked(compose_cfg, tmp_path):
    """null = unknown: the run goes ahead as before (here rtx4090 with the field cleared)."""
    rec = _run(compose_cfg, tmp_path, "null", "system=lbs", "beams=270", "hardware.host_memory_bytes=null")
    assert rec["status"] == "ok" and "host_kv_bytes" not in rec["summary"]


def test_in_gpu_holds_nothing_on_the_host(compose_cfg, tmp_path):
    """in_gpu keeps its own oom (the KV budget); a request LBS keeps resident offloads nothing."""
    rec = _run(compose_cfg, tmp_path, "ing", "system=in_gpu", f"beams={2**20}")
    assert rec["status"] == "oom" and "exceeds the KV budget" in rec["message"]
    fits = _run(
        compose_cfg, tmp_path, "res", "system=lbs", "beams=4", "kv_budget=16GiB", "hardware.host_memory_bytes=1048576"
    )
    assert fits["status"] == "ok" and fits["summary"]["h2d_bytes"] == 0


# -- the real engine (torch, CPU): the prediction against what its host pools hold -----------------
KV = 1024  # tiny OPT below, float64: 2 * 4 heads * 16 * 8 B per layer-token; 4 layers
MODEL = [
    "model=tiny-opt",
    "model.num_layers=4",
    "model.hidden_size=64",
    "model.num_heads=4",
    "model.num_kv_heads=4",
    "model.head_dim=16",
    "model.intermediate_size=128",
    "model.vocab_size=1000",
    "model.dtype=float64",
    "model.hf_config.word_embed_proj_dim=64",
]
WORK = ["beams=8", "prompt_len=16", "gen_len=32", "step=8", "seed=7", "kv_budget=491520"]  # 480 KiB
# LBS: 4 steps of 8 tokens, 4 kept parents: peak (16 + 4*24 + 8*8) x 4 KiB = 704 KiB (full KV: 1536 KiB).
# Layer-wise: L = floor(480 / (8 * 48)) = 1 resident layer at the last token; 3 x 8 x 48 x 1 KiB = 1152 KiB.
PREDICTED = {"lbs": (16 + 4 * 24 + 8 * 8) * 4 * KV, "layerwise": 3 * 8 * 48 * KV}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("system", ["lbs", "layerwise"])
def test_real_engine_host_peak_within_the_prediction_and_checked_against_available_memory(
    compose_cfg, tmp_path, monkeypatch, system
):
    """On torch the check uses the machine's available memory (/proc/meminfo MemAvailable; faked
    here): one byte under the prediction is a predicted oom; exactly the prediction runs, and the
    host pools' measured peak is within it (layer-wise: equal, its host layers are sized once;
    LBS: at least the prompt, the last step's parents and new tokens)."""
    from systems.kv_offload import kvstore

    peak = [0]

    def tracking(cls, name):
        orig = getattr(cls, name)

        def wrapped(self, *a, **kw):
            out = orig(self, *a, **kw)
            peak[0] = max(peak[0], self.nbytes)
            return out

        monkeypatch.setattr(cls, name, wrapped)

    tracking(kvstore.HostPool, "ensure")
    tracking(kvstore.HostLayers, "layer")
    over = ["backend=torch", "backend.device=cpu", f"system={system}", *MODEL, *WORK]
    want = PREDICTED[system]

    monkeypatch.setattr(runner, "available_host_memory", lambda: want - 1)
    rec = run(compose_cfg(*over, output_dir=tmp_path / "under"))
    assert rec["status"] == "oom" and rec["summary"]["host_kv_bytes"] == want
    assert "MemAvailable of this machine" in rec["message"] and peak[0] == 0  # nothing was allocated

    monkeypatch.setattr(runner, "available_host_memory", lambda: want)
    rec = run(compose_cfg(*over, output_dir=tmp_path / "exact"))
    assert rec["status"] == "ok", rec["message"]
    if system == "layerwise":
        assert peak[0] == want
    else:
        assert (16 + 4 * 8 + 8 * 8) * 4 * KV <= peak[0] <= want


def test_available_host_memory_reads_the_machine():
    avail = runner.available_host_memory()
    assert avail is None or 0 < avail


def test_beams_past_the_bound_are_bad_input(compose_cfg):
    """beams=2**63 was an OverflowError recorded as error after the run started (issue 39). At most
    2**20 beams (the papers use up to 256); more exits 2 before any work. Mutation caught: the bound
    dropped (the validation then passes)."""
    from harness.errors import ConfigError
    from harness.run import validate

    with pytest.raises(ConfigError, match=r"beams=9223372036854775808 is not allowed: at most 1,048,576"):
        validate(compose_cfg("system=lbs", f"beams={2**63}"))
    validate(compose_cfg("system=lbs", f"beams={2**20}"))
