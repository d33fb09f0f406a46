"""The import contract: every module of harness/, systems/, workloads/ imports in a fresh process; the
import graph has no cycles; policy modules import neither torch nor vllm nor the run lifecycle
(harness.run), directly or through other modules.

The graph is read from the source (``ast``): every ``import`` statement, also those inside functions
(a deferred import is still a dependency; the issue's three cycles went through such imports),
except under ``if TYPE_CHECKING:``. One edge is the plugin point, not a dependency:
``harness.family.families()`` reading the family list ``systems.families`` (the harness runs the
families it finds there; they import the harness, never the reverse) (:data:`PLUGIN_EDGES`).

The families are siblings: no family package imports another (machinery two of them use lives in
``systems.common``).
"""

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "systems", "workloads")

# Policies decide (which beams/requests run, which clock/chunk, which speculation); plain Python
# shared by the real and simulated backends (docs/design.md). New policy modules belong here.
POLICY_MODULES = (
    "systems.kv_offload.plan",
    "systems.kv_offload.beamset",
    "systems.kv_offload.tree",
    "systems.kv_offload.analytic",
    "systems.energy_serving.controllers",
    "systems.energy_serving.profiler",
    "systems.energy_serving.protocol",
    "systems.energy_serving.driver",
    "systems.energy_serving.build",
    "systems.energy_serving.metrics",
    "systems.verifier_search.search",
    "systems.verifier_search.beams",
    "systems.verifier_search.memory",
    "systems.verifier_search.speculation",
    "systems.verifier_search.memory_plan",
    "systems.verifier_search.protocol",
)
FORBIDDEN_FOR_POLICIES = ("torch", "vllm", "harness.run")

# Cycles and policy imports known on main when this test was written, each fixed by its family's
# engineer in parallel (issue 12 item 5); expected to fail until then, and strict, so the fix turns
# the mark into a failure that asks for its removal.
KNOWN = {}


def _modules() -> Dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


MODULES = _modules()


def _imported_names(path: Path) -> Set[str]:
    """Dotted names every import statement of the file names (``from a.b import c`` -> a.b, a.b.c;
    only a.b.c when c is a module of ours)."""
    names: Set[str] = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                names.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                full = [f"{child.module}.{a.name}" for a in child.names]
                names.update(full)
                if not all(f in MODULES for f in full):  # ``from pkg import submodule``: the submodule
                    names.add(child.module)
            visit(child)

    visit(ast.parse(path.read_text()))
    return names


def _resolve(name: str) -> str:
    """The project module a dotted name lives in, else its top-level (external) package."""
    n = name
    while n and n not in MODULES:
        n = n.rpartition(".")[0]
    return n or name.split(".")[0]


PLUGIN_EDGES = {("harness.family", "systems.families")}
FAMILIES = ("systems.kv_offload", "systems.verifier_search", "systems.energy_serving")


def _graph() -> Dict[str, Set[str]]:
    """module -> the modules and external top-level packages it imports (:data:`PLUGIN_EDGES` left out)."""
    graph = {m: {_resolve(n) for n in _imported_names(p)} - {m} for m, p in MODULES.items()}
    for a, b in PLUGIN_EDGES:
        graph[a].discard(b)
    return graph


GRAPH = _graph()


def _cycles() -> List[List[str]]:
    """Strongly connected groups of >= 2 project modules (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in MODULES:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in MODULES:
        if v not in index:
            strong(v)
    return out


def _known(key: str):
    return pytest.param(key, marks=pytest.mark.xfail(reason=KNOWN[key], strict=True)) if key in KNOWN else key


@pytest.mark.parametrize(
    "area",
    [
        _known(a)
        for a in ("harness", "workloads", "systems.kv_offload", "systems.verifier_search", "systems.energy_serving")
    ],
)
def test_no_import_cycles(area):
    """Mutations caught: harness/backend.py importing ConfigError from harness.config again (the
    config <-> backend cycle), any module importing one that imports it back."""
    mine = [c for c in _cycles() if any(m == area or m.startswith(area + ".") for m in c)]
    assert mine == [], f"import cycles: {mine}"


def _family(module: str) -> str:
    return next((f for f in FAMILIES if module == f or module.startswith(f + ".")), "")


def test_no_family_imports_another():
    """Each family package imports the harness, systems.common and itself, never another family.
    Mutation caught: systems/kv_offload/sim.py importing the GPU model from the BEAM family again."""
    crossing = sorted(
        (m, n) for m, deps in GRAPH.items() for n in deps if _family(m) and _family(n) and _family(m) != _family(n)
    )
    assert crossing == [], f"family packages importing another family: {crossing}"


def test_every_family_is_in_the_registry():
    """systems.families lists every family package under systems/ (a package with a FAMILY)."""
    from harness.family import families

    packages = sorted(p.parent.name for p in (ROOT / "systems").glob("*/__init__.py") if "FAMILY =" in p.read_text())
    assert sorted(families()) == packages == sorted(f.rpartition(".")[2] for f in FAMILIES)


def test_the_graph_sees_deferred_imports():
    """A function-level import is an edge (harness.config imports harness.backend inside a resolver)."""
    assert "harness.backend" in GRAPH["harness.config"] and "harness.config" not in GRAPH["harness.backend"]


def _reachable(start: str) -> Set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for n in GRAPH.get(m, ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


@pytest.mark.parametrize("policy", [_known(p) for p in POLICY_MODULES])
def test_policies_import_no_engine_and_no_run_lifecycle(policy):
    """Mutation caught: systems/kv_offload/plan.py importing RunOOM from harness.run again."""
    bad = sorted(set(FORBIDDEN_FOR_POLICIES) & _reachable(policy))
    assert bad == [], f"{policy} imports {bad} (directly or through other modules)"


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_every_module_imports_in_a_fresh_process():
    code = (
        "import importlib, traceback\nbad = []\n"
        f"for m in {sorted(MODULES)!r}:\n"
        "    try:\n        importlib.import_module(m)\n"
        "    except Exception:\n        bad.append(m + ': ' + traceback.format_exc().splitlines()[-1])\n"
        "print('\\n'.join(bad))\n"
    )
    out = _fresh(code)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr[-3000:]


def test_policy_modules_load_no_engine_when_imported():
    """At run time too: importing the policies (those without a known violation) leaves torch, vllm
    and harness.run out of sys.modules."""
    clean = [p for p in POLICY_MODULES if p not in KNOWN]
    out = _fresh(
        f"import importlib, sys\nfor m in {clean!r}: importlib.import_module(m)\n"
        f"print(sorted(set({list(FORBIDDEN_FOR_POLICIES)!r}) & set(sys.modules)))"
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-3000:]
