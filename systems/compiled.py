"""Compiled twins of the simulators' hot modules: the same source, compiled by Cython (setup.py).

A twin is an optional speed-up, never another implementation: ``systems/serving/simulator.py`` is
the rule, ``simulator.pxd`` beside it only gives C types to its hot locals and attributes, and
``setup.py`` compiles the two into ``systems.serving._simulator_c`` with the sha256 of both files
inside. :func:`twin` returns the compiled module only when that hash matches the files on disk;
otherwise (not built, built from an older source, or ``TTC_PURE_PYTHON=1``) it returns the
pure-Python module, and says why once per process (not when ``TTC_PURE_PYTHON=1`` asked for it).
Either gives the same results, bit for bit (``tests/test_compiled.py`` runs both and compares every
table).

:data:`LOADED` (module -> "compiled" | "pure" | "compiled and pure") is what this process ran,
recorded in ``run.json`` as ``compiled`` (written when the run used a module that has a twin): a
timing is only comparable with one of the same kind.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict

# the modules that have a twin, each with a .pxd beside its .py (setup.py compiles these)
MODULES = ("systems.serving.simulator", "systems.serving.driver", "systems.serving.gpu_model",
           "systems.serving.controllers", "systems.tts.sim")
PURE_ENV = "TTC_PURE_PYTHON"
LOADED: Dict[str, str] = {}
_said: set = set()


def twin_name(module: str) -> str:
    """``systems.serving.simulator`` -> ``systems.serving._simulator_c``."""
    pkg, _, leaf = module.rpartition(".")
    return f"{pkg}._{leaf}_c"


def file_sha256(root: Path, module: str) -> str:
    """sha256 of the module's .py and .pxd bytes under checkout ``root``: what setup.py compiles into
    its twin and :func:`twin` compares."""
    py = Path(root, *module.split(".")).with_suffix(".py")
    h = hashlib.sha256(py.read_bytes())
    h.update(py.with_suffix(".pxd").read_bytes())
    return h.hexdigest()


ROOT = Path(__file__).resolve().parent.parent         # the checkout holding systems/


def status(module: str) -> str:
    """Why :func:`twin` would give what it gives: "compiled", or the reason it runs pure Python."""
    if module not in MODULES:
        raise ValueError(f"{module} has no compiled twin; these do: {', '.join(MODULES)}")
    if os.environ.get(PURE_ENV) == "1":
        return f"{PURE_ENV}=1"
    try:
        spec = importlib.util.find_spec(twin_name(module))
    except ImportError:
        spec = None
    if spec is None:
        return ("not built (`.venv/bin/python setup.py build_ext --inplace` or pip install -e . builds it; needs "
                "Cython and a C compiler)")
    built = getattr(importlib.import_module(twin_name(module)), "SOURCE_SHA256", None)
    if built != file_sha256(ROOT, module):
        return ("built from another version of the source: rebuild with `.venv/bin/python setup.py build_ext "
                "--inplace` (or pip install -e . again)")
    return "compiled"


def twin(module: str, compiled: bool = True) -> ModuleType:
    """The compiled twin of ``module`` (one of :data:`MODULES`) when it is built from the source on
    disk, else the module itself; ``compiled=False``: the module itself (a caller whose speed does not
    matter, e.g. a real engine's driver), recorded as such. Raises ValueError for a module without a
    twin."""
    why = status(module) if compiled else "asked for"
    kind = "compiled" if why == "compiled" else "pure"
    LOADED[module] = kind if LOADED.get(module, kind) == kind else "compiled and pure"
    if kind == "compiled":
        return importlib.import_module(twin_name(module))
    if why.startswith(("built from", "not built")) and module not in _said:
        _said.add(module)
        print(f"note: {module}: its compiled twin is {why}; running the pure-Python module (same results, "
              f"slower; {PURE_ENV}=1 runs it on purpose)", file=sys.stderr)
    return importlib.import_module(module)
