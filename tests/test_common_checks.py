"""The checks every family shares (harness.config.validate_common, harness.cli.preflight): a hardware
profile's and a model's numbers, kv_budget against the device, seed, the on/off settings and
tracking's, each a ConfigError (exit 2) naming the field and what is allowed, before any work."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.config import HARDWARE_NUMBERS, check_hardware, check_model, check_numbers
from harness.errors import ConfigError
from harness.run import validate_config

CONF = Path(__file__).resolve().parent.parent / "conf"
FAMILIES = {  # a small job of each family
    "lbs": ("system=lbs",),
    "fasttts": ("system=fasttts", "model=tiny-qwen2", "verifier=tiny-prm", "workload=aime24", "n=8"),
    "beam": ("system=vanilla", "workload=poisson", "hardware=rtx4090"),
}


@pytest.mark.parametrize(
    "override,message",
    [
        ("hardware.h2d_bw=-5", "hardware.h2d_bw=-5.0 is not allowed: a bandwidth in bytes/s > 0"),
        ("hardware.h2d_bw=0", "hardware.h2d_bw=0.0 is not allowed: a bandwidth in bytes/s > 0"),
        ("hardware.peak_flops=0", "hardware.peak_flops=0.0 is not allowed: a compute rate in FLOP/s > 0"),
        ("hardware.mem_bw=inf", "hardware.mem_bw=inf is not allowed: a bandwidth in bytes/s > 0 and finite"),
        ("hardware.memory_bytes=-1", "hardware.memory_bytes=-1 is not allowed: a device memory size in bytes > 0"),
        (
            "hardware.flops_efficiency=1.5",
            "hardware.flops_efficiency=1.5 is not allowed: a fraction of peak_flops in (0, 1]",
        ),
        (
            "hardware.kv_reserve_bytes=-1",
            "hardware.kv_reserve_bytes=-1 is not allowed: a size in bytes >= 0 (null = 10 % of memory_bytes)",
        ),
        ("model.num_layers=0", "model.num_layers=0 is not allowed: a count > 0"),
        (
            "kv_budget=1e30",
            "kv_budget=1e+30 is not allowed: a KV cache size per device of at most the device's "
            "memory, hardware.memory_bytes=25757220864 B (23.99 GiB on rtx4090)",
        ),
        ("progress=maybe", "progress='maybe' is not allowed: true or false"),
        ("resume=maybe", "resume='maybe' is not allowed: true or false"),
        ("isolate=sometimes", "isolate='sometimes' is not allowed: auto, true or false"),
        ("tracking.mode=bogus", "tracking.mode='bogus' is not allowed: one of offline, online, disabled"),
    ],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_an_impossible_shared_value_is_refused_in_every_family(compose_cfg, family, override, message):
    """Mutations caught: validate_common without check_numbers for hardware / model (h2d_bw=-5, num_layers=0
    ran with status ok; 0 divided by zero mid-run), "> 0" as ">= 0", no isfinite, without check_kv_budget
    (1e30 overflowed mid-run), without the true/false, isolate or tracking.mode checks (accepted, rc 0)."""
    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg(*FAMILIES[family], override))
    assert str(e.value) == message


@pytest.mark.parametrize("family", FAMILIES)
def test_a_negative_seed_is_refused_in_every_family(compose_cfg, family):
    """seed=-1 was an error record (LBS), a run (FastTTS) or a crash (BEAM). Mutation caught: no ``seed < 0``."""
    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg(*FAMILIES[family], "seed=-1", "repeats=2"))
    assert str(e.value) == "seed=-1 is not allowed: an integer >= 0 (repeats use seeds seed..seed+repeats-1)"


def test_a_kv_budget_above_the_device_memory_is_refused_even_for_the_in_gpu_baseline(compose_cfg):
    """system=in_gpu beams=64 kv_budget=1TiB on the 24 GB RTX 4090 reported status ok with 64 GiB of
    device KV; the device's whole memory itself is allowed (whether the weights fit too is the run's)."""
    with pytest.raises(
        ConfigError,
        match=r"^kv_budget='1TiB' is not allowed: a KV cache size per device of at "
        r"most the device's memory, hardware.memory_bytes=25757220864 B",
    ):
        validate_config(compose_cfg("system=in_gpu", "beams=64", "kv_budget=1TiB"))
    validate_config(compose_cfg("system=in_gpu", "beams=64", "kv_budget=25757220864"))


def test_an_infinite_request_rate_is_refused(compose_cfg):
    """rate=inf reached numpy ("lam value too large", a traceback). Mutation caught: the serving
    runner's rate check as ``float(rate) > 0`` (inf passes)."""
    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg(*FAMILIES["beam"], "rate=inf"))
    assert str(e.value) == "workload.rate=inf is not allowed: a request rate in req/s > 0 and finite"


@pytest.mark.parametrize("group", ["hardware", "model", "verifier"])
def test_every_profile_and_model_in_conf_passes_the_number_checks(compose_cfg, group):
    """The ranges allow what the shipped options use: 0 where it means none (cpu.yaml's tdp_w, clocks,
    interconnect_bw), null kv_reserve_bytes / num_params, a clock range without a minimum (rtx3070ti),
    profiles without a power model. Mutation caught: interconnect_bw as "> 0"."""
    check = check_hardware if group == "hardware" else lambda node: check_model(group, node)
    for p in sorted((CONF / group).glob("*.yaml")):
        if p.stem == "none":
            continue
        check(compose_cfg(f"{group}={p.stem}")[group])
    check_numbers("hardware", OmegaConf.create({"kv_reserve_bytes": None, "launch_overhead_s": 0}), HARDWARE_NUMBERS)


@pytest.mark.parametrize(
    "override,message",
    [
        ("hardware.power.act_a_w=-500", "hardware.power.act_a_w=-500 is not allowed: a power in watts >= 0"),
        (
            "hardware.power.blocking_w=nan",
            "hardware.power.blocking_w=nan is not allowed: a power in watts >= 0 and finite",
        ),
        ("hardware.power.limit_w=-1", "hardware.power.limit_w=-1 is not allowed: a power in watts > 0"),
        (
            "hardware.power.mem_beta=5",
            "hardware.power.mem_beta=5 is not allowed: a fraction of the active power in [0, 1]",
        ),
        (
            "hardware.clock_default_mhz=9999",
            "hardware.clock_default_mhz=9999 is not allowed: a clock at most "
            "hardware.clock_max_mhz=3105 MHz (clock_min_mhz <= clock_default_mhz <= clock_max_mhz)",
        ),
        (
            "hardware.clock_min_mhz=4000",
            "hardware.clock_min_mhz=4000 is not allowed: a clock at most "
            "hardware.clock_default_mhz=2520 MHz (clock_min_mhz <= clock_default_mhz <= clock_max_mhz)",
        ),
        ("hardware.idle_w=1000", "hardware.idle_w=1000.0 is not allowed: a power at most hardware.tdp_w=450.0 W"),
        (
            "model.num_kv_heads=5",
            "model.num_kv_heads=5 is not allowed: a divisor of model.num_heads=32 (grouped-query attention)",
        ),
        (
            "model.num_kv_heads=64",
            "model.num_kv_heads=64 is not allowed: a divisor of model.num_heads=32 (grouped-query attention)",
        ),
    ],
)
def test_a_profiles_power_model_clock_order_and_a_models_heads_are_checked(compose_cfg, override, message):
    """A negative or NaN power-model term gave negative or NaN energy recorded as ok; a default clock
    above the maximum, an idle power above the TDP and KV heads that do not divide the heads ran too
    (QA). Mutations caught: the power block not checked; the clock order not checked; the idle/TDP
    check dropped; the heads check dropped."""
    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg("system=lbs", "beams=4", override))
    assert str(e.value) == message


def test_a_value_of_the_wrong_type_for_a_group_field_stops_the_preflight():
    """system.prefetch=maybe was Hydra's "Error merging override" (exit 1). Mutation caught: preflight
    without check_value_type."""
    from harness.cli import preflight

    for args, message in [
        (["system.prefetch=maybe"], "system.prefetch='maybe' is not allowed: true or false"),
        (["-m", "system.prefetch=true,maybe"], "system.prefetch='maybe' is not allowed: true or false"),
        (["hardware.memory_bytes=2.5e10"], "hardware.memory_bytes='2.5e10' is not allowed: an integer"),
        (["hardware.h2d_bw=fast"], "hardware.h2d_bw='fast' is not allowed: a number"),
    ]:
        with pytest.raises(ConfigError) as e:
            preflight(args, CONF)
        assert str(e.value) == message
    preflight(
        [
            "-m",
            "system.prefetch=false",
            "system.prefetch=true,false",
            "hardware.kv_reserve_bytes=null",
            "hardware.h2d_bw=1e10",
            "system.kv_budget=7GiB",
            "workload.num_problems=null",
        ],
        CONF,
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        (("system=vanilla", "rate=inf"), "rate=inf is not allowed: a request rate in req/s > 0 and finite"),
        (("system=lbs", "rate=-1"), "rate=-1 is not allowed: a request rate in req/s > 0"),
        (("system=lbs", "n=-5"), "n=-5 is not allowed: a path count: an integer > 0"),
    ],
)
def test_a_shortcut_nothing_reads_is_still_checked(compose_cfg, overrides, message):
    """``rate`` with the ServeGen trace (which replays its own arrivals) or with LBS, ``n`` with LBS:
    no setting reads them, so no family checked them and rate=inf ran with rc 0 (QA). Mutation
    caught: validate without check_shortcuts."""
    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg(*overrides))
    assert str(e.value) == message


def test_a_single_run_warns_of_a_shortcut_nothing_reads(compose_cfg, capsys):
    """``rate=2`` on LBS runs (a sweep may set a shortcut for jobs of several workloads, so it is no
    error) and the run says the value has no effect; a shortcut that is read gets no warning.
    Mutation caught: unused_shortcuts returning none."""
    from harness.config import unused_shortcuts
    from harness.run import run

    rec = run(compose_cfg("system=lbs", "beams=4", "rate=2"), multirun=False)
    assert rec["status"] == "ok"
    assert (
        "warning: rate=2 has no effect: no setting of this run reads it (system=lbs, workload=ttc_beam)"
        in capsys.readouterr().err
    )
    assert unused_shortcuts(compose_cfg("system=lbs", "beams=4")) == []
    assert unused_shortcuts(compose_cfg("system=vanilla", "workload=poisson", "rate=2")) == []


def test_a_shortcut_beside_its_own_group_field_names_the_field_that_wins(compose_cfg, capsys, tmp_path):
    """``system.kv_budget=8GiB kv_budget=9GiB`` said the shortcut was read by no setting of the run (QA);
    it names the field now. Mutation caught: the overrides not passed (the old message)."""
    from harness.run import run

    over = ["system=lbs", "beams=4", "system.kv_budget=8GiB", "kv_budget=9GiB"]
    rec = run(compose_cfg(*over, output_dir=tmp_path / "r"), multirun=False, overrides=over)
    assert rec["status"] == "ok" and rec["summary"]["kv_budget_bytes"] == 8 << 30
    assert (
        "warning: kv_budget=9GiB has no effect: system.kv_budget=8GiB is set too and wins (drop one of the two)"
        in capsys.readouterr().err
    )


def test_system_parallel_beside_tp_pp_names_the_setting_that_wins(compose_cfg, capsys, tmp_path):
    """``system.parallel=2x4 tp=4 pp=1`` ran at 2x4 without a word (QA); each losing value is warned of,
    a value equal to the one used is not, nor is tp without system.parallel. (Mutations caught: the
    family hook not called by harness.run; values compared without the one used.)"""
    from harness.run import run
    from systems.energy_serving.runner import ignored_settings

    over = ["system=beam", "workload=poisson", "workload.duration_s=5", "system.parallel=2x4", "tp=4", "pp=4"]
    rec = run(compose_cfg(*over, output_dir=tmp_path / "r"), multirun=False, overrides=over)
    assert (rec["summary"]["tp"], rec["summary"]["pp"]) == (2, 4)
    err = capsys.readouterr().err
    assert (
        "warning: tp=4 has no effect: system.parallel=2x4 is set too and wins (tp=2, pp=4; drop one of the two)" in err
        and "pp=4 has no effect" not in err
    )
    assert ignored_settings(
        compose_cfg("system=beam", "system.tp=1", "system.parallel=2x2"), ["system.tp=1", "system.parallel=2x2"]
    ) == ["system.tp=1 has no effect: system.parallel=2x2 is set too and wins (tp=2, pp=2; drop one of the two)"]
    assert ignored_settings(compose_cfg("system=beam", "tp=1"), ["tp=1"]) == []


def test_a_verifier_on_a_family_without_one_is_warned_of(compose_cfg, capsys, tmp_path):
    """``system=lbs verifier=skywork-prm-1.5b`` ran without a word (QA): a single run says the verifier
    has no effect; FastTTS reads it, so no warning there. (Mutations caught: the check dropped; the
    FastTTS runner without USES_VERIFIER.)"""
    from harness.run import run

    run(compose_cfg("system=lbs", "beams=4", "verifier=skywork-prm-1.5b", output_dir=tmp_path / "lbs"), multirun=False)
    assert (
        "warning: verifier=skywork-prm-1.5b has no effect: system=lbs runs no verifier model" in capsys.readouterr().err
    )
    run(
        compose_cfg(
            "system=fasttts",
            "workload=aime24",
            "workload.num_problems=1",
            "n=4",
            "verifier=skywork-prm-1.5b",
            "model=qwen2.5-math-1.5b",
            output_dir=tmp_path / "tts",
        ),
        multirun=False,
    )
    assert "verifier=" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,modes",
    [
        (["-m", "experiment=beam_fig10", "--cfg", "job"], "--multirun and --cfg"),
        (["--multirun", "-c", "job"], "--multirun and --cfg"),
        (["--info", "--cfg=job"], "--info and --cfg"),
    ],
)
def test_two_hydra_modes_are_one_clear_error(args, modes):
    """``run.py -m experiment=... --cfg job`` was Hydra's ValueError traceback (QA). Mutation caught:
    preflight without check_mode_flags; one flag alone still passes."""
    from harness.cli import preflight

    with pytest.raises(ConfigError) as e:
        preflight(args, CONF)
    assert str(e.value).startswith(f"{modes} cannot be combined")
    preflight(["experiment=beam_fig10", "--cfg", "job"], CONF)
    preflight(["-m", "experiment=beam_fig10"], CONF)


@pytest.mark.parametrize("system", ["beam", "fasttts"])
@pytest.mark.parametrize(
    "value,message",
    [("lots", "system.cpu_kv_budget='lots' is not a size"), ("-3", "system.cpu_kv_budget=-3 must be >= 0 bytes")],
)
def test_a_bad_cpu_kv_budget_is_refused_where_it_is_not_used(compose_cfg, system, value, message):
    """system.cpu_kv_budget=lots ran with rc 0 on the simulator (parsed only by a real CPU engine).
    Mutation caught: check_kv_budget without the cpu_kv_budget check."""
    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg(f"system={system}", f"system.cpu_kv_budget={value}"))
    assert str(e.value).startswith(message)
    validate_config(compose_cfg(f"system={system}", "system.cpu_kv_budget=1GiB"))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ("system=layerwise", "backend=torch", "model=opt-6.7b"),
            "model='opt-6.7b' with random weights (12.4 GiB) is not allowed for torch on CPU",
        ),
        (
            ("system=fasttts", "backend=vllm", "model=qwen2.5-math-7b", "verifier=tiny-prm", "workload=aime24", "n=8"),
            "model='qwen2.5-math-7b' with random weights (14.2 GiB) is not allowed for vLLM on CPU",
        ),
        (
            (
                "system=fasttts",
                "backend=vllm",
                "model=tiny-qwen2",
                "verifier=skywork-prm-1.5b",
                "workload=aime24",
                "n=8",
            ),
            "verifier='skywork-prm-1.5b' with random weights (2.9 GiB) is not allowed for vLLM on CPU",
        ),
        (
            ("system=beam", "backend=vllm", "model=llama-3.1-8b", "workload=poisson"),
            "model='llama-3.1-8b' with random weights (15.0 GiB) is not allowed for vLLM on CPU",
        ),
    ],
)
def test_a_paper_size_random_model_on_a_real_cpu_engine_is_refused_in_every_family(compose_cfg, overrides, message):
    """One rule (harness.model_facts.check_cpu_model) for the three real engines on a CPU: LBS on torch
    and FastTTS on vLLM loaded random 7B weights for minutes, then searched for hours (QA); BEAM's
    vLLM refused them already. Mutations caught: the call dropped from the LBS / FastTTS
    validate_backend (each), the verifier not checked, ``>`` as ``<``."""
    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg(*overrides))
    assert str(e.value).startswith(message + ": use a tiny-* model (<= 2 GiB of weights), backend=sim, a CUDA GPU")


def test_a_local_checkpoint_or_a_tiny_model_passes_the_cpu_engine_rule(tmp_path):
    from harness.model_facts import check_cpu_model

    big = OmegaConf.load(CONF / "model" / "opt-6.7b.yaml")
    big.name = "opt-6.7b"
    check_cpu_model(OmegaConf.merge(big, {"weights": str(tmp_path)}), "torch")  # the user's own checkpoint
    tiny = OmegaConf.load(CONF / "model" / "tiny-opt.yaml")
    check_cpu_model(tiny, "torch")


@pytest.mark.parametrize(
    "value,why",
    [
        ("foo.bar", "ModuleNotFoundError: No module named 'foo'"),
        ("systems.kv_offload.report.nothere", "systems.kv_offload.report has no function 'nothere'"),
        ("fig9", "not a dotted module.function"),
    ],
)
def test_a_report_that_names_no_function_stops_a_sweep_before_its_jobs(value, why, capsys):
    """``-m report=foo.bar`` ran every job, then failed at the sweep's end (QA). Mutation caught:
    preflight without check_report; a function that exists refused."""
    from harness.cli import preflight

    with pytest.raises(ConfigError) as e:
        preflight(["-m", f"report={value}", "beams=4,8"], CONF)
    assert str(e.value) == (
        f"report={value!r} is not allowed: a module.function called at a sweep's end with "
        f"(sweep_dir, runs, cfg), e.g. systems.kv_offload.report.fig9, or null ({why})"
    )
    preflight(["-m", "report=systems.kv_offload.report.fig9", "beams=4,8"], CONF)
    assert capsys.readouterr().err == ""


def test_a_report_on_a_single_run_warns_and_stays_out_of_job_folder_names(capsys):
    """A single run ignored ``report=`` silently, and in a sweep the value landed in every job's folder
    name (QA). Mutations caught: no warning; ``report`` not in hydra.job.config.override_dirname.exclude_keys;
    the warning for an experiment (a sweep by its hydra.mode; QA), or for one inheriting that mode."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.cli import preflight

    preflight(["report=systems.kv_offload.report.fig9"], CONF)
    assert (
        "warning: report=systems.kv_offload.report.fig9 has no effect: a report runs at a sweep's end"
        in capsys.readouterr().err
    )
    for exp in ("lbs_fig4", "beam_fidelity_sim"):  # experiments are sweeps without -m (hydra.mode, or inherited)
        preflight([f"experiment={exp}", "report=systems.kv_offload.report.fig5"], CONF)
        err = capsys.readouterr().err
        assert "has no effect" not in err and f"note: experiment={exp} is a sweep" in err
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        master = compose("config", overrides=["tracking=none"], return_hydra_config=True)
        job = (
            GlobalHydra.instance()
            .config_loader()
            .load_sweep_config(master, ["tracking=none", "report=systems.kv_offload.report.fig9", "beams=4"])
        )
    assert job.hydra.job.override_dirname == "beams=4"


def test_a_hydra_group_option_that_does_not_exist_is_one_clear_error():
    """``hydra/launcher=foo`` was Hydra's MissingConfigException, exit 1 (QA). Mutation caught: preflight
    without check_hydra_groups; an existing option (ours, Hydra's, a plugin's) refused; an empty value or an
    unknown hydra/ group passed (Hydra's error, exit 1)."""
    from harness.cli import preflight

    with pytest.raises(ConfigError) as e:
        preflight(["-m", "hydra/launcher=foo", "beams=4,8"], CONF)
    assert str(e.value).startswith("hydra/launcher='foo' is not allowed: one of basic, joblib, local, ray, slurm")
    for bad_arg, message in (
        ("hydra/launcher=", "hydra/launcher='' is not allowed: one of basic, joblib,"),
        ("hydra/foo=bar", "hydra/foo is not a Hydra config group: use one such as hydra/launcher"),
        ("system=", "system='' is not allowed: one of beam, "),
    ):
        with pytest.raises(ConfigError) as e:  # empty values and unknown groups were exit 1 too
            preflight([bad_arg, "beams=4"], CONF)
        assert str(e.value).startswith(message)
    for ok in ("hydra/launcher=local", "hydra/launcher=basic", "hydra/launcher=joblib", "hydra/job_logging=disabled"):
        preflight(["-m", ok, "beams=4,8"], CONF)


@pytest.mark.parametrize(
    "overrides",
    [
        ("system=lbs", "backend=torch", "model=tiny-opt"),
        ("system=beam", "backend=vllm", "model=tiny-llama", "workload=poisson"),
    ],
)
def test_a_weights_path_that_is_no_checkpoint_is_refused_where_weights_are_loaded(compose_cfg, overrides, tmp_path):
    """One rule (harness.model_facts.check_weights) for LBS on torch and BEAM on vLLM: LBS made an error
    record after ~10 s (QA), and a folder without weights ended in a ValueError record (issue 39).
    Mutations caught: either call dropped; a file accepted as a checkpoint directory; a folder
    without config.json or without weight files accepted."""
    allowed = "allowed: random or a local checkpoint directory (config.json and weights; nothing is fetched from a hub)"
    (tmp_path / "f").write_text("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    cases = {
        "/nonexistent": f"no such directory; {allowed}",
        str(tmp_path / "f"): f"no such directory; {allowed}",
        str(tmp_path / "empty"): f"the directory has no config.json; {allowed}",
        str(tmp_path / "bad"): "its config.json is not valid JSON",
        str(tmp_path / "noweights"): f"no weights in the directory (none of *.safetensors, *.bin); {allowed}",
    }
    for weights, why in cases.items():
        with pytest.raises(ConfigError) as e:
            validate_config(compose_cfg(*overrides, f"model.weights={weights}"))
        assert str(e.value).startswith(f"model.weights={weights!r} is not allowed: {why}"), str(e.value)


def test_an_experiment_without_dash_m_says_it_runs_its_sweep(capsys):
    """``run.py experiment=lbs_fig9`` ran 225 jobs on every core without a word (QA): preflight notes
    that the experiment is a sweep; not with -m, --cfg or a hydra.mode of the user's own, nor for a
    plain run. (Mutations caught: the note not called by preflight; the -m exemption dropped.)"""
    from harness.cli import preflight
    from tests.conftest import ROOT

    conf = ROOT / "conf"
    preflight(["experiment=lbs_fig9"], conf)
    assert "note: experiment=lbs_fig9 is a sweep (its hydra.mode is MULTIRUN)" in capsys.readouterr().err
    for args in (
        ["-m", "experiment=lbs_fig9"],
        ["experiment=lbs_fig9", "hydra.mode=RUN", "system=lbs"],
        ["experiment=lbs_fig9", "--cfg", "job"],
        ["system=lbs"],
    ):
        preflight(args, conf)
        assert "is a sweep" not in capsys.readouterr().err, args


def test_a_comma_list_in_a_single_run_is_exit_2_with_hydras_advice():
    """``run.py system=in_gpu,layerwise`` was Hydra's "Ambiguous value" with exit 1 (QA): a ConfigError
    (exit 2) up front with the same advice; a sweep, a bracketed list, a quoted string and an
    experiment that sweeps pass. (Mutations caught: the check not called; commas inside brackets
    counted.)"""
    from harness.cli import preflight
    from harness.errors import ConfigError
    from tests.conftest import ROOT

    conf = ROOT / "conf"
    with pytest.raises(
        ConfigError,
        match=r"system=in_gpu,layerwise is a sweep over 2 values, and this is a single "
        r"run: add -m",
    ):
        preflight(["system=in_gpu,layerwise", "beams=4"], conf)
    for ok in (
        ["-m", "system=in_gpu,layerwise"],
        ["+tags=[a,b]"],
        ["+tag='a,b'"],
        ["experiment=lbs_fig12", "system=lbs,layerwise"],
    ):
        preflight(ok, conf)


def test_a_family_without_a_real_engine_is_simulated_never_a_keyerror(compose_cfg, monkeypatch):
    """A family without a real engine (a newcomer's toy family, ``real_engine=None``): backend=auto
    simulates it, even with a CUDA GPU, and a real backend exits 2 saying it has none (was KeyError:
    'toy', exit 1, and an empty run folder). Mutation caught: the real engine looked up by name."""
    import harness.backend as B
    from harness.errors import ConfigError
    from harness.family import Family
    from systems.kv_offload import FAMILY as KV_OFFLOAD

    toy = Family(name="toy", validate=lambda cfg: None, run=lambda cfg, ctx: None, register_configs=lambda cs: None)
    monkeypatch.setattr(B, "cuda_available", lambda: True)
    b = B.resolve_backend(compose_cfg("system=lbs"), toy)
    assert b.simulated and "(family toy has no real engine)" in b.reason
    with pytest.raises(
        ConfigError,
        match=r"backend='torch' is not allowed for system='lbs' \(family toy\): "
        r"use auto, sim \(no real engine\)",
    ):
        B.resolve_backend(compose_cfg("system=lbs", "backend=torch"), toy)
    assert not B.resolve_backend(compose_cfg("system=lbs"), KV_OFFLOAD).simulated  # a listed family: its engine


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "hardware.peak_flops=1e-300",
            "hardware.peak_flops=1e-300 is not allowed: a compute rate in FLOP/s from 1e+08 to 1e+17 "
            "(0.1 GFLOP/s to 100 PFLOP/s (an H200: 0.99 PFLOP/s dense fp16))",
        ),
        (
            "hardware.launch_overhead_s=1e308",
            "hardware.launch_overhead_s=1e+308 is not allowed: a time in seconds from",
        ),
        (
            "hardware.host_memory_bytes=-1",
            "hardware.host_memory_bytes=-1 is not allowed: a host memory size in bytes > 0",
        ),
        (
            "hardware.host_memory_bytes=1",
            "hardware.host_memory_bytes=1 is not allowed: a host memory size in bytes from",
        ),
        (
            "hardware.mem_bw=1e15",
            "hardware.mem_bw=1000000000000000.0 is not allowed: a bandwidth in bytes/s from 1e+08",
        ),
        ("hardware.h2d_bw=5", "hardware.h2d_bw=5.0 is not allowed: a bandwidth in bytes/s from 1e+06 to 1e+13"),
        ("hardware.num_gpus=100000", "hardware.num_gpus=100000 is not allowed: a GPU count from 1 to 1024"),
        ("hardware.tdp_w=1e6", "hardware.tdp_w=1000000.0 is not allowed: a power in watts from 1 to 10000"),
        (
            "hardware.memory_bytes=1125899906842624",
            "hardware.memory_bytes=1125899906842624 is not allowed: a device memory size in bytes from",
        ),
    ],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_physically_implausible_hardware_number_is_refused_in_every_family(compose_cfg, family, override, message):
    """Issue 39: peak_flops=1e-300 and launch_overhead_s=1e308 ran with status ok and an infinite
    latency; host_memory_bytes=-1 was not checked. Each bound's reason is in the message.
    (Mutations caught: the bounds not applied; host_memory_bytes missing from the checks.)"""
    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg(*FAMILIES[family], override))
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize(
    "override",
    ["hardware.peak_flops=1e8", "hardware.peak_flops=1e17", "hardware.launch_overhead_s=0", "hardware.tdp_w=0"],
)
def test_a_bound_itself_and_a_zero_that_means_unset_are_allowed(compose_cfg, override):
    validate_config(compose_cfg(*FAMILIES["lbs"], override))


def test_a_sweep_name_too_long_for_a_folder_exits_before_any_work(compose_cfg):
    """sweep_name of 300 bytes ended in an OSError traceback (File name too long) after the sweeper
    had started (issue 39); now exit 2 with the rule, checked with every job. 100 bytes pass.
    (Mutation caught: the length left unchecked.)"""
    validate_config(compose_cfg(*FAMILIES["lbs"], "sweep_name=" + "a" * 100))
    with pytest.raises(ConfigError, match=r"sweep_name='a{101}' is not allowed: a name of at most 100 bytes"):
        validate_config(compose_cfg(*FAMILIES["lbs"], "sweep_name=" + "a" * 101))


@pytest.mark.parametrize(
    "family,backend",
    [("lbs", "sim"), ("lbs", "torch"), ("fasttts", "sim"), ("fasttts", "vllm"), ("beam", "sim"), ("beam", "vllm")],
)
def test_model_shapes_are_checked_at_validation_for_every_family_and_backend(compose_cfg, family, backend):
    """An odd head_dim simulated as ok (backend=sim) and failed on the torch engine only after it
    started (exit 1, an error record): now every family and backend refuses it in validate_common,
    naming the field (the message is the architecture's: OPT, Qwen2 and LLaMA here). The verifier gets
    the same rule. Mutation caught: validate_common without check_model (or check_model without
    check_model_shapes): these ran, or failed late."""
    with pytest.raises(ConfigError, match=r"^model\.head_dim=33 is not allowed: "):
        validate_config(compose_cfg(*FAMILIES[family], f"backend={backend}", "model.head_dim=33"))
    if family == "fasttts":
        with pytest.raises(ConfigError, match=r"^verifier\.num_kv_heads=3 is not allowed: a divisor of verifier"):
            validate_config(compose_cfg(*FAMILIES[family], f"backend={backend}", "verifier.num_kv_heads=3"))


def test_tp_must_divide_the_attention_heads_of_a_served_model(compose_cfg):
    """Qwen2.5-Math-7B (28 heads, 4 KV heads) at tp=8 passed the KV-heads check (8 is a multiple of 4)
    and simulated as ok; vLLM asserts heads % tp == 0 as it starts. tp=4 (a divisor of both) passes.
    Mutation caught: the serving runner without its ``num_heads % tp`` check."""
    base = ("system=vanilla", "workload=poisson", "hardware=a100-80gb", "model=qwen2.5-math-7b", "pp=1")
    validate_config(compose_cfg(*base, "tp=4"))
    with pytest.raises(ConfigError) as e:
        validate_config(compose_cfg(*base, "tp=8"))
    assert str(e.value) == "tp=8 is not allowed: a divisor of the model's 28 attention heads (each GPU gets heads / tp)"
