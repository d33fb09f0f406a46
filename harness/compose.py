"""Composition cache for Hydra sweeps (used by ``hydra_plugins.harness_sweeper.FastBasicSweeper``).

``MemoConfigLoader`` composes a job's config with Hydra once per *defaults list*: jobs that differ
only in plain values (``beams=16`` vs ``beams=32``) reuse a cached composition of the same config
groups and get their values applied the way Hydra applies them
(``ConfigLoaderImpl._apply_overrides_to_config``), with ``hydra.overrides.task`` and
``hydra.job.override_dirname`` rebuilt. Anything it cannot reproduce exactly (``+``/``~`` overrides,
list or dict values, ``hydra.*`` sweep overrides) goes through Hydra unchanged.
tests/test_configs.py asserts the result equals Hydra's own composition, node for node.

The cache is a module global of each worker process. It lives here, in a regular package, because
Hydra re-executes modules under ``hydra_plugins/`` whenever it rescans plugins (a fresh cache per
job) and cloudpickle ships their classes by value.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import DictConfig, OmegaConf

_COMPOSED: Dict[Tuple, DictConfig] = {}     # per process: memo key -> pristine composed config
_PRIMITIVES = (str, int, float, bool, type(None))


class MemoConfigLoader(ConfigLoaderImpl):
    """A ``ConfigLoaderImpl`` whose ``load_sweep_config`` reuses compositions (see module doc)."""

    hits = 0            # per process, for tests and curiosity

    @classmethod
    def wrap(cls, loader: Any) -> Any:
        if isinstance(loader, cls) or not isinstance(loader, ConfigLoaderImpl):
            return loader
        return cls(config_search_path=loader.config_search_path)

    def _split(self, overrides: List[str]) -> Optional[Tuple[Tuple, List[Override], List[Override]]]:
        """(memo key, value overrides, task overrides), or None when the job must go through Hydra."""
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
        groups, values = [], []
        for o in parsed:
            if o.is_hydra_override():
                groups.append(o.input_line)           # from the master config: identical for all jobs
                continue
            value = o.value()
            if self.repository.group_exists(o.key_or_group) and not isinstance(value, dict):
                groups.append(o.input_line)
            elif (o.type == OverrideType.CHANGE and o.package is None and isinstance(value, _PRIMITIVES)
                  and not o.key_or_group.startswith("hydra.")):
                values.append(o)
            else:
                return None
        key = (tuple(groups), tuple(o.key_or_group for o in values))
        return key, values, [o for o in parsed if not o.is_hydra_override()]

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: List[str]) -> DictConfig:
        overrides = list(OmegaConf.to_container(master_config.hydra.overrides.hydra)) + list(sweep_overrides)
        split = self._split(overrides)
        if split is None:
            return super().load_sweep_config(master_config, sweep_overrides)
        key, values, task = split
        search_path = tuple((e.provider, e.path) for e in self.config_search_path.get_path())
        key = (master_config.hydra.job.config_name, search_path) + key
        cached = _COMPOSED.get(key)
        if cached is None:
            cfg = super().load_sweep_config(master_config, sweep_overrides)
            _COMPOSED[key] = copy.deepcopy(cfg)
            return cfg
        MemoConfigLoader.hits += 1
        cfg = copy.deepcopy(cached)
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        cfg.hydra.overrides.task = [o.input_line for o in task]
        dirname = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=task, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys)
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg
