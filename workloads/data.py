"""Where the data files live (a leaf module: no imports of ours).

Data (math problem sets, serving traces) is never copied into the repository. Lookup order:
``$TTC_DATA_DIR``; else ``<repo>/../shared/data`` when it exists (this team's layout, and what CI
uses); else ``~/.cache/ttc-sched-bench/data``. ``python -m workloads.fetch`` fetches into and checks
the same folder by default. :func:`missing_hint` is the sentence every "no such data file" error ends with.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
CACHE = Path.home() / ".cache" / "ttc-sched-bench" / "data"
MANIFEST = Path(__file__).resolve().parent / "data_manifest.json"


def data_dir() -> Path:
    """The data folder every run reads (module docstring)."""
    env = os.environ.get("TTC_DATA_DIR")
    if env:
        return Path(env).expanduser()
    if SHARED.is_dir():
        return SHARED
    return CACHE


def resolve(path) -> Path:
    """An absolute path as is; a relative one under :func:`data_dir`."""
    p = Path(str(path)).expanduser()
    return p if p.is_absolute() else data_dir() / p


def missing_hint() -> str:
    return (
        f"get the data with `python -m workloads.fetch` (downloads the pinned public files into "
        f"{data_dir()}, the folder runs read; `--from DIR` copies a local mirror), or set TTC_DATA_DIR"
    )
