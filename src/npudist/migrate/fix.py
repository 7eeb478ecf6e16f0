"""Apply the mechanical rewrites of an analysis, keeping every comment and line the rules do not touch."""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from npudist.migrate.findings import Analysis, Finding
from npudist.migrate.fold import fold


@dataclass(frozen=True)
class Fixed:
    code: str
    applied: tuple[Finding, ...]
    left: tuple[Finding, ...]
    """Findings a person must decide on (the reason is the rule's)."""

    @property
    def blocking(self) -> tuple[Finding, ...]:
        """What is left that stops the script off CUDA: error rules (they raise, or exit without training), but
        not a kept ``torch.cuda.is_available()``, which answers False there and leaves a branch dead, not broken."""
        return tuple(f for f in self.left if f.severity == "error" and not _is_available(f.node))


class _Replace(cst.CSTTransformer):
    def __init__(self, fixes: dict[int, Finding]) -> None:
        super().__init__()
        self._fixes = fixes

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        finding = self._fixes.get(id(original))
        if finding is None or finding.fix is None:
            return updated
        return finding.fix(updated)


def _parents(module: cst.Module) -> dict[int, cst.CSTNode]:
    parents: dict[int, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = []

    class _Walk(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if stack:
                parents[id(node)] = stack[-1]
            stack.append(node)
            return True

        def on_leave(self, original_node: cst.CSTNode) -> None:
            stack.pop()

    module.visit(_Walk())
    return parents


def _guard(node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> cst.CSTNode | None:
    """The if / while / conditional expression whose test holds ``node``; None when its value goes elsewhere."""
    child = node
    while id(child) in parents:
        parent = parents[id(child)]
        if isinstance(parent, cst.If | cst.While | cst.IfExp) and parent.test is child:
            return parent
        if isinstance(parent, cst.BaseStatement | cst.BaseSmallStatement):
            return None
        child = parent
    return None


def _inside(region: cst.CSTNode, parents: dict[int, cst.CSTNode], node: cst.CSTNode) -> bool:
    while node is not None:
        if node is region:
            return True
        node = parents.get(id(node))
    return False


def _guarded(findings: tuple[Finding, ...], module: cst.Module) -> tuple[Finding, ...]:
    """``torch.cuda.is_available()`` is rewritten only where everything it guards is rewritten too: otherwise
    a branch dead off CUDA (``if torch.cuda.is_available(): torch.cuda.get_device_properties(0)``) would run."""
    parents = _parents(module)
    left = [f for f in findings if f.fix is None and f.node is not None]
    out = []
    for f in findings:
        if f.fix is None or not _is_available(f.node):
            out.append(f)
            continue
        region = _guard(f.node, parents)
        blocker = None if region is None else next((g for g in left if _inside(region, parents, g.node)), None)
        if region is None:
            out.append(replace(f, fix=None, detail="its value is kept, not tested here: rewrite it where every "
                                                   "use is ported"))
        elif blocker is not None:
            out.append(replace(f, fix=None, detail=f"guards line {blocker.line}: {blocker.code} (left)"))
        else:
            out.append(f)
    return tuple(out)


def _is_available(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
        node.func.attr.value == "is_available" and cst.Module([]).code_for_node(node.func.value).endswith("cuda")


def _touched_names(findings: tuple[Finding, ...]) -> set[str]:
    names: set[str] = set()

    class _Collect(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            names.add(node.value)

    for f in findings:
        if f.node is not None:
            f.node.visit(_Collect())
    return names


def _drop_dead_imports(original: cst.Module, module: cst.Module, names: set[str]) -> cst.Module:
    """Imports whose only uses were rewritten (``DDP``, ``dist``, ``cudnn``) go, as ruff's F401 would ask."""
    context = CodemodContext()

    class _Imports(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            for alias in node.names:
                dotted = cst.Module([]).code_for_node(alias.name)
                bound = alias.asname.name.value if alias.asname else dotted.split(".")[0]
                if bound in names:
                    RemoveImportsVisitor.remove_unused_import(
                        context, dotted, asname=alias.asname.name.value if alias.asname else None)

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            if node.module is None or node.relative or isinstance(node.names, cst.ImportStar):
                return
            module_name = cst.Module([]).code_for_node(node.module)
            for alias in node.names:
                bound = alias.asname.name.value if alias.asname else alias.name.value
                if bound in names:
                    RemoveImportsVisitor.remove_unused_import(
                        context, module_name, alias.name.value, alias.asname.name.value if alias.asname else None)

    original.visit(_Imports())
    return RemoveImportsVisitor(context).transform_module(module)


def apply(analysis: Analysis) -> Fixed:
    """The rewritten source; idempotent because no rewrite produces a construct a rule matches."""
    findings = _guarded(analysis.findings, analysis.module)
    fixes = {id(f.node): f for f in findings if f.fix is not None}
    applied = tuple(fixes.values())
    left = tuple(f for f in findings if f.fix is None)
    if not fixes:
        return Fixed(analysis.module.code, (), left)
    module = fold(analysis.module.visit(_Replace(fixes)))
    module = _drop_dead_imports(analysis.module, module, _touched_names(applied))
    context = CodemodContext()
    if "npudist." in module.code:  # a rewrite that only changes a test (model.py's device_type) needs no npudist
        AddImportsVisitor.add_needed_import(context, "npudist")
    if any(f.rule in ("cuda-amp", "cuda-device-test") for f in applied):
        AddImportsVisitor.add_needed_import(context, "torch")
    module = module.visit(AddImportsVisitor(context))
    return Fixed(module.code, applied, left)
