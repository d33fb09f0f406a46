"""User-given files, opened only when they are what a run can read (issue 39: a FIFO given as
``system.latency_profile`` blocked the run before any work; a binary trace or problem set ended in a
UnicodeDecodeError traceback). Each check raises ConfigError (exit 2 before any work) naming the
setting, the path and what is allowed."""

from __future__ import annotations

import stat
from pathlib import Path

from harness.errors import ConfigError

MAX_TEXT_BYTES = 4 << 30  # the largest data file a run reads whole (the full traces are < 1 GiB)


def regular_file(path, field: str, what: str = "a file", max_bytes: int = MAX_TEXT_BYTES) -> Path:
    """``path`` as a Path when it is a regular file of at most ``max_bytes``; ConfigError when it is
    missing, a folder, a FIFO, a device or a socket (reading those blocks or never ends), or larger."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise ConfigError(f"{field}={str(path)!r} is not allowed: {what}; it cannot be read ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{field}={str(path)!r} is not allowed: {what}, not a folder")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
        raise ConfigError(f"{field}={str(path)!r} is not allowed: {what}, a regular file (this is {kind})")
    if st.st_size > max_bytes:
        raise ConfigError(
            f"{field}={str(path)!r} is not allowed: {what} of at most {max_bytes:,} bytes ({st.st_size:,} bytes)"
        )
    return p


def read_text(path, field: str, what: str = "a text file", max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of a user-given file (:func:`regular_file`); ConfigError naming the first byte
    that is not UTF-8 (a binary file)."""
    p = regular_file(path, field, what, max_bytes)
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{field}={str(path)!r} is not allowed: {what} in UTF-8 (byte {e.start} is not: a binary file?)"
        ) from None
