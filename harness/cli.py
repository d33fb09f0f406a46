"""Command-line pre-flight for ``run.py``: our ``--help``, and bad overrides stopped with our message.

Hydra's own messages for a typo list internal ``_*_schema`` entries (``system=lbss``) or say
"Key 'sytem' is not in struct" and exit 1. Before Hydra starts, :func:`preflight` checks every
``key=value`` argument: a config group's option must exist (``conf/<group>/<option>.yaml``), and a
key must exist in ``conf/config.yaml`` or in some option or schema of its group; otherwise a
ConfigError names the key and the nearest valid one (exit 2); a value a typed schema field cannot
hold (``system.prefetch=maybe``) is named with the type allowed. ``+key=`` (add), ``~key`` (delete),
``hydra.*`` and arguments with sweep functions or interpolations are left to Hydra.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from harness.errors import TYPE_WORDS, ConfigError, bad

CONFIG_GROUPS = ("hardware", "model", "verifier", "workload", "system", "backend", "tracking", "experiment")
_OWN_SEARCH_PATH = ("--config-dir", "-cd", "--config-path", "-cp", "hydra.searchpath")
_HYDRA_FLAGS = (
    "-m",
    "--multirun",
    "--cfg",
    "-c",
    "--resolve",
    "--info",
    "-i",
    "--package",
    "-p",
    "--run",
    "-r",
    "--hydra-help",
    "--version",
    "--shell-completion",
    "-sc",
    "--experimental-rerun",
)

EXAMPLES = """\
  python run.py system=lbs model=opt-6.7b beams=64                      # LBS, simulated RTX 4090 without a GPU
  python run.py system=layerwise backend=torch model=tiny-opt beams=16 step=32 gen_len=256 kv_budget=16MiB
  python run.py system=beam model=llama-3.3-70b hardware=a100-80gb tp=2 pp=4 workload=servegen
  python run.py system=fasttts model=qwen2.5-math-1.5b verifier=skywork-prm-1.5b workload=aime24 n=64
  python run.py -m experiment=lbs_fig9                                  # a paper figure: sweep + figure + table"""


def group_options(conf_dir: Path, group: str) -> List[str]:
    """The options of config group ``group`` (``conf/<group>/*.yaml``, schemas ``_*`` left out), sorted."""
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml") if not p.stem.startswith("_"))


def usage(conf_dir) -> str:
    """Our ``--help``: what run.py does, the config groups and their options, the top-level
    shortcuts, and example commands."""
    from omegaconf import OmegaConf

    conf_dir = Path(conf_dir)
    root = OmegaConf.load(conf_dir / "config.yaml")
    lines = [
        "usage: python run.py [-m] [group=option ...] [key=value ...]",
        "",
        "Runs one job (or, with -m, a sweep) composed from one option of each config group, and",
        "records it under results/ (run.json + parquet tables). Without a CUDA GPU, backend=auto",
        "simulates the hardware profile's GPU and labels every number simulated.",
        "",
        "config groups (group=option):",
    ]
    for g in CONFIG_GROUPS:
        lines.append(f"  {g:<10} {', '.join(group_options(conf_dir, g))}")
    lines += ["", "shortcuts (key=value; null = the group's own default):"]
    raw = OmegaConf.to_container(root, resolve=False)
    shortcuts = [k for k, v in raw.items() if k not in ("defaults", "hydra") and not isinstance(v, dict)]
    lines.append("  " + ", ".join(shortcuts))
    lines += [
        "",
        "any field: group.field=value (e.g. system.prefetch=false, workload.num_problems=5)",
        "",
        "examples:",
        EXAMPLES,
        "",
        "python run.py --hydra-help shows Hydra's own flags (--cfg job prints the composed config).",
    ]
    return "\n".join(lines)


def _keys_of(node) -> Optional[Dict]:
    """Nested key tree of a config node; None for an open mapping (a Dict[str, Any] field)."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(node, DictConfig):
        return {}
    if len(node) == 0:
        return None
    out: Dict = {}
    for k in node.keys():
        v = node._get_node(k)
        out[str(k)] = _keys_of(v) if OmegaConf.is_dict(v) else {}
    return out


def _merge(a: Optional[Dict], b: Optional[Dict]) -> Optional[Dict]:
    if a is None or b is None:
        return None
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if k in out else v
    return out


def _group_tree(conf_dir: Path, group: str) -> Dict:
    """Union of the key trees of every option and schema of ``group``."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    tree: Dict = {}
    for p in sorted((conf_dir / group).glob("*.yaml")):
        y = OmegaConf.load(p)
        if "defaults" in y:
            y.pop("defaults")
        tree = _merge(tree, _keys_of(y)) or {}
    for node in (ConfigStore.instance().repo.get(group) or {}).values():
        if hasattr(node, "node"):
            tree = _merge(tree, _keys_of(node.node)) or {}
    return tree


def _nearest(key: str, candidates: Iterable[str]) -> str:
    m = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.5)
    return f"; did you mean {m[0]!r}?" if m else ""


def _top_level_keys(path: Path) -> set:
    """The top-level keys of a yaml file, read by pyyaml (its C loader where built: ~0.5 ms; building
    the file's DictConfig with OmegaConf.load cost every command ~13 ms)."""
    import yaml

    return {str(k) for k in yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))}


def check_key(key: str, conf_dir, _cache: Optional[dict] = None) -> None:
    """Raise ConfigError unless the dotted ``key`` exists in config.yaml or some option/schema of
    its group (open mappings such as ``hardware.sources`` accept any sub-key)."""
    conf_dir = Path(conf_dir)
    cache = _cache if _cache is not None else {}
    if "root" not in cache:
        cache["root"] = (_top_level_keys(conf_dir / "config.yaml") - {"defaults"}) | set(CONFIG_GROUPS)
    parts = key.split(".")
    top = parts[0]
    if top not in cache["root"]:
        raise ConfigError(
            f"{key!r} is not a config key{_nearest(top, cache['root'])} "
            f"(python run.py --help lists the groups and shortcuts)"
        )
    if len(parts) == 1 or top not in CONFIG_GROUPS:
        return
    tree = cache.get(top) or cache.setdefault(top, _group_tree(conf_dir, top))
    for i, p in enumerate(parts[1:], start=1):
        if tree is None:  # open mapping: any sub-key
            return
        if p not in tree:
            prefix = ".".join(parts[:i])
            raise ConfigError(
                f"{key!r} is not a config key: {prefix} has no field {p!r}"
                f"{_nearest(p, tree)} (fields: {', '.join(sorted(tree))})"
            )
        tree = tree[p]


def _option_tree(conf_dir: Path, group: str, option: str) -> Optional[Dict]:
    """Key tree of one option of ``group`` (``conf/<group>/<option>.yaml`` and the schemas its defaults
    name, ``_..._schema``); {} when it cannot be read (Hydra's to report)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    try:
        y = OmegaConf.load(conf_dir / group / f"{option}.yaml")
    except Exception:
        return {}
    schemas = [
        d
        for d in (y.pop("defaults") if "defaults" in y else [])
        if isinstance(d, str) and d.startswith("_") and d != "_self_"
    ]
    tree = _keys_of(y)
    repo = ConfigStore.instance().repo.get(group) or {}
    for name in schemas:
        node = repo.get(f"{name}.yaml")
        if node is not None and hasattr(node, "node"):
            tree = _merge(tree, _keys_of(node.node))
    return tree


def check_key_of_options(key: str, args: List[str], conf_dir) -> None:
    """A key that some option of its group has, but not the one(s) the command selects
    (``system=lbs system.window_s=3``: a BEAM field) was Hydra's "Could not override" with exit 1.
    Raises ConfigError naming the options that have it. Only for ``group=option`` on the command line."""
    group, *path = key.split(".")
    chosen = [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == group]
    if not path or group not in CONFIG_GROUPS or not chosen or any(c in chosen[-1] for c in "()[]{}*$"):
        return
    conf_dir = Path(conf_dir)

    def has(option: str) -> bool:
        tree = _option_tree(conf_dir, group, option)
        for p in path:
            if tree is None:  # an open mapping: any sub-key
                return True
            if p not in tree:
                return False
            tree = tree[p]
        return True

    lacking = [o for o in (x.strip() for x in chosen[-1].split(",")) if o and not has(o)]
    if lacking:
        others = [o for o in group_options(conf_dir, group) if not o.startswith("_") and has(o)]
        raise ConfigError(
            f"{key!r} is not a field of {group}={','.join(lacking)}; it is a field of "
            f"{group}={', '.join(others) or '(none)'} (python run.py {group}={lacking[0]} --cfg job "
            f"shows that option's fields)"
        )


def _option_keys(conf_dir: Path, group: str, option: str) -> Optional[Dict]:
    """The keys one option of ``group`` sets in its own yaml (an empty mapping as {}, not the schemas'
    open ones); None when it cannot be read or extends another option (its defaults name one)."""
    from omegaconf import DictConfig, OmegaConf

    def keys(node) -> Dict:
        if not isinstance(node, DictConfig):
            return {}
        return {str(k): keys(node._get_node(k)) if OmegaConf.is_dict(node._get_node(k)) else {} for k in node.keys()}

    try:
        y = OmegaConf.load(conf_dir / group / f"{option}.yaml")
    except Exception:
        return None
    defaults = y.pop("defaults") if "defaults" in y else []
    if any(isinstance(d, str) and not d.startswith("_") for d in defaults):
        return None
    return keys(y)


def check_mapping_key(key: str, value: str, args: List[str], conf_dir, _cache: Optional[dict] = None) -> None:
    """A key into an open mapping of its group (``hardware.mem_bw_by_rows.4``, ``hardware.power.x``)
    that the selected option does not hold was Hydra's "Could not override ... Key '4' is not in
    struct" with exit 1: raises ConfigError saying to add it with ``+``. The option is the one on the
    command line, else ``conf/config.yaml``'s default; with an experiment or a sweep of the group,
    Hydra decides."""
    import yaml

    group, *path = key.split(".")
    if group not in CONFIG_GROUPS or not path or any(a.split("=", 1)[0] in ("experiment", "+experiment") for a in args):
        return
    conf_dir = Path(conf_dir)
    cache = _cache if _cache is not None else {}
    tree: Optional[Dict] = cache.get(group) or cache.setdefault(group, _group_tree(conf_dir, group))  # check_key's
    depth = 0
    while tree is not None and depth < len(path) and path[depth] in tree:
        tree, depth = tree[path[depth]], depth + 1
    if tree is not None or depth >= len(path):  # not a key inside an open mapping
        return
    chosen = [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == group]
    if chosen:
        option = chosen[-1]
    else:
        defaults = yaml.safe_load((conf_dir / "config.yaml").read_text()).get("defaults") or []
        option = next((d[group] for d in defaults if isinstance(d, dict) and group in d), None)
    if not option or any(c in str(option) for c in ",()[]{}*$"):
        return
    node = _option_keys(conf_dir, group, str(option))
    if node is None:  # an option that cannot be read or extends another: Hydra's to report
        return
    for p in path[:depth]:  # down to the mapping, as this option sets it ({} where it sets nothing)
        node = node.get(p, {})
    held = sorted(node)
    for p in path[depth:]:
        if p not in node:
            mapping = ".".join([group, *path[:depth]])
            raise ConfigError(
                f"{key!r}: {group}={option} has no {key} to override ({mapping} holds "
                f"{', '.join(held) if held else 'nothing'}); add it with +{key}={value}"
            )
        node = node[p]


def check_value_type(key: str, value: str, whole: bool = False) -> None:
    """Raise ConfigError when ``value`` (each value of an ``a,b`` sweep; ``whole``: the value as one,
    a list literal ``[1,2]``) converts to the type of the field ``key`` in none of its group's schemas
    that declare it as a bool, an integer or a number (``system.prefetch=maybe``,
    ``hardware.memory_bytes=[1,2]``: Hydra's "Error merging override", exit 1)."""
    group, *path = key.split(".")
    if not path:  # ``system=lbs`` selects an option: check_group_options' job
        return
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf, ValueNode
    from omegaconf.errors import ValidationError

    typed = []  # (the field's node in a schema, "an integer" / ...)
    for entry in (ConfigStore.instance().repo.get(group) or {}).values():
        node = getattr(entry, "node", None)
        for p in path:
            node = node._get_node(p) if OmegaConf.is_dict(node) and p in node.keys() else None
        word = TYPE_WORDS.get(type(node).__name__.removesuffix("Node"))
        if isinstance(node, ValueNode) and word:
            typed.append((node, word))
    for v in [value] if whole else (x.strip() for x in value.split(",")):
        if typed and v != "null" and not any(_converts(node, v, ValidationError) for node, _ in typed):
            raise bad(key, v, typed[0][1])


def _converts(node, value: str, error) -> bool:
    try:
        node.validate_and_convert(value)
        return True
    except error:
        return False


def check_group_options(args, conf_dir) -> None:
    """Raise ConfigError for a command-line ``group=option`` (or ``group=a,b`` sweep) naming no
    ``conf/<group>/<option>.yaml``, listing the options that exist, and for a list of options
    (``group=[a,b]``: Hydra composes them into one run, silently)."""
    conf_dir = Path(conf_dir)
    for a in args:
        if "=" not in a or a[0] in "+~-":
            continue
        key, value = a.split("=", 1)
        if key in CONFIG_GROUPS and value.strip().startswith("["):  # Hydra merges a list's options into one
            raise bad(
                key,
                value,
                f"one option of conf/{key}/ (a list composes its options into one run, the last one's "
                f"values winning: {key}=[lbs,layerwise] ran layerwise); to run each, sweep them: "
                f"python run.py -m {key}={value.strip().strip('[]')}",
            )
        if key not in CONFIG_GROUPS or any(c in value for c in "()[]{}*$"):
            continue
        for v in (x.strip() for x in value.split(",")):
            if not (v and (conf_dir / key / f"{v}.yaml").exists()):  # empty: left to Hydra's own error
                raise bad(key, v, f"one of {', '.join(group_options(conf_dir, key))} (conf/{key}/*.yaml)")


_MODES = {
    "-m": "--multirun",
    "--multirun": "--multirun",
    "--cfg": "--cfg",
    "-c": "--cfg",
    "--info": "--info",
    "-i": "--info",
    "--run": "--run",
    "-r": "--run",
}


def check_mode_flags(args: List[str]) -> None:
    """Hydra runs one mode per command (``--multirun``, ``--cfg``, ``--info``, ``--run``); two of
    them was Hydra's ValueError traceback. Raises ConfigError naming both and what to run instead."""
    modes = list(dict.fromkeys(_MODES[a.split("=", 1)[0]] for a in args if a.split("=", 1)[0] in _MODES))
    if len(modes) < 2:
        return
    hint = ""
    if "--multirun" in modes and ("--cfg" in modes or "--info" in modes):
        hint = (
            "; to see a sweep job's config, drop -m and give one value per swept key "
            "(python run.py experiment=NAME KEY=VALUE --cfg job)"
        )
    raise ConfigError(
        f"{' and '.join(modes)} cannot be combined: Hydra runs one of --run, --multirun, "
        f"--cfg, --info per command{hint}"
    )


def _experiment_is_a_sweep(name: str, conf_dir) -> bool:
    """Whether ``conf/experiment/<name>.yaml`` (or an experiment it lists in its defaults) sets
    ``hydra.mode: MULTIRUN``: a sweep without -m."""
    import yaml

    path = Path(conf_dir) / "experiment" / f"{name}.yaml"
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    if str(((doc.get("hydra") or {}).get("mode")) or "").upper() == "MULTIRUN":
        return True
    return any(
        _experiment_is_a_sweep(d, conf_dir)
        for d in doc.get("defaults") or ()  # an experiment it extends
        if isinstance(d, str) and d != "_self_" and d != name
    )


def _sweeps(args: List[str], conf_dir) -> bool:
    """Whether the command runs a sweep: ``-m``, ``hydra.mode=MULTIRUN``, or an experiment that sets it."""
    return any(a in ("-m", "--multirun") or a.replace(" ", "") == "hydra.mode=MULTIRUN" for a in args) or any(
        _experiment_is_a_sweep(a.split("=", 1)[1], conf_dir) for a in args if a.startswith("experiment=")
    )


def _top_level_comma(value: str) -> bool:
    """Whether ``value`` holds a comma outside brackets and quotes (Hydra's sweep syntax ``a,b``)."""
    depth, quote = 0, None
    for c in value:
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            return True
    return False


def check_sweep_values(args: List[str], conf_dir) -> None:
    """``system=in_gpu,layerwise`` without ``-m`` was Hydra's "Ambiguous value" with exit 1: the same
    advice, as a ConfigError (exit 2). Raises ConfigError."""
    if _sweeps(args, conf_dir) or any(a.split("=", 1)[0] in _MODES for a in args):
        return
    for a in args:
        key, eq, value = a.partition("=")
        if eq and not key.startswith("-") and _top_level_comma(value):
            raise ConfigError(
                f"{a} is a sweep over {value.count(',') + 1} values, and this is a single run: add -m to "
                f"sweep (python run.py -m ... {a}); for a list write {key}=[{value}], for a string "
                f"holding a comma quote it: {key}='{value}'"
            )


def check_report(args: List[str], conf_dir) -> None:
    """A command-line ``report=module.function`` must name a function (it is called at a sweep's end
    with ``(sweep_dir, runs, cfg)``), checked before any job runs. Raises
    ConfigError naming the value and what is allowed. Without ``-m`` it warns that the report will
    not run (a single run has no sweep end)."""
    multirun = _sweeps(args, conf_dir)
    for a in args:
        key, _, value = a.partition("=")
        if key.lstrip("+") != "report" or value in ("", "null"):
            continue
        if not multirun:
            print(
                f"warning: report={value} has no effect: a report runs at a sweep's end (python run.py -m ...); "
                f"this is a single run",
                file=sys.stderr,
            )
        mod, _, fn = value.rpartition(".")
        try:
            why = "" if callable(getattr(importlib.import_module(mod), fn, None)) else f"{mod} has no function {fn!r}"
        except Exception as e:  # noqa: BLE001 - any import failure is the value's
            why = f"{type(e).__name__}: {e}" if mod else "not a dotted module.function"
        if why:
            raise bad(
                "report",
                value,
                "a module.function called at a sweep's end with (sweep_dir, runs, cfg), "
                f"e.g. systems.kv_offload.report.fig9, or null ({why})",
            )


def hydra_group_options(conf_dir, group: str) -> List[str]:
    """The options of a Hydra group ``hydra/<group>`` (``launcher``, ``sweeper``, ...): this project's
    ``conf/hydra/<group>/*.yaml``, Hydra's own and its plugins' (ConfigStore)."""
    import hydra
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # registers the installed plugins' configs
    names = {
        p.stem
        for d in (Path(conf_dir) / "hydra" / group, Path(hydra.__file__).parent / "conf" / "hydra" / group)
        if d.is_dir()
        for p in d.glob("*.yaml")
    }
    node = ConfigStore.instance().repo.get("hydra", {}).get(group, {})
    names |= {k[:-5] for k in node if isinstance(k, str) and k.endswith(".yaml")}
    return sorted(names)


def check_hydra_groups(args, conf_dir) -> None:
    """A command-line ``hydra/<group>=option`` must name an option of the group (``hydra/launcher=foo``
    does not). Raises ConfigError listing the options."""
    for a in args:
        key, _, value = a.partition("=")
        key = key.lstrip("+~")
        if not key.startswith("hydra/") or "=" not in a or any(c in value for c in "()[]{}*$,"):
            continue
        allowed = hydra_group_options(conf_dir, key.split("/", 1)[1])
        if not allowed:  # hydra/foo: no such group
            known = ", ".join(f"hydra/{g}" for g in ("launcher", "sweeper", "hydra_logging", "job_logging"))
            raise ConfigError(f"{key} is not a Hydra config group: use one such as {known}")
        if value not in allowed:
            raise bad(key, value, f"one of {', '.join(allowed)}")


def note_implicit_sweep(args: List[str], conf_dir) -> None:
    """An experiment whose yaml sets ``hydra.mode: MULTIRUN`` runs its whole sweep without ``-m``
    (``run.py experiment=lbs_fig9`` runs its 225 jobs on every core): say so first."""
    if any(a.split("=", 1)[0] in _MODES or a.replace(" ", "").startswith("hydra.mode=") for a in args):
        return  # -m, --cfg / --info, or a mode of the user's own
    for a in args:
        if a.startswith("experiment=") and _experiment_is_a_sweep(a.split("=", 1)[1], conf_dir):
            print(
                f"note: {a} is a sweep (its hydra.mode is MULTIRUN): every job of it runs, as with -m; "
                f"give one value per swept key with hydra.mode=RUN for a single job",
                file=sys.stderr,
            )


def preflight(args: List[str], conf_dir) -> None:
    """All command-line checks before Hydra starts. Raises ConfigError."""
    check_mode_flags(args)
    check_report(args, conf_dir)
    check_sweep_values(args, conf_dir)
    note_implicit_sweep(args, conf_dir)
    if any(a.split("=", 1)[0] in _OWN_SEARCH_PATH for a in args):
        return  # another config search path: Hydra decides
    check_hydra_groups(args, conf_dir)
    check_group_options(args, conf_dir)
    cache: dict = {}
    for a in args:
        if "=" not in a or a[0] in "+~-" or a.split("=", 1)[0] in _HYDRA_FLAGS:
            continue
        key = a.split("=", 1)[0]
        if (
            key.startswith("hydra.")
            or key == "hydra"
            or not key.replace(".", "").replace("_", "").replace("-", "").isalnum()
        ):
            continue
        check_key(key, conf_dir, cache)
        check_key_of_options(key, args, conf_dir)
        value = a.split("=", 1)[1]
        check_mapping_key(key, value, args, conf_dir, cache)
        if key.split(".")[0] in CONFIG_GROUPS:
            if value.startswith("[") and value.endswith("]"):  # a list literal: whole, not a sweep
                check_value_type(key, value, whole=True)
            elif not any(c in value for c in "()[]{}*$'\""):
                check_value_type(key, value)


def check_tool_values(
    values: Dict[str, str],
    ints: Iterable[str] = (),
    flags: Iterable[str] = (),
    groups: Iterable[str] = (),
    files: Iterable[str] = (),
) -> None:
    """A tool's own ``key=value`` arguments, checked before it calibrates or runs anything
    (a bad value would otherwise surface after minutes of calibration, or lose it): each of ``ints`` present an
    integer >= 1, each of ``flags`` true or false, each of ``groups`` (a config group's name as the
    key) an option of it (:func:`check_group_options`), each of ``files`` a file path whose folder
    can be made. Raises ConfigError."""
    from harness.records import check_creatable

    for k in files:
        if k in values:
            if not values[k].strip() or Path(values[k]).is_dir():
                raise bad(k, values[k], "a file path (the file to write), not a folder")
            check_creatable(Path(values[k]).resolve().parent, k)
    for k in ints:
        if k in values:
            try:
                ok = int(values[k]) >= 1
            except ValueError:
                ok = False
            if not ok:
                raise bad(k, values[k], "an integer >= 1")
    for k in flags:
        if k in values and values[k] not in ("true", "false"):
            raise bad(k, values[k], "true or false")
    check_group_options(
        [f"{k}={values[k]}" for k in groups if k in values], Path(__file__).resolve().parent.parent / "conf"
    )


def tool_args(argv: List[str], doc: str, allowed: Optional[Iterable[str]] = None) -> Dict[str, str]:
    """The ``key=value`` arguments of one of the project's ``python -m`` tools (calibration, fidelity),
    as a dict, checked before any work: ``-h``/``--help`` prints ``doc`` (the tool's module docstring)
    and exits 0; an argument that is not ``key=value``, or (with ``allowed``) a key outside ``allowed``,
    exits 2 with what is allowed. ``allowed`` None: any key (a tool that passes the rest to run.py).
    Raises SystemExit."""
    if any(a in ("-h", "--help") for a in argv):
        print(doc.strip())
        raise SystemExit(0)
    out: Dict[str, str] = {}
    for a in argv:
        key, eq, value = a.partition("=")
        if not eq or not key:
            print(
                f"error: argument {a!r} is not allowed: key=value arguments only (--help lists them)", file=sys.stderr
            )
            raise SystemExit(2)
        if allowed is not None and key not in allowed:
            print(
                f"error: {key!r} is not an option of this tool{_nearest(key, allowed)} (its options: "
                f"{', '.join(sorted(allowed))}; --help shows its usage)",
                file=sys.stderr,
            )
            raise SystemExit(2)
        out[key] = value
    return out
