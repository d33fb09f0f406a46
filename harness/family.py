"""The contract between the harness and a system family.

A family (the LBS engine's, FastTTS's, BEAM's) is one package under ``systems/`` that exports one
:class:`Family`; :data:`systems.families.FAMILIES` lists them and :func:`families` is how the harness finds
them (the one place it imports ``systems``). A run of ``system=<name>`` goes to the family its
``conf/system/<name>.yaml`` names in ``family:``: the harness validates the config with the family's
``validate`` (before any work), resolves the backend from its ``real_engine``, and calls its ``run``
with a :class:`RunContext`; ``run`` returns a :class:`RunResult`, which the harness records.
``docs/adding_a_family.md`` walks through a family of one's own.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from harness.errors import ConfigError

# A runner that warms its engine up before measuring puts the warm-up's wall time (s) in its summary
# under this key; the warm-up is excluded from every other timing, and the record says so per repeat.
WARMUP_KEY = "warmup_s"


@dataclass
class RunResult:
    """What a family's ``run`` returns.

    status: ok | oom | timeout (system.deadline passed) | error | interrupted (SIGINT, SIGTERM).
    summary: scalar metrics (SI units: seconds, bytes, joules) stored in run.json (``WARMUP_KEY``:
        a warm-up's wall time, excluded from the other timings).
    display: rows (label, key, formatter) for the printed table; values come from ``summary``,
        so the printed table and the record cannot disagree.
    tables: name -> pandas DataFrame, list of row dicts or dict of columns (name -> numpy array),
        each written as ``<name>.parquet``.
    extra: stored verbatim in run.json.
    """

    status: str = "ok"
    message: str = ""
    summary: Dict[str, Any] = field(default_factory=dict)
    display: List[Tuple[str, str, Callable[[Any], str]]] = field(default_factory=list)
    tables: Dict[str, Any] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RunContext:
    """What a family's ``run`` gets besides its config: the backend (harness.backend.Backend), the
    job's folder, its tracker (harness.tracking) and whether to draw progress bars."""

    cfg: Any
    backend: Any
    outdir: Path
    tracker: Any
    show_progress: bool = True

    def progress(self, total: int, desc: str):
        """A tqdm bar (stderr) for steps done / total inside the job; none (a bar that draws nothing,
        without importing tqdm) when stderr is not a terminal: a log file would keep the bar's
        carriage returns glued to the next output."""
        if not (self.show_progress and sys.stderr.isatty()):
            return _NoBar()
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)


class _NoBar:
    """The part of tqdm's interface runners use (update, close, ``with``), doing nothing."""

    def update(self, n: int = 1) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc) -> None: ...


def _nothing(*args) -> None:
    return None


def _no_settings(cfg, overrides) -> List[str]:
    return []


@dataclass(frozen=True)
class Family:
    """One system family, as the harness sees it.

    name: what ``system.family`` says in conf/system/*.yaml, and run.json's ``family``.
    validate(cfg): raise ConfigError (harness.errors.bad) for bad input, before any work.
    run(cfg, ctx) -> RunResult: the job; raise harness.errors.RunOOM when it does not fit.
    register_configs(cs): store the family's structured-config schemas in Hydra's ConfigStore.
    real_engine: the backend that runs it for real (``torch`` | ``vllm``), None when simulated only.
    validate_backend(cfg, backend): checks that need the resolved backend (e.g. a CPU's limits).
    ignored_settings(cfg, overrides) -> warnings for settings given that this run does not read.
    uses_verifier: whether ``verifier=`` means anything to it (else a single run warns).
    former_names: the family's names in records written before a rename.
    """

    name: str
    validate: Callable[[Any], None]
    run: Callable[[Any, RunContext], RunResult]
    register_configs: Callable[[Any], None]
    real_engine: Optional[str] = None
    validate_backend: Callable[[Any, Any], None] = _nothing
    ignored_settings: Callable[[Any, Optional[List[str]]], List[str]] = _no_settings
    uses_verifier: bool = False
    former_names: Tuple[str, ...] = ()


def families() -> Dict[str, Family]:
    """Every family by name (systems.families.FAMILIES)."""
    from systems.families import FAMILIES

    return {f.name: f for f in FAMILIES}


def family_of(cfg) -> Family:
    """The family of the config's system. Raises ConfigError naming the families there are."""
    name = cfg.system.family
    known = families()
    if name not in known:
        raise ConfigError(
            f"system={cfg.system.name!r} names family {name!r}, which is not a family: one of {', '.join(known)} "
            f"(systems.families.FAMILIES)"
        )
    return known[name]


def current_name(recorded: str) -> str:
    """A record's ``family`` as the family is called now (a name it had before a rename maps to it)."""
    for f in families().values():
        if recorded == f.name or recorded in f.former_names:
            return f.name
    return recorded
