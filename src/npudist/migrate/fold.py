"""One ``ctx = npudist.init()`` per script, where the process group was started, and the device uses it
dominates spelled ``ctx.device``.

scan.py rewrites each construct on its own: ``set_device`` to a mark, ``init_process_group`` to
``npudist.init(...)`` (or, with an explicit rank / world size / rendezvous, to the same call with the vendor's
backend), every "this rank's CUDA device" to the current device. Here they become one intent: the group start
binds ``ctx``; ``set_device`` is folded into it (npudist.init() sets the device first); the device uses that
follow it in the same block read ``ctx.device``. Elsewhere (another function) the current device stays, which
is the same device once init() has run.
"""

from __future__ import annotations

import libcst as cst

from npudist.migrate.rewrites import BACKEND, DEVICE, SET_DEVICE_MARK

_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _kind(stmt: cst.CSTNode) -> str | None:
    """'init': ``npudist.init(...)`` alone on a line; 'kept': an init_process_group that keeps its layout;
    'set': the set_device mark; None: anything else."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return None
    call = stmt.body[0].value
    if not isinstance(call, cst.Call):
        return None
    if isinstance(call.func, cst.Name) and call.func.value == SET_DEVICE_MARK:
        return "set"
    func = _code(call.func)
    if func == "npudist.init":
        return "init"
    if func.endswith("init_process_group") and any(_code(a.value) == BACKEND for a in call.args):
        return "kept"
    return None


def _assign(name: str, call: cst.BaseExpression, like: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    return like.with_changes(body=[cst.Assign([cst.AssignTarget(cst.Name(name))], call)])


class _UseCtx(cst.CSTTransformer):
    """The current-device spelling -> ``ctx.device``, outside nested functions and classes."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._attr = cst.Attribute(cst.Name(name), cst.Name("device"))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        return self._attr if _code(updated) == DEVICE else updated


class Fold(cst.CSTTransformer):
    def __init__(self, name: str, has_group: bool) -> None:
        super().__init__()
        self._name = name
        self._has_group = has_group
        self._set_placed = False
        self.sites = 0

    def _body(self, body: tuple[cst.BaseStatement, ...]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        site = False
        use = _UseCtx(self._name)
        for stmt in body:
            kind = _kind(stmt)
            if kind == "set":
                if self._has_group or self._set_placed:
                    continue  # npudist.init() sets this rank's device before it starts the group
                self._set_placed = True
                stmt, kind = _assign(self._name, cst.parse_expression("npudist.init()"), stmt), "site"
            elif kind == "init":
                call = stmt.body[0].value
                after_site = bool(out) and _kind_of_site(out[-1])
                if after_site and not call.args:
                    continue  # set_device then init_process_group: one init
                if after_site:
                    out.pop()  # the bare init from set_device gives way to init(timeout=...)
                    self.sites -= 1
                stmt, kind = _assign(self._name, call, stmt), "site"
            elif kind == "kept":
                out.append(stmt)
                stmt, kind = _assign(self._name, cst.parse_expression("npudist.init()"),
                                     cst.SimpleStatementLine([])), "site"
            elif site:
                stmt = stmt.visit(use)
            if kind == "site":
                self.sites += 1
                site = True
            out.append(stmt)
        return [self._unbind_unused(s, out[i + 1:]) for i, s in enumerate(out)] or \
            [cst.SimpleStatementLine([cst.Pass()])]

    def _unbind_unused(self, stmt: cst.BaseStatement, rest: list[cst.BaseStatement]) -> cst.BaseStatement:
        """``ctx = npudist.init()`` that nothing after it reads is ``npudist.init()`` (ruff F841)."""
        if not _kind_of_site(stmt) or any(n.value == self._name for r in rest for n in _names(r)):
            return stmt
        return stmt.with_changes(body=[cst.Expr(stmt.body[0].value)])

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(body=self._body(updated.body))

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._body(updated.body))


def _kind_of_site(stmt: cst.CSTNode) -> bool:
    """``ctx = npudist.init(...)`` as this module writes it."""
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and \
        isinstance(stmt.body[0], cst.Assign) and isinstance(stmt.body[0].value, cst.Call) and \
        _code(stmt.body[0].value.func) == "npudist.init"


class _Unmark(cst.CSTTransformer):
    """A set_device mark inside an expression (not alone on a line) is a plain ``npudist.init()``."""

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if isinstance(updated.func, cst.Name) and updated.func.value == SET_DEVICE_MARK:
            return cst.parse_expression("npudist.init()")
        return updated


def fold(module: cst.Module) -> cst.Module:
    """The rewritten module with one ``ctx`` per group start (``npudist_ctx`` where ``ctx`` is taken)."""
    code = module.code
    has_group = "npudist.init(" in code or f"backend={BACKEND}" in code or f"({BACKEND}" in code
    taken = "ctx" in {n.value for n in _names(module)}
    module = module.visit(Fold("npudist_ctx" if taken else "ctx", has_group))
    return module.visit(_Unmark())


def _names(module: cst.CSTNode) -> list[cst.Name]:
    found: list[cst.Name] = []

    class _Collect(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            found.append(node)

    module.visit(_Collect())
    return found
