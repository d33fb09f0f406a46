"""Every option of every config group composes, resolves and passes its schema (Hydra compose API)."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
GROUPS = ["hardware", "model", "verifier", "workload", "system", "backend", "tracking", "experiment"]


def _options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


CASES = [(g, o) for g in GROUPS for o in _options(g)]


@pytest.mark.parametrize("group,option", CASES, ids=[f"{g}={o}" for g, o in CASES])
def test_option_composes_and_resolves(group, option):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=[f"{group}={option}"] + (["tracking=none"] if group != "tracking" else []))
    container = OmegaConf.to_container(cfg, resolve=True)  # schema types checked on resolution
    if group != "experiment":
        assert container[group]["name"] == option


def _numeric_fields(node, prefix=""):
    """Dotted keys of every number in a composed hardware profile (schema defaults included; a
    size with a unit such as kv_budget '7GiB' counts), except the provenance blocks ``measured``
    and ``datasheet`` (harness.calibrate: a dated measurement / the replaced datasheet value)."""
    from harness.units import parse_size

    out = []
    for k, v in node.items():
        key = f"{prefix}{k}"
        if k in ("sources", "measured", "datasheet") and not prefix:
            continue
        if isinstance(v, dict):
            out += _numeric_fields(v, f"{key}.")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(key)
        elif isinstance(v, str) and k.startswith("kv_"):
            try:
                parse_size(v)
                out.append(key)
            except ValueError:
                pass
    return out


@pytest.mark.parametrize("option", _options("hardware"))
def test_every_hardware_number_has_a_source_or_is_marked_an_assumption(option):
    """Every number a profile holds, its schema defaults included, is covered by ``sources`` (the key
    or a pattern such as ``power.act_*``) with a non-empty text, and every source names a field.
    Mutations caught: deleting a source line (h100 flops_efficiency); a misspelt source key
    (rtx4090 ``flops_eficiency``: it names no field)."""
    import fnmatch

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        hw = OmegaConf.to_container(
            compose("config", overrides=[f"hardware={option}", "tracking=none"]).hardware, resolve=True
        )
    sources = hw["sources"]
    fields = _numeric_fields(hw)
    missing = [f for f in fields if not any(fnmatch.fnmatchcase(f, pat) for pat in sources)]
    assert not missing, f"hardware/{option}.yaml: no source for {missing}"
    assert all(isinstance(t, str) and t.strip() for t in sources.values())
    unused = [pat for pat in sources if not any(fnmatch.fnmatchcase(f, pat) for f in fields)]
    assert not unused, f"hardware/{option}.yaml: sources name no numeric field: {unused}"


def test_unknown_option_lists_the_choices():
    from hydra.errors import MissingConfigException

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        with pytest.raises(MissingConfigException, match=r"(?s)Could not find 'model/gpt-5'.*opt-6\.7b"):
            compose("config", overrides=["model=gpt-5"])


def test_schema_rejects_wrong_type():
    from hydra.errors import ConfigCompositionException

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        with pytest.raises(ConfigCompositionException):
            compose("config", overrides=["workload.beam_width=two"])


def test_main_command_end_to_end(tmp_path):
    """The README's main command through Hydra, in a subprocess, as a user runs it."""
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "system=lbs",
            "model=opt-6.7b",
            "beams=64",
            "tracking=none",
            "progress=false",
            f"results_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert "SIMULATED" in first and "rtx4090" in first
    assert "end-to-end latency" in out.stdout
    assert len(list(tmp_path.glob("runs/*/run.json"))) == 1


def test_a_real_engine_command_ends_without_leak_warnings(tmp_path):
    """The README's real-engine command (shorter): exit 0 and none of triton's nanobind "leaked"
    warnings, which run.py's final gc.freeze() caused after torch was imported. Mutation caught:
    gc.freeze() whatever was imported."""
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "system=layerwise",
            "backend=torch",
            "model=tiny-opt",
            "beams=4",
            "step=16",
            "gen_len=32",
            "kv_budget=2MiB",
            "tracking=none",
            "progress=false",
            f"results_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "nanobind" not in out.stderr, out.stderr[-2000:]


def test_multirun_sweep_leaves_a_record_per_job(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "system=in_gpu,lbs",
            "beams=4,64",
            "gen_len=256",
            "tracking=none",
            "progress=false",
            f"results_dir={tmp_path}",
            "sweep_name=t",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    recs = sorted(tmp_path.glob("sweeps/t/*/run.json"))
    assert len(recs) == 4
    assert (tmp_path / "sweeps/t/runs.parquet").exists()


def test_bad_input_exits_with_message(tmp_path):
    out = subprocess.run(
        [sys.executable, "run.py", "beams=15", "tracking=none", f"results_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "beams=15 is not allowed: a positive multiple of beam_width=2" in out.stderr
    assert not list(tmp_path.rglob("run.json"))


@pytest.mark.parametrize(
    "launcher,target",
    [
        ("local", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"),
        ("slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
        ("ray", "hydra_plugins.harness_ray_launcher.RayLauncher"),
    ],
)
def test_launcher_configs_compose(launcher, target):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose(
            "config", overrides=[f"hydra/launcher={launcher}", "experiment=lbs_fig9"], return_hydra_config=True
        )
    assert cfg.hydra.launcher._target_ == target
    if launcher == "slurm":
        assert cfg.hydra.launcher.gpus_per_node == 1
        import importlib

        mod, cls = target.rsplit(".", 1)
        assert hasattr(importlib.import_module(mod), cls)
    if launcher == "local":
        assert cfg.hydra.launcher.pre_dispatch == "all"


@pytest.mark.parametrize(
    "first,second",
    [
        (
            ["model=opt-6.7b", "beams=4", "step=32", "system=lbs"],
            ["model=opt-6.7b", "beams=64", "step=128", "system=lbs"],
        ),
        (
            ["system=beam", "model=llama-3.3-70b", "hardware=a100-80gb", "tp=2", "pp=4", "workload=servegen"],
            ["system=beam", "model=llama-3.3-70b", "hardware=a100-80gb", "tp=4", "pp=2", "workload=servegen"],
        ),
        (
            ["model=qwen-7b", "workload.beam_width=4", "gen_len=256"],
            ["model=qwen-7b", "workload.beam_width=2", "gen_len=512"],
        ),
    ],
)
def test_memoised_sweep_composition_equals_hydras(first, second):
    """harness.compose.MemoConfigLoader: a job served from the composition cache (same config groups,
    other values) gets exactly the config Hydra composes for it, hydra node included."""
    from hydra.core.global_hydra import GlobalHydra

    from harness.compose import MemoConfigLoader

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        hydra_loader = GlobalHydra.instance().config_loader()
        master = compose("config", overrides=["tracking=none"], return_hydra_config=True)
        memo = MemoConfigLoader.wrap(hydra_loader)
        hits = MemoConfigLoader.hits
        memo.load_sweep_config(master, ["tracking=none"] + first)  # composes and caches
        got = memo.load_sweep_config(master, ["tracking=none"] + second)  # from the cache
        assert MemoConfigLoader.hits == hits + 1
        want = hydra_loader.load_sweep_config(master, ["tracking=none"] + second)
    assert OmegaConf.to_container(got, resolve=False) == OmegaConf.to_container(want, resolve=False)
    assert OmegaConf.to_container(got.hydra.overrides.task) == ["tracking=none"] + second
    assert got.hydra.job.override_dirname == want.hydra.job.override_dirname


def test_memoised_composition_falls_back_for_additions():
    """'+key=value' cannot be re-applied to a cached config: such jobs go through Hydra every time."""
    from hydra.core.global_hydra import GlobalHydra

    from harness.compose import MemoConfigLoader

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        master = compose("config", overrides=["tracking=none"], return_hydra_config=True)
        memo = MemoConfigLoader.wrap(GlobalHydra.instance().config_loader())
        hits = MemoConfigLoader.hits
        for seed in (1, 2):
            cfg = memo.load_sweep_config(master, ["tracking=none", f"+extra_tag={seed}"])
            assert cfg.extra_tag == seed
        assert MemoConfigLoader.hits == hits


@pytest.mark.parametrize(
    "args,message",
    [
        (["system=lbss"], "system='lbss' is not allowed: one of beam, "),
        (["-m", "model=opt-6.7b,opt-67b"], "model='opt-67b' is not allowed: one of llama-2-7b, "),
        (["beams=abc"], "beams='abc' is not allowed: an integer (sets workload.beams)"),
        (["-m", "system=lbs", "beams=7,16"], "beams=7 is not allowed: a positive multiple of beam_width=2"),
        (
            ["-m", "system=lbs,layerwise", "beams=4", "tracking.sweep_jobs=bogus"],
            "tracking.sweep_jobs='bogus' is not allowed: one of auto, runs, table",
        ),
        (["sytem=lbs"], "'sytem' is not a config key; did you mean 'system'?"),
        (["system=beam", "system.dvfs.actuat=true"], "system.dvfs has no field 'actuat'; did you mean 'actuate'?"),
        (["-m", "workload.num_problem=3,4"], "workload has no field 'num_problem'; did you mean 'num_problems'?"),
        (["hardware.h2d_bw=-5"], "hardware.h2d_bw=-5.0 is not allowed: a bandwidth in bytes/s > 0"),
        (["-m", "system=vanilla", "workload=poisson", "seed=-1,0"], "seed=-1 is not allowed: an integer >= 0"),
        (["-m", "system=vanilla", "workload=poisson", "rate=1,inf"], "workload.rate=inf is not allowed"),
        (["system.prefetch=maybe"], "system.prefetch='maybe' is not allowed: true or false"),
        # a list for a number (issue 39: Hydra's "Error merging override", exit 1); mutation caught:
        # list literals skipped by the preflight as sweep syntax
        (["hardware.memory_bytes=[1,2]"], "hardware.memory_bytes='[1,2]' is not allowed: an integer"),
        # a list of a group's options (issue 39: Hydra composed them into one run, exit 0, running the last);
        # mutation caught: check_group_options skipping list values as before
        (["system=[lbs,layerwise]"], "system='[lbs,layerwise]' is not allowed: one option of conf/system/"),
        # issue 39: repeats=100000 was accepted (14 h, every repeat's tables in memory); mutation caught: no bound
        (["repeats=1001"], "repeats=1001 is not allowed: an integer in 1..1000"),
        # a field of another option of the group (was Hydra's "Could not override", exit 1; QA)
        (
            ["system=lbs", "system.window_s=3"],
            "'system.window_s' is not a field of system=lbs; it is a field of "
            "system=beam, beam_dvfs_only, beam_s1, beam_s2, vanilla, window_dvfs",
        ),
        (["-m", "system=beam,lbs", "system.window_s=3"], "'system.window_s' is not a field of system=lbs;"),
        # a key inside an open mapping the option does not hold, without '+' (was Hydra's "Could not
        # override ... not in struct", exit 1); mutation caught: check_mapping_key not called
        (
            ["hardware.mem_bw_by_rows.4=1e10"],
            "'hardware.mem_bw_by_rows.4': hardware=rtx4090 has no hardware.mem_bw_by_rows.4 to override "
            "(hardware.mem_bw_by_rows holds nothing); add it with +hardware.mem_bw_by_rows.4=1e10",
        ),
        (["hardware.power.nope=5"], "(hardware.power holds act_a_w, act_alpha, act_b_w, blocking_w, limit_w,"),
        (["+hardware.mem_bw_by_rows.4=-5"], "hardware.mem_bw_by_rows.4=-5.0 is not allowed: a bandwidth in bytes/s"),
    ],
)
def test_bad_input_stops_single_runs_and_sweeps_before_work(tmp_path, args, message):
    """A typo in an option, a value of the wrong type or a bad value of a swept parameter: exit 2
    with our message, before any job runs (sweeps check every swept value up front)."""
    out = subprocess.run(
        [sys.executable, "run.py", *args, "tracking=none", f"results_dir={tmp_path}", "sweep_name=t"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-1500:]
    assert message in out.stderr
    assert "_schema" not in out.stderr
    assert not list(tmp_path.rglob("run.json"))


def test_covering_jobs_contain_every_swept_value():
    import itertools

    from hydra_plugins.harness_sweeper import covering_jobs

    params = [
        ["model=a", "model=b", "model=c"],
        ["beams=4", "beams=8", "beams=16", "beams=32", "beams=64"],
        ["step=32", "step=64"],
    ]
    batch = [list(job) for job in itertools.product(*params)]
    jobs = covering_jobs(batch)
    assert len(jobs) == 5 and all(job in batch for job in jobs)
    assert {o for job in jobs for o in job} == {o for p in params for o in p}


def test_help_shows_groups_examples_and_no_schemas():
    out = subprocess.run([sys.executable, "run.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "config groups" in out.stdout and "  system     beam, beam_dvfs_only" in out.stdout
    assert out.stdout.count("python run.py ") >= 5 and "_schema" not in out.stdout


def test_nested_known_keys_pass_the_preflight():
    """Keys that exist only in some options or schemas of a group are accepted; open mappings too."""
    from harness.cli import preflight

    preflight(
        [
            "system=beam",
            "system.dvfs.actuate=false",
            "workload.num_problems=3",
            "hardware.power.act_a_w=1",
            "+new.key=1",
            "hydra.launcher.n_jobs=2",
            "beams=4",
        ],
        CONF,
    )
    preflight(
        [
            "-m",
            "system=lbs,layerwise",
            "system.prefetch=false",
            "system.deadline=1e10",  # both have them
            "hardware=rtx4090,a100-80gb",
            "hardware.power.act_a_w=1",
            "hardware.sources.x=y",
        ],
        CONF,
    )


EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
OPTION_GROUPS = [g for g in GROUPS if g != "experiment"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_an_experiments_base_config_has_its_jobs_groups(name):
    """Hydra composes an experiment's base config (before its sweep) with the command line's
    overrides, so ``experiment=beam_fig8 workload.duration_s=60`` failed with "Key 'duration_s' not in
    'TTCBeamWorkload' ... use +" (QA): the base had the default LBS workload, the jobs the burst one.
    Every group an experiment sweeps is chosen in its defaults list as one of the swept values.
    (Mutation caught: the override /workload line dropped from beam_fig8.)"""
    y = yaml.safe_load((CONF / "experiment" / f"{name}.yaml").read_text())
    params = ((y.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
    choices = cfg.hydra.runtime.choices
    for group in OPTION_GROUPS:
        if group in params:
            swept = [v.strip() for v in str(params[group]).split(",")]
            assert choices[group] in swept, (name, group, choices[group], swept)
