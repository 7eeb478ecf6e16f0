"""Layers point one way: what ``import npudist`` loads, who imports telemetry, no import cycles, and
torch.distributed's collectives called from comm/ only.

The import graph is read from the source (every ``import`` statement, inside functions too), so a lazy
import cannot hide a cycle or a wrong-way dependency. GRAPH leaves out imports under ``if TYPE_CHECKING``
(what runs); TYPED_GRAPH keeps them (what a reader and a type checker follow).

From the ground up: runtime/ (settings, rank layout, the Runtime holder), then accelerators, then diagnosis
(pure verdicts), then comm, then checkpoint and telemetry, then lifecycle.py (init/shutdown), which starts and
ends what they own.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.conftest import child_env, run_py

SRC = Path(__file__).resolve().parents[1] / "src"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _imports(path: Path, *, typing: bool = False) -> set[str]:
    """npudist modules ``path`` imports (``from pkg import mod`` counts as pkg.mod); ``typing``: also
    those under ``if TYPE_CHECKING``."""
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
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
TYPED_GRAPH = {name: {m for m in _imports(path, typing=True) if m in MODULES and m != name}
               for name, path in MODULES.items()}


def _under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.subprocess
def test_import_npudist_loads_neither_torch_nor_telemetry_nor_dashboards():
    code = ("import json, sys, npudist; import npudist.comm, npudist.lifecycle; "
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


def test_the_diagnosis_is_pure_and_sits_below_what_feeds_it():
    # diagnosis/ judges what the ranks publish: comm's threads and telemetry's reporters import it, never
    # the reverse, and it imports no collector (torch, torch.distributed, a store) at all.
    wrong = {(src, dst) for src, dsts in TYPED_GRAPH.items() if _under(src, "npudist.diagnosis")
             for dst in dsts if not _under(dst, "npudist.diagnosis", "npudist.runtime", "npudist.accelerators",
                                             *BELOW_GROUND)}
    assert not wrong
    heavy = {name for name, path in MODULES.items() if _under(name, "npudist.diagnosis")
             for line in path.read_text().splitlines() if line.lstrip().startswith(("import torch", "from torch"))}
    assert not heavy, "the diagnosis is pure: pass it what torch said, do not import torch there"


def test_the_runtime_holder_depends_on_nothing_but_the_settings():
    # comm and accelerators reach runtime.state; it must not reach back into them.
    assert TYPED_GRAPH["npudist.runtime.state"] <= {"npudist.runtime.settings"}
    assert TYPED_GRAPH["npudist.runtime.settings"] == set()


# Helpers under the ground: they import nothing of npudist, so any layer may use them.
BELOW_GROUND = ("npudist._lazy", "npudist._version")


def test_the_helpers_below_the_ground_import_nothing_of_npudist():
    assert [name for name in BELOW_GROUND if TYPED_GRAPH[name]] == []


def test_runtime_is_the_ground_layer_even_for_type_hints():
    wrong = {(src, dst) for src, dsts in TYPED_GRAPH.items() if _under(src, "npudist.runtime")
             for dst in dsts if not _under(dst, "npudist.runtime", *BELOW_GROUND)}
    assert not wrong, "runtime/ imports from above it; give the type as a Protocol or Any with a docstring"


def test_lifecycle_sits_above_what_it_starts_and_ends():
    below = ("npudist.runtime", "npudist.accelerators", "npudist.comm", "npudist.checkpoint", "npudist.telemetry")
    assert "npudist.runtime.lifecycle" not in MODULES
    assert {"npudist.comm.control", "npudist.runtime.state"} <= GRAPH["npudist.lifecycle"]
    wrong = {src for src, dsts in TYPED_GRAPH.items() if "npudist.lifecycle" in dsts and _under(src, *below)}
    assert not wrong


def test_launch_takes_no_constants_from_telemetry():
    launch = [path for name, path in MODULES.items() if _under(name, "npudist.launch")]
    assert len(launch) > 5  # the package's modules, not only its __init__
    taken = [a.name for path in launch for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("npudist.telemetry")
             for a in node.names]
    assert not [n for n in taken if n.isupper()], taken


def _cycle(graph: dict[str, set[str]] = GRAPH) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return [*path[path.index(w):], w]
            if w not in state and (found := visit(w)):
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_no_import_cycles_among_npudist_modules():
    assert _cycle() is None


def test_no_import_cycles_even_through_type_hints():
    assert _cycle(TYPED_GRAPH) is None


def test_the_cycle_finder_finds_a_cycle(monkeypatch):
    monkeypatch.setitem(GRAPH, "npudist.accelerators.accelerator",
                        GRAPH["npudist.accelerators.accelerator"] | {"npudist.accelerators.detect"})
    assert _cycle() is not None


# Every torch.distributed call that is a collective (or makes a group, which is one): npudist issues them
# from comm/ only, where the door (comm/control.py) knows which device the group's backend wants.
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
    "all_gather_object", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "gather_object", "scatter",
    "scatter_object_list", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "send_object_list", "recv_object_list", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "split_group",
})
_DIST_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")


def distributed_collectives(source: str) -> list[str]:
    """``line: expression`` of every reference to a torch.distributed collective in ``source``."""
    tree = ast.parse(source)
    modules, names = set(_DIST_MODULES), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name in _DIST_MODULES and a.asname)
        elif isinstance(node, ast.ImportFrom) and node.module in ("torch", *_DIST_MODULES):
            for a in node.names:
                if f"{node.module}.{a.name}" in _DIST_MODULES:
                    modules.add(a.asname or a.name)
                elif node.module != "torch" and a.name in COLLECTIVES:
                    names.add(a.asname or a.name)
    found = []
    for node in ast.walk(tree):
        attribute = isinstance(node, ast.Attribute) and node.attr in COLLECTIVES and ast.unparse(node.value) in modules
        if attribute or (isinstance(node, ast.Name) and node.id in names):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


BENCH_RANK = "npudist.bench.rank"
"""`npudist bench collective`'s rank: it times torch's own collectives beside npudist's, so it calls them."""


def test_only_comm_calls_torch_distributed_collectives():
    found = {name: hits for name, path in MODULES.items() if not _under(name, "npudist.comm", BENCH_RANK)
             if (hits := distributed_collectives(path.read_text()))}
    assert not found, "send npudist's own flags, objects and barriers through npudist.comm.control"


@pytest.mark.parametrize("source", [
    "import torch.distributed as dist\ndist.all_reduce(t)",
    "import torch.distributed\ntorch.distributed.barrier()",
    "from torch import distributed as d\nd.broadcast_object_list(x, src=0)",
    "from torch.distributed import all_gather as ag\nag(out, t)",
    "import torch.distributed as dist\nGATHER = dist.all_gather_into_tensor",
    "from torch.distributed import distributed_c10d as c10d\nc10d.new_group(backend='gloo')",
])
def test_the_collective_finder_finds_each_spelling(source):
    assert distributed_collectives(source)


def test_the_collective_finder_leaves_other_calls_alone():
    assert not distributed_collectives("import torch.distributed as dist\ndist.get_rank(); dist.is_initialized()\n"
                                       "comm.all_reduce(t); pg.broadcast([t])")
