"""On a CUDA host: detection picks cuda, `npudist launch --nproc-per-node auto` starts one rank per device,
and init() selects the device before it creates the NCCL group (NCCL binds a communicator to the
current device when it is created: torch.distributed docs, "Backends", NCCL)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import run_npudist, run_py

pytestmark = pytest.mark.cuda

DETECT = textwrap.dedent("""
    import json
    import npudist
    from npudist.accelerators import BY_NAME
    from npudist.accelerators.detect import why_unavailable

    acc = npudist.accelerator()
    print(json.dumps({"name": acc.name, "device_type": acc.device_type, "backend": acc.backend,
                      "count": acc.device_count(), "cuda_reason": why_unavailable(BY_NAME["cuda"])}))
""")

# One rank: record the order of torch.cuda.set_device and init_process_group (with the device current
# at that moment), then all_reduce rank+1 over NCCL on this rank's GPU. One JSON file per rank.
PROBE = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    import npudist

    calls = []
    real_set_device, real_init = torch.cuda.set_device, dist.init_process_group

    def set_device(device):
        calls.append(["set_device", str(device)])
        real_set_device(device)

    def init_process_group(*args, **kwargs):
        backend = args[0] if args else kwargs.get("backend")
        calls.append(["init_process_group", str(backend), torch.cuda.current_device()])
        return real_init(*args, **kwargs)

    torch.cuda.set_device, dist.init_process_group = set_device, init_process_group
    ctx = npudist.init()
    t = torch.full((1024,), float(ctx.rank + 1), device=ctx.device)
    npudist.all_reduce(t)
    torch.cuda.synchronize()
    record = {"rank": ctx.rank, "world": ctx.world_size, "local_rank": ctx.local_rank, "backend": ctx.backend,
              "dist_backend": str(dist.get_backend()), "device": str(ctx.device),
              "current_device": torch.cuda.current_device(), "tensor_device": str(t.device),
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


def _check_rank(r: dict, world: int) -> None:
    """This rank's device is cuda:LOCAL_RANK, made current before the NCCL group, and NCCL summed on it."""
    index = r["local_rank"]
    assert r["backend"] == r["dist_backend"] == "nccl", r
    assert r["device"] == r["tensor_device"] == f"cuda:{index}" and r["current_device"] == index, r
    names = [c[0] for c in r["calls"]]
    assert "set_device" in names and "init_process_group" in names, r["calls"]
    assert names.index("set_device") < names.index("init_process_group"), r["calls"]
    group_call = r["calls"][names.index("init_process_group")]
    assert group_call[1] == "nccl" and group_call[2] == index, r["calls"]
    want = world * (world + 1) / 2
    assert r["sum_min"] == r["sum_max"] == want, r


@pytest.mark.timeout(150)
def test_detection_picks_cuda_and_nccl() -> None:
    proc = run_py(["-c", DETECT], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"name": "cuda", "device_type": "cuda", "backend": "nccl",
                   "count": torch.cuda.device_count(), "cuda_reason": None}


@pytest.mark.timeout(150)
def test_init_sets_the_device_before_the_nccl_group(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_py([str(_probe(tmp_path)), str(out)], timeout=120)  # a world of one: no launcher variables
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    [record] = _records(out)
    assert record["world"] == 1 and record["rank"] == 0
    _check_rank(record, 1)


@pytest.mark.timeout(200)
def test_launch_auto_starts_one_rank_per_device(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_npudist(["launch", "--nproc-per-node", "auto", str(_probe(tmp_path)), str(out)], timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = _records(out)
    count = torch.cuda.device_count()
    assert len(records) == count, f"{len(records)} ranks reported for {count} devices"
    assert sorted(r["local_rank"] for r in records) == list(range(count))
    for r in records:
        assert r["world"] == count
        _check_rank(r, count)
