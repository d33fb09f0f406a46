"""Errors shared by every family (a leaf module: imports nothing of ours).

- :class:`ConfigError`: bad input, raised before any work (exit code 2).
- :class:`RunOOM`: a configuration does not fit in (real or simulated) memory: a recorded result
  (status ``oom``), never a crash.
- :class:`RunInterrupted`: a job was interrupted (SIGINT, Ctrl-C) and its record (status
  ``interrupted``) written; raised after the record so the process or sweep stops.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is not allowed. The message names the field, the value and what is allowed."""


class RunOOM(RuntimeError):
    """Raised by an engine or a memory plan when the configuration does not fit in (real or simulated) memory."""


class RunInterrupted(KeyboardInterrupt):
    """A job interrupted by SIGINT (Ctrl-C) whose record is at ``record``: ``status`` interrupted
    (what it had done kept, as the runner returned it), or the status of a job whose work had ended
    when the signal came (held until its record was written); a KeyboardInterrupt, so whatever does
    not know it stops as on Ctrl-C."""

    def __init__(self, record: str, status: str = "interrupted"):
        super().__init__(record)
        self.record, self.status = record, status


# What a value of each OmegaConf node type must be, in a message (``IntegerNode`` -> "an integer").
TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false"}


def bad(field_name: str, value: Any, allowed: str) -> ConfigError:
    """Build a ConfigError naming the field, the value and what is allowed."""
    return ConfigError(f"{field_name}={value!r} is not allowed: {allowed}")


__all__ = ["ConfigError", "RunInterrupted", "RunOOM", "TYPE_WORDS", "bad"]
