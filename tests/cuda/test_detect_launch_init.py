"""Detection picks the device and its backend, `npudist launch --nproc-per-node auto` starts one rank per
device, and init() selects the device before it creates the group (NCCL binds a communicator to the current
device when it is created: torch.distributed docs, "Backends", NCCL; HCCL likewise, torch_npu
ProcessGroupHCCL). On a CUDA host over NCCL (``make device-check``) and, in CI, on the simulated NPU over its
hccl: the same children, so a change in the device API path fails CI before the first GPU run."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from npudist.runtime import compat
from tests.conftest import child_env, run_npudist, run_py
from tests.sim import chips

_SIM = pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")
# (accelerator, device type, backend, environment): the simulated host shows two chips.
DEVICES = [
    pytest.param(("cuda", "cuda", "nccl", {}), marks=pytest.mark.cuda, id="cuda"),
    pytest.param(("npu-sim", "npu", "hccl", {"NPUDIST_SIMULATE": "npu", "ASCEND_RT_VISIBLE_DEVICES": "0,1"}),
                 marks=_SIM, id="npu-sim"),
]


def _count(accelerator: str) -> int:
    return torch.cuda.device_count() if accelerator == "cuda" else 2

DETECT = textwrap.dedent("""
    import json
    import npudist
    from npudist.accelerators import BY_NAME
    from npudist.accelerators.detect import why_unavailable

    acc = npudist.accelerator()
    print(json.dumps({"name": acc.name, "device_type": acc.device_type, "backend": acc.backend,
                      "count": acc.device_count(), "reason": why_unavailable(BY_NAME.get(acc.name, acc.vendor))}))
""")

# One rank: record the order of torch.<device>.set_device and init_process_group (with the device current
# at that moment), then all_reduce rank+1 over the group on this rank's device. One JSON file per rank.
PROBE = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    import npudist

    npudist.accelerator()  # the simulated NPU installs torch.npu here
    mod = getattr(torch, sys.argv[2])
    calls = []
    real_set_device, real_init = mod.set_device, dist.init_process_group

    def set_device(device):
        calls.append(["set_device", str(device)])
        real_set_device(device)

    def init_process_group(*args, **kwargs):
        backend = args[0] if args else kwargs.get("backend")
        calls.append(["init_process_group", str(backend), mod.current_device()])
        return real_init(*args, **kwargs)

    mod.set_device, dist.init_process_group = set_device, init_process_group
    ctx = npudist.init()
    t = torch.full((1024,), float(ctx.rank + 1), device=ctx.device)
    npudist.all_reduce(t)
    mod.synchronize()
    record = {"rank": ctx.rank, "world": ctx.world_size, "local_rank": ctx.local_rank, "backend": ctx.backend,
              "dist_backend": str(dist.get_backend()), "device": str(ctx.device),
              "current_device": mod.current_device(), "tensor_device": str(t.device),
              "sum_min": t.min().item(), "sum_max": t.max().item(), "calls": calls}
    npudist.shutdown()
    with open(os.path.join(sys.argv[1], f"rank{record['rank']}.json"), "w") as f:
        json.dump(record, f)
""")


def _probe(tmp_path: Path) -> Path:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def _records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def _check_rank(r: dict, world: int, device: tuple) -> None:
    """This rank's device is <type>:LOCAL_RANK, made current before the group, and the backend summed on it."""
    accelerator, device_type, backend, _ = device
    index = r["local_rank"]
    assert r["backend"] == r["dist_backend"] == backend, r
    assert r["device"] == f"{device_type}:{index}" and r["current_device"] == index, r
    # A simulated tensor is on npu:<local rank> where the simulation's device guard builds, else on npu:0
    # whatever index made it (npudist/sim/device.py says why; tests/sim/chips.py).
    assert r["tensor_device"] == (f"{device_type}:{index}" if accelerator == "cuda" else chips.device(index)), r
    names = [c[0] for c in r["calls"]]
    assert "set_device" in names and "init_process_group" in names, r["calls"]
    assert names.index("set_device") < names.index("init_process_group"), r["calls"]
    group_call = r["calls"][names.index("init_process_group")]
    assert group_call[1] == backend and group_call[2] == index, r["calls"]
    want = world * (world + 1) / 2
    assert r["sum_min"] == r["sum_max"] == want, r


@pytest.mark.subprocess
@pytest.mark.timeout(150)
@pytest.mark.parametrize("device", DEVICES)
def test_detection_picks_the_device_and_its_backend(device) -> None:
    accelerator, device_type, backend, env = device
    proc = run_py(["-c", DETECT], env=child_env(env), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"name": accelerator, "device_type": device_type, "backend": backend,
                   "count": _count(accelerator), "reason": None}


@pytest.mark.subprocess
@pytest.mark.timeout(150)
@pytest.mark.parametrize("device", DEVICES)
def test_init_sets_the_device_before_the_group(tmp_path: Path, device) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # a world of one: no launcher variables
    proc = run_py([str(_probe(tmp_path)), str(out), device[1]], env=child_env(device[3]), timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    [record] = _records(out)
    assert record["world"] == 1 and record["rank"] == 0
    _check_rank(record, 1, device)


@pytest.mark.ranks
@pytest.mark.timeout(200)
@pytest.mark.parametrize("device", DEVICES)
def test_launch_auto_starts_one_rank_per_device(tmp_path: Path, device) -> None:
    accelerator, device_type, _, env = device
    out = tmp_path / "out"
    out.mkdir()
    simulate = ["--simulate", "npu"] if accelerator == "npu-sim" else []
    proc = run_npudist(["launch", *simulate, "--nproc-per-node", "auto", str(_probe(tmp_path)), str(out),
                        device_type], env=child_env(env), timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = _records(out)
    count = _count(accelerator)
    assert len(records) == count, f"{len(records)} ranks reported for {count} devices"
    assert sorted(r["local_rank"] for r in records) == list(range(count))
    for r in records:
        assert r["world"] == count
        _check_rank(r, count, device)
