"""The walk over one concrete syntax tree that finds the CUDA-only constructs (scan.py runs it).

Each ``visit_*`` matches one shape of construct against the rule tables (rules.py) and records a Finding
with the rewrite that fixes it (rewrites.py), or none where a person must decide. Names are resolved
through the file's imports by libcst's QualifiedNameProvider; nothing the file names is imported or run.
"""

from __future__ import annotations

import re

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider

from npudist.migrate.findings import Finding
from npudist.migrate.rewrites import (
    ACC,
    ALLOCATOR_CALLS,
    AMP_POSITIONAL,
    BACKEND,
    CUDA_INDEX,
    DEVICE,
    DEVICE_FIRST_ARG,
    FIXED_DEVICE_CALLS,
    INDEX_NAME,
    Rewrite,
    amp_fix,
    backend_only,
    constant,
    cuda_event,
    cuda_fstring_index,
    cuda_to_to,
    device_for,
    device_test,
    dotted,
    gate_for_accelerators,
    keeps_layout,
    kw_arg,
    npudist_ddp,
    npudist_init,
    nth_arg,
    on_accelerator,
    string_value,
    sync_batchnorm,
)
from npudist.migrate.rules import (
    COLLECTIVES,
    CUDA_DEVICE_QUERIES,
    CUDA_ENV,
    CUDA_MEMORY_CALLS,
    CUDA_NO_OP_CALLS,
    CUDA_STREAM_CALLS,
    DEVICE_COUNT_QUERIES,
    DEVICE_KEYWORDS,
    NCCL_ENV,
)

_SYNC_BATCHNORM = frozenset({"torch.nn.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm"})
_EXITS = frozenset({"exit", "quit", "sys.exit", "builtins.exit", "builtins.quit", "os._exit"})
# A test already true on every accelerator (what cuda-device-test writes, or written so by hand).
_ACCELERATOR_TEST = re.compile(
    r"""(!=\s*['"]cpu['"]|['"]cuda['"]\s*(==|in)|==\s*['"]cuda['"]|startswith\(\s*['"]cuda)""")
_TYPED = re.compile(r"(type|\.type)$")


GROUP_STARTERS = frozenset({
    "torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group", "npudist.init",
    "torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn",
    "torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.distributed.fsdp.FullyShardedDataParallel", "torch.distributed.fsdp.fully_shard",
    "torch.distributed.device_mesh.init_device_mesh", "accelerate.Accelerator", "deepspeed.initialize",
})
"""Calls that make a script one job of several processes (or its data-parallel wrapper)."""


class CudaFinder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ParentNodeProvider)

    def __init__(self, bf16_refused: bool) -> None:
        super().__init__()
        self.found: list[Finding] = []
        self._bf16_refused = bf16_refused
        self._claimed: set[int] = set()  # nodes already reported through an enclosing construct
        self._lines: set[tuple[str, int]] = set()
        self._entry: cst.CSTNode | None = None  # where a script starts (its argument parser or main guard)
        self._starts_group = False
        self._functions: list[str] = []  # the enclosing function definitions, innermost last
        self._querying: set[str] = set()  # functions that ask torch how many devices it sees
        self._exit_ifs: list[tuple[cst.If, bool, set[str]]] = []  # (if that exits, asks directly, local calls)

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
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._functions.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()

    def visit_Comparison(self, node: cst.Comparison) -> None:
        """``'cuda' in device``, ``device_type == 'cuda'``: tests that hold on CUDA only."""
        if len(node.comparisons) != 1:
            return
        op, right = node.comparisons[0].operator, node.comparisons[0].comparator
        if isinstance(op, cst.In | cst.NotIn) and string_value(node.left) == "cuda":
            self._device_test(node, node.left, right, "right", isinstance(op, cst.In))
        elif isinstance(op, cst.Equal | cst.NotEqual):
            for literal, other, side in ((right, node.left, "left"), (node.left, right, "right")):
                if string_value(literal) == "cuda" and "device" in cst.Module([]).code_for_node(other).lower():
                    self._device_test(node, literal, other, side, isinstance(op, cst.Equal))
                    return

    def _device_test(self, node: cst.CSTNode, literal: cst.CSTNode, device: cst.CSTNode, side: str,
                     accelerator_when_true: bool) -> None:
        self._claimed.add(id(literal))
        typed = bool(_TYPED.search(cst.Module([]).code_for_node(device)))
        self._add("cuda-device-test", node,
                  fix=device_test(side, accelerator_when_true=accelerator_when_true, typed=typed))

    def _guarded_by_device_test(self, node: cst.CSTNode) -> bool:
        """``node`` runs only where a device test says there is an accelerator (nanoGPT's ``if device_type ==
        'cuda': x.pin_memory()``, which cuda-device-test makes true on every accelerator)."""
        child = node
        while True:
            parent = self.get_metadata(ParentNodeProvider, child, None)
            if parent is None or isinstance(parent, cst.FunctionDef | cst.Module):
                return False
            if isinstance(parent, cst.If | cst.IfExp) and child is parent.body and \
                    _ACCELERATOR_TEST.search(cst.Module([]).code_for_node(parent.test)):
                return True
            child = parent

    def visit_If(self, node: cst.If) -> None:
        if self._entry is None and "__main__" in cst.Module([]).code_for_node(node.test) and \
                "__name__" in cst.Module([]).code_for_node(node.test):
            self._entry = node
        if not self._exits(node.body) or "device_type != " in cst.Module([]).code_for_node(node.test):
            return
        calls: list[cst.Call] = []

        class _Calls(cst.CSTVisitor):
            def visit_Call(self, call: cst.Call) -> None:
                calls.append(call)

        node.test.visit(_Calls())
        direct = any(self._qnames(c.func) & DEVICE_COUNT_QUERIES for c in calls)
        local = {c.func.value for c in calls if isinstance(c.func, cst.Name)}
        self._exit_ifs.append((node, direct, local))

    def _exits(self, body: cst.BaseSuite) -> bool:
        found = False

        class _Exit(cst.CSTVisitor):
            def visit_Call(inner, call: cst.Call) -> None:  # the outer visitor is self
                nonlocal found
                found = found or bool(self._qnames(call.func) & _EXITS)

            def visit_Raise(inner, raise_: cst.Raise) -> None:
                nonlocal found
                found = found or "SystemExit" in cst.Module([]).code_for_node(raise_)

        body.visit(_Exit())
        return found

    def visit_Call(self, node: cst.Call) -> None:
        names = self._qnames(node.func)
        if self._functions and names & DEVICE_COUNT_QUERIES:
            self._querying.add(self._functions[-1])
        self._starts_group = self._starts_group or bool(names & GROUP_STARTERS)
        if self._entry is None and "argparse.ArgumentParser" in names:
            self._entry = node
        for name in names:
            if self._call_rule(node, name):
                return
        if isinstance(node.func, cst.Attribute) and \
                not (any(n.startswith("torch.") for n in names) and dotted(node.func.value)):
            # a method on a value (torch.randn(4).cuda(), nn.Linear(4, 4).cuda()), not torch.x.cuda's module
            self._method_rule(node, node.func.attr.value)
        index = cuda_fstring_index(node)
        if index is not None and id(node) not in self._claimed:
            self._cuda_string(node, None, index)

    def leave_Module(self, original_node: cst.Module) -> None:
        # An if that exits when torch sees too few accelerators, asked there or in a function of this file.
        for node, direct, local in self._exit_ifs:
            if direct or local & self._querying:
                self._add("device-gate", node, fix=gate_for_accelerators)
        # A script with device code that never starts a process group is a one-process trainer: N ranks of
        # it are N separate trainings (every finding above concerns the device, so one is the evidence).
        if self._entry is not None and not self._starts_group and self.found:
            self._add("single-process", self._entry)

    def _call_rule(self, node: cst.Call, name: str) -> bool:
        if name.startswith("torch.cuda.amp."):
            tail = name.rsplit(".", 1)[1]
            target = {"autocast": "torch.autocast", "GradScaler": "torch.amp.GradScaler"}.get(tail)
            fix = None
            if target is not None:
                fix = amp_fix(target, AMP_POSITIONAL[tail])
            self._add("cuda-amp", node, fix=fix)
        elif name.startswith("torch.cuda."):
            tail = name[len("torch.cuda."):]
            if tail in CUDA_DEVICE_QUERIES:
                self._add("cuda-device-query", node, fix=on_accelerator(CUDA_DEVICE_QUERIES[tail]))
            elif tail in FIXED_DEVICE_CALLS or tail == "current_device":
                maker = FIXED_DEVICE_CALLS.get(tail)
                self._add("cuda-device-api", node, fix=maker)
            elif tail in CUDA_MEMORY_CALLS:
                self._add("cuda-memory-api", node, fix=on_accelerator(tail) if tail in ALLOCATOR_CALLS else None)
            elif tail == "Event" and len([a for a in node.args if a.keyword is None]) <= 1:
                self._add("cuda-streams", node, fix=cuda_event)
            elif tail in CUDA_STREAM_CALLS:
                self._add("cuda-streams", node)
            elif tail in CUDA_NO_OP_CALLS:
                self._add("cuda-no-op", node)
            else:
                self._add("cuda-api", node, fix=on_accelerator(tail) if tail in ALLOCATOR_CALLS else None)
        elif name == "torch.distributed.init_process_group":
            self._init_process_group(node)
        elif name in ("torch.nn.parallel.DistributedDataParallel",
                      "torch.nn.parallel.distributed.DistributedDataParallel"):
            self._ddp(node)
        elif name.startswith("torch.distributed.") and name.rsplit(".", 1)[1] in COLLECTIVES:
            rule = "bf16-collective" if self._bf16_refused else "direct-collective"
            self._add(rule, node, detail=name.rsplit(".", 1)[1])
        elif name.rsplit(".", 1)[-1] == "convert_sync_batchnorm" or name in _SYNC_BATCHNORM:
            parent = self.get_metadata(ParentNodeProvider, node)
            if isinstance(parent, cst.IfExp) and "device_type" in cst.Module([]).code_for_node(parent.test):
                return True  # already gated on an accelerator (what fix writes)
            model = nth_arg(0, node)
            plain = model is not None and len(node.args) == 1 and dotted(model.value)
            fix = sync_batchnorm if plain and name.endswith("convert_sync_batchnorm") else None
            self._add("sync-batchnorm", node, fix=fix)
        elif name.startswith(("torch.npu.", "torch_npu.")) and "transfer_to_npu" not in name:
            self._add("vendor-locked", node, detail=name)
        elif name in DEVICE_FIRST_ARG:
            self._device_first_arg(node, name)
            return False  # its keywords (device_type=) are still looked at as strings
        else:
            return False
        return True

    def _method_rule(self, node: cst.Call, method: str) -> None:
        if method == "cuda":
            self._add("cuda-method", node, fix=cuda_to_to)
        elif method == "to":
            first = nth_arg(0, node)
            if first is not None and self._is_index(first.value):
                literal = first.value.value if isinstance(first.value, cst.Integer) else ""
                self._add("int-device-index", first.value,
                          fix=constant(f"{ACC}.device({literal})" if literal else DEVICE))
        elif method == "npu":
            self._add("vendor-locked", node, detail=".npu()")
        elif method == "pin_memory" and not self._guarded_by_device_test(node):
            self._add("pin-memory-call", node)
        elif method == "startswith":
            first = nth_arg(0, node)
            if first is not None and string_value(first.value) == "cuda" and len(node.args) == 1:
                self._device_test(node, first.value, node.func.value, "receiver", True)

    def _is_index(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Integer):
            return True
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "int":
            return True
        terminal = expr.attr.value if isinstance(expr, cst.Attribute) else getattr(expr, "value", None)
        return isinstance(terminal, str) and bool(INDEX_NAME.search(terminal)) and terminal != "device"

    def _init_process_group(self, node: cst.Call) -> None:
        backend = kw_arg(node, "backend") or nth_arg(0, node)
        if backend is not None and cst.Module([]).code_for_node(backend.value) == BACKEND:
            return  # already ported (fix keeps a group with an explicit layout and gives it the vendor's backend)
        value = string_value(backend.value) if backend is not None else None
        if backend is not None:
            self._claimed.add(id(backend.value))
        fix = backend_only if keeps_layout(node) else npudist_init
        # device_id binds the group to a device and connects eagerly: a CPU device is refused (rewrites.py)
        bound = "; device_id dropped: npudist.init() sets the device" if kw_arg(node, "device_id") else ""
        if value == "nccl" or backend is None:
            detail = "backend 'nccl'" if value else "no backend: torch guesses from the tensors' device"
            self._add("init-process-group", node, detail=detail + bound, fix=fix)
        else:
            detail = f"backend {value!r}" if value else "backend chosen at run time"
            self._add("process-group-setup", node, detail=detail + bound, fix=fix)

    def _ddp(self, node: cst.Call) -> None:
        module = kw_arg(node, "module") or nth_arg(0, node)
        positional = [a for a in node.args if a.keyword is None and not a.star]
        mechanical = module is not None and len(positional) <= 1 and not any(a.star == "*" for a in node.args)
        self._add("ddp-wrap", node, fix=npudist_ddp if mechanical else None,
                  detail="" if mechanical else "positional or *args after the module: left as written")

    def _device_first_arg(self, node: cst.Call, name: str) -> None:
        first = nth_arg(0, node)
        if first is None:
            return
        value, index = string_value(first.value), cuda_fstring_index(first.value)
        if value is None and index is None:
            return
        self._claimed.add(id(first.value))
        if name == "torch.device":
            second = nth_arg(1, node)
            device = device_for(value, index)
            if device is not None and second is not None and value == "cuda":
                device = cst.parse_expression(DEVICE)
            if device is not None:
                self._add("cuda-device-string", node, fix=constant(device))
        elif value == "cuda":  # autocast("cuda") / GradScaler("cuda"): a device type
            self._add("cuda-device-string", first.value, fix=constant(f"{ACC}.device_type"))

    # -- strings ------------------------------------------------------------------------------
    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if id(node) in self._claimed:
            return
        value = string_value(node)
        if value is None:
            return
        if CUDA_INDEX.fullmatch(value):
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
        index = cuda_fstring_index(node)
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
                fix = constant(f"{ACC}.device_type")
            elif keyword in DEVICE_KEYWORDS or is_to:
                device = device_for(value, index)
                fix = constant(device) if device is not None else None
        elif isinstance(parent, cst.IfExp) and value == "cuda" and \
                string_value(parent.orelse if parent.body is node else parent.body) == "cpu":
            # "cuda" if cond else "cpu": a device type beside another one, so the vendor's device type
            fix = constant(f"{ACC}.device_type")
        elif (isinstance(parent, cst.Assign | cst.AnnAssign) and self._device_variable(parent)) or index is not None:
            # device = "cuda:0", loc = "cuda:{}".format(gpu): used as strings ("cuda" in device), so keep one
            device = device_for(value, index)
            if device is not None:
                fix = constant(cst.Call(cst.Name("str"), args=[cst.Arg(device)]))
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
