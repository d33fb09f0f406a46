"""Serving request streams: synthetic arrivals (Poisson, burst, ramp) and real traces.

A stream is a :class:`Requests` (arrays sorted by arrival): ``arrival_s`` (s from the start),
``input_len`` and ``output_len`` (tokens). Sources:

* Poisson at ``rate`` req/s; burst (``rate`` -> ``rate_high`` in [burst_start_s, burst_end_s));
  ramp (rate linear from ``rate`` to ``rate_high``), all by thinning a Poisson process (BEAM §2.8).
* Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens`` CSV), Mooncake FAST'25
  JSONL (``timestamp`` ms, ``input_length``, ``output_length``), replayed with ``time_scale``.
* ServeGen per-client 10-minute windows (rate, CV, Gamma/Weibull IAT parameters) and per-client
  token-length PDFs, sampled the way ServeGen's ``generate_workload`` does, scaled to a target
  token rate (BEAM's main trace: the 19:00-20:00 segment at about 1,800 tokens/s).

Files are read from paths given by the user (relative paths from ``$TTC_DATA_DIR``, default
``../shared/data`` beside the repository); nothing is copied into the repository. Each file is read
whole by pyarrow / numpy; malformed input or a value out of range (a token count < 1, a negative
or non-finite time or rate) is then read line by line, which raises :class:`TraceError` naming the
file, the line and the field (see ``_read``). A ServeGen folder's trace CSVs are parsed together in
one pass, its token-length PDFs per 6-hour window when a segment first reads the window (a bad
PDF is reported by the run that reads it). Naive trace timestamps are UTC, so
arrivals do not depend on the host's time zone.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, NamedTuple, Tuple

import numpy as np

from workloads.data import missing_hint, resolve

# Most requests a stream may be expected to hold (synthetic: peak rate x duration_s, checked by
# systems.energy_serving.runner.validate; ServeGen: its windows' rates x the target's scale). Its arrays, and
# the draws behind them, are ~50 bytes a request (0.5 GB at the bound), and a simulation serves each
# request; workload=poisson rate=1e9 asked numpy for 447 GiB.
MAX_REQUESTS = 10_000_000


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names the file and the line."""


@dataclass
class Requests:
    """Requests sorted by arrival. Arrays of equal length N: arrival_s (float s), input_len and
    output_len (int tokens, >= 1). ``note``: how the stream was made (scaling, truncation)."""

    arrival_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    note: str = ""

    def __len__(self) -> int:
        return int(len(self.arrival_s))

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second over the span (N / span)."""
        return len(self) / self.span_s if self.span_s > 0 else float("nan")


# -- synthetic arrivals ------------------------------------------------------------------------
def thinned_poisson(
    rate_fn: Callable[[np.ndarray], np.ndarray], rate_max: float, duration_s: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times (s) of a Poisson process with rate ``rate_fn(t)`` <= ``rate_max`` on [0, duration)."""
    if rate_max <= 0 or duration_s <= 0:
        return np.zeros(0)
    n = rng.poisson(rate_max * duration_s)
    t = np.sort(rng.uniform(0.0, duration_s, n))
    keep = rng.uniform(0.0, rate_max, n) < rate_fn(t)
    return t[keep]


def lengths(n: int, mean_in: int, mean_out: int, jitter: float, rng: np.random.Generator):
    """Input/output lengths: the means, or uniform within +-``jitter`` of them (tokens, >= 1)."""

    def one(m):
        if jitter <= 0:
            return np.full(n, int(m), dtype=np.int64)
        return np.maximum(1, np.rint(rng.uniform(m * (1 - jitter), m * (1 + jitter), n))).astype(np.int64)

    return one(mean_in), one(mean_out)


def rate_function(w) -> Tuple[Callable, float]:
    """(rate(t) req/s, its maximum) for a poisson / burst / ramp workload config."""
    lo, hi = float(w.rate), float(w.rate_high)
    if w.kind == "poisson":
        return (lambda t: np.full_like(t, lo)), lo
    if w.kind == "burst":
        a, b = float(w.burst_start_s), float(w.burst_end_s)
        return (lambda t: np.where((t >= a) & (t < b), hi, lo)), max(lo, hi)
    if w.kind == "ramp":
        d = float(w.duration_s)
        return (lambda t: lo + (hi - lo) * t / d), max(lo, hi)
    raise ValueError(f"workload.kind={w.kind!r} has no rate function")


# -- trace files -------------------------------------------------------------------------------
# Each format has a vectorised reader (pyarrow / numpy, the whole file at once) and a line-by-line
# reader. :func:`_read` tries the first; when it meets anything it does not take as is (a parse
# error, a value out of range, rows out of order) the line-by-line reader reads the file, and it
# either reads it (an unusual but valid spelling, e.g. a token count written 7.0) or raises the
# TraceError that names the file, the line and the field. Both give the same arrays for a valid
# file (tests/energy_serving/test_models_and_traces.py checks it on every shared trace).
class _Unusual(Exception):
    """The vectorised reader does not take this file as is (the line-by-line one decides)."""


def _read(fast: Callable, by_line: Callable, path: Path):
    """The vectorised reader's result, else the line-by-line one's (whose errors name the line).
    TraceError for a path that is no regular file (a FIFO would block) or no UTF-8 text."""
    import pyarrow as pa

    from harness.errors import ConfigError
    from harness.inputs import regular_file

    try:
        regular_file(path, "trace file", "a trace file")
    except ConfigError as e:
        raise TraceError(f"{path}: {str(e).split(' is not allowed: ', 1)[-1]}") from None
    try:
        return fast(path)
    except (_Unusual, pa.ArrowInvalid, ValueError, KeyError, TypeError):
        pass
    try:
        return by_line(path)
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not a UTF-8 text file (byte {e.start} is not UTF-8: a binary file?)") from None


def _numpy(col, dtype) -> np.ndarray:
    """A fixed-width pyarrow column (or array) without nulls as a numpy array, read through its
    buffers (pyarrow's own ``to_numpy`` imports pandas, ~0.3 s). Raises _Unusual for one with nulls."""
    if col.null_count:
        raise _Unusual
    size = np.dtype(dtype).itemsize
    parts = [
        np.frombuffer(c.buffers()[1], dtype=dtype, count=len(c), offset=c.offset * size)
        for c in getattr(col, "chunks", [col])
    ]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _strings(col) -> np.ndarray:
    """A dictionary-encoded pyarrow string column as an object array of str (through its buffers)."""
    return (
        np.concatenate(
            [np.array(c.dictionary.to_pylist(), dtype=object)[_numpy(c.indices, np.int32)] for c in col.chunks]
        )
        if col.num_chunks
        else np.zeros(0, dtype=object)
    )


def _whole_counts(x: np.ndarray, minimum: int = 1) -> np.ndarray:
    """Token counts as int64; raises _Unusual unless every value is a finite whole number >= minimum."""
    x = np.asarray(x, dtype=float)
    if not (np.isfinite(x).all() and (x == np.floor(x)).all() and (x >= minimum).all()):
        raise _Unusual
    return x.astype(np.int64)


def _sorted(t: np.ndarray) -> np.ndarray:
    if len(t) == 0 or (np.diff(t) < 0).any():
        raise _Unusual
    return t


def _fail(path: Path, line: int, what: str):
    raise TraceError(f"{path}:{line}: {what}")


def _token_count(path: Path, line: int, name: str, value) -> int:
    """``value`` as a token count >= 1 (an int, or an integral float / numeric string); else
    TraceError naming file, line and field."""
    try:
        x = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        x = float("nan")
    if not (math.isfinite(x) and x.is_integer()):
        _fail(path, line, f"{name}={value!r} is not a whole number of tokens")
    if x < 1:
        _fail(path, line, f"{name}={value!r} is out of range: a token count >= 1")
    return int(x)


def _utc_seconds(text: str) -> float:
    """POSIX seconds of an ISO-8601 timestamp; a naive one (no offset) is UTC, whatever the host's
    TZ (the Azure traces' timestamps carry no zone). Raises ValueError if not ISO-8601."""
    t = datetime.fromisoformat(text.strip())
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def _azure_fast(path: Path):
    """(seconds, context, generated) of an Azure CSV, parsed by pyarrow: timestamps to the
    microsecond (as datetime does), naive = UTC."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    with open(path) as f:
        if [h.strip() for h in f.readline().split(",")] != AZURE_HEADER:
            raise _Unusual
    types = {"TIMESTAMP": pa.timestamp("ns"), "ContextTokens": pa.float64(), "GeneratedTokens": pa.float64()}
    tb = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(column_types=types, include_columns=AZURE_HEADER))
    us = _numpy(tb.column("TIMESTAMP"), np.int64) // 1000  # datetime keeps 6 digits, truncated
    return (
        _sorted(us.astype(float) / 1e6),
        _whole_counts(_numpy(tb.column("ContextTokens"), np.float64)),
        _whole_counts(_numpy(tb.column("GeneratedTokens"), np.float64)),
    )


def _azure_by_line(path: Path):
    ts, ins, outs = [], [], []
    with open(path, newline="") as f:
        rd = csv.reader(f)
        header = next(rd, None)
        if header is None or [h.strip() for h in header[:3]] != AZURE_HEADER:
            _fail(path, 1, f"header {header!r}, expected TIMESTAMP,ContextTokens,GeneratedTokens")
        for i, row in enumerate(rd, start=2):
            if len(row) < 3:
                _fail(path, i, f"{len(row)} fields, expected 3")
            try:
                t = _utc_seconds(row[0])
            except ValueError:
                _fail(path, i, f"TIMESTAMP={row[0]!r} is not YYYY-MM-DD HH:MM:SS[.fffffff]")
            a = _token_count(path, i, "ContextTokens", row[1].strip())
            b = _token_count(path, i, "GeneratedTokens", row[2].strip())
            if ts and t < ts[-1]:
                _fail(path, i, "TIMESTAMP earlier than the previous row (rows must be sorted)")
            ts.append(t), ins.append(a), outs.append(b)
    if not ts:
        raise TraceError(f"{path}: no rows")
    return np.asarray(ts), np.asarray(ins, np.int64), np.asarray(outs, np.int64)


def load_azure(path) -> Requests:
    """Azure LLM inference trace 2023 CSV (header ``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Arrivals are seconds from the first row; naive timestamps are read as UTC (identical arrivals
    under any ``TZ``, also across a daylight-saving change). Raises TraceError (file:line: field)
    for a missing file, a wrong header, a bad timestamp, a token count that is not an integer >= 1,
    or rows out of time order.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: trace file not found; {missing_hint()}")
    t, ins, outs = _read(_azure_fast, _azure_by_line, path)
    return Requests(t - t[0], ins, outs, note=f"azure {path.name}")


MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


def _mooncake_fast(path: Path):
    """(ms, input, output) of a Mooncake JSONL, parsed by pyarrow (other fields ignored)."""
    import pyarrow as pa
    import pyarrow.json as pjson

    schema = pa.schema([(f, pa.float64()) for f in MOONCAKE_FIELDS])
    tb = pjson.read_json(
        path, parse_options=pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    )
    t, a, b = (_numpy(tb.column(c), np.float64) for c in MOONCAKE_FIELDS)
    if not (np.isfinite(t).all() and (t >= 0).all()):
        raise _Unusual
    return _sorted(t / 1e3), _whole_counts(a), _whole_counts(b)


def _mooncake_by_line(path: Path):
    ts, ins, outs = [], [], []
    with open(path) as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                o = json.loads(line)
                raw_t, raw_a, raw_b = o["timestamp"], o["input_length"], o["output_length"]
                t = float(raw_t) / 1e3
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                _fail(path, i, f"not a request object with timestamp/input_length/output_length ({e})")
            if not (math.isfinite(t) and t >= 0):
                _fail(path, i, f"timestamp={raw_t!r} is out of range: milliseconds >= 0")
            a = _token_count(path, i, "input_length", raw_a)
            b = _token_count(path, i, "output_length", raw_b)
            if ts and t < ts[-1]:
                _fail(path, i, "timestamp earlier than the previous line (lines must be sorted)")
            ts.append(t), ins.append(a), outs.append(b)
    if not ts:
        raise TraceError(f"{path}: no requests")
    return np.asarray(ts), np.asarray(ins, np.int64), np.asarray(outs, np.int64)


def load_mooncake(path) -> Requests:
    """Mooncake JSONL (``timestamp`` ms from the trace start, ``input_length``, ``output_length`` per
    line). Raises TraceError (file:line: field) for a line that is not such an object, a timestamp
    that is negative or not finite, a length that is not an integer >= 1, or lines out of order."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: trace file not found; {missing_hint()}")
    t, ins, outs = _read(_mooncake_fast, _mooncake_by_line, path)
    return Requests(t - t[0], ins, outs, note=f"mooncake {path.name}")


# -- ServeGen --------------------------------------------------------------------------------
_INT_KEY = re.compile(r"([{,]\s*)(-?\d+)\s*:")


def _pdf_literal(text: str) -> Dict[int, float]:
    """A ServeGen PDF string ``{value: probability, ...}`` (a Python dict literal) as a dict.
    Parsed as JSON after quoting the int keys; falls back to ``ast.literal_eval``."""
    try:
        d = json.loads(_INT_KEY.sub(r'\1"\2":', text))
    except ValueError:
        d = ast.literal_eval(text)
    return {int(a): float(b) for a, b in d.items()}


def _pdf_fast(text: str, minimum: int) -> Tuple[np.ndarray, np.ndarray]:
    """A ServeGen PDF string as (token counts int64, probabilities) in the string's order, parsed by
    numpy in one pass; raises _Unusual (or ValueError) for anything but ``{int: number, ...}`` with
    counts >= ``minimum`` and probabilities finite, >= 0, not all 0."""
    inner = text.strip()
    if not (inner.startswith("{") and inner.endswith("}")):
        raise _Unusual
    inner = inner[1:-1]
    n = inner.count(":")
    if n == 0:
        if inner.strip():
            raise _Unusual
        return np.zeros(0, np.int64), np.zeros(0)
    flat = np.fromstring(inner.replace(":", ","), sep=",")
    if len(flat) != 2 * n or inner.count(",") != n - 1:
        raise _Unusual
    p = flat[1::2]
    if not (np.isfinite(p).all() and (p >= 0).all() and p.sum() > 0):
        raise _Unusual
    return _whole_counts(flat[0::2], minimum), p


SERVEGEN_FIELDS = ("timestamp", "rate", "cv", "pattern", "shape", "scale")
SERVEGEN_PATTERNS = ("Gamma", "Weibull", "")  # empty: the client is inactive in the window
MIN_TOKENS = {"input_tokens": 1, "output_tokens": 0}  # 0 output tokens occur in the data (served as 1)
Windows = Tuple[np.ndarray, ...]  # a client's windows: t, rate, cv, pattern, shape, scale (arrays)


def _servegen_row(path: Path, line: int, text: str) -> tuple:
    """One window of a ``chunk-*-trace.csv``: (t, rate, cv, pattern, shape, scale). Numbers must be
    finite and >= 0, the pattern Gamma, Weibull or empty, and an active window's shape > 0."""
    parts = text.strip().split(",")
    if len(parts) != 6:
        _fail(path, line, f"{len(parts)} fields, expected {','.join(SERVEGEN_FIELDS)}")
    row = []
    for name, raw in zip(SERVEGEN_FIELDS, parts):
        if name == "pattern":
            if raw not in SERVEGEN_PATTERNS:
                _fail(path, line, f"pattern={raw!r} is not allowed: Gamma, Weibull or empty")
            row.append(raw)
            continue
        try:
            x = float(raw or 0)
        except ValueError:
            _fail(path, line, f"{name}={raw!r} is not a number")
        if not (math.isfinite(x) and x >= 0):
            _fail(path, line, f"{name}={raw!r} is out of range: a finite number >= 0")
        row.append(x)
    if row[1] > 0 and row[3] and not row[4] > 0:
        _fail(path, line, f"shape={parts[4]!r} is out of range: > 0 in an active {row[3]} window")
    return tuple(row)


def _windows(rows) -> Windows:
    cols = list(zip(*rows)) if rows else [()] * 6
    return tuple(np.asarray(c, dtype=object if i == 3 else float) for i, c in enumerate(cols))


def _servegen_csv(data):
    """Trace CSV text (a path or a buffer) parsed by pyarrow: the six columns as numpy arrays
    (pattern: object array of str). Raises _Unusual for a value the line reader must judge."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    types = {f: pa.dictionary(pa.int32(), pa.string()) if f == "pattern" else pa.float64() for f in SERVEGEN_FIELDS}
    tb = pcsv.read_csv(
        data,
        read_options=pcsv.ReadOptions(column_names=list(SERVEGEN_FIELDS)),
        convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=False),
    )
    cols = [_strings(tb.column(f)) if f == "pattern" else _numpy(tb.column(f), np.float64) for f in SERVEGEN_FIELDS]
    for i in (0, 1, 2, 4, 5):
        if not (np.isfinite(cols[i]).all() and (cols[i] >= 0).all()):
            raise _Unusual
    pat = cols[3]
    if not np.isin(pat, SERVEGEN_PATTERNS).all() or ((cols[1] > 0) & (pat != "") & ~(cols[4] > 0)).any():
        raise _Unusual
    return cols


def _servegen_trace_fast(path: Path) -> Windows:
    """A ``chunk-*-trace.csv`` parsed by pyarrow (an empty number: the line reader's, which reads it as 0)."""
    return tuple(_servegen_csv(path))


def _servegen_traces(paths) -> list:
    """The windows of every ``chunk-*-trace.csv`` in ``paths``, as :func:`_read` with
    :func:`_servegen_trace_fast` gives them file by file, from one pyarrow parse of the files'
    text joined (a parse per file costs ~0.5 ms of set-up: 160 files, ~0.07 s). Each file's rows
    are its lines, ended by \\n or \\r\\n. pyarrow reads fewer rows than lines where a file has a
    blank line (or a quoted line break) and more only where a lone \\r ends one: with no lone \\r,
    as many rows as lines means each file's rows are its lines. Otherwise, or for a value the line
    reader must judge, every file goes to :func:`_read`."""
    import pyarrow as pa

    blobs = [b if b.endswith(b"\n") else b + b"\n" for b in (p.read_bytes() for p in paths)]
    data = b"".join(blobs)
    rows = [b.count(b"\n") for b in blobs]
    try:
        if data.count(b"\r") != data.count(b"\r\n"):
            raise _Unusual
        cols = _servegen_csv(pa.py_buffer(data))
        if len(cols[0]) != sum(rows):
            raise _Unusual
    except (_Unusual, pa.ArrowInvalid, ValueError, KeyError, TypeError):
        return [_read(_servegen_trace_fast, _servegen_trace_by_line, p) for p in paths]
    parts = [np.split(c, np.cumsum(rows)[:-1]) for c in cols]
    return [tuple(part[i] for part in parts) for i in range(len(paths))]


def _servegen_trace_by_line(path: Path) -> Windows:
    with open(path) as f:
        return _windows([_servegen_row(path, i, line) for i, line in enumerate(f, start=1)])


def _line_of(text: str, *keys: str) -> int:
    """Line (1-based) of the JSON key path ``keys`` in ``text`` (each key searched after the last)."""
    pos = 0
    for k in keys:
        pos = max(text.find(f'"{k}"', pos), pos)
    return text.count("\n", 0, pos) + 1


def _dataset_raw(path: Path):
    """(text, {window start s: {field: PDF string}}) of a ``chunk-*-dataset.json``."""
    text = path.read_text()
    try:
        raw = json.loads(text)
        ok = isinstance(raw, dict) and all(isinstance(d, dict) for d in raw.values())
        keys = {k: int(k) for k in raw} if ok else None
    except ValueError as e:
        ok, keys = False, str(e)
    if not ok:
        raise TraceError(
            f"{path}: not a ServeGen dataset (window start -> field -> dict-literal PDF)"
            + (f": {keys}" if keys else "")
        )
    return text, {keys[k]: d for k, d in raw.items()}


def _window_pdfs_fast(d: dict) -> dict:
    """One window of a dataset: {field: (counts, probabilities)} by :func:`_pdf_fast`."""
    return {f: _pdf_fast(d[f], MIN_TOKENS[f]) for f in MIN_TOKENS if f in d}


def _window_pdfs_by_line(path: Path, text: str, k: int, d: dict) -> dict:
    """One window of a dataset read by :func:`_pdf_literal`: a PDF's token counts must be integers
    >= 1 (output: >= 0) and its probabilities finite, >= 0, not all 0; else TraceError naming the
    file's line (found in ``text``), the window and the field."""
    out = {}
    for fld in (f for f in MIN_TOKENS if f in d):

        def fail(what):
            raise TraceError(f"{path}:{_line_of(text, str(k), fld)}: window {k} {fld}: {what}")

        try:
            pdf = _pdf_literal(d[fld])
        except (ValueError, SyntaxError, AttributeError, TypeError) as e:
            fail(f"not a dict-literal PDF ({e})")
        bad_n = [n for n in pdf if n < MIN_TOKENS[fld]]
        if bad_n:
            fail(f"token count {bad_n[0]} is out of range: >= {MIN_TOKENS[fld]}")
        bad_p = [(n, q) for n, q in pdf.items() if not (math.isfinite(q) and q >= 0)]
        if bad_p or (pdf and not sum(pdf.values()) > 0):
            n, q = bad_p[0] if bad_p else next(iter(pdf.items()))
            fail(f"probability {q!r} of {n} tokens is out of range: finite, >= 0, not all 0")
        out[fld] = (
            np.fromiter(pdf.keys(), dtype=np.int64, count=len(pdf)),
            np.fromiter(pdf.values(), dtype=float, count=len(pdf)),
        )
    return out


def _servegen_dataset_fast(path: Path):
    """A ``chunk-*-dataset.json``, every window by :func:`_pdf_fast` (no fall-back)."""
    _, raw = _dataset_raw(path)
    return {k: _window_pdfs_fast(d) for k, d in raw.items()}


def _servegen_dataset_by_line(path: Path):
    """A ``chunk-*-dataset.json``: {window start s: {input_tokens|output_tokens: (counts, probabilities)}},
    every window by :func:`_window_pdfs_by_line`."""
    text, raw = _dataset_raw(path)
    return {k: _window_pdfs_by_line(path, text, k, d) for k, d in raw.items()}


class _Dataset(Mapping):
    """A client's ``chunk-*-dataset.json`` as {window start s: {field: (counts, probabilities)}},
    each window's PDFs parsed when first read (a segment of one hour reads one 6-hour window of the
    clients active in it: a quarter of the text or less; parsing all of m-large's 150 files took
    ~0.25 s). A window reads as :func:`_servegen_dataset_fast` gives it, or, when that does not take
    it as is, as :func:`_servegen_dataset_by_line` does (which raises TraceError for a bad PDF: so a
    bad PDF is reported when a run reads its window). Raises TraceError at once for a file that is
    not a dataset."""

    def __init__(self, path: Path):
        self.path = path
        _, self._raw = _dataset_raw(path)
        self._parsed: Dict[int, dict] = {}

    def __getitem__(self, k: int) -> dict:
        if k not in self._parsed:
            d = self._raw[k]
            try:
                self._parsed[k] = _window_pdfs_fast(d)
            except (_Unusual, ValueError, KeyError, TypeError, AttributeError):
                self._parsed[k] = _window_pdfs_by_line(self.path, self.path.read_text(), k, d)
        return self._parsed[k]

    def __iter__(self):
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


@lru_cache(maxsize=4)
def _servegen_clients(root: str):
    """{client_id: (trace windows (t, rate, cv, pattern, shape, scale arrays), :class:`_Dataset` or None)}."""
    root_p = Path(root)
    traces = sorted(root_p.glob("chunk-*-trace.csv"))
    if not traces:
        raise TraceError(
            f"{root_p}: no chunk-*-trace.csv files (a ServeGen <category>/<model> folder); {missing_hint()}"
        )
    out = {}
    for tp, windows in zip(traces, _servegen_traces(traces)):
        cid = tp.name[len("chunk-") : -len("-trace.csv")]
        ds_path = root_p / f"chunk-{cid}-dataset.json"
        out[cid] = (windows, _Dataset(ds_path) if ds_path.is_file() else None)
    return out


def _pdf_arrays(pdf):
    v, p = pdf
    return v, p / p.sum()


def _pooled(keys: list, weights: list) -> Tuple[np.ndarray, np.ndarray]:
    """(token counts in order of first appearance, summed weights) of PDFs given as arrays; each
    count's weights added in input order (np.bincount's loop)."""
    k, w = np.concatenate(keys), np.concatenate(weights)
    uniq, first, inv = np.unique(k, return_index=True, return_inverse=True)
    order = np.argsort(first)
    return uniq[order], np.bincount(inv, weights=w, minlength=len(uniq))[order]


def _sequential_sum(x: np.ndarray) -> float:
    """x[0] + x[1] + ... left to right (Python's ``sum``; numpy's ``sum`` adds pairwise)."""
    return float(np.cumsum(x)[-1]) if len(x) else 0


def _client_pdfs(clients, cid, t):
    """Client ``cid``'s (input, output) token-length PDFs for the 6-hour key containing ``t``, or
    None when it has no dataset file or the window's PDFs are empty."""
    ds = clients[cid][1]
    if not ds:
        return None
    key = max(k for k in ds if k <= t) if any(k <= t for k in ds) else min(ds)
    d = ds[key]
    if any(len(d.get(f, ((),))[0]) == 0 for f in MIN_TOKENS):
        return None
    return d["input_tokens"], d["output_tokens"]


class ServegenPlan(NamedTuple):
    """What a ServeGen segment will draw, known before any draw (:func:`servegen_plan`): the
    segment [t0, t1) s; its active client windows (cid, window start s, length s, rate req/s,
    pattern, shape, scale); the rate-weighted pooled PDFs (for clients without data); the rate
    scale for the target token rate; ``expected`` requests after scaling and their expected
    ``mean_output_tokens`` (tokens, rate-weighted over the windows; 0 drawn is served as 1)."""

    clients: dict
    t0: float
    t1: float
    active: list
    pool: tuple
    scale_rate: float
    expected: float
    mean_output_tokens: float


def servegen_plan(path, start_s: float, duration_s: float, target_tokens_per_s: float) -> ServegenPlan:
    """The :class:`ServegenPlan` of the segment [start_s, start_s + duration_s) of day 1 (reads the
    trace windows and the PDFs of the windows the segment reads; draws nothing). Raises TraceError
    for no active window, no token-length PDFs, or more than MAX_REQUESTS expected requests."""
    clients = _servegen_clients(str(Path(path)))
    t0, t1 = float(start_s), float(start_s) + float(duration_s)
    active = []  # (cid, win_start, win_len, rate, pattern, shape, scale)
    for cid, ((t, rate, _, pat, shape, scale), _) in clients.items():
        lo, hi = np.maximum(t, t0), np.minimum(t + 600.0, t1)
        for i in np.flatnonzero((hi > lo) & (rate > 0) & (pat != "")):
            active.append(
                (cid, float(lo[i]), float(hi[i] - lo[i]), float(rate[i]), pat[i], float(shape[i]), float(scale[i]))
            )
    if not active:
        raise TraceError(f"{path}: no active client windows in [{t0}, {t1}) s")

    # pooled PDFs (rate-weighted, in order of first appearance) for clients without data; every sum
    # left to right, as the per-window dicts of the first version added them (same floats)
    pool_parts = ([], []), ([], [])  # (token counts, weighted probabilities) per field
    mean_tok, mean_out = {}, {}
    for cid, lo, ln, rate, *_ in active:
        pd_ = _client_pdfs(clients, cid, lo)
        if pd_ is None:
            continue
        w = rate * ln
        for (k, p), (keys, weights) in zip(pd_, pool_parts):
            keys.append(k)
            weights.append(w * p)
        mean_tok[(cid, lo)] = _sequential_sum(pd_[0][0] * pd_[0][1]) + _sequential_sum(pd_[1][0] * pd_[1][1])
        mean_out[(cid, lo)] = float(pd_[1][0] @ pd_[1][1] / pd_[1][1].sum())
    if not pool_parts[0][0]:
        raise TraceError(f"{path}: no client in the segment has token-length PDFs (chunk-*-dataset.json)")
    pool = tuple(_pdf_arrays(_pooled(keys, weights)) for keys, weights in pool_parts)
    pool_mean = float(pool[0][0] @ pool[0][1] + pool[1][0] @ pool[1][1])
    exp_tokens = sum(rate * ln * mean_tok.get((cid, lo), pool_mean) for cid, lo, ln, rate, *_ in active)
    scale_rate = (target_tokens_per_s * (t1 - t0) / exp_tokens) if target_tokens_per_s > 0 else 1.0
    unscaled = sum(rate * ln for _, _, ln, rate, *_ in active)
    expected = scale_rate * unscaled
    if expected > MAX_REQUESTS:
        raise TraceError(
            f"workload.target_tokens_per_s={target_tokens_per_s:g} would draw {expected:,.0f} requests in "
            f"[{t0:g}, {t1:g}) s (at most {MAX_REQUESTS:,}; the trace's own rates give "
            f"{expected / scale_rate:,.0f}: lower it or workload.duration_s)"
        )
    pool_out = float(pool[1][0] @ pool[1][1])
    out_tokens = sum(rate * ln * max(1.0, mean_out.get((cid, lo), pool_out)) for cid, lo, ln, rate, *_ in active)
    return ServegenPlan(clients, t0, t1, active, pool, scale_rate, expected, out_tokens / unscaled)


def load_servegen(
    path, start_s: float, duration_s: float, target_tokens_per_s: float, rng: np.random.Generator
) -> Requests:
    """Sample requests from ServeGen windows in [start_s, start_s + duration_s) of day 1.

    Each active client window yields IATs from its Gamma/Weibull (shape, scale), rescaled so the
    window hits ``rate * s``, where ``s`` makes the expected input+output token rate equal
    ``target_tokens_per_s`` (0 = unscaled). Token lengths come from the client's PDF for the 6-hour
    key containing the window, or the rate-weighted pool of all clients' PDFs when the client has
    no dataset file. Arrival times are seconds from ``start_s``. The segment is planned first
    (:func:`servegen_plan`, which raises TraceError before any draw).
    """
    clients, t0, t1, active, pool, scale_rate, *_ = servegen_plan(path, start_s, duration_s, target_tokens_per_s)

    arr, ins, outs = [], [], []
    for cid, lo, ln, rate, pat, shape, scale in active:
        r = rate * scale_rate
        if r <= 0:
            continue
        # start the renewal process one window early so the window sees it in steady state
        # (starting at the window edge would put a burst of near-zero IATs there)
        n_exp = r * (ln + 600.0)
        n_draw = int(n_exp + 6 * math.sqrt(n_exp) + 5)

        def draw(k):
            if pat == "Gamma" and shape > 0:
                return rng.gamma(shape, 1.0, k) / shape
            if pat == "Weibull" and shape > 0:
                return rng.weibull(shape, k) / math.gamma(1 + 1 / shape)
            return rng.exponential(1.0, k)

        iat = draw(n_draw) / r  # mean IAT = 1 / r
        while iat.sum() < ln + 600.0:  # bursty IATs: draw until past the window
            iat = np.concatenate([iat, draw(n_draw) / r])
        t = lo - 600.0 + np.cumsum(iat)
        t = t[(t >= lo) & (t < lo + ln)]
        if len(t) == 0:
            continue
        pd_ = _client_pdfs(clients, cid, lo)
        (vi, pi), (vo, po) = pool if pd_ is None else (_pdf_arrays(pd_[0]), _pdf_arrays(pd_[1]))
        arr.append(t - t0)
        ins.append(rng.choice(vi, len(t), p=pi))
        outs.append(rng.choice(vo, len(t), p=po))
    if not arr:  # workload.duration_s=1e-9: np.concatenate's ValueError traceback before
        raise TraceError(
            f"{path}: no request was drawn in [{t0:g}, {t1:g}) s (allowed: a segment in which requests arrive; "
            f"widen workload.duration_s or move workload.start_s)"
        )
    a = np.concatenate(arr)
    order = np.argsort(a, kind="stable")
    out_len = np.concatenate(outs)[order]
    zero_out = int((out_len == 0).sum())
    note = (
        f"servegen {Path(path).name} [{t0:.0f},{t1:.0f}) s, {len(active)} client windows, "
        f"rates x{scale_rate:.4g} for {target_tokens_per_s:g} tok/s"
        + (f"; {zero_out} requests drawn with 0 output tokens served as 1" if zero_out else "")
    )
    return Requests(a[order], np.concatenate(ins)[order], np.maximum(1, out_len), note=note)


# -- one entry point ----------------------------------------------------------------------------
def build_requests(w) -> Requests:
    """The request stream of a serving workload config (see systems/energy_serving/config.py).

    Trace and ServeGen streams are cut to ``duration_s`` (and ``max_requests``); prompts longer than
    ``max_input_len`` are truncated. Raises TraceError for missing/malformed files.
    """
    rng = np.random.default_rng(int(w.seed))
    if w.kind in ("poisson", "burst", "ramp"):
        fn, rmax = rate_function(w)
        t = thinned_poisson(fn, rmax, float(w.duration_s), rng)
        i, o = lengths(len(t), w.input_len, w.output_len, float(w.len_jitter), rng)
        req = Requests(t, i, o, note=f"{w.kind} arrivals")
    elif w.kind == "trace":
        p = resolve(w.path)
        full = load_azure(p) if w.format == "azure" else load_mooncake(p)
        t = full.arrival_s / float(w.time_scale)
        sel = (t >= float(w.start_s)) & (t < float(w.start_s) + float(w.duration_s))
        req = Requests(
            t[sel] - float(w.start_s),
            full.input_len[sel],
            full.output_len[sel],
            note=f"{full.note} time_scale {w.time_scale}",
        )
    elif w.kind == "servegen":
        req = load_servegen(resolve(w.path), w.start_s, w.duration_s, float(w.target_tokens_per_s), rng)
    else:
        raise ValueError(f"workload.kind={w.kind!r}")
    if w.max_requests is not None and len(req) > int(w.max_requests):
        n = int(w.max_requests)
        req = Requests(req.arrival_s[:n], req.input_len[:n], req.output_len[:n], req.note)
    trunc = int((req.input_len > int(w.max_input_len)).sum())
    if trunc:
        req.input_len = np.minimum(req.input_len, int(w.max_input_len))
        req.note += f"; {trunc} prompts truncated to {w.max_input_len} tokens"
    return req
