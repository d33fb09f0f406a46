"""Records respect the umask (group-readable on a shared cluster) and tests never write into the
user's results/ or W&B folders.

Mutations caught: dropping the fchmod (mkstemp's 0600 stays); results_dir not read from
$TTC_RESULTS_DIR."""
import os
import stat

import pytest

from harness import records


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_record_files_follow_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        records.atomic_write_json(tmp_path / "run.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "run.json").stat().st_mode) == mode


def test_tests_write_to_temporary_folders(compose_cfg):
    cfg = compose_cfg()
    assert cfg.results_dir == os.environ["TTC_RESULTS_DIR"] and "ttc-tests-" in cfg.results_dir
    assert "ttc-tests-" in os.environ["WANDB_DIR"]
