import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")
# Data: every test reads the small slices in tests/fixture_data (the data folder's layout; sources and
# licences in its README), whatever TTC_DATA_DIR says. The folder runs would read without the suite
# ($TTC_DATA_DIR, ../shared/data, the fetch cache) serves only tests that need a full data set
# (the `full_data` fixture); they are skipped, with the reason, where it is absent.
from workloads.data import data_dir  # noqa: E402

FIXTURE_DATA = ROOT / "tests" / "fixture_data"
FULL_DATA = data_dir()
os.environ["TTC_DATA_DIR"] = str(FIXTURE_DATA)
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


def replace_run(monkeypatch, family: str, run) -> None:
    """For the test, ``family``'s ``run`` is ``run`` (the harness finds families in systems.families)."""
    import dataclasses

    import systems.families as registry

    monkeypatch.setattr(
        registry,
        "FAMILIES",
        tuple(dataclasses.replace(f, run=run) if f.name == family else f for f in registry.FAMILIES),
    )


@pytest.fixture
def compose_cfg(tmp_path):
    """compose_cfg(*overrides) -> a composed config writing its record under tmp_path."""
    from hydra import compose, initialize_config_dir

    def _compose(*overrides, output_dir=None):
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            return compose(
                "config",
                overrides=[
                    f"output_dir={output_dir or tmp_path / 'run'}",
                    "tracking=none",
                    "progress=false",
                    *overrides,
                ],
            )

    return _compose


def full_data_missing(prefix: str = "") -> list:
    """The pinned data files (workloads/data_manifest.json) under ``prefix`` that FULL_DATA lacks
    (absent, or of another size)."""
    from workloads.fetch import load_manifest

    return [
        e["path"]
        for e in load_manifest()
        if e["path"].startswith(prefix)
        and not ((FULL_DATA / e["path"]).is_file() and (FULL_DATA / e["path"]).stat().st_size == e["bytes"])
    ]


def pytest_collection_modifyitems(items):
    """A test that takes the ``full_data`` fixture is marked ``full_data`` (``pytest -m full_data`` selects them)."""
    for item in items:
        if "full_data" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("full_data"):
            item.add_marker(pytest.mark.full_data)


@pytest.fixture
def full_data(request, monkeypatch):
    """The full data folder, for a test that needs whole data sets: it is skipped, naming what is
    missing, unless every pinned file under the prefixes of its ``@pytest.mark.full_data("math/", ...)``
    marker (default: all) is in FULL_DATA. For the test's duration runs read that folder
    (``TTC_DATA_DIR``)."""
    mark = request.node.get_closest_marker("full_data")
    prefixes = mark.args if mark and mark.args else ("",)
    missing = [p for prefix in prefixes for p in full_data_missing(prefix)]
    if missing:
        files = f"{len(missing)} file{'s' if len(missing) != 1 else ''}"
        pytest.skip(
            f"needs the full data set ({', '.join(prefixes) or 'all'}): {files} missing in "
            f"{FULL_DATA} (e.g. {missing[0]}); `python -m workloads.fetch` or TTC_DATA_DIR provides it"
        )
    monkeypatch.setenv("TTC_DATA_DIR", str(FULL_DATA))
    return FULL_DATA


@pytest.fixture(autouse=True)
def _full_data_where_marked(request):
    """A test marked ``full_data`` (directly or through a parameter) gets the ``full_data`` fixture:
    skipped where the data is absent, run on it where present."""
    if request.node.get_closest_marker("full_data"):
        request.getfixturevalue("full_data")


def marked_full_data(names, needs: dict) -> list:
    """Parameters ``names``, those in ``needs`` (name -> data prefix) marked ``full_data(prefix)``."""
    return [pytest.param(n, marks=pytest.mark.full_data(needs[n])) if n in needs else n for n in names]


@pytest.fixture(params=["fixture", pytest.param("full", marks=pytest.mark.full_data("traces/"))])
def each_trace_data(request):
    """A test run twice: on tests/fixture_data's traces, and on the full data folder's (skipped where absent)."""
    return FIXTURE_DATA if request.param == "fixture" else request.getfixturevalue("full_data")


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
