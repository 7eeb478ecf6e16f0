"""Find the CUDA-only constructs of one Python source, with the rewrite for each one that has a mechanical fix.

libcst, not the stdlib ast: ``fix`` must keep comments and formatting, and sharing one concrete tree
between ``check`` and ``fix`` keeps what is reported and what is rewritten the same nodes. Names are
resolved through the file's imports (``from torch.distributed import init_process_group`` is found as
``torch.distributed.init_process_group``); nothing the file names is imported or run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider

from npudist.migrate.rules import (
    COLLECTIVES,
    CUDA_ENV,
    CUDA_MEMORY_CALLS,
    CUDA_NO_OP_CALLS,
    CUDA_STREAM_CALLS,
    DEVICE_KEYWORDS,
    NCCL_ENV,
    RULES,
)

Rewrite = Callable[[Any], cst.CSTNode]
"""Builds the replacement from the node as already rewritten inside (a fix within a fix survives)."""

_ACC = "npudist.accelerator()"
DEVICE = f"{_ACC}.device()"
"""The rank's device wherever a script names "its" CUDA device: the current device, which npudist.init() sets;
fix.py spells it ``ctx.device`` where the ``ctx = npudist.init()`` it inserts is in scope."""
SET_DEVICE_MARK = "__npudist_set_device__"
"""What ``torch.cuda.set_device(...)`` becomes until fix.py folds it into the one ``ctx = npudist.init()``."""
BACKEND = f"{_ACC}.backend"
_CUDA_INDEX = re.compile(r"cuda(?::(\d+))?")
# Names that hold a device *index* in CUDA scripts (.to(local_rank), .to(self.gpu_id)).
_INDEX_NAME = re.compile(r"(rank|gpu|device_id|dev_id|^local)", re.IGNORECASE)
# Calls whose first positional argument is a device or a device type.
_DEVICE_FIRST_ARG = frozenset({"torch.device", "torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler"})
_FIXED_DEVICE_CALLS: Mapping[str, Rewrite] = MappingProxyType({
    # set_device(local_rank) is what npudist.init() does first (then it starts the group).
    "set_device": lambda call: cst.Call(cst.Name(SET_DEVICE_MARK)),
    "device_count": lambda call: call.with_changes(func=cst.parse_expression(f"{_ACC}.device_count")),
    "synchronize": lambda call: call.with_changes(func=cst.parse_expression(f"{_ACC}.synchronize")),
    "is_available": lambda call: cst.parse_expression(f'({_ACC}.device_type != "cpu")'),
})


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    column: int
    code: str
    """The source text of the construct (first line)."""
    detail: str = ""
    """What is specific to this occurrence (the HCCL counterpart of an NCCL variable, say)."""
    fix: Rewrite | None = None
    """Makes the node that replaces the matched one; None where a person must decide."""
    node: cst.CSTNode | None = None

    @property
    def severity(self) -> str:
        return RULES[self.rule].severity


@dataclass(frozen=True)
class Analysis:
    module: cst.Module
    findings: tuple[Finding, ...]


def analyse(source: str, *, bf16_refused: bool = False) -> Analysis:
    """Parse ``source`` (raises ``libcst.ParserSyntaxError``) and report its findings in line order.

    ``bf16_refused``: the active constraint row cannot reduce bfloat16, so a direct collective in a file
    that uses bfloat16 is an error rather than advice.
    """
    wrapper = MetadataWrapper(cst.parse_module(source))
    visitor = _Visitor(bf16_refused="bfloat16" in source and bf16_refused)
    wrapper.visit(visitor)
    found = sorted(visitor.found, key=lambda f: (f.line, f.column, f.rule))
    return Analysis(wrapper.module, tuple(found))


def uses_transfer_to_npu(analysis: Analysis) -> bool:
    """The file imports ``torch_npu.contrib.transfer_to_npu``, which patches torch.cuda onto the NPU at
    import (Ascend "PyTorch Model Migration: automatic migration"): it runs on Ascend unchanged."""
    return any("transfer_to_npu" in cst.Module([]).code_for_node(line) for line in analysis.module.body
               if isinstance(line, cst.SimpleStatementLine) and
               any(isinstance(s, cst.Import | cst.ImportFrom) for s in line.body))


def _arg(index: int | None, call: cst.Call) -> cst.Arg | None:
    positional = [a for a in call.args if a.keyword is None and a.star == ""]
    return positional[index] if index is not None and index < len(positional) else None


def _kw(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def _string_value(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:  # an undecodable bytes literal: not a device name
            return None
        return value if isinstance(value, str) else None
    return None


def _cuda_fstring_index(node: cst.CSTNode) -> cst.BaseExpression | None:
    """``f"cuda:{expr}"`` or ``"cuda:{}".format(expr)`` -> expr."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format" \
            and _string_value(node.func.value) == "cuda:{}" and len(node.args) == 1 and not node.args[0].keyword:
        return node.args[0].value
    if isinstance(node, cst.FormattedString) and len(node.parts) == 2:
        text, expr = node.parts
        if isinstance(text, cst.FormattedStringText) and text.value == "cuda:" and \
                isinstance(expr, cst.FormattedStringExpression) and expr.format_spec is None:
            return expr.expression
    return None


def _device_for(value: str | None, index_expr: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """The vendor-neutral device for a CUDA device name, or None where the name is not a device."""
    if index_expr is not None:
        return cst.parse_expression(DEVICE)  # cuda:{local_rank}: this rank's device
    match = _CUDA_INDEX.fullmatch(value or "")
    if match is None:
        return None
    return cst.parse_expression(f"{_ACC}.device({match.group(1)})" if match.group(1) else DEVICE)


def _constant(expr: str | cst.BaseExpression) -> Rewrite:
    node = cst.parse_expression(expr) if isinstance(expr, str) else expr
    return lambda _: node


def _cuda_to_to(call: cst.Call) -> cst.Call:
    """``x.cuda(i, non_blocking=b)`` -> ``x.to(<the rank's device>, non_blocking=b)``.

    An index held in a variable (``args.gpu``, ``device=rank``) is the rank's own device in every script
    seen; a literal index stays that index."""
    index = _kw(call, "device") or _arg(0, call)
    device = cst.parse_expression(DEVICE)
    if index is not None and isinstance(index.value, cst.Integer):
        device = cst.parse_expression(f"{_ACC}.device({index.value.value})")
    rest = [a for a in call.args if (a.keyword is not None and a.keyword.value != "device") or a.star == "**"]
    return call.with_changes(func=call.func.with_changes(attr=cst.Name("to")), args=[cst.Arg(device), *rest])


# init_process_group's arguments npudist.init() takes from the launcher's environment instead.
_GROUP_LAYOUT = frozenset({"init_method", "world_size", "rank", "store", "group_name", "pg_options", "device_id"})


def _keeps_layout(call: cst.Call) -> bool:
    """An explicit rank, world size, rendezvous or ``**kwargs``: dropping them would start N worlds of one."""
    return any(a.star or (a.keyword is not None and a.keyword.value in _GROUP_LAYOUT) for a in call.args) or \
        len([a for a in call.args if a.keyword is None]) > 1


def _backend_only(call: cst.Call) -> cst.Call:
    """init_process_group(nccl, init_method=, rank=, ...) keeps its layout; only the backend becomes the
    vendor's (fix.py then adds ``ctx = npudist.init()``, which adopts the group and sets the device)."""
    backend = cst.Arg(cst.parse_expression(BACKEND), keyword=cst.Name("backend"))
    args, replaced = [], False
    for i, a in enumerate(call.args):
        if (a.keyword is not None and a.keyword.value == "backend") or (i == 0 and a.keyword is None and not a.star):
            args.append(a.with_changes(value=cst.parse_expression(BACKEND)))
            replaced = True
        else:
            args.append(a)
    if not replaced:
        args.insert(0, backend.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
    return call.with_changes(args=args)


def _npudist_init(call: cst.Call) -> cst.Call:
    """init_process_group(...) -> npudist.init(timeout=...): the backend and device are npudist's choice."""
    timeout = _kw(call, "timeout")
    new = cst.parse_expression("npudist.init()")
    if timeout is not None:
        new = new.with_changes(args=[timeout.with_changes(comma=cst.MaybeSentinel.DEFAULT)])
    return new


# torch.cuda.amp's positional parameters, named so they land on the same ones of torch.autocast /
# torch.amp.GradScaler, whose first parameter is the device type (torch/cuda/amp/autocast_mode.py).
_AMP_POSITIONAL: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "autocast": ("enabled", "dtype", "cache_enabled"),
    "GradScaler": ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"),
})


def _amp_fix(target: str, positional: tuple[str, ...]) -> Rewrite:
    def fix(call: cst.Call) -> cst.Call:
        first = cst.Arg(cst.parse_expression(f"{_ACC}.device_type"))
        args, i = [], 0
        for a in call.args:
            if a.keyword is None and not a.star and i < len(positional):
                a = a.with_changes(keyword=cst.Name(positional[i]), equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
                i += 1
            args.append(a)
        return call.with_changes(func=cst.parse_expression(target), args=[first, *args])
    return fix


def _dotted(expr: cst.BaseExpression) -> bool:
    """``torch.nn.Module``: a chain of names, so its qualified name is a module path, not a value."""
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    return isinstance(expr, cst.Name)


def _npudist_ddp(call: cst.Call) -> cst.Call:
    """DDP(m, device_ids=..., output_device=..., **kw) -> npudist.ddp(m, **kw): the ids are per vendor."""
    module = _kw(call, "module") or _arg(0, call)
    keep = [a for a in call.args if a.star == "**" or (a.keyword is not None and a.keyword.value not in
            ("module", "device_ids", "output_device"))]
    args = [cst.Arg(module.value), *keep]
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return cst.Call(cst.parse_expression("npudist.ddp"), args=args)


class _Visitor(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ParentNodeProvider)

    def __init__(self, bf16_refused: bool) -> None:
        super().__init__()
        self.found: list[Finding] = []
        self._bf16_refused = bf16_refused
        self._claimed: set[int] = set()  # nodes already reported through an enclosing construct
        self._lines: set[tuple[str, int]] = set()

    def _add(self, rule: str, node: cst.CSTNode, *, detail: str = "", fix: Rewrite | None = None,
             once_per_line: bool = False) -> None:
        pos = self.get_metadata(PositionProvider, node).start
        if once_per_line:
            if (rule, pos.line) in self._lines:
                return
            self._lines.add((rule, pos.line))
        code = cst.Module([]).code_for_node(node).splitlines()[0] if node is not None else ""
        self.found.append(Finding(rule, pos.line, pos.column + 1, code[:120], detail, fix, node))

    def _qnames(self, node: cst.CSTNode) -> set[str]:
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

    # -- calls --------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        names = self._qnames(node.func)
        for name in names:
            if self._call_rule(node, name):
                return
        if isinstance(node.func, cst.Attribute) and \
                not (any(n.startswith("torch.") for n in names) and _dotted(node.func.value)):
            # a method on a value (torch.randn(4).cuda(), nn.Linear(4, 4).cuda()), not torch.x.cuda's module
            self._method_rule(node, node.func.attr.value)
        index = _cuda_fstring_index(node)
        if index is not None and id(node) not in self._claimed:
            self._cuda_string(node, None, index)

    def _call_rule(self, node: cst.Call, name: str) -> bool:
        if name.startswith("torch.cuda.amp."):
            tail = name.rsplit(".", 1)[1]
            target = {"autocast": "torch.autocast", "GradScaler": "torch.amp.GradScaler"}.get(tail)
            fix = None
            if target is not None:
                fix = _amp_fix(target, _AMP_POSITIONAL[tail])
            self._add("cuda-amp", node, fix=fix)
        elif name.startswith("torch.cuda."):
            tail = name[len("torch.cuda."):]
            if tail in _FIXED_DEVICE_CALLS or tail == "current_device":
                maker = _FIXED_DEVICE_CALLS.get(tail)
                self._add("cuda-device-api", node, fix=maker)
            elif tail in CUDA_MEMORY_CALLS:
                self._add("cuda-memory-api", node)
            elif tail in CUDA_STREAM_CALLS:
                self._add("cuda-streams", node)
            elif tail in CUDA_NO_OP_CALLS:
                self._add("cuda-no-op", node)
            else:
                self._add("cuda-api", node)
        elif name == "torch.distributed.init_process_group":
            self._init_process_group(node)
        elif name in ("torch.nn.parallel.DistributedDataParallel",
                      "torch.nn.parallel.distributed.DistributedDataParallel"):
            self._ddp(node)
        elif name.startswith("torch.distributed.") and name.rsplit(".", 1)[1] in COLLECTIVES:
            rule = "bf16-collective" if self._bf16_refused else "direct-collective"
            self._add(rule, node, detail=name.rsplit(".", 1)[1])
        elif name.startswith(("torch.npu.", "torch_npu.")) and "transfer_to_npu" not in name:
            self._add("vendor-locked", node, detail=name)
        elif name in _DEVICE_FIRST_ARG:
            self._device_first_arg(node, name)
            return False  # its keywords (device_type=) are still looked at as strings
        else:
            return False
        return True

    def _method_rule(self, node: cst.Call, method: str) -> None:
        if method == "cuda":
            self._add("cuda-method", node, fix=_cuda_to_to)
        elif method == "to":
            first = _arg(0, node)
            if first is not None and self._is_index(first.value):
                literal = first.value.value if isinstance(first.value, cst.Integer) else ""
                self._add("int-device-index", first.value,
                          fix=_constant(f"{_ACC}.device({literal})" if literal else DEVICE))
        elif method == "npu":
            self._add("vendor-locked", node, detail=".npu()")
        elif method == "pin_memory":
            self._add("pin-memory-call", node)

    def _is_index(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Integer):
            return True
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "int":
            return True
        terminal = expr.attr.value if isinstance(expr, cst.Attribute) else getattr(expr, "value", None)
        return isinstance(terminal, str) and bool(_INDEX_NAME.search(terminal)) and terminal != "device"

    def _init_process_group(self, node: cst.Call) -> None:
        backend = _kw(node, "backend") or _arg(0, node)
        if backend is not None and cst.Module([]).code_for_node(backend.value) == BACKEND:
            return  # already ported (fix keeps a group with an explicit layout and gives it the vendor's backend)
        value = _string_value(backend.value) if backend is not None else None
        if backend is not None:
            self._claimed.add(id(backend.value))
        fix = _backend_only if _keeps_layout(node) else _npudist_init
        if value == "nccl" or backend is None:
            detail = "backend 'nccl'" if value else "no backend: torch guesses from the tensors' device"
            self._add("init-process-group", node, detail=detail, fix=fix)
        else:
            detail = f"backend {value!r}" if value else "backend chosen at run time"
            self._add("process-group-setup", node, detail=detail, fix=fix)

    def _ddp(self, node: cst.Call) -> None:
        module = _kw(node, "module") or _arg(0, node)
        positional = [a for a in node.args if a.keyword is None and not a.star]
        mechanical = module is not None and len(positional) <= 1 and not any(a.star == "*" for a in node.args)
        self._add("ddp-wrap", node, fix=_npudist_ddp if mechanical else None,
                  detail="" if mechanical else "positional or *args after the module: left as written")

    def _device_first_arg(self, node: cst.Call, name: str) -> None:
        first = _arg(0, node)
        if first is None:
            return
        value, index = _string_value(first.value), _cuda_fstring_index(first.value)
        if value is None and index is None:
            return
        self._claimed.add(id(first.value))
        if name == "torch.device":
            second = _arg(1, node)
            device = _device_for(value, index)
            if device is not None and second is not None and value == "cuda":
                device = cst.parse_expression(DEVICE)
            if device is not None:
                self._add("cuda-device-string", node, fix=_constant(device))
        elif value == "cuda":  # autocast("cuda") / GradScaler("cuda"): a device type
            self._add("cuda-device-string", first.value, fix=_constant(f"{_ACC}.device_type"))

    # -- strings ------------------------------------------------------------------------------
    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if id(node) in self._claimed:
            return
        value = _string_value(node)
        if value is None:
            return
        if _CUDA_INDEX.fullmatch(value):
            self._cuda_string(node, value, None)
        elif value == "nccl":
            self._add("nccl-string", node)
        elif value == "CUDA_VISIBLE_DEVICES":
            self._add("visible-devices", node)
        elif value == "LOCAL_RANK":
            self._add("local-rank-env", node)
        elif value in NCCL_ENV:
            self._add("nccl-env", node, detail=f"{value} -> {NCCL_ENV[value]}")
        elif value in CUDA_ENV:
            self._add("cuda-env", node, detail=f"{value} -> {CUDA_ENV[value]}")

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        index = _cuda_fstring_index(node)
        if index is not None and id(node) not in self._claimed:
            self._cuda_string(node, None, index)

    def _cuda_string(self, node: cst.CSTNode, value: str | None, index: cst.BaseExpression | None) -> None:
        """A device name: rewritten where it is plainly a device (a device= keyword or .to's argument)."""
        parent = self.get_metadata(ParentNodeProvider, node)
        fix = None
        if isinstance(parent, cst.Arg):
            call = self.get_metadata(ParentNodeProvider, parent)
            keyword = parent.keyword.value if parent.keyword is not None else None
            is_to = isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and \
                call.func.attr.value == "to" and keyword is None
            if keyword == "device_type" and value == "cuda":
                fix = _constant(f"{_ACC}.device_type")
            elif keyword in DEVICE_KEYWORDS or is_to:
                device = _device_for(value, index)
                fix = _constant(device) if device is not None else None
        elif isinstance(parent, cst.IfExp) and value == "cuda" and \
                _string_value(parent.orelse if parent.body is node else parent.body) == "cpu":
            # "cuda" if cond else "cpu": a device type beside another one, so the vendor's device type
            fix = _constant(f"{_ACC}.device_type")
        elif (isinstance(parent, cst.Assign | cst.AnnAssign) and self._device_variable(parent)) or index is not None:
            # device = "cuda:0", loc = "cuda:{}".format(gpu): used as strings ("cuda" in device), so keep one
            device = _device_for(value, index)
            if device is not None:
                fix = _constant(cst.Call(cst.Name("str"), args=[cst.Arg(device)]))
        self._add("cuda-device-string", node, fix=fix)

    @staticmethod
    def _device_variable(assign: cst.Assign | cst.AnnAssign) -> bool:
        targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
        return len(targets) == 1 and isinstance(targets[0], cst.Name) and "device" in targets[0].value.lower() \
            and "type" not in targets[0].value.lower()

    # -- attributes, keywords, decorators ----------------------------------------------------
    def visit_Attribute(self, node: cst.Attribute) -> None:
        for name in self._qnames(node):
            if name.startswith(("torch.backends.cudnn.", "torch.backends.cuda.")):
                self._add("cuda-backend-flags", node, once_per_line=True)
            elif name == "torch.channels_last":
                self._add("channels-last", node, once_per_line=True)
            elif name == "torch.jit.script":
                self._add("jit-script", node, once_per_line=True)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value == "pin_memory" and \
                not (isinstance(node.value, cst.Name) and node.value.value == "False"):
            self._add("pin-memory", node)
