"""Obtain the data files the experiments read: math problem sets and serving traces.

    python -m workloads.fetch                      # download from the public sources into the data folder
    python -m workloads.fetch --from /mirror/data  # copy from a local mirror (same layout), no network
    python -m workloads.fetch --check              # verify what is there, fetch nothing

Every file is pinned: its public repository, commit and path, and the sha256 of the file as the
experiments read it (``workloads/data_manifest.json``); a file whose checksum differs is refused and
not kept. The destination (and what ``--check`` verifies) is the folder the runs read,
:func:`workloads.data.data_dir` (``$TTC_DATA_DIR``, else ``../shared/data`` beside the repository
when it exists, else ``~/.cache/ttc-sched-bench/data``), or ``--dest``. Nothing is ever copied into
the repository.

Two sources are cut, as the shared copy was (recorded in the manifest as ``cut``): ServeGen's
``language/m-large`` keeps day 1 (trace rows and dataset keys with timestamp < 86400 s; datasets
re-serialised with ``json.dumps(indent=2)``). The cut is applied to the download and the checksum is
checked on the result.

``python -m workloads.fetch --write-manifest DIR`` rebuilds the manifest from a verified copy (for
maintainers adding a file).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

from workloads.data import MANIFEST, data_dir

DAY_S = 86400
# Public sources: folder prefix in the data dir -> (repository, commit, path prefix in it, license)
SOURCES = {
    "math/aime24/": (
        "QwenLM/Qwen2.5-Math",
        "a45202bd16f1ec06f433442dc1152d0074773465",
        "evaluation/data/aime24/",
        "MIT",
    ),
    "math/amc23/": ("QwenLM/Qwen2.5-Math", "a45202bd16f1ec06f433442dc1152d0074773465", "evaluation/data/amc23/", "MIT"),
    "math/math500/": (
        "hkust-nlp/simpleRL-reason",
        "cf1c7858bfc145a27aa733e75d930d34f0d318a6",
        "examples/simplelr_math_eval/data/math500/",
        "MIT",
    ),
    "traces/azure_llm_2023/": (
        "Azure/AzurePublicDataset",
        "b469a113cedca53ddc3bdea71a143dc4b7d8700c",
        "data/",
        "CC-BY-4.0",
    ),
    "traces/mooncake/": (
        "kvcache-ai/Mooncake",
        "3b5a594133958449a1feaf1c9e0fc1b553e34a28",
        "FAST25-release/traces/",
        "Apache-2.0",
    ),
    "traces/servegen/": ("alibaba/ServeGen", "f891d1189eb32b3868dfc443800c4150548c282a", "data/", "Apache-2.0"),
    # GPU power (systems.energy_serving.power_fit): the Perseus SOSP'24 artifact's A100 stage profiles, and
    # ML.ENERGY v3's per-model files (Apache-2.0 as the ML.ENERGY dataset card states; the leaderboard
    # repository has no LICENSE file)
    "gpu_power/perseus_a100_sxm/": (
        "ml-energy/zeus",
        "38cb3f90c30d9041d4b141cfe5c922dba55baa45",
        "sosp24_data/emulation/stage_profile/",
        "Apache-2.0",
    ),
    "gpu_power/mlenergy_leaderboard_v3/": (
        "ml-energy/leaderboard",
        "0cd52dab897c5d91a45f4d413038f3b8b4251b0f",
        "public/data/models/",
        "Apache-2.0",
    ),
}
# Files a data folder may hold under those prefixes that are derived, not the source's: not pinned
DERIVED = ("gpu_power/mlenergy_leaderboard_v3/llm_configs_flat.csv",)
CUT_DAY1 = "traces/servegen/language/m-large/"


class FetchError(RuntimeError):
    """A file could not be obtained or its checksum differs (the message names file and fix)."""


def _unreachable(ex: Exception) -> bool:
    """Whether a download failed for want of a network (no answer from the host), not for the file:
    a URLError other than an HTTP error (DNS, refused, unreachable), or a timeout."""
    return (isinstance(ex, urllib.error.URLError) and not isinstance(ex, urllib.error.HTTPError)) or isinstance(
        ex, (TimeoutError, ConnectionError)
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def source_of(rel: str) -> Dict[str, str]:
    """The pinned public source of data file ``rel`` (relative to the data dir)."""
    for prefix, (repo, commit, path, lic) in SOURCES.items():
        if rel.startswith(prefix):
            url = f"https://raw.githubusercontent.com/{repo}/{commit}/{path}{rel[len(prefix) :]}"
            return {
                "repo": repo,
                "commit": commit,
                "url": url,
                "license": lic,
                "cut": "day1" if rel.startswith(CUT_DAY1) else "",
            }
    raise FetchError(f"{rel}: no public source is recorded for this folder")


def cut_day1(rel: str, data: bytes) -> bytes:
    """ServeGen m-large day 1: trace rows / dataset keys with timestamp < 86400 s (module docstring)."""
    if rel.endswith("-dataset.json"):
        d = json.loads(data)
        return json.dumps({k: v for k, v in d.items() if int(k) < DAY_S}, indent=2).encode()
    lines = data.split(b"\n")
    return b"\n".join(ln for ln in lines if not ln.strip() or float(ln.split(b",")[0]) < DAY_S)


def load_manifest() -> List[dict]:
    """Every pinned file: path (relative to the data dir), sha256, bytes, and its source."""
    rows = json.loads(MANIFEST.read_text())["files"]
    return [{"path": r, "sha256": h, "bytes": n, **source_of(r)} for r, h, n in rows]


def _download(url: str, timeout_s: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 (pinned https URL)
        return r.read()


def _write(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, prefix=f".{dest.name}.") as f:
        f.write(data)
    Path(f.name).replace(dest)


def fetch(
    dest: Path, mirror: Optional[Path] = None, only: Optional[str] = None, check_only: bool = False, log=print
) -> Dict[str, int]:
    """Bring every manifest file (or those under the prefix ``only``) to ``dest``; returns counts
    ``{"present": .., "fetched": .., "failed": ..}``. A file already there with the right checksum is
    kept. Raises FetchError listing every failure at the end (nothing half-written is left)."""
    counts = {"present": 0, "fetched": 0, "failed": 0}
    errors = []
    for e in load_manifest():
        rel = e["path"]
        if only and not rel.startswith(only):
            continue
        target = dest / rel
        if target.is_file() and sha256(target.read_bytes()) == e["sha256"]:
            counts["present"] += 1
            continue
        if check_only:
            counts["failed"] += 1
            errors.append(f"{rel}: {'checksum differs' if target.exists() else 'missing'}")
            continue
        try:
            if mirror is not None:
                src = mirror / rel
                if not src.is_file():
                    raise FetchError(f"not in the mirror {mirror}")
                data = src.read_bytes()
            else:
                data = _download(e["url"])
                if e.get("cut") == "day1":
                    data = cut_day1(rel, data)
            got = sha256(data)
            if got != e["sha256"]:
                raise FetchError(f"sha256 {got} != pinned {e['sha256']}")
            _write(target, data)
            counts["fetched"] += 1
        except Exception as ex:  # one bad file must not stop the others; no network stops all
            if mirror is None and _unreachable(ex):
                reason = getattr(ex, "reason", ex)
                raise FetchError(
                    f"could not reach raw.githubusercontent.com ({reason}) for {rel}: no network? "
                    f"Copy from a local mirror of a data folder instead (same layout, e.g. a "
                    f"colleague's or ../shared/data): `python -m workloads.fetch --from DIR`, or point "
                    f"TTC_DATA_DIR at such a folder ({counts['fetched']} files fetched into {dest} "
                    f"before this)"
                ) from ex
            counts["failed"] += 1
            errors.append(f"{rel}: {ex}")
    if errors:
        shown = "\n  ".join(errors[:10]) + (f"\n  ... and {len(errors) - 10} more" if len(errors) > 10 else "")
        raise FetchError(
            f"{len(errors)} of the data files in {dest} could not be "
            f"{'verified' if check_only else 'obtained'}:"
            f"\n  {shown}"
        )
    if check_only:
        log(f"data in {dest}: all {counts['present']} files present, each with its pinned sha256")
    else:
        log(f"data in {dest}: {counts['present']} present (sha256 checked), {counts['fetched']} fetched")
    return counts


def write_manifest(src: Path) -> int:
    """Rebuild the manifest from a verified copy ``src`` (maintainers). Returns the file count."""
    files = []
    for prefix in SOURCES:
        for p in sorted((src / prefix).rglob("*")):
            rel = p.relative_to(src).as_posix()
            if p.is_file() and p.name != "README.md" and rel not in DERIVED:
                source_of(rel)  # every file needs a recorded source
                files.append([rel, sha256(p.read_bytes()), p.stat().st_size])
    body = ",\n".join(json.dumps(f) for f in files)
    MANIFEST.write_text(
        '{"about": "data files as the experiments read them: [path, sha256, bytes]; '
        'sources in workloads/fetch.py",\n"files": [\n' + body + "\n]}\n"
    )
    return len(files)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workloads.fetch", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dest",
        default=None,
        help=f"data folder (default: the one runs read: $TTC_DATA_DIR, else ../shared/data beside the "
        f"repository when it exists, else ~/.cache/ttc-sched-bench/data; here {data_dir()})",
    )
    ap.add_argument("--from", dest="mirror", type=Path, default=None, help="copy from a local mirror instead")
    ap.add_argument("--only", default=None, help="only files under this prefix, e.g. math/ or traces/azure_llm_2023/")
    ap.add_argument("--check", action="store_true", help="verify checksums, fetch nothing")
    ap.add_argument("--write-manifest", type=Path, default=None, metavar="DIR", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.write_manifest:
        print(f"{write_manifest(a.write_manifest)} files -> {MANIFEST}")
        return 0
    if a.dest is not None and not a.dest.strip():  # '' would write into the current folder
        print("error: --dest '': a folder; leave it out for the folder runs read", file=sys.stderr)
        return 2
    dest = Path(a.dest) if a.dest is not None else data_dir()
    if a.mirror is not None and not a.mirror.is_dir():
        print(f"error: --from {a.mirror}: not a directory", file=sys.stderr)
        return 2
    if a.only is not None and not any(e["path"].startswith(a.only) for e in load_manifest()):
        tops = sorted({e["path"].split("/")[0] + "/" for e in load_manifest()})
        print(
            f"error: --only {a.only!r}: no data file under it; a prefix of workloads/data_manifest.json's paths "
            f"such as {', '.join(tops)}",
            file=sys.stderr,
        )
        return 2
    try:
        fetch(dest, a.mirror, a.only, a.check)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
