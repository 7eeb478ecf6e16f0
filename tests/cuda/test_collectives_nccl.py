"""npudist's collectives on device tensors over a one-rank group: every op/dtype pair the backend's constraint
row lists goes through the call path, and the adaptations the row demands (cast, contiguous) run on the device
and are counted. A world of one keeps each value, so any change is a bug.

Runs on CUDA over NCCL (``make device-check``) and, in CI, on the simulated NPU over its ``hccl`` (the same
child, so an API change in npudist or torch fails CI before the first GPU run)."""

from __future__ import annotations

import json
import textwrap

import pytest

from npudist.comm.constraints import PROFILES
from npudist.runtime import compat
from tests.conftest import child_env, run_py

pytestmark = pytest.mark.subprocess

# (accelerator, backend, environment of the child)
DEVICES = [
    pytest.param(("cuda", "nccl", {}), marks=pytest.mark.cuda, id="cuda"),
    pytest.param(("npu-sim", "hccl", {"NPUDIST_SIMULATE": "npu"}), id="npu-sim",
                 marks=pytest.mark.skipif(not compat.simulation_available(),
                                          reason="the simulated NPU needs torch >= 2.10")),
]

CHILD = textwrap.dedent("""
    import json
    import torch
    import npudist
    from npudist.comm.constraints import PROFILES

    ctx = npudist.init()  # no launcher variables: a world of one, on device 0 (cuda:0, npu:0)
    ROW = PROFILES[ctx.backend]
    sync = getattr(torch, ctx.device.type).synchronize
    results = []

    def values(dtype):
        base = torch.arange(-3, 13, device=ctx.device)
        return (base % 2 == 0) if dtype == torch.bool else base.to(dtype)

    def check(name, t, call, want):
        ptr, dtype = t.data_ptr(), t.dtype
        try:
            out = call(t)
            sync()
            ok = (out is t and t.data_ptr() == ptr and t.dtype == dtype and t.device == ctx.device
                  and torch.equal(t, want))
            results.append({"case": name, "ok": bool(ok), "got": t.cpu().tolist() if not ok else None})
        except Exception as exc:
            results.append({"case": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"})

    for op, dtypes in sorted(ROW.reduce_dtypes.items()):
        for dtype in sorted(dtypes, key=str):
            t = values(dtype)
            check(f"all_reduce {op} {dtype}", t, lambda x, op=op: npudist.all_reduce(x, op=op), t.clone())

    # Adaptations the row demands: an integer type the row does not sum (int16 on NCCL, uint8 on HCCL) is
    # reduced in a wider one and cast back, and a strided view is reduced through a contiguous copy written
    # back into the caller's view.
    narrow = next(d for d in (torch.int16, torch.uint8) if d not in ROW.native_dtypes("sum"))
    t = torch.arange(0, 16, device=ctx.device).to(narrow)
    check(f"all_reduce sum {narrow} (cast)", t, lambda x: npudist.all_reduce(x), t.clone())
    base = torch.arange(32.0, device=ctx.device).reshape(4, 8)
    view = base[:, ::2]
    check("all_reduce sum strided view (contiguous)", view, lambda x: npudist.all_reduce(x), view.clone())
    results.append({"case": "strided view left the other columns alone",
                    "ok": torch.equal(base, torch.arange(32.0, device=ctx.device).reshape(4, 8))})
    try:
        npudist.all_reduce(torch.ones(4, dtype=torch.int32, device=ctx.device), op="band")
        results.append({"case": "band is refused (no bitwise ops)", "ok": False, "error": "no error"})
    except TypeError as exc:
        results.append({"case": "band is refused (no bitwise ops)",
                        "ok": ctx.backend in str(exc) and "band" in str(exc), "error": str(exc)})

    g = npudist.all_gather(torch.arange(6.0, device=ctx.device))
    results.append({"case": "all_gather", "ok": g.device == ctx.device and g.shape == (1, 6)
                    and torch.equal(g[0], torch.arange(6.0, device=ctx.device))})
    b = torch.arange(5, dtype=torch.bfloat16, device=ctx.device)
    npudist.broadcast(b, 0)
    results.append({"case": "broadcast bfloat16",
                    "ok": torch.equal(b, torch.arange(5, dtype=torch.bfloat16, device=ctx.device))})

    s = npudist.comm.stats().get("all_reduce", ctx.backend)
    print(json.dumps({"backend": ctx.backend, "device": str(ctx.device), "accelerator": ctx.accelerator.name,
                      "results": results,
                      "calls": s.calls if s else 0, "adaptations": s.adaptations if s else {}}))
    npudist.shutdown()
""")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("device", DEVICES)
def test_every_op_and_dtype_of_the_row_on_device_tensors(device) -> None:
    accelerator, backend, env = device
    proc = run_py(["-c", CHILD], env=child_env(env), timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    device_type = "cuda" if accelerator == "cuda" else "npu"
    assert (got["accelerator"], got["backend"], got["device"]) == (accelerator, backend, f"{device_type}:0")
    failed = [r for r in got["results"] if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    listed = sum(len(d) for d in PROFILES[backend].reduce_dtypes.values())
    reduced = [r for r in got["results"] if r["case"].startswith("all_reduce")]
    assert len(reduced) == listed + 2
    assert got["calls"] == listed + 2, got  # the refused band call is not counted
    assert got["adaptations"]["cast"] == 1 and got["adaptations"]["contiguous"] == 1, got["adaptations"]
