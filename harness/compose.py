"""Composition cache for Hydra sweeps (used by ``hydra_plugins.harness_sweeper.FastBasicSweeper``).

``MemoConfigLoader`` wraps Hydra's config loader behind Hydra's public ``ConfigLoader`` interface
and composes a job's config once per *defaults list*: jobs that differ only in plain values
(``beams=16`` vs ``beams=32``) reuse a cached composition of the same config groups and get their
values applied the way Hydra applies a plain override (``OmegaConf.update(cfg, key, value,
merge=True)`` on the struct config), with ``hydra.overrides.task`` and
``hydra.job.override_dirname`` rebuilt. Anything it cannot reproduce exactly (``+``/``~``
overrides, list or dict values, ``hydra.*`` sweep overrides, a key the config lacks) goes through
Hydra unchanged. tests/test_configs.py asserts the result equals Hydra's own composition, node for
node; tests/test_sweeps.py asserts no module of ours imports ``hydra._internal``.

The cache is a module global of each worker process. It lives here, in a regular package, because
Hydra re-executes modules under ``hydra_plugins/`` whenever it rescans plugins (a fresh cache per
job) and cloudpickle ships their classes by value.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Dict, List, Optional, Tuple

from hydra.core.config_loader import ConfigLoader
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

_COMPOSED: Dict[Tuple, DictConfig] = {}  # per process: memo key -> pristine composed config
_VIEWS: Dict[Tuple, DictConfig] = {}  # per process: memo key -> one config reused by job_view
_PARSED: Dict[str, Override] = {}  # per process: override string -> Hydra's parse of it
_PRIMITIVES = (str, int, float, bool, type(None))


class MemoConfigLoader(ConfigLoader):
    """A ``ConfigLoader`` whose ``load_sweep_config`` reuses compositions (see module doc); every
    other method is the wrapped loader's."""

    hits = 0  # per process, for tests and curiosity

    def __init__(self, inner: ConfigLoader) -> None:
        self.inner = inner
        self._is_group: Dict[str, bool] = {}

    @classmethod
    def wrap(cls, loader: ConfigLoader) -> ConfigLoader:
        return loader if isinstance(loader, cls) else cls(loader)

    # --- the cached path ------------------------------------------------------------------------
    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: List[str]) -> DictConfig:
        split = self._memo_key(master_config, sweep_overrides)
        if split is None:
            return self.inner.load_sweep_config(master_config, sweep_overrides)
        key, values, task = split
        cached = _COMPOSED.get(key)
        if cached is None:
            cfg = self.inner.load_sweep_config(master_config, sweep_overrides)
            _COMPOSED[key] = copy.deepcopy(cfg)
            return cfg
        # a fresh copy; pickle.loads of a pickled config would be ~7x faster, but the launcher schema
        # classes Hydra re-imports while scanning plugins cannot be pickled by name in a worker
        cfg = copy.deepcopy(cached)
        try:
            for o in values:  # Hydra's own step for a plain `key=value` override
                OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        except OmegaConfBaseException:  # e.g. a key the config lacks: Hydra says so its way
            return self.inner.load_sweep_config(master_config, sweep_overrides)
        MemoConfigLoader.hits += 1
        _set_task(cfg, task)
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg

    def job_view(self, master_config: DictConfig, sweep_overrides: List[str]) -> Optional[DictConfig]:
        """The job's config to read, not to keep: one config per defaults list, reused by every job
        of that list with the job's values set in place (no copy; each job sets the same keys, so
        the view holds exactly its job's values until the next call). None where
        :meth:`load_sweep_config` would go through Hydra (the caller then treats the job as unknown)."""
        split = self._memo_key(master_config, sweep_overrides)
        if split is None:
            return None
        key, values, task = split
        view = _VIEWS.get(key)
        if view is None:
            view = _VIEWS[key] = self.load_sweep_config(master_config, sweep_overrides)
        try:
            for o in values:
                OmegaConf.update(view, o.key_or_group, o.value(), merge=True)
        except OmegaConfBaseException:
            del _VIEWS[key]
            return None
        _set_task(view, task)
        return view

    def _memo_key(self, master_config: DictConfig, sweep_overrides: List[str]):
        """(memo key, value overrides, task overrides) of a job, or None when it must go through Hydra."""
        overrides = list(OmegaConf.to_container(master_config.hydra.overrides.hydra)) + list(sweep_overrides)
        split = self._split(overrides)
        if split is None:
            return None
        key, values, task = split
        search_path = tuple((e.provider, e.path) for e in self.inner.get_search_path().get_path())
        return (master_config.hydra.job.config_name, search_path) + key, values, task

    def _split(self, overrides: List[str]) -> Optional[Tuple[Tuple, List[Override], List[Override]]]:
        """(memo key, value overrides, task overrides), or None when the job must go through Hydra."""
        parsed = [_parse(line) for line in overrides]
        groups, values = [], []
        for o in parsed:
            if o.is_hydra_override():
                groups.append(o.input_line)  # from the master config: identical for all jobs
                continue
            value = o.value()
            if self._group_exists(o.key_or_group) and not isinstance(value, dict):
                groups.append(o.input_line)
            elif (
                o.type == OverrideType.CHANGE
                and o.package is None
                and isinstance(value, _PRIMITIVES)
                and not o.key_or_group.startswith("hydra.")
            ):
                values.append(o)
            else:
                return None
        key = (tuple(groups), tuple(o.key_or_group for o in values))
        return key, values, [o for o in parsed if not o.is_hydra_override()]

    def _group_exists(self, key: str) -> bool:
        if key not in self._is_group:
            parent, _, name = key.rpartition("/")
            self._is_group[key] = name in self.inner.list_groups(parent)
        return self._is_group[key]

    # --- the rest of the ConfigLoader interface: the wrapped loader's -----------------------------
    def load_configuration(
        self,
        config_name: Optional[str],
        overrides: List[str],
        run_mode: RunMode,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> DictConfig:
        return self.inner.load_configuration(
            config_name, overrides, run_mode, from_shell=from_shell, validate_sweep_overrides=validate_sweep_overrides
        )

    def get_search_path(self) -> Any:
        return self.inner.get_search_path()

    def get_sources(self) -> List[Any]:
        return self.inner.get_sources()

    def list_groups(self, parent_name: str) -> List[str]:
        return self.inner.list_groups(parent_name)

    def get_group_options(
        self,
        group_name: str,
        results_filter: Optional[ObjectType] = ObjectType.CONFIG,
        config_name: Optional[str] = None,
        overrides: Optional[List[str]] = None,
    ) -> List[str]:
        return self.inner.get_group_options(group_name, results_filter, config_name, overrides)

    def compute_defaults_list(self, config_name: Optional[str], overrides: List[str], run_mode: RunMode) -> Any:
        return self.inner.compute_defaults_list(config_name, overrides, run_mode)


def _set_task(cfg: DictConfig, task: List[Override]) -> None:
    """``hydra.overrides.task`` and ``hydra.job.override_dirname`` of a job, as Hydra sets them."""
    cfg.hydra.overrides.task = [o.input_line for o in task]
    dirname = cfg.hydra.job.config.override_dirname
    cfg.hydra.job.override_dirname = override_dirname(task, dirname.exclude_keys, dirname.item_sep, dirname.kv_sep)


def _parse(line: str) -> Override:
    """Hydra's parse of one override string, once per process (ANTLR parsing costs ~0.7 ms each)."""
    if line not in _PARSED:
        _PARSED[line] = OverridesParser.create().parse_overrides(overrides=[line])[0]
    return _PARSED[line]


def job_dirname(job: List[str], dirname_cfg) -> str:
    """A sweep job's folder name (``hydra.sweep.subdir``: its ``hydra.job.override_dirname``, made a
    safe name by :func:`harness.config.job_folder_name`) from its override strings and
    ``hydra.job.config.override_dirname`` (exclude_keys, item_sep, kv_sep)."""
    from harness.config import job_folder_name

    return job_folder_name(
        override_dirname(
            [_parse(line) for line in job], dirname_cfg.exclude_keys, dirname_cfg.item_sep, dirname_cfg.kv_sep
        )
    )


def override_dirname(task: List[Override], exclude_keys: List[str], item_sep: str, kv_sep: str) -> str:
    """``hydra.job.override_dirname`` as Hydra builds it: the task overrides not in
    ``exclude_keys``, sorted, joined by ``item_sep``, each ``=`` replaced by ``kv_sep``."""
    lines = sorted(o.input_line for o in task if o.key_or_group not in exclude_keys)
    return re.sub("=", kv_sep, item_sep.join(lines))
