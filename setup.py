"""Build the compiled twins of the simulators' hot modules (optional; everything else is in pyproject.toml).

A twin is the same Python source compiled by Cython, with C types for its hot locals and
attributes from the ``.pxd`` file beside it (Cython's "augmenting .pxd": the ``.py`` stays plain
Python and is the one source of the rules). ``systems/serving/simulator.py`` + ``simulator.pxd``
become the extension module ``systems.serving._simulator_c``; the source's sha256 is compiled in,
and :func:`systems.compiled.twin` uses a twin only when it matches the source on disk (else the
pure-Python module runs, with a note). Results are the same either way
(``tests/test_compiled.py`` runs both and compares every table).

No twin is built when Cython is missing or ``TTC_PURE_PYTHON=1`` is set; a twin that fails to
compile is skipped with a warning (``optional``). ``pip install -e .`` builds them next to their
sources (ignored by git); so does ``python setup.py build_ext --inplace`` after an edit.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
BUILD = Path("build") / "twins"          # generated sources (relative: setuptools wants relative paths)


def _compiled():
    """systems/compiled.py (stdlib only), loaded by path: its MODULES and the hash a twin carries."""
    spec = importlib.util.spec_from_file_location("_ttc_compiled", ROOT / "systems" / "compiled.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def twin_sources(module: str, sha256: str) -> Extension:
    """Write the twin's source (the module + its hash, under its own name) and its .pxd into
    build/twins, with the package __init__ files Cython needs to name it, and return its Extension."""
    rel = Path(*module.split(".")).with_suffix(".py")
    py = ROOT / rel
    pkg = rel.parent
    name = f"_{py.stem}_c"
    out = ROOT / BUILD / pkg
    out.mkdir(parents=True, exist_ok=True)
    for d in [*reversed(pkg.parents[:-1]), pkg]:            # systems/, systems/serving/
        (ROOT / BUILD / d / "__init__.py").touch()
    src = py.read_text() + f"\n\nSOURCE_SHA256 = {sha256!r}   # added by setup.py: the twin's source\n"
    for path, text in ((out / f"{name}.py", src), (out / f"{name}.pxd", py.with_suffix(".pxd").read_text())):
        if not path.exists() or path.read_text() != text:      # unchanged files keep their time: no rebuild
            path.write_text(text)
    # -ffp-contract=off: no fused multiply-add, so every float operation rounds as Python's does
    return Extension(".".join([*pkg.parts, name]), [str(BUILD / pkg / f"{name}.py")], optional=True,
                     extra_compile_args=["-O2", "-ffp-contract=off"])


def twins() -> list:
    if os.environ.get("TTC_PURE_PYTHON") == "1":
        print("setup.py: TTC_PURE_PYTHON=1: no compiled twins", file=sys.stderr)
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("setup.py: Cython not installed: no compiled twins (the pure-Python modules run)", file=sys.stderr)
        return []
    # annotation_typing off: the .py's annotations document, only the .pxd types
    c = _compiled()
    return cythonize([twin_sources(m, c.file_sha256(ROOT, m)) for m in c.MODULES], language_level=3, quiet=True,
                     build_dir=str(BUILD / "c"),
                     compiler_directives={"annotation_typing": False, "binding": False})


setup(ext_modules=twins())
