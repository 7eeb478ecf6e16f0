"""Layers point one way: what ``import npudist`` loads, who imports telemetry, and no import cycles.

The import graph is read from the source (every ``import`` statement, inside functions too, except under
``if TYPE_CHECKING``), so a lazy import cannot hide a cycle or a wrong-way dependency.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from tests.conftest import child_env, run_py

SRC = Path(__file__).resolve().parents[1] / "src"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """npudist modules ``path`` imports (``from pkg import mod`` counts as pkg.mod)."""
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("npudist"))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("npudist"):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    out.add(full if full in MODULES else node.module)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])

    visit(ast.parse(path.read_text()).body)
    return out


GRAPH = {name: {m for m in _imports(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def _under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_import_npudist_loads_neither_torch_nor_telemetry_nor_dashboards():
    code = ("import json, sys, npudist; import npudist.comm, npudist.runtime.lifecycle; "
            "print(json.dumps(sorted(sys.modules)))")
    bare = run_py(["-c", "import json, sys, npudist; print(json.dumps(sorted(sys.modules)))"], env=child_env(),
                  timeout=60)
    assert bare.returncode == 0, bare.stderr
    loaded = json.loads(bare.stdout)
    assert "torch" not in loaded
    assert not [m for m in loaded if _under(m, "npudist.telemetry", "npudist.dashboards")]
    full = run_py(["-c", code], env=child_env(), timeout=120)
    assert full.returncode == 0, full.stderr
    loaded = json.loads(full.stdout)
    assert "npudist.comm.collectives" in loaded  # the check below looked at a real import of comm
    assert not [m for m in loaded if _under(m, "npudist.telemetry", "npudist.dashboards")]


def test_comm_and_runtime_never_import_telemetry_or_dashboards():
    wrong = {(src, dst) for src, dsts in GRAPH.items() if _under(src, "npudist.comm", "npudist.runtime")
             for dst in dsts if _under(dst, "npudist.telemetry", "npudist.dashboards")}
    assert not wrong


def test_the_runtime_holder_depends_on_nothing_but_the_settings():
    # comm and accelerators reach runtime.state; it must not reach back into them.
    assert GRAPH["npudist.runtime.state"] <= {"npudist.runtime.settings"}
    assert GRAPH["npudist.runtime.settings"] == set()


def test_launch_takes_no_constants_from_telemetry():
    tree = ast.parse(MODULES["npudist.launch"].read_text())
    taken = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and (node.module or "").startswith("npudist.telemetry") for a in node.names]
    assert not [n for n in taken if n.isupper()], taken


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(GRAPH[v]):
            if state.get(w) == 1:
                return [*path[path.index(w):], w]
            if w not in state and (found := visit(w)):
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(GRAPH):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_no_import_cycles_among_npudist_modules():
    assert _cycle() is None


def test_the_cycle_finder_finds_a_cycle(monkeypatch):
    monkeypatch.setitem(GRAPH, "npudist.accelerators.accelerator",
                        GRAPH["npudist.accelerators.accelerator"] | {"npudist.accelerators.detect"})
    assert _cycle() is not None
