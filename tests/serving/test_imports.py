"""Import contract of the serving family: no import cycles between its modules (function-level
imports included), and the policy side imports neither torch, vLLM nor the run lifecycle."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "systems" / "serving"
POLICY = ("protocol", "driver", "controllers", "profiler", "build", "metrics")


def imports(mod: str):
    """Every module name ``systems/serving/<mod>.py`` imports, at any depth."""
    tree = ast.parse((PKG / f"{mod}.py").read_text())
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
    return out


def test_no_cycles_between_serving_modules():
    mods = [p.stem for p in PKG.glob("*.py") if p.stem != "__init__"]
    graph = {m: {i.rsplit(".", 1)[-1] for i in imports(m) if i.startswith("systems.serving.")} for m in mods}

    def reach(start):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph.get(m, ())
        return seen
    cycles = sorted(m for m in mods if m in reach(m))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_policy_side_imports_no_engine_and_no_run_lifecycle():
    for m in POLICY:
        bad = {i for i in imports(m) if i.split(".")[0] in ("torch", "vllm") or i == "harness.run"}
        assert not bad, f"systems/serving/{m}.py imports {sorted(bad)}"
