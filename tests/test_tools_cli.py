"""The project's ``python -m`` tools (calibration, fidelity) check their arguments before any work:
``--help`` printed nothing and started the tool (``systems.energy_serving.fidelity --help``: a 20-minute
vLLM run; ``systems.kv_offload.fidelity --help`` rewrote conf/hardware/cpu-calibrated.yaml, then crashed;
QA). (Mutations caught: the --help branch dropped; a bare word let through; a tool's keys unchecked.)"""

import importlib

import pytest

TOOLS = [
    "harness.calibrate",
    "systems.kv_offload.fidelity",
    "systems.energy_serving.fidelity",
    "systems.energy_serving.calibrate",
    "systems.verifier_search.fidelity",
    "systems.verifier_search.calibrate",
]


@pytest.mark.parametrize("tool", TOOLS)
def test_help_prints_the_tools_docstring_and_does_nothing(tool, capsys):
    mod = importlib.import_module(tool)
    with pytest.raises(SystemExit) as e:
        mod.main(["repeats=1", "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == mod.__doc__.strip()


@pytest.mark.parametrize("tool", TOOLS)
def test_an_argument_that_is_not_key_value_exits_2(tool, capsys):
    with pytest.raises(SystemExit) as e:
        importlib.import_module(tool).main(["bogus"])
    assert e.value.code == 2
    assert "argument 'bogus' is not allowed: key=value arguments only" in capsys.readouterr().err


@pytest.mark.parametrize(
    "tool,arg",
    [
        ("harness.calibrate", "hardwre=cpu"),
        ("systems.verifier_search.fidelity", "problem=3"),
        ("systems.energy_serving.calibrate", "modle=tiny-llama"),
        ("systems.verifier_search.calibrate", "thread=2"),
    ],
)
def test_a_key_the_tool_does_not_read_exits_2(tool, arg, capsys):
    with pytest.raises(SystemExit) as e:
        importlib.import_module(tool).main([arg])
    assert e.value.code == 2
    err = capsys.readouterr().err  # the key named as unknown, the nearest option suggested
    assert f"error: {arg.split('=')[0]!r} is not an option of this tool; did you mean" in err


@pytest.mark.parametrize(
    "tool,arg,message",
    [
        ("systems.verifier_search.fidelity", "repeats=0", "repeats='0' is not allowed: an integer >= 1"),
        ("systems.verifier_search.fidelity", "recalibrate=maybe", "recalibrate='maybe' is not allowed: true or false"),
        ("systems.verifier_search.fidelity", "workload=nosuch", "workload='nosuch' is not allowed: one of ablation, "),
        ("systems.kv_offload.fidelity", "repeats=abc", "repeats='abc' is not allowed: an integer >= 1"),
        ("systems.kv_offload.fidelity", "sytem=lbs", "'sytem' is not a config key; did you mean 'system'?"),
        ("systems.energy_serving.fidelity", "recalibrate=maybe", "recalibrate='maybe' is not allowed: true or false"),
        ("systems.energy_serving.fidelity", "hardware=nosuch", "hardware='nosuch' is not allowed: one of a100-80gb, "),
    ],
)
def test_a_bad_value_exits_2_before_any_calibration(tool, arg, message, capsys, monkeypatch):
    """QA: repeats=0, recalibrate=maybe, workload=nosuch, a misspelt run.py key: each started minutes of
    calibration (or crashed after it). Mutation caught: check_tool_values / check_overrides not called."""
    import subprocess

    mod = importlib.import_module(tool)
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: pytest.fail("the tool started work"))
    if tool == "systems.verifier_search.fidelity":
        import systems.verifier_search.calibrate as cal

        monkeypatch.setattr(cal, "main", lambda *a, **k: pytest.fail("the tool started work"))
    assert mod.main([arg]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


@pytest.mark.parametrize(
    "tool,arg,message",
    [
        ("harness.calibrate", "threads=0", "threads='0' is not allowed: an integer >= 1"),
        ("harness.calibrate", "quick=maybe", "quick='maybe' is not allowed: true or false"),
        ("harness.calibrate", "out=", "out='' is not allowed: a file path (the file to write), not a folder"),
        ("harness.calibrate", "out=/proc/nope/x.yaml", "output directory '/proc/nope' (out) cannot be written"),
        ("systems.energy_serving.calibrate", "rounds=0", "rounds='0' is not allowed: an integer >= 1"),
        ("systems.energy_serving.calibrate", "reps=abc", "reps='abc' is not allowed: an integer >= 1"),
        ("systems.verifier_search.calibrate", "model=nosuch", "model='nosuch' is not allowed: one of "),
        (
            "systems.verifier_search.calibrate",
            "refit=/missing.yaml",
            "refit='/missing.yaml' is not allowed: a calibrated profile file",
        ),
    ],
)
def test_a_calibration_checks_its_values_before_measuring(tool, arg, message, capsys, monkeypatch):
    """QA: threads=0 ran with 2 threads, rounds=0 crashed after 27 s, out=/proc/... lost 7 s of
    measurements, model=nosuch was Hydra's traceback. Mutation caught: check_tool_values not called."""
    mod = importlib.import_module(tool)
    for name in ("measure", "calibrate"):
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, lambda *a, **k: pytest.fail("the tool started measuring"))
    assert mod.main(["hardware=cpu", arg] if tool == "harness.calibrate" else [arg]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")
