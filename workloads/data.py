"""Where the data files live (a leaf module: no imports of ours).

Data (math problem sets, serving traces) is never copied into the repository. Lookup order:
``$TTC_DATA_DIR``; else ``<repo>/../shared/data`` when it exists (this team's layout, and what CI
uses); else ``~/.cache/ttc-sched-bench/data``. ``python -m workloads.fetch`` fetches into and checks
the same folder by default. :func:`missing_hint` is the sentence every "no such data file" error ends with.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Dict, Tuple

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


_DIGESTS: Dict[Tuple, str] = {}  # (path, size, mtime, ctime, inode) -> sha256, for this process


def digest(path: Path) -> str:
    """sha256 of a file's bytes (hex). Computed once per process for a file whose size, times and
    inode stay the same; an in-place edit that keeps the size and the mtime changes the ctime."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def data_files(workload) -> Dict[str, str]:
    """``{resolved path: sha256}`` of the data files a workload reads: its ``path``, a file or every
    regular file under a folder; {} for a workload without one (synthetic prompts and arrivals) or
    whose path does not exist (its run says so). What run.json records and resume compares."""
    rel = workload.get("path") if hasattr(workload, "get") else None
    if not rel:
        return {}
    root = resolve(rel)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(f for f in root.rglob("*") if f.is_file())
    else:
        return {}
    return {str(f): digest(f) for f in files}
