import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")
# Tests write only to temporary folders: run records (results_dir defaults to $TTC_RESULTS_DIR) and
# everything W&B keeps outside a run (logs, cache, artifact staging, settings).
_TMP = Path(tempfile.mkdtemp(prefix="ttc-tests-"))
os.environ["TTC_RESULTS_DIR"] = str(_TMP / "results")
for _var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
    os.environ[_var] = str(_TMP / "wandb" / _var.lower())
# DVFS lock records (harness.clock_locks) go to a temporary folder, never the user's home
os.environ.setdefault("TTC_CLOCK_LOCK_DIR", tempfile.mkdtemp(prefix="ttc-clock-locks-"))
FAKE_NVML_DIR = ROOT / "tests" / "nvml_fake"

from harness.config import register_configs, register_resolvers  # noqa: E402

register_resolvers()
register_configs()


@pytest.fixture
def compose_cfg(tmp_path):
    """compose_cfg(*overrides) -> a composed config writing its record under tmp_path."""
    from hydra import compose, initialize_config_dir

    def _compose(*overrides, output_dir=None):
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            return compose("config", overrides=[f"output_dir={output_dir or tmp_path / 'run'}",
                                                 "tracking=none", "progress=false", *overrides])
    return _compose


@pytest.fixture
def shared_data():
    d = SHARED / "data"
    if not d.exists():
        pytest.fail(f"shared data not found at {d}")
    return d


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    """fake_nvml(gpus, **kw) -> a private copy of the fake NVML (tests/nvml_fake/pynvml.py) whose
    GPUs' state lives in tmp_path. ``gpus``: in NVML index order, each the arguments of the fake's
    ``gpu(uuid, pci_bus_id, name=..., energy_step_mj=...)``; ``kw``: its ``configure`` options.
    The test also gets its own clock lock-record folder."""
    import importlib.util
    monkeypatch.setenv("TTC_CLOCK_LOCK_DIR", str(tmp_path / "clock-locks"))

    def make(gpus, **kw):
        spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML_DIR / "pynvml.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.configure(tmp_path / "nvml-state.json", [mod.gpu(*g) for g in gpus], **kw)
        return mod
    return make


@pytest.fixture(autouse=True)
def _torch_set_num_threads_restored():
    """vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op for the rest of its process
    (vllm/v1/worker/cpu_worker.py); tests that run vLLM in-process must not take thread control
    away from the tests after them."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch.set_num_threads, "__name__", "") == "skip_set_num_threads":
        torch.set_num_threads = torch._C.set_num_threads
