"""A collective backend registered for one device type only, the way HCCL and NCCL are, on a CPU machine.

``install()`` renames PrivateUse1 to ``fakedev`` (the slot torch_npu uses for ``npu``), makes ``fakedev``
tensors wrappers around CPU tensors, and registers the backend ``fakeccl`` for ``devices=["fakedev"]``
only. Its collectives run on an inner gloo group over the host copies. Because the backend is registered
for no other device, torch itself refuses a CPU tensor with the text HCCL and NCCL groups give:
``No backend type associated with device type cpu``. Call ``install()`` once per process, before
``init_process_group("fakeccl", ...)``; the rename cannot be undone, so use it in rank subprocesses.

Sources: torch's ``utils/backend_registration.py`` (``_setup_privateuseone_for_python_backend``),
``Backend.register_backend(name, creator, devices=[...])`` and its threaded test process group
(``torch/testing/_internal/distributed/multi_threaded_pg.py``), and /work/shared/notes/simulated-npu.md.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future
from torch.utils._pytree import tree_map

DEVICE = "fakedev"
BACKEND = "fakeccl"
aten = torch.ops.aten


class FakeDevTensor(torch.Tensor):
    """A ``fakedev:0`` tensor whose data is the CPU tensor ``inner`` (views share it, so aliasing holds)."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> FakeDevTensor:
        return torch.Tensor._make_wrapper_subclass(cls, inner.size(), strides=inner.stride(),
                                                   storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                   device=torch.device(DEVICE, 0))

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._to_copy.default:
            src = args[0].inner if isinstance(args[0], FakeDevTensor) else args[0]
            device = kwargs.pop("device", None)
            out = aten._to_copy.default(src, **{**kwargs, "device": torch.device("cpu")})
            return FakeDevTensor(out) if device is None or torch.device(device).type == DEVICE else out
        if func is aten._copy_from.default:
            return _copy_from(*args, **kwargs)
        out = func(*tree_map(_host, args), **tree_map(_host, kwargs))
        mutated = [a for a in args if isinstance(a, FakeDevTensor)]
        if func._schema.is_mutable and mutated and isinstance(out, torch.Tensor):
            return mutated[0]  # in-place: the caller keeps its own wrapper
        return tree_map(lambda t: FakeDevTensor(t) if isinstance(t, torch.Tensor) else t, out)


def _host(x):
    return x.inner if isinstance(x, FakeDevTensor) else x


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return FakeDevTensor(torch.empty(size, dtype=dtype))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return FakeDevTensor(torch.empty_strided(size, stride, dtype=dtype))


def _copy_from(src, dst, non_blocking=False):
    _host(dst).copy_(_host(src))
    return dst


def _done(result: object = None):
    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class FakeCCL(dist.ProcessGroup):
    """Collectives on ``fakedev`` tensors, run by an inner gloo group on their host copies."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.calls: list[str] = []

    def _run(self, name: str, tensors: list[torch.Tensor], call) -> object:
        _refuse_host(tensors)
        self.calls.append(name)
        hosts = [t.inner if isinstance(t, FakeDevTensor) else t for t in tensors]
        call(hosts).wait()
        return _done(tensors)

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        return self._run("allreduce", tensors, lambda h: self.gloo.allreduce(h, opts))

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        return self._run("broadcast", tensors, lambda h: self.gloo.broadcast(h, opts))

    def allgather(self, outputs, inputs, opts=None):
        opts = opts or dist.AllgatherOptions()
        _refuse_host([*inputs, *(t for out in outputs for t in out)])
        self.calls.append("allgather")
        self.gloo.allgather([[_host(t) for t in out] for out in outputs], [_host(t) for t in inputs], opts).wait()
        return _done(outputs)

    def barrier(self, opts=None):
        self.calls.append("barrier")
        self.gloo.barrier(dist.BarrierOptions()).wait()
        return _done()

    def getBackendName(self) -> str:
        return BACKEND


def _refuse_host(tensors: list[torch.Tensor]) -> None:
    """What torch's ProcessGroup says when no backend of the group serves a tensor's device type."""
    for t in tensors:
        if t.device.type != DEVICE:
            raise RuntimeError(f"No backend type associated with device type {t.device.type}")


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> FakeCCL:
    return FakeCCL(store, rank, size, timeout)


def install() -> None:
    """Set up the ``fakedev`` device and register ``fakeccl`` for it alone (once per process)."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(DEVICE)
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    install.lib = lib  # the registrations live as long as the Library object
    dist.Backend.register_backend(BACKEND, _create, devices=[DEVICE])
