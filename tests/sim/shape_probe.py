"""Runs in one process with NPUDIST_SIMULATE=npu and only npudist on the path, for test_torch_npu_shape.py.

``import torch`` alone must bring the simulated NPU (npudist's ``torch.backends`` entry point). Prints one
``RESULT`` line with what the test checks.
"""

from __future__ import annotations

import json
import sys
import time


def outcome(fn) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def main() -> None:
    import torch

    r: dict = {"torch_npu_loaded_by_import_torch": "torch_npu" in sys.modules}
    r["device_string"] = str(torch.ones(2, device="npu:0").device)
    r["accelerator"] = [str(torch.accelerator.current_accelerator()), torch.accelerator.is_available()]
    import torch_npu
    import torch_npu.npu.utils
    from torch.npu.amp import autocast as npu_autocast
    from torch_npu.npu import amp

    r["same_module"] = [torch_npu.npu is torch.npu, amp is torch.npu.amp, npu_autocast is amp.autocast,
                        torch_npu.npu.utils.get_device_name() == torch.npu.get_device_name()]
    from npudist.sim.transfer import to_npu

    r["cuda_device_mapped"] = [str(to_npu(torch.device("cuda", 1))), str(to_npu(torch.device("cuda")))]
    r["not_simulated_attr"] = outcome(lambda: torch_npu.npu_rms_norm)
    r["not_simulated_npu_attr"] = outcome(lambda: torch.npu.NPUGraph)
    r["not_simulated_module"] = outcome(lambda: __import__("torch_npu.profiler"))
    r["hasattr_is_false"] = [hasattr(torch.npu, "NPUGraph"), hasattr(torch_npu, "npu_rms_norm")]
    r["not_torch_npus"] = outcome(lambda: torch.npu.no_such_call)
    r["simulated_extras"] = [torch.npu.is_current_stream_capturing(), torch.npu.memory_cached() >= 0,
                             len(torch.npu.get_rng_state_all())]

    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    stream = torch.npu.Stream()
    start.record()
    with torch.npu.stream(stream):
        time.sleep(0.02)
    end.record(stream)
    stream.synchronize()
    r["event_ms"] = start.elapsed_time(end)
    r["stream_query"] = [stream.query(), end.query()]

    free_before, total = torch.npu.mem_get_info()
    held = torch.empty(1024 * 1024, device="npu")
    free_after, _ = torch.npu.mem_get_info()
    r["mem"] = [total, free_before - free_after, held.numel() * 4]
    props = torch.npu.get_device_properties(0)
    r["props"] = [props.name, props.total_memory]

    model = torch.nn.Linear(8, 8).npu()
    with amp.autocast():
        r["npu_amp_dtype"] = str(model(torch.randn(4, 8).npu()).dtype)
    with torch.amp.autocast("npu", dtype=torch.bfloat16):
        r["torch_amp_dtype"] = str(model(torch.randn(4, 8).npu()).dtype)
    fixed = amp.GradScaler(init_scale=1024.0, dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        with amp.autocast():
            loss = model(torch.randn(4, 8).npu()).float().pow(2).mean() * 1e6  # overflows fp16 grads
        opt.zero_grad()
        fixed.scale(loss).backward()
        fixed.step(opt)
        fixed.update()
    r["static_scale"] = fixed.get_scale()
    dynamic = torch.amp.GradScaler("npu", init_scale=1024.0)
    with torch.amp.autocast("npu"):
        loss = model(torch.randn(4, 8).npu()).float().pow(2).mean() * 1e6
    opt.zero_grad()
    dynamic.scale(loss).backward()
    dynamic.step(opt)
    dynamic.update()
    r["dynamic_scale"] = dynamic.get_scale()
    sys.stdout.write("RESULT " + json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
