import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "disabled")

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
