"""The migration rules as data: what a CUDA-only construct breaks off NVIDIA, and what replaces it.

A rule is found by ``scan.py`` and, where ``fixable``, rewritten by ``fix.py``; adding a rule is adding a
row here and one matcher there. Vendor facts cite their source next to the row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

SEVERITIES = ("info", "warning", "error")
"""Ordered: ``--fail-on warning`` fails on warnings and errors."""


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    breaks: str
    """What goes wrong on an NPU, MLU, RK3588 board or CPU."""
    replacement: str
    """The vendor-neutral form."""
    fixable: bool
    """``npudist migrate fix`` rewrites it (in the contexts scan.py marks as mechanical)."""
    example: str = ""
    """The replacement as code that runs; tests/migrate/advice_probe.py executes it on CPU and on the simulated
    NPU (names there: torch, dist, os, npudist, ctx = npudist.init(), model, x)."""


_RULES = (
    Rule("cuda-device-api", "error",
         "torch.cuda.* talks to the CUDA runtime only; on an NPU or MLU it reports no device or raises",
         "npudist.accelerator().set_device/device_count/synchronize/device() (the detected vendor's module)",
         True, "acc = npudist.accelerator()\nn = acc.device_count()\nacc.synchronize()\n"
               "on_accelerator = acc.device_type != 'cpu'\nassert acc.device() == ctx.device"),
    Rule("cuda-memory-api", "warning",
         "torch.cuda memory statistics read CUDA's allocator: 0 (silently) on other devices",
         "npudist.accelerator().memory_allocated / max_memory_allocated / memory_reserved / max_memory_reserved / "
         "empty_cache (the vendor's allocator; 0 on CPU); memory_stats() for a vendor-neutral dict", True,
         "acc = npudist.accelerator()\nacc.reset_peak_memory_stats()\nbig = torch.ones(1024, device=ctx.device)\n"
         "assert acc.max_memory_allocated() >= acc.memory_allocated() >= 0\n"
         "assert acc.max_memory_reserved() >= acc.memory_reserved() >= 0\nacc.empty_cache()\n"
         "stats = acc.memory_stats()\nassert set(stats) <= {'allocated_bytes', 'reserved_bytes'}"),
    Rule("cuda-streams", "error",
         "torch.cuda streams and events exist only on CUDA: constructing one raises",
         "npudist.accelerator().event(enable_timing=True) (the vendor's event; the host clock on CPU); streams: "
         "npudist.accelerator().synchronize() to wait for the device", True,
         "acc = npudist.accelerator()\nstart, end = acc.event(enable_timing=True), acc.event(enable_timing=True)\n"
         "start.record()\ny = x @ x\nend.record()\nacc.synchronize()\nassert start.elapsed_time(end) >= 0"),
    Rule("cuda-amp", "warning",
         "torch.cuda.amp autocasts and scales for CUDA only: off CUDA it disables itself with a warning and "
         "trains in float32 (deprecated since torch 2.4)",
         "torch.autocast(device_type, ...) and torch.amp.GradScaler(device_type, ...) with "
         "npudist.accelerator().device_type", True,
         "dt = npudist.accelerator().device_type\nscaler = torch.amp.GradScaler(dt, enabled=False)\n"
         "with torch.autocast(dt, enabled=False):\n    loss = model(x).sum()\n"
         "scaler.scale(loss).backward()\nwith torch.autocast(dt, dtype=torch.bfloat16):\n    y = model(x)\n"
         "assert y.dtype == torch.bfloat16\n"
         "scaler = torch.amp.GradScaler(dt)\nscaler.scale(y.float().sum()).backward()"),
    Rule("cuda-device-query", "error",
         "torch.cuda.get_device_name / get_device_properties / mem_get_info ask the CUDA runtime: on an NPU, MLU "
         "or CPU host they raise",
         "npudist.accelerator().device_name() / device_properties() / mem_get_info(): the vendor's answer (name, "
         "total_memory, major, minor, multi_processor_count), the host's on CPU", True,
         "acc = npudist.accelerator()\nname = acc.device_name()\np = acc.device_properties()\n"
         "free, total = acc.mem_get_info()\nassert name and p.total_memory > 0 and 0 <= free <= total"),
    Rule("cuda-device-test", "warning",
         "a test for 'cuda' in a device's name ('cuda' in device, device.startswith('cuda'), device_type == "
         "'cuda') is false on every other accelerator: the script silently takes its CPU branch there (nanoGPT "
         "loses autocast, pinning and fused AdamW on an NPU)",
         "torch.device(d).type != 'cpu' (true on every accelerator), or device_type != 'cpu'", True,
         "device = str(ctx.device)\ndevice_type = npudist.accelerator().device_type if torch.device(device).type "
         "!= 'cpu' else 'cpu'\nassert device_type == ctx.device.type"),
    Rule("device-gate", "error",
         "the script exits unless torch sees enough accelerators (pytorch/examples' verify_min_gpu_count): CPU "
         "ranks (gloo) and a host whose vendor torch.accelerator does not know exit without training, with "
         "status 0",
         "keep the gate for accelerators only: `if npudist.accelerator().device_type != 'cpu' and not ...:` "
         "(npudist.init() refuses a rank without its device on every vendor)", True,
         "gate = npudist.accelerator().device_type != 'cpu' and not torch.accelerator.is_available()\n"
         "assert not gate"),
    Rule("cuda-api", "error",
         "a torch.cuda call with no meaning on another device type: it raises there",
         "npudist.accelerator() (device(), device_count(), synchronize(), reset_peak_memory_stats(), "
         "memory_stats()), or drop the call",
         False, "print(npudist.accelerator().device(), npudist.accelerator().device_count())"),
    Rule("cuda-no-op", "warning",
         "a torch.cuda call that answers without CUDA but wrongly: seeds nothing, reports no bf16",
         "torch.manual_seed(n) (seeds every device); a bf16 check by trying the dtype on ctx.device", False,
         "torch.manual_seed(0)\nok = torch.ones(1, dtype=torch.bfloat16, device=ctx.device).sum().item() == 1"),
    Rule("cuda-method", "error",
         ".cuda() moves to a CUDA device; on an NPU host it raises 'Torch not compiled with CUDA enabled'",
         ".to(npudist.accelerator().device()) (ctx.device after npudist.init())", True,
         "m = model.to(ctx.device)\ny = x.to(ctx.device, non_blocking=True)"),
    Rule("cuda-device-string", "error",
         "a 'cuda' / 'cuda:N' device names the CUDA device type only",
         "npudist.accelerator().device(N), or ctx.device from npudist.init()", True,
         "t = torch.zeros(2, device=ctx.device)\nd = torch.device(npudist.accelerator().device_type)"),
    Rule("int-device-index", "error",
         ".to(<int>) means .to('cuda:<int>'): a bare index always selects a CUDA device",
         ".to(ctx.device) (the rank's device)", True, "t = torch.ones(1).to(ctx.device)"),
    Rule("cuda-backend-flags", "warning",
         "torch.backends.cudnn / torch.backends.cuda settings do nothing off NVIDIA (silently)",
         "torch.use_deterministic_algorithms(True) for determinism; "
         "torch.set_float32_matmul_precision('high') for TF32-like speed", False,
         "torch.set_float32_matmul_precision('high')"),
    Rule("init-process-group", "error",
         "init_process_group('nccl') fails where NCCL is absent ('Device backend nccl is not available'), "
         "and without set_device first HCCL binds every rank's communicator to device 0",
         "ctx = npudist.init(): sets the device, then starts hccl/nccl/cncl/gloo as the host needs", True,
         "assert npudist.init() is ctx and dist.is_initialized()"),
    Rule("process-group-setup", "info",
         "a hand-made process group works only if the device was set first and the backend suits it",
         "ctx = npudist.init(): the same for every vendor, with npudist's errors and hang diagnosis", True,
         "assert ctx.backend == dist.get_backend()"),
    Rule("single-process", "warning",
         "the script starts no process group, so it is one process's training: under `npudist launch "
         "--nproc-per-node N` or torchrun it runs N separate trainings of the whole data set, each writing the "
         "same output files, and on a real host each on the device its process was given",
         "run it with --nproc-per-node 1; or make it data parallel: ctx = npudist.init(), "
         "DistributedDataParallel(model), a DistributedSampler for the data, saves on rank 0 only", False,
         "assert ctx.world_size == dist.get_world_size()"),
    Rule("nccl-string", "warning",
         "a backend compared with or set to 'nccl' takes the wrong branch on HCCL, CNCL or gloo "
         "(transfer_to_npu's documented limitation)",
         "ctx.backend from npudist.init(), or test ctx.device.type", False,
         "on_accelerator = ctx.device.type != 'cpu'\nprint(ctx.backend)"),
    Rule("ddp-wrap", "warning",
         "DistributedDataParallel(device_ids=[local_rank]) is right on CUDA only and sends gradient "
         "buckets unadapted (bf16 is refused by strict HCCL)",
         "npudist.ddp(model): the right device_ids per vendor, buckets through npudist.comm", True,
         "m = npudist.ddp(torch.nn.Linear(4, 2).to(ctx.device))\nm(x).sum().backward()"),
    Rule("visible-devices", "warning",
         "CUDA_VISIBLE_DEVICES does not restrict Ascend or Cambricon devices",
         "ASCEND_RT_VISIBLE_DEVICES (NPU), MLU_VISIBLE_DEVICES (MLU); npudist.accelerator().vendor."
         "visible_devices_var names the active one", False,
         "var = npudist.accelerator().vendor.visible_devices_var\nprint(var, os.environ.get(var or '', ''))"),
    Rule("local-rank-env", "info",
         "LOCAL_RANK read by hand to pick a device skips the vendor's visible-devices mapping",
         "ctx.local_rank and ctx.device from npudist.init()", False,
         "assert ctx.device == npudist.accelerator().device() and ctx.local_rank >= 0"),
    Rule("pin-memory", "info",
         "DataLoader(pin_memory=True) page-locks for the accelerator; with none (CPU, RK3588) it warns and "
         "only costs memory",
         "pin_memory=(npudist.accelerator().device_type != 'cpu')", False,
         "dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=2,\n"
         "    pin_memory=(npudist.accelerator().device_type != 'cpu'))\nbatches = list(dl)"),
    Rule("pin-memory-call", "error",
         "tensor.pin_memory() raises where no accelerator is present (CPU hosts, RK3588 boards)",
         "x.pin_memory() if npudist.accelerator().device_type != 'cpu' else x", False,
         "p = x.pin_memory() if npudist.accelerator().device_type != 'cpu' else x"),
    Rule("jit-script", "warning",
         "torch.jit.script is disabled by torch_npu's transfer_to_npu and unsupported on Ascend",
         "eager mode, or torch.compile with the vendor's backend", False, "y = model(x)"),
    Rule("channels-last", "warning",
         "channels_last memory format is not supported on Ascend (transfer_to_npu documentation)",
         "the default contiguous format", False,
         "m = model.to(memory_format=torch.contiguous_format)"),
    Rule("nccl-env", "warning",
         "NCCL_* variables are ignored by HCCL and CNCL",
         "the counterpart listed in the finding (set both for a portable job)", False,
         "os.environ.setdefault('HCCL_CONNECT_TIMEOUT', '120')\nos.environ.setdefault('NCCL_CONNECT_TIMEOUT', '120')"),
    Rule("cuda-env", "warning",
         "a CUDA runtime variable is ignored by the other vendors' runtimes (silently)",
         "the counterpart listed in the finding (PYTORCH_NPU_ALLOC_CONF, ASCEND_LAUNCH_BLOCKING)", False,
         "os.environ.setdefault('PYTORCH_NPU_ALLOC_CONF', 'expandable_segments:True')"),
    Rule("sync-batchnorm", "error",
         "torch's SyncBatchNorm refuses CPU tensors ('SyncBatchNorm expected input tensor to be on GPU or XPU or "
         "privateuseone'): a CPU or RK3588 (gloo) rank raises in its first forward",
         "SyncBatchNorm.convert_sync_batchnorm(model) if npudist.accelerator().device_type != 'cpu' else model "
         "(batch statistics per rank on CPU)", True,
         "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to(ctx.device)\n"
         "m = torch.nn.SyncBatchNorm.convert_sync_batchnorm(m) if npudist.accelerator().device_type != 'cpu' else m\n"
         "m(x).sum().backward()"),
    Rule("vendor-locked", "error",
         "torch_npu-only code (.npu(), torch.npu.*, torch_npu.*): raises wherever torch_npu is absent "
         "(CPU CI, GPUs, MLUs, RK3588 boards)",
         "ctx.device / npudist.accelerator() (the same calls for every vendor)", False,
         "y = x.to(ctx.device)\nnpudist.accelerator().synchronize()"),
    Rule("direct-collective", "info",
         "torch.distributed collectives pass dtypes and layouts to the backend unadapted",
         "npudist.all_reduce / all_gather / broadcast / reduce_scatter adapt to the constraint row", False,
         "t = torch.ones(2, device=ctx.device)\nnpudist.all_reduce(t)"),
    Rule("bf16-collective", "error",
         "the active constraint row does not reduce bfloat16 natively: the collective raises",
         "npudist.all_reduce (casts to a wider dtype and back, counted) or npudist.ddp", False,
         "t = torch.ones(2, dtype=torch.bfloat16, device=ctx.device)\nnpudist.all_reduce(t)"),
)

RULES: Mapping[str, Rule] = MappingProxyType({r.id: r for r in _RULES})

# NCCL variable -> its counterpart on Ascend (HCCL) with the difference that matters.
# Sources: HCCL environment variable reference (CANN "Environment Variables" > "Collective Communication"),
# NCCL "Environment Variables" documentation.
NCCL_ENV: Mapping[str, str] = MappingProxyType({
    "NCCL_SOCKET_IFNAME": "HCCL_SOCKET_IFNAME (interface name) or HCCL_IF_IP (an address)",
    "NCCL_DEBUG": "ASCEND_GLOBAL_LOG_LEVEL (0 debug .. 3 error) and ASCEND_SLOG_PRINT_TO_STDOUT=1",
    "NCCL_TIMEOUT": "HCCL_EXEC_TIMEOUT (seconds, default 1836) and npudist.init(timeout=)",
    "NCCL_BLOCKING_WAIT": "HCCL_ASYNC_ERROR_HANDLING=1 with npudist.init(timeout=)",
    "NCCL_ASYNC_ERROR_HANDLING": "HCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "HCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT": "HCCL_ASYNC_ERROR_HANDLING=1 with npudist.init(timeout=)",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_HCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "TORCH_HCCL_DUMP_ON_TIMEOUT",
    "NCCL_IB_DISABLE": "none: HCCL always uses RoCE between nodes (HCCL_INTRA_ROCE_ENABLE within a node)",
    "NCCL_BUFFSIZE": "HCCL_BUFFSIZE (MB, not bytes)",
    "NCCL_ALGO": "HCCL_ALGO (different algorithm names)",
    "NCCL_P2P_DISABLE": "HCCL_INTRA_PCIE_ENABLE / HCCL_INTRA_ROCE_ENABLE",
    "NCCL_CONNECT_TIMEOUT": "HCCL_CONNECT_TIMEOUT (seconds, default 120)",
})

# torch.cuda calls by what they do on a torch without CUDA (tests/migrate/test_severity.py calls each):
# CUDA runtime variable -> its Ascend counterpart (CANN "Environment Variables" reference; torch_npu's
# PYTORCH_NPU_ALLOC_CONF documentation).
CUDA_ENV: Mapping[str, str] = MappingProxyType({
    "PYTORCH_CUDA_ALLOC_CONF": "PYTORCH_NPU_ALLOC_CONF (same syntax for expandable_segments, max_split_size_mb)",
    "CUDA_LAUNCH_BLOCKING": "ASCEND_LAUNCH_BLOCKING",
    "CUDA_DEVICE_ORDER": "none: Ascend numbers devices by PCIe order",
})

CUDA_MEMORY_CALLS = frozenset({
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "empty_cache",
    "memory_stats",
})
"""Answer 0 / {} / nothing: a memory report that is silently wrong (the raising ones are cuda-api)."""
CUDA_NO_OP_CALLS = frozenset({"manual_seed", "manual_seed_all", "seed", "seed_all", "is_bf16_supported"})
"""Answer without CUDA, wrongly: the device generator is not seeded, bf16 reported missing."""
CUDA_STREAM_CALLS = frozenset({"Stream", "Event", "current_stream", "stream", "default_stream", "set_stream"})
CUDA_DEVICE_CALLS = frozenset({"set_device", "device_count", "synchronize", "is_available", "current_device"})
CUDA_DEVICE_QUERIES: Mapping[str, str] = MappingProxyType({
    "get_device_name": "device_name", "get_device_properties": "device_properties", "mem_get_info": "mem_get_info",
})
"""torch.cuda query -> the npudist.accelerator() method answering it on every vendor (and the host on CPU)."""
DEVICE_COUNT_QUERIES = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count",
                                  "torch.cuda.is_available", "torch.accelerator.is_available"})
"""What a device gate (pytorch/examples' verify_min_gpu_count) asks before it exits."""
COLLECTIVES = frozenset({"all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                         "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all", "all_to_all_single"})
DEVICE_KEYWORDS = frozenset({"device", "map_location", "pin_memory_device", "device_type"})
