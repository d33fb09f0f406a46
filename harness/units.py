"""Byte sizes with units: ``7GiB``, ``512MiB``, ``24GB`` or a plain number of bytes."""

from __future__ import annotations

import re

from harness.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value, field: str = "size") -> int:
    """Parse a byte size.

    Args:
        value: int/float bytes, or a string such as ``"7GiB"``, ``"512 MiB"``, ``"24GB"``, ``"1e9"``.
        field: name used in the error message.
    Returns:
        The size in bytes (int).
    Raises:
        ValueError: naming the field, the value and the accepted forms.
    """
    if isinstance(value, bool):
        raise ValueError(f"{field}={value!r} is not a size; use bytes or a unit such as 7GiB, 512MiB")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{field}={value!r} is not a size: a finite number of bytes, or e.g. 7GiB, 512MiB")
        if value < 0:
            raise ValueError(f"{field}={value!r} must be >= 0 bytes")
        return int(value)
    if str(value).strip().startswith("-"):
        raise ValueError(f"{field}={value!r} must be >= 0 bytes")
    m = _SIZE_RE.match(str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(
            f"{field}={value!r} is not a size; use bytes (e.g. 7516192768) or a number with one of the "
            f"units B, KiB, MiB, GiB, TiB (binary) or KB, MB, GB, TB (decimal), case-insensitive "
            f"(e.g. 7GiB, 512MiB)"
        )
    size = float(m.group(1)) * _UNITS[unit]
    if size == float("inf"):
        raise ValueError(f"{field}={value!r} is not a size: a finite number of bytes, or e.g. 7GiB, 512MiB")
    return int(size)


def size_setting(value, field: str) -> int:
    """:func:`parse_size` of a config setting: bad input (ConfigError, exit 2) instead of ValueError."""
    try:
        return parse_size(value, field)
    except ValueError as e:
        raise ConfigError(str(e)) from None


GiB = 1 << 30
MiB = 1 << 20
