"""Apply the mechanical rewrites of an analysis, keeping every comment and line the rules do not touch."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from npudist.migrate.scan import Analysis, Finding


@dataclass(frozen=True)
class Fixed:
    code: str
    applied: tuple[Finding, ...]
    left: tuple[Finding, ...]
    """Findings a person must decide on (the reason is the rule's)."""


class _Replace(cst.CSTTransformer):
    def __init__(self, fixes: dict[int, Finding]) -> None:
        super().__init__()
        self._fixes = fixes

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        finding = self._fixes.get(id(original))
        if finding is None or finding.fix is None:
            return updated
        return finding.fix(updated)


def _is_init(line: cst.BaseStatement, *, bare: bool) -> bool:
    """``npudist.init(...)`` alone on a line (``bare``: with no arguments and no comment)."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return False
    expr = line.body[0]
    if not (isinstance(expr, cst.Expr) and isinstance(expr.value, cst.Call)):
        return False
    call = expr.value
    named = isinstance(call.func, cst.Attribute) and call.func.attr.value == "init" and \
        isinstance(call.func.value, cst.Name) and call.func.value.value == "npudist"
    quiet = not call.args and line.trailing_whitespace.comment is None and not line.leading_lines
    return named and (quiet or not bare)


class _DropRepeatedInit(cst.CSTTransformer):
    """set_device(local_rank) then init_process_group() both become npudist.init(): keep one."""

    def _body(self, body: tuple[cst.BaseStatement, ...]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for line in body:
            if out and _is_init(out[-1], bare=True) and _is_init(line, bare=False):
                out[-1] = line
            elif out and _is_init(line, bare=True) and _is_init(out[-1], bare=False):
                continue
            else:
                out.append(line)
        return out

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(body=self._body(updated.body))

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._body(updated.body))


def apply(analysis: Analysis) -> Fixed:
    """The rewritten source; idempotent because no rewrite produces a construct a rule matches."""
    fixes = {id(f.node): f for f in analysis.findings if f.fix is not None}
    applied = tuple(fixes.values())
    left = tuple(f for f in analysis.findings if f.fix is None)
    if not fixes:
        return Fixed(analysis.module.code, (), left)
    module = analysis.module.visit(_Replace(fixes)).visit(_DropRepeatedInit())
    context = CodemodContext()
    AddImportsVisitor.add_needed_import(context, "npudist")
    if any(f.rule == "cuda-amp" for f in applied):
        AddImportsVisitor.add_needed_import(context, "torch")
    module = module.visit(AddImportsVisitor(context))
    return Fixed(module.code, applied, left)
