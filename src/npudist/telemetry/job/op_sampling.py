"""Operator timing from torch.profiler: aten op names folded into a few families (matmul, softmax, ...).

Only leaf kernels are listed: composites such as ``aten::linear`` or ``aten::layer_norm`` spend their
time in the leaves they call (``aten::addmm``, ``aten::native_layer_norm``), and counting both would
observe one call twice. Self time is used for the same reason. Ops not in the table are not exported,
which keeps the ``op`` label bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

# Leaf aten ops as they appear in torch.profiler events (native_functions.yaml names); backward kernels
# map to their forward's family.
OP_FAMILIES: Mapping[str, str] = MappingProxyType({
    "aten::mm": "matmul", "aten::addmm": "matmul", "aten::bmm": "matmul", "aten::baddbmm": "matmul",
    "aten::addmv": "matmul", "aten::mv": "matmul", "aten::dot": "matmul",
    "aten::_softmax": "softmax", "aten::_log_softmax": "softmax",
    "aten::_softmax_backward_data": "softmax", "aten::_log_softmax_backward_data": "softmax",
    "aten::native_layer_norm": "layer_norm", "aten::native_layer_norm_backward": "layer_norm",
    "aten::native_batch_norm": "batch_norm", "aten::native_batch_norm_backward": "batch_norm",
    "aten::_scaled_dot_product_flash_attention": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::_scaled_dot_product_efficient_attention": "attention",
    "aten::_scaled_dot_product_cudnn_attention": "attention",
    "aten::_flash_attention_forward": "attention", "aten::_flash_attention_backward": "attention",
    "aten::mkldnn_convolution": "conv", "aten::cudnn_convolution": "conv",
    "aten::convolution_backward": "conv",
    "aten::gelu": "activation", "aten::gelu_backward": "activation", "aten::relu": "activation",
    "aten::threshold_backward": "activation", "aten::silu": "activation",
    "aten::silu_backward": "activation",
    "aten::embedding_dense_backward": "embedding", "aten::index_select": "embedding",
    "aten::nll_loss_forward": "loss", "aten::nll_loss_backward": "loss",
    "aten::native_dropout": "dropout", "aten::native_dropout_backward": "dropout",
})


def normalise(name: str) -> str | None:
    """The op family of a profiler event name, or None when it is not a tracked leaf kernel."""
    return OP_FAMILIES.get(name.strip())


def event_seconds(event: Any) -> float:
    """Self time of one FunctionEvent: device time when the profiler captured it, else CPU time (us -> s)."""
    device_us = getattr(event, "self_device_time_total", None)
    if device_us is None:  # torch < 2.4 named it after CUDA
        device_us = getattr(event, "self_cuda_time_total", 0)
    us = device_us if device_us else event.self_cpu_time_total
    return float(us) / 1e6


def _children(ev: Any) -> Iterable[Any]:
    kids = getattr(ev, "cpu_children", None)  # FunctionEvent; the C++ event tree names them ``children``
    return kids if kids is not None else getattr(ev, "children", ())


def _redispatch(name: str, children: Iterable[Any]) -> bool:
    """An op that runs itself again on other tensors: a tensor subclass (the simulated NPU's; torch
    records its ``__torch_dispatch__`` as ``PythonSubclass``) or a vendor wrapper. The inner call is the
    kernel, so the outer one is not counted, or every call would be counted twice."""
    for child in children:
        if child.name == name:
            return True
        if child.name == _SUBCLASS and any(g.name == name for g in _children(child)):
            return True
    return False


_SUBCLASS = "PythonSubclass"


def op_durations(events: Iterable[Any]) -> list[tuple[str, float]]:
    """(family, seconds) for every tracked op call in a profiled step's events."""
    out = []
    for ev in events:
        name = getattr(ev, "name", "")
        op = normalise(name)
        if op is not None and not _redispatch(name, _children(ev)):
            out.append((op, event_seconds(ev)))
    return out


def tree_op_durations(roots: Iterable[Any]) -> list[tuple[str, float]]:
    """(family, self seconds) for every tracked op in a profiler event tree (nodes with ``name``,
    ``duration_time_ns`` and ``children``); self time = own duration minus the children's, as
    FunctionEvent.self_cpu_time_total computes it."""
    out = []
    stack = list(roots)
    while stack:
        ev = stack.pop()
        children = ev.children
        op = OP_FAMILIES.get(ev.name)
        if op is not None and not _redispatch(ev.name, children):
            child_ns = sum(c.duration_time_ns for c in children)
            out.append((op, max(ev.duration_time_ns - child_ns, 0) / 1e9))
        stack.extend(children)
    return out


def profiled_op_durations(prof: Any, device_type: str) -> list[tuple[str, float]]:
    """Op durations of a stopped torch.profiler ``prof``.

    On CPU the C++ event tree is walked directly: ``prof.events()`` builds Python FunctionEvents for
    every op of the step, which on the example job costs 20-50x the profiled step's own overhead
    (about 0.4-0.9 s vs 14 ms per profiled step, measured on torch 2.13). Device profiles keep the
    FunctionEvent path, which carries the device kernels' self time.
    """
    if isinstance(prof, DispatchTimer):
        return list(prof.durations)
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    tree = getattr(results, "experimental_event_tree", None)
    if device_type == "cpu" and tree is not None:
        return tree_op_durations(tree())
    return op_durations(prof.events())


def start_profiler(device_type: str) -> Any:
    """Start torch.profiler for one step: CPU always, plus the device's activity where torch has one."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    extra = {"cuda": "CUDA", "xpu": "XPU"}.get(device_type)
    if extra is not None and hasattr(ProfilerActivity, extra):
        activities.append(getattr(ProfilerActivity, extra))
    prof = profile(activities=activities, record_shapes=False, with_stack=False)
    prof.__enter__()
    return prof


class DispatchTimer:
    """Times aten kernels of one CPU step at the dispatcher, without torch.profiler.

    A profiled step cost 10-55 ms more than a plain 14 ms step of the example job (kineto set-up and
    event collection), up to ~4 % of step time at one step in 100; timing each kernel call here costs a
    few microseconds per op. CPU kernels are synchronous, so the wall time around a leaf kernel is its
    time. The mode is not re-entered inside a kernel, so each call is counted once.
    """

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        timer = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import time

                started = time.perf_counter()
                out = func(*args, **(kwargs or {}))
                op = OP_FAMILIES.get(func._schema.name)
                if op is not None:
                    timer.durations.append((op, time.perf_counter() - started))
                return out

        self.durations: list[tuple[str, float]] = []
        self._mode = _Mode()

    def __enter__(self) -> DispatchTimer:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


def start_op_timer(device_type: str) -> Any:
    """Start timing one step's operators: the dispatcher on CPU, torch.profiler on devices (async kernels)."""
    if device_type == "cpu":
        return DispatchTimer().__enter__()
    return start_profiler(device_type)
