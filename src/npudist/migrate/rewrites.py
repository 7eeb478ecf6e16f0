"""The rewrites ``fix`` applies, as pure functions from a libcst node to its vendor-neutral replacement.

scan.py decides where each applies (the matched node and its context); here is only what it becomes. Every
rewrite keeps the call's other arguments (positional flags named, ``**kwargs`` passed on), so nothing the
script said is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import libcst as cst

Rewrite = Callable[[Any], cst.CSTNode]
"""Builds the replacement from the node as already rewritten inside (a fix within a fix survives)."""

ACC = "npudist.accelerator()"
DEVICE = f"{ACC}.device()"
"""The rank's device wherever a script names "its" CUDA device: the current device, which npudist.init() sets;
fix.py spells it ``ctx.device`` where the ``ctx = npudist.init()`` it inserts is in scope."""
SET_DEVICE_MARK = "__npudist_set_device__"
"""What ``torch.cuda.set_device(...)`` becomes until fix.py folds it into the one ``ctx = npudist.init()``."""
BACKEND = f"{ACC}.backend"
CUDA_INDEX = re.compile(r"cuda(?::(\d+))?")
# Names that hold a device *index* in CUDA scripts (.to(local_rank), .to(self.gpu_id)).
INDEX_NAME = re.compile(r"(rank|gpu|device_id|dev_id|^local)", re.IGNORECASE)
# Calls whose first positional argument is a device or a device type.
DEVICE_FIRST_ARG = frozenset({"torch.device", "torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler",
                              # a DTensor/FSDP2 mesh's device type: init_device_mesh("cuda", (world,))
                              "torch.distributed.device_mesh.init_device_mesh", "torch.distributed.init_device_mesh",
                              "torch.distributed.device_mesh.DeviceMesh", "torch.distributed.DeviceMesh"})
FIXED_DEVICE_CALLS: Mapping[str, Rewrite] = MappingProxyType({
    # set_device(local_rank) is what npudist.init() does first (then it starts the group).
    "set_device": lambda call: cst.Call(cst.Name(SET_DEVICE_MARK)),
    "device_count": lambda call: call.with_changes(func=cst.parse_expression(f"{ACC}.device_count")),
    "synchronize": lambda call: call.with_changes(func=cst.parse_expression(f"{ACC}.synchronize")),
    "is_available": lambda call: cst.parse_expression(f'({ACC}.device_type != "cpu")'),
})


def nth_arg(index: int | None, call: cst.Call) -> cst.Arg | None:
    positional = [a for a in call.args if a.keyword is None and a.star == ""]
    return positional[index] if index is not None and index < len(positional) else None


def kw_arg(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def string_value(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:  # an undecodable bytes literal: not a device name
            return None
        return value if isinstance(value, str) else None
    return None


def cuda_fstring_index(node: cst.CSTNode) -> cst.BaseExpression | None:
    """``f"cuda:{expr}"`` or ``"cuda:{}".format(expr)`` -> expr."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format" \
            and string_value(node.func.value) == "cuda:{}" and len(node.args) == 1 and not node.args[0].keyword:
        return node.args[0].value
    if isinstance(node, cst.FormattedString) and len(node.parts) == 2:
        text, expr = node.parts
        if isinstance(text, cst.FormattedStringText) and text.value == "cuda:" and \
                isinstance(expr, cst.FormattedStringExpression) and expr.format_spec is None:
            return expr.expression
    return None


def device_for(value: str | None, index_expr: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """The vendor-neutral device for a CUDA device name, or None where the name is not a device."""
    if index_expr is not None:
        return cst.parse_expression(DEVICE)  # cuda:{local_rank}: this rank's device
    match = CUDA_INDEX.fullmatch(value or "")
    if match is None:
        return None
    return cst.parse_expression(f"{ACC}.device({match.group(1)})" if match.group(1) else DEVICE)


def constant(expr: str | cst.BaseExpression) -> Rewrite:
    node = cst.parse_expression(expr) if isinstance(expr, str) else expr
    return lambda _: node


def cuda_to_to(call: cst.Call) -> cst.Call:
    """``x.cuda(i, non_blocking=b)`` -> ``x.to(<the rank's device>, non_blocking=b)``.

    An index held in a variable (``args.gpu``, ``device=rank``) is the rank's own device in every script
    seen; a literal index stays that index."""
    index = kw_arg(call, "device") or nth_arg(0, call)
    device = cst.parse_expression(DEVICE)
    if index is not None and isinstance(index.value, cst.Integer):
        device = cst.parse_expression(f"{ACC}.device({index.value.value})")
    rest = [a for a in call.args if (a.keyword is not None and a.keyword.value != "device") or a.star == "**"]
    return call.with_changes(func=call.func.with_changes(attr=cst.Name("to")), args=[cst.Arg(device), *rest])


# init_process_group's arguments npudist.init() takes from the launcher's environment instead.
_GROUP_LAYOUT = frozenset({"init_method", "world_size", "rank", "store", "group_name", "pg_options"})
DROPPED_GROUP_ARGS = frozenset({"device_id"})
"""init_process_group arguments a port drops: ``device_id`` binds the group to a device and connects eagerly, which
a CPU device (gloo ranks) or a vendor backend without eager connection refuses; npudist.init() sets the device."""


def keeps_layout(call: cst.Call) -> bool:
    """An explicit rank, world size, rendezvous or ``**kwargs``: dropping them would start N worlds of one."""
    return any(a.star or (a.keyword is not None and a.keyword.value in _GROUP_LAYOUT) for a in call.args) or \
        len([a for a in call.args if a.keyword is None]) > 1


def backend_only(call: cst.Call) -> cst.Call:
    """init_process_group(nccl, init_method=, rank=, ...) keeps its layout; only the backend becomes the
    vendor's (fix.py then adds ``ctx = npudist.init()``, which adopts the group and sets the device)."""
    backend = cst.Arg(cst.parse_expression(BACKEND), keyword=cst.Name("backend"))
    args, replaced = [], False
    for i, a in enumerate(call.args):
        if a.keyword is not None and a.keyword.value in DROPPED_GROUP_ARGS:
            continue
        if (a.keyword is not None and a.keyword.value == "backend") or (i == 0 and a.keyword is None and not a.star):
            args.append(a.with_changes(value=cst.parse_expression(BACKEND)))
            replaced = True
        else:
            args.append(a)
    if not replaced:
        args.insert(0, backend.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=args)


def npudist_init(call: cst.Call) -> cst.Call:
    """init_process_group(...) -> npudist.init(timeout=...): the backend and device are npudist's choice."""
    timeout = kw_arg(call, "timeout")
    new = cst.parse_expression("npudist.init()")
    if timeout is not None:
        new = new.with_changes(args=[timeout.with_changes(comma=cst.MaybeSentinel.DEFAULT)])
    return new


# torch.cuda.amp's positional parameters, named so they land on the same ones of torch.autocast /
# torch.amp.GradScaler, whose first parameter is the device type (torch/cuda/amp/autocast_mode.py).
AMP_POSITIONAL: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "autocast": ("enabled", "dtype", "cache_enabled"),
    "GradScaler": ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"),
})


def amp_fix(target: str, positional: tuple[str, ...]) -> Rewrite:
    def fix(call: cst.Call) -> cst.Call:
        first = cst.Arg(cst.parse_expression(f"{ACC}.device_type"))
        args, i = [], 0
        for a in call.args:
            if a.keyword is None and not a.star and i < len(positional):
                a = a.with_changes(keyword=cst.Name(positional[i]), equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
                i += 1
            args.append(a)
        return call.with_changes(func=cst.parse_expression(target), args=[first, *args])
    return fix


def dotted(expr: cst.BaseExpression) -> bool:
    """``torch.nn.Module``: a chain of names, so its qualified name is a module path, not a value."""
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    return isinstance(expr, cst.Name)


def npudist_ddp(call: cst.Call) -> cst.Call:
    """DDP(m, device_ids=..., output_device=..., **kw) -> npudist.ddp(m, **kw): the ids are per vendor."""
    module = kw_arg(call, "module") or nth_arg(0, call)
    keep = [a for a in call.args if a.star == "**" or (a.keyword is not None and a.keyword.value not in
            ("module", "device_ids", "output_device"))]
    args = [cst.Arg(module.value), *keep]
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return cst.Call(cst.parse_expression("npudist.ddp"), args=args)


ALLOCATOR_CALLS = frozenset({"memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                             "reset_peak_memory_stats", "empty_cache"})
"""torch.cuda calls with the same name and meaning on ``npudist.accelerator()`` (0 / nothing on CPU).
``memory_stats`` is not one: its keys are CUDA's allocator's."""


def on_accelerator(name: str) -> Rewrite:
    """``torch.cuda.<name>(...)`` -> ``npudist.accelerator().<name>(...)``, arguments kept."""
    return lambda call: call.with_changes(func=cst.parse_expression(f"{ACC}.{name}"))


def cuda_event(call: cst.Call) -> cst.Call:
    """``torch.cuda.Event(enable_timing=True)`` -> ``npudist.accelerator().event(enable_timing=True)``: the
    vendor's event, a host-clock one on CPU (scan.py leaves an Event with positional flags past the first)."""
    return call.with_changes(func=cst.parse_expression(f"{ACC}.event"))


def sync_batchnorm(call: cst.Call) -> cst.BaseExpression:
    """``SyncBatchNorm.convert_sync_batchnorm(model)`` -> the same where there is an accelerator, else
    ``model``: torch's SyncBatchNorm refuses CPU tensors, so CPU ranks keep per-rank batch statistics."""
    model = call.args[0].value
    return cst.parse_expression(f'(({cst.Module([]).code_for_node(call)}) if {ACC}.device_type != "cpu" else '
                                f'{cst.Module([]).code_for_node(model)})')


NOT_CPU = "!= \"cpu\""


def device_test(side: str, *, accelerator_when_true: bool, typed: bool) -> Rewrite:
    """``'cuda' in d`` / ``d == 'cuda'`` / ``d.startswith('cuda')`` -> a test that holds on every accelerator.

    ``side`` says where the device is in the (rewritten) node: "left" or "right" of a comparison, "receiver" of
    ``.startswith``. ``typed``: the expression is already a device type (``device_type``, ``device.type``), so it
    is compared with "cpu" directly; otherwise ``torch.device(d).type`` reads the type of a name or a device.
    """

    def fix(node: Any) -> cst.BaseExpression:
        if side == "receiver":
            device = node.func.value
        else:
            device = node.left if side == "left" else node.comparisons[0].comparator
        code = cst.Module([]).code_for_node(device)
        kind = code if typed else f"torch.device({code}).type"
        return cst.parse_expression(f'{kind} {"!=" if accelerator_when_true else "=="} "cpu"')

    return fix


def gate_for_accelerators(node: cst.If) -> cst.If:
    """``if not verify_min_gpu_count(...): exit()`` -> the same gate, for accelerators only: CPU ranks need no
    device count (npudist.init() refuses a rank without its device on every vendor)."""
    test = node.test
    if isinstance(test, cst.BooleanOperation):
        test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    guard = cst.parse_expression(f'{ACC}.device_type != "cpu"')
    return node.with_changes(test=cst.BooleanOperation(left=guard, operator=cst.And(), right=test))
