"""Rank telemetry from the real CUDA caching allocator and from torch.profiler on CUDA.

The labels are built by the rank exporter's own ``rank_labels`` and the sampled-step test also runs on the
CPU, so CI fails when the rank label set changes (issue 33: these tests had rotted with a 3-label tuple).

The caching allocator keeps freed blocks reserved for reuse until empty_cache() (PyTorch docs, "CUDA
semantics: memory management"), so freeing every other block leaves reserved memory no tensor uses:
fragmentation 1 - allocated/reserved > 0; allocating the same sizes again reuses those blocks.
"""

from __future__ import annotations

import json

import pytest
import torch
from prometheus_client import CollectorRegistry

from npudist.accelerators import get
from npudist.runtime import compat
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.rank_exporter import rank_labels
from npudist.telemetry.job.allocator import AllocatorCollector, read_allocator
from npudist.telemetry.job.step_timer import StepTimer, TrainingMetrics
from npudist.telemetry.sources.readings import RankDevice
from tests.conftest import REPO, child_env, run_py
from tests.telemetry.exp_helpers import families, registry_text, samples

BLOCK = 512 << 10  # small-pool size (<= 1 MiB): served from 2 MiB segments, four blocks each
LABELS = rank_labels(0, 0, "node", RankDevice(0, 0, 0))
ON_CUDA = pytest.param("cuda", marks=pytest.mark.cuda)


def test_allocator_collector_exports_with_the_rank_labels() -> None:
    """The collector half of the fragmentation test, with the caching allocator's numbers given: runs in CI."""
    health = CollectorHealth()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AllocatorCollector(lambda: {"allocated_bytes": 3 << 20, "reserved_bytes": 4 << 20}, health,
                                         LABELS))
    fams = families(registry_text(registry))
    [exported] = samples(fams, "npudist_allocator_fragmentation_ratio").values()
    assert exported == pytest.approx(0.25) and health.errors("allocator") == {}


@pytest.mark.cuda
@pytest.mark.timeout(60)
def test_fragmentation_from_the_caching_allocator() -> None:
    acc = get("cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.empty(BLOCK, dtype=torch.uint8, device="cuda:0") for _ in range(64)]
    del blocks[::2]  # every other block freed: holes inside segments the allocator keeps
    torch.cuda.synchronize()
    holed = read_allocator(acc, 0)
    assert holed is not None
    assert holed.allocated_bytes == torch.cuda.memory_allocated(0)
    assert holed.reserved_bytes == torch.cuda.memory_reserved(0)
    assert holed.reserved_bytes - holed.allocated_bytes >= 32 * BLOCK, holed
    assert holed.fragmentation_ratio is not None and 0 < holed.fragmentation_ratio < 1, holed

    health = CollectorHealth()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AllocatorCollector(lambda: acc.memory_stats(0), health, LABELS))
    fams = families(registry_text(registry))
    [exported] = samples(fams, "npudist_allocator_fragmentation_ratio").values()
    assert exported == pytest.approx(holed.fragmentation_ratio)
    [reserved] = samples(fams, "npudist_allocator_reserved_bytes").values()
    assert reserved == holed.reserved_bytes
    assert health.errors("allocator") == {}

    refill = [torch.empty(BLOCK, dtype=torch.uint8, device="cuda:0") for _ in range(32)]
    torch.cuda.synchronize()
    filled = read_allocator(acc, 0)
    assert filled.reserved_bytes == holed.reserved_bytes, (holed, filled)  # the holes were reused
    assert filled.fragmentation_ratio < holed.fragmentation_ratio, (holed, filled)
    del blocks, refill
    torch.cuda.empty_cache()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", [ON_CUDA, "cpu"])
def test_sampled_step_times_matmul_kernels(device: str) -> None:
    metrics = TrainingMetrics(LABELS)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    timer = StepTimer(metrics, exchange_every=0, op_every=1, device_type=device, synchronize=sync)
    size = 1024 if device == "cuda" else 128
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    timer.step()  # starts the clock, and the profiler for step 1
    for _ in range(3):
        c = torch.relu(a @ b)
        (c @ a).sum()
        timer.step()
    timer.pause()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    fams = families(registry_text(registry))
    counts = samples(fams, "npudist_op_duration_seconds", "npudist_op_duration_seconds_count")
    sums = samples(fams, "npudist_op_duration_seconds", "npudist_op_duration_seconds_sum")
    matmul = [k for k in counts if ("op", "matmul") in k]
    assert matmul, f"no matmul family among {sorted(counts)}"
    assert counts[matmul[0]] >= 6 and sums[matmul[0]] > 0  # two products per step, three steps


@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_profiler_on_cuda_captures_device_time_of_mm() -> None:
    from npudist.telemetry.job import op_sampling

    a = torch.randn(2048, 2048, device="cuda:0")
    torch.cuda.synchronize()
    prof = op_sampling.start_profiler("cuda")
    try:
        for _ in range(3):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()
    finally:
        prof.__exit__(None, None, None)
    events = [e for e in prof.events() if e.name == "aten::mm"]
    assert len(events) == 3, sorted({e.name for e in prof.events()})
    device_us = [getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) for e in events]
    assert all(us > 0 for us in device_us), device_us  # the GEMM kernels' time, from CUPTI
    durations = op_sampling.profiled_op_durations(prof, "cuda")
    assert [op for op, _ in durations].count("matmul") == 3 and all(s > 0 for _, s in durations), durations


_SIM_ALLOCATOR = """
import json, sys
from npudist.sim import install
install("npu")
import torch
from prometheus_client import CollectorRegistry
from npudist.accelerators import get
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.rank_exporter import rank_labels
from npudist.telemetry.job.allocator import AllocatorCollector, read_allocator
from npudist.telemetry.sources.readings import RankDevice
from tests.telemetry.exp_helpers import families, registry_text, samples

acc = get("npu-sim")
blocks = [torch.empty(%(block)d, dtype=torch.uint8, device="npu:0") for _ in range(64)]
del blocks[::2]
holed = read_allocator(acc, 0)
health = CollectorHealth()
registry = CollectorRegistry(auto_describe=False)
registry.register(AllocatorCollector(lambda: acc.memory_stats(0), health,
                                     rank_labels(0, 0, "node", RankDevice(0, 0, 0))))
fams = families(registry_text(registry))
[ratio] = samples(fams, "npudist_allocator_fragmentation_ratio").values()
sys.stdout.write("RESULT " + json.dumps({"allocated": holed.allocated_bytes, "reserved": holed.reserved_bytes,
                                         "ratio": ratio, "errors": health.errors("allocator")}) + "\\n")
"""


@pytest.mark.subprocess
@pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")
def test_fragmentation_path_on_the_simulated_npu(tmp_path) -> None:
    """The fragmentation test's reading and export through a device module's memory_allocated/reserved, on
    the simulated NPU (whose reserved bytes are the peak of the live ones, as a caching allocator keeps)."""
    script = tmp_path / "sim_allocator.py"
    script.write_text(_SIM_ALLOCATOR % {"block": BLOCK})
    proc = run_py([str(script)], env=child_env(pythonpath=[REPO]), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT ")).split(" ", 1)[1])
    assert got["reserved"] - got["allocated"] >= 32 * BLOCK
    assert got["ratio"] == pytest.approx(1 - got["allocated"] / got["reserved"]) and 0 < got["ratio"] < 1
    assert got["errors"] == {}
