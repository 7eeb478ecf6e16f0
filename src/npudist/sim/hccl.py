"""The simulated ``hccl`` backend: a process group for ``npu`` tensors only, carried over gloo.

It refuses what the real backend refuses, in the real backend's words, before gloo sees anything:

- a CPU tensor on a group whose backend is registered for ``npu`` only: torch's ProcessGroup finds no
  backend for the device and raises ``No backend type associated with device type cpu``
  (torch/csrc/distributed/c10d/ProcessGroup.hpp, getBackend), as HCCL and NCCL groups do;
- a non-contiguous tensor: ``Tensors must be contiguous`` (torch_npu ProcessGroupHCCL checkTensor);
- ``ReduceOp.AVG`` where the row says the group emulates it (``avg_in_group``: the ``hccl`` row, as current
  torch_npu's ProcessGroupHCCL does) is reduced as a sum and divided by the group size afterwards, in the
  tensor's dtype (an integer tensor then fails in the division, as it does there); the ``hccl-strict`` row,
  like torch_npu releases before 2025-02, refuses it;
- what the active constraint row (comm/constraints.py: ``hccl``, or ``hccl-strict`` under
  ``--simulate npu:strict``, for floating-point tensors; integer ones always meet ``hccl``) does not
  take: a dtype or reduce op (HCCL_E_NOT_SUPPORT), an element count
  that is not a multiple of the row's ``element_multiple`` or a data pointer off its ``alignment_bytes``
  (HCCL_E_PARA). The names are HcclResult members of hccl_types.h (CANN; shipped in the torch-npu
  wheel): HCCL_E_PARA = 1, HCCL_E_NOT_SUPPORT = 5.

Every call runs to completion before it returns (gloo's work is waited for), so the returned work is
already done; calls, payload bytes and refusals per collective are counted in ``SIM.counts``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from npudist.comm.constraints import HCCL, Constraints
from npudist.sim.hccl_errors import HCCL_E_NOT_SUPPORT, HCCL_E_PARA, RESULT_CODES, HcclError, op_name
from npudist.sim.hccl_views import BackendView, dispatched_view
from npudist.sim.state import SIM
from npudist.sim.tensor import DEVICE_TYPE, SimTensor

BACKEND = "hccl"


PG_REDUCE_CAST = MappingProxyType({torch.bool: torch.int32, torch.uint8: torch.int32})
"""Dtypes torch_npu's ProcessGroupHCCL casts before an all-reduce or reduce (ProcessGroupHCCL.cpp, allreduce /
allreduce_coalesced / reduce / _reduce_oop: kBool and kByte become kInt, and the result is copied back), so HCCL
sees int32: a bool sum is an or, a uint8 sum wraps modulo 256."""
_PG_CASTING_CALLS = frozenset({"HcclAllReduce", "HcclReduce"})

GLOO_CARRIER = MappingProxyType({torch.int16: torch.int32})
"""Dtypes HCCL takes that gloo cannot carry (ProcessGroupGloo's type switch has no int16: "Invalid scalar
type"), with the wider dtype gloo moves and reduces them in; the result is cast back, exactly."""


class SimHcclGroup(dist.ProcessGroup):
    """The whole group for ``hccl``: checks each tensor as HCCL would, then lets gloo move host data."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta, row: Constraints) -> None:
        super().__init__(rank, size)
        host = dist.ProcessGroupGloo(dist.PrefixStore("sim_hccl", store), rank, size, timeout)
        self._inner: dist.ProcessGroupGloo | None = host
        self._view: Any = None
        """A C++ ProcessGroup over ``_inner``: calls through it pass the dispatcher, where the process-group
        watch (comm/pg_watch.py) counts them as it counts a real HCCL group's."""
        self.row = row
        self._store, self._timeout = store, timeout
        self._backend = BackendView(self)
        self._write_back: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._divide: list[torch.Tensor] = []
        self._name = ""

    def getBackendName(self) -> str:
        return BACKEND

    def _set_group_name(self, name: str) -> None:
        # torch names every group it makes (distributed_c10d._new_process_group_helper); the C++ ProcessGroup keeps
        # the name on its backends, which a Python group has none of, so DeviceMesh (FSDP2) reading group_name
        # found "ProcessGroup name not set". The name is kept here.
        self._name = name
        if self._view is not None and self._view is not self._inner:
            self._view._set_group_name(name)

    @property
    def collectives_dispatched(self) -> bool:
        """Whether this group's collectives reach torch's dispatcher (where the process-group watch counts
        them): they do through the view, where this torch can build one (comm/pg_watch.py's dispatched)."""
        return self._inner is not None and self._host_group() is not self._inner

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def _device_types(self) -> list[torch.device]:
        """The device this group serves. torch's object collectives (broadcast_object_list, all_gather_object,
        gather_object, scatter_object_list) read it to place their byte tensors
        (distributed_c10d._get_object_coll_device); as on a real HCCL group, that is the NPU."""
        return [torch.device(DEVICE_TYPE)]

    def _get_backend(self, device: torch.device | str) -> BackendView:
        """The backend serving ``device``: this group for ``npu``, none for anything else.

        torch asks for it by device: ``init_process_group(device_id=...)`` (eager connect), DeviceMesh and
        ``split_group`` (whether it can split). A C++ ProcessGroup answers from the backends registered on
        it; a Python group has none, so torch found "No backend type associated with device type npu"."""
        kind = torch.device(device).type
        if kind != DEVICE_TYPE:
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self._backend

    def get_group_store(self) -> dist.Store:
        return self._store

    def split_group(self, ranks: list[int], *, timeout: timedelta | None = None, opts: Any = None,
                    group_name: str = "", group_desc: str | None = None, device_types: Any = None,
                    **_: Any) -> SimHcclGroup | None:
        """A new group of ``ranks`` (ranks of this group), as ProcessGroupHCCL splits its communicator
        (HcclCommInitRootInfoConfig with a split color, torch_npu). torch's ``split_group`` calls it; DeviceMesh
        does for every mesh dimension of a group bound to a device (``init_process_group(device_id=...)``).
        None on a rank not in ``ranks``, as torch's own split returns."""
        if self.rank() not in ranks:
            return None
        store = dist.PrefixStore(f"split/{group_name}", self._store)
        group = SimHcclGroup(store, ranks.index(self.rank()), len(ranks), timeout or self._timeout, self.row)
        group._set_group_name(group_name)
        if group_desc:
            group._set_group_desc(group_desc)
        return group

    def _host_group(self) -> Any:
        """The gloo group that moves the host data, seen through a dispatched ProcessGroup where this torch
        can build one (torch's own _new_process_group_helper wraps its backends the same way)."""
        if self._inner is None:
            raise RuntimeError("the simulated hccl group was shut down (destroy_process_group); create a new "
                               "group with dist.init_process_group or npudist.init() to communicate again")
        if self._view is None:
            self._view = dispatched_view(self._inner, self._store, self.rank(), self.size(), self._name)
        return self._view

    def shutdown(self) -> None:
        """Join the host group's worker threads now: destroy_process_group calls this, and a gloo group
        destroyed later, during interpreter finalization, can abort the process (runtime/state.py, close).
        ProcessGroupGloo.shutdown leaves its threads running (torch 2.13); only its destructor joins them,
        and this is the one reference to it."""
        self._inner = self._view = None

    abort = shutdown

    def __repr__(self) -> str:
        return f"SimHcclGroup(rank={self.rank()}, size={self.size()}, row={self.row.name})"

    # -- the checks HCCL makes -------------------------------------------------------------------------
    def _host(self, call: str, tensors: Iterable[torch.Tensor], op: str | None = None) -> list[torch.Tensor]:
        out = []
        try:
            for t in tensors:
                if not isinstance(t, SimTensor):
                    SIM.counts.refused[call] += 1
                    raise RuntimeError(f"No backend type associated with device type {t.device.type}")
                if not t.is_contiguous():
                    SIM.counts.refused[call] += 1
                    raise RuntimeError("Tensors must be contiguous")
                cast = PG_REDUCE_CAST.get(t.dtype) if op is not None and call in _PG_CASTING_CALLS else None
                self._check_row(call, t, op, cast or t.dtype)
                out.append(self._carried(t.elem, cast))
        except Exception:
            self._write_back.clear()
            self._divide.clear()
            raise
        return out

    def _same_device(self, call: str, tensors: Iterable[torch.Tensor], others: Iterable[torch.Tensor]) -> None:
        """Each tensor and its counterpart on one device, or torch_npu's refusal (ProcessGroupHCCL.cpp,
        flatten_for_scatter_gather, which the scatter/gather-shaped collectives go through). Only the C++
        device guard (sim/guard.py) gives tensors different devices."""
        for t, other in zip(tensors, others, strict=True):
            if t.device != other.device:
                SIM.counts.refused[call] += 1
                raise RuntimeError("Corresponding input/output tensors to scatter/gather must all reside on the "
                                   "same device")

    def _avg_as_sum(self, opts: Any, outputs: Iterable[torch.Tensor]) -> Any:
        """AVG as torch_npu's ProcessGroupHCCL runs it (getHcclReduceOp: HCCL_REDUCE_SUM, then ``div_(size)``):
        gloo is asked for a sum and ``outputs`` are divided when it is done. Reached only for tensors whose row
        took avg in ``_check_row``."""
        if op_name(opts) != "avg":
            return opts
        opts.reduceOp = dist.ReduceOp.SUM
        self._divide.extend(t.elem for t in outputs)
        return opts

    def _carried(self, held: torch.Tensor, cast: torch.dtype | None = None) -> torch.Tensor:
        """The host tensor gloo moves: ``held`` itself, or a copy in ``cast`` (the group's own cast) or
        GLOO_CARRIER's wider dtype, whose result is written back into ``held`` when the call is done."""
        wider = cast or GLOO_CARRIER.get(held.dtype)
        if wider is None:
            return held
        wide = held.to(wider)
        self._write_back.append((held, wide))
        return wide

    def _check_row(self, call: str, t: torch.Tensor, op: str | None, dtype: torch.dtype) -> None:
        """``dtype``: what HCCL is handed (the tensor's, or the group's PG_REDUCE_CAST of it)."""
        # The strict row's reports concern data: torch's own integer bookkeeping (DDP's bucket-index and
        # shape broadcasts, object sizes) ran on those machines, so integer tensors meet the plain hccl row.
        row = self.row if dtype.is_floating_point else HCCL
        native = "sum" if op == "avg" and row.avg_in_group else op
        allowed = row.native_dtypes(native) if native is not None else row.copy_dtypes
        if dtype not in allowed:
            what = f"reduce op {op} on {t.dtype}" if op is not None else f"data type {t.dtype}"
            self._refuse(call, HCCL_E_NOT_SUPPORT, f"{what} is not supported ({row.name} row)")
        if t.numel() % row.element_multiple:
            self._refuse(call, HCCL_E_PARA, f"count {t.numel()} is not a multiple of {row.element_multiple} "
                         f"({row.name} row)")
        if t.data_ptr() % row.alignment_bytes:
            self._refuse(call, HCCL_E_PARA, f"buffer address is not {row.alignment_bytes}-byte aligned "
                         f"({row.name} row)")

    def _refuse(self, call: str, name: str, detail: str) -> None:
        SIM.counts.refused[call] += 1
        raise HcclError(f"{call} failed: {name} (error code {RESULT_CODES[name]}): {detail}")

    def _done(self, result: Any, inner_work: Any = None) -> Any:
        if inner_work is not None:
            inner_work.wait()
        for held, wide in self._write_back:
            held.copy_(wide)  # a sum or product wraps modulo 2**16 either way: the same int16 bits as HCCL's
        self._write_back.clear()
        divide, self._divide = self._divide, []
        for held in divide:
            held.div_(self.size())  # an integer tensor raises here, as torch_npu's div_ does (not on Ascend950)
        fut: Future = Future()
        fut.set_result(result)
        return _create_work_from_future(fut)

    # -- collectives ---------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        host = self._host("HcclAllReduce", tensors, op_name(opts))
        opts = self._avg_as_sum(opts, tensors)
        SIM.counts.add("all_reduce", tensors)
        return self._done(list(tensors), self._host_group().allreduce(host, opts))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        host = self._host("HcclAllReduce", tensors, op_name(opts))
        opts = self._avg_as_sum(opts, tensors)
        SIM.counts.add("all_reduce_coalesced", tensors)
        return self._done(list(tensors), self._host_group().allreduce_coalesced(host, opts))

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        host = self._host("HcclBroadcast", tensors)
        SIM.counts.add("broadcast", tensors)
        return self._done(list(tensors), self._host_group().broadcast(host, opts))

    def allgather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        self._same_device("HcclAllGather", [outs[0] for outs in output_lists], inputs)
        host_in = self._host("HcclAllGather", inputs)
        host_out = [self._host("HcclAllGather", outs) for outs in output_lists]
        SIM.counts.add("all_gather", inputs)
        return self._done(output_lists, self._host_group().allgather(host_out, host_in, opts))

    def _allgather_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        self._same_device("HcclAllGather", [output], [input])
        (host_out,) = self._host("HcclAllGather", [output])
        (host_in,) = self._host("HcclAllGather", [input])
        SIM.counts.add("all_gather_into_tensor", [input])
        # HCCL (as NCCL) fills any output of world x input elements (SyncBatchNorm passes [1, world*n]); gloo
        # wants the inputs concatenated along dim 0, so it gets the same memory in that shape.
        if host_out.is_contiguous() and host_out.numel() == self.size() * host_in.numel() and host_in.dim():
            host_out = host_out.view(-1, *host_in.shape[1:])
        return self._done(output, self._host_group()._allgather_base(host_out, host_in, opts))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = op_name(opts)
        self._same_device("HcclReduceScatter", outputs, [ins[0] for ins in input_lists])
        host_out = self._host("HcclReduceScatter", outputs, op)
        host_in = [self._host("HcclReduceScatter", ins, op) for ins in input_lists]
        opts = self._avg_as_sum(opts, outputs)
        SIM.counts.add("reduce_scatter", outputs)
        return self._done(list(outputs), self._host_group().reduce_scatter(host_out, host_in, opts))

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = op_name(opts)
        self._same_device("HcclReduceScatter", [output], [input])
        (host_out,) = self._host("HcclReduceScatter", [output], op)
        (host_in,) = self._host("HcclReduceScatter", [input], op)
        opts = self._avg_as_sum(opts, [output])
        SIM.counts.add("reduce_scatter_tensor", [output])
        return self._done(output, self._host_group()._reduce_scatter_base(host_out, host_in, opts))

    # The names torch's Python API calls (dist.all_gather_single / all_gather_into_tensor, reduce_scatter_tensor,
    # all_to_all_single): bound here, so they reach the checks above instead of the C++ op registry, which
    # would hand the host tensors to a group with no cpu backend.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        # what torch's functional all_gather (DTensor, FSDP2's state dicts) calls on the group
        for output, input in zip(outputs, inputs, strict=True):
            self._allgather_base(output, input, opts)
        return self._done(list(outputs))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs, strict=True):
            self._reduce_scatter_base(output, input, opts)
        return self._done(list(outputs))

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        host = self._host("HcclReduce", tensors, op_name(opts))
        opts = self._avg_as_sum(opts, tensors)
        SIM.counts.add("reduce", tensors)
        return self._done(list(tensors), self._host_group().reduce(host, opts))

    def gather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        host_in = self._host("HcclGather", inputs)
        host_out = [self._host("HcclGather", outs) for outs in output_lists]
        SIM.counts.add("gather", inputs)
        return self._done(output_lists, self._host_group().gather(host_out, host_in, opts))

    def gather_single(self, output, input, opts=None):
        # torch >= 2.15 (dist.gather_single): one output tensor on the root holding the ranks' inputs in order,
        # an empty placeholder elsewhere; gloo's gather takes the root's output as one tensor per rank.
        opts = opts if opts is not None else dist.GatherOptions()
        (host_in,) = self._host("HcclGather", [input])
        (host_out,) = self._host("HcclGather", [output])
        rows = [list(host_out.view(self.size(), -1).unbind(0))] if self.rank() == opts.rootRank else []
        SIM.counts.add("gather", [input])
        return self._done(output, self._host_group().gather(rows, [host_in], opts))

    def scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        host_out = self._host("HcclScatter", outputs)
        host_in = [self._host("HcclScatter", ins) for ins in input_lists]
        SIM.counts.add("scatter", outputs)
        return self._done(list(outputs), self._host_group().scatter(host_out, host_in, opts))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        (host_out,) = self._host("HcclAlltoAllV", [output])
        (host_in,) = self._host("HcclAlltoAllV", [input])
        SIM.counts.add("all_to_all_single", [input])
        work = self._host_group().alltoall_base(host_out, host_in, output_split_sizes, input_split_sizes, opts)
        return self._done(output, work)

    all_to_all_single = alltoall_base

    def send(self, tensors, dst, tag=0):
        host = self._host("HcclSend", tensors)
        SIM.counts.add("send", tensors)
        return self._done(list(tensors), self._host_group().send(host, dst, tag))

    def recv(self, tensors, src, tag=0):
        host = self._host("HcclRecv", tensors)
        SIM.counts.add("recv", tensors)
        return self._done(list(tensors), self._host_group().recv(host, src, tag))

    def barrier(self, opts=None):
        # HCCL's barrier all-reduces a one-element device tensor; the host group's barrier is the same
        # rendezvous without one.
        SIM.counts.calls["barrier"] += 1
        return self._done([], self._host_group().barrier(dist.BarrierOptions()))


def creator(row: Constraints):
    """The function ``dist.Backend.register_backend`` calls to build a group."""

    def create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> SimHcclGroup:
        return SimHcclGroup(store, rank, size, timeout, row)

    return create


def register(row: Constraints) -> None:
    """Register ``hccl`` for the ``npu`` device type only, as torch_npu does."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, creator(row), devices=[DEVICE_TYPE])
    # torch >= 2.15 attaches a Python flight-recorder hook to a group whose backend does not record itself,
    # keyed on a group name a ProcessGroup subclass cannot have (distributed_c10d._maybe_attach_flight_recorder:
    # "Such a group cannot be recorded"). Every call here is carried by gloo, which records itself, so the
    # group is declared self-recording in the set torch keeps for that (_FR_SELF_RECORDING_BACKENDS).
    self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if self_recording is not None:
        self_recording.add(BACKEND)
