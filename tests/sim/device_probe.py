"""Runs in a child process for test_device.py: the simulated device's semantics, printed as one JSON line.

A child, because installing the simulation renames torch's PrivateUse1 device for the whole process.
"""

from __future__ import annotations

import copy
import io
import json

import torch
import torch.nn as nn

from npudist.sim import install
from npudist.sim.state import SIM

install("npu")
r: dict = {}

# Placement and aliasing: a view's write is seen through its base, on the device.
z = torch.zeros(4, device="npu")
z[1:3].add_(1)
r["alias"] = z.cpu().tolist()
r["devices"] = [str(t.device) for t in (z, z[1:], torch.tensor([1.0], device="npu"), torch.ones(2).npu())]
r["to_cpu_is_plain"] = type(z.cpu()) is torch.Tensor
r["transpose_contiguous"] = torch.arange(6.0).npu().view(2, 3).t().contiguous().cpu().tolist()

# Factories that size their result while filling it (torch's arange resizes an empty out= tensor).
r["aranges"] = [[list(t.shape), str(t.dtype), t.cpu().tolist()] for t in (
    torch.arange(6.0, device="npu"), torch.arange(2, 5, device="npu:0"),
    torch.arange(0, 1.5, 0.5, device="npu", dtype=torch.float64))]
try:
    resized = torch.arange(3.0, out=torch.empty(0, device="npu"))
    r["arange_resized_out"] = [list(resized.shape), resized.cpu().tolist()]
except RuntimeError as exc:
    r["arange_resized_out"] = str(exc)

# A model trained on npu:0 and on the CPU from the same weights: bitwise equal.
torch.manual_seed(0)
cpu = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
sim = copy.deepcopy(cpu).to("npu")
attn_cpu = nn.MultiheadAttention(8, 2, batch_first=True)
attn_sim = copy.deepcopy(attn_cpu).to("npu")
opts = [torch.optim.AdamW(list(m.parameters()) + list(a.parameters())) for m, a in ((cpu, attn_cpu), (sim, attn_sim))]
g = torch.Generator().manual_seed(1)
for _ in range(3):
    x = torch.randn(2, 5, 8, generator=g)
    for (m, a), opt, dev in zip(((cpu, attn_cpu), (sim, attn_sim)), opts, ("cpu", "npu"), strict=True):
        xx = x.to(dev)
        y = m(a(xx, xx, xx, need_weights=False)[0])
        opt.zero_grad()
        y.square().mean().backward()
        opt.step()
pairs = [*zip(cpu.parameters(), sim.parameters(), strict=True),
         *zip(attn_cpu.parameters(), attn_sim.parameters(), strict=True)]
r["bitwise_equal_training"] = all(torch.equal(a, b.cpu()) for a, b in pairs)

# Memory: real bytes of live storages, a view adds nothing, freeing returns them.
base = torch.npu.memory_allocated()
big = torch.empty(1024, device="npu")
view = big[10:]
r["allocated_delta"] = torch.npu.memory_allocated() - base
# The counters torchtitan's DeviceMemoryMonitor reads (torchtitan/components/metrics.py), under torch_npu's keys.
stats = torch.npu.memory_stats()
r["stats"] = {key: stats.get(key) for key in ("active_bytes.all.current", "allocated_bytes.all.current",
                                              "num_alloc_retries", "num_ooms")}
r["stats_peaks_cover_current"] = (stats["active_bytes.all.peak"] >= stats["active_bytes.all.current"]
                                  and stats["reserved_bytes.all.peak"] >= stats["active_bytes.all.current"])
del big, view
r["freed_delta"] = torch.npu.memory_allocated() - base
r["reserved_at_least_allocated"] = torch.npu.memory_reserved() >= torch.npu.memory_allocated()

# A stream has torch.Stream's fields; FSDP2 on torch >= 2.15 hands them to torch.ops.fsdp.record_grad_output_stream
# after every gradient reduction (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
first, second = torch.npu.Stream(), torch.npu.Stream()
r["stream_fields"] = [first.device_index, first.device_type == int(torch._C._autograd.DeviceType.PrivateUse1.value),
                      first.stream_id != second.stream_id]
try:
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import record_grad_output_stream
except ImportError:  # torch < 2.15
    r["fsdp_records_the_stream"] = "absent"
else:
    record_grad_output_stream(torch.ones(4, device="npu"), torch.npu.current_stream())
    r["fsdp_records_the_stream"] = "ran"

# The host's chips, as a process without ASCEND_RT_VISIBLE_DEVICES sees them.
r["device_count"] = torch.npu.device_count()
for index in (1, 8):
    try:
        torch.npu.set_device(index)
        r[f"set_device_{index}"] = None
    except RuntimeError as exc:
        r[f"set_device_{index}"] = str(exc)
r["device_name_3"] = torch.npu.get_device_name(3)
torch.npu.set_device(0)
start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
start.record()
torch.npu.current_stream().synchronize()
end.record()
r["event_ms_nonnegative"] = start.elapsed_time(end) >= 0

# Checkpoint bytes hold host tensors: they load with weights_only anywhere.
buf = io.BytesIO()
torch.save({"w": torch.arange(3.0).npu()}, buf)
buf.seek(0)
loaded = torch.load(buf, weights_only=True)["w"]
r["saved_as"] = [str(loaded.device), loaded.tolist()]

# Op sampling: each matmul counted once although the subclass runs it again on host tensors.
from npudist.telemetry.job.op_sampling import profiled_op_durations, start_op_timer  # noqa: E402

lin = nn.Linear(16, 16).npu()
prof = start_op_timer("npu")
lin(torch.randn(4, 16).npu())
prof.__exit__(None, None, None)
r["profiled_matmuls"] = sum(1 for op, _ in profiled_op_durations(prof, "npu") if op == "matmul")
r["row"] = SIM.row
print("RESULT " + json.dumps(r))
