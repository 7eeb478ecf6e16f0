"""The rules table against torch itself: each rule's severity is what its calls do on this CPU torch
(raises = error, answers wrongly = warning, costs only = info), and each "use instead" runs on CPU and on
the simulated NPU. Calls are made, not looked up, so the table cannot drift from torch."""

from __future__ import annotations

import contextlib
import json
import warnings

import pytest
import torch

from npudist.migrate.rules import RULES, SEVERITIES
from tests.conftest import REPO, child_env, run_npudist

# rule -> (code calling the CUDA construct, what it does when it does not raise: "wrong" or "cost").
# Rules absent here are about vendor stacks this host cannot run (HCCL variables, Ascend's jit and
# channels_last support): DOCUMENTED gives the source their severity rests on.
PROBES: dict[str, list[tuple[str, str]]] = {
    "cuda-device-api": [("torch.cuda.set_device(0)", ""), ("torch.cuda.synchronize()", ""),
                        ("torch.cuda.current_device()", ""), ("assert torch.cuda.device_count() == 0", "wrong")],
    "cuda-memory-api": [("assert torch.cuda.memory_allocated() == 0", "wrong"),
                        ("assert torch.cuda.max_memory_reserved() == 0", "wrong"),
                        ("assert torch.cuda.memory_stats() == {}", "wrong"), ("torch.cuda.empty_cache()", "wrong")],
    "cuda-api": [("torch.cuda.reset_peak_memory_stats()", ""), ("torch.cuda.get_device_capability(0)", "")],
    "cuda-device-query": [("torch.cuda.mem_get_info()", ""), ("torch.cuda.get_device_properties(0)", ""),
                          ("torch.cuda.get_device_name(0)", "")],
    # nanoGPT's line on a device named "npu:0": the CPU branch, silently (no autocast, pinning, fused AdamW)
    "cuda-device-test": [("device = 'npu:0'\ndevice_type = 'cuda' if 'cuda' in device else 'cpu'\n"
                          "assert device_type == 'cpu'", "wrong")],
    "cuda-no-op": [("torch.cuda.manual_seed_all(0)", "wrong"), ("torch.cuda.manual_seed(0)", "wrong"),
                   ("assert torch.cuda.is_bf16_supported() is False", "wrong")],
    "cuda-streams": [("torch.cuda.Event(enable_timing=True)", ""), ("torch.cuda.Stream()", ""),
                     ("torch.cuda.current_stream()", "")],
    "cuda-amp": [("assert not torch.cuda.amp.GradScaler().is_enabled()", "wrong"),
                 ("with torch.cuda.amp.autocast():\n    pass", "wrong")],
    "cuda-method": [("torch.zeros(2).cuda()", "")],
    "cuda-device-string": [("torch.zeros(2, device='cuda')", "")],
    "int-device-index": [("torch.zeros(2).to(0)", "")],
    "cuda-backend-flags": [("torch.backends.cudnn.benchmark = True", "wrong")],
    "init-process-group": [("import torch.distributed as dist\n"
                            "dist.init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1)", "")],
    "pin-memory": [("list(torch.utils.data.DataLoader([torch.ones(2)], pin_memory=True))", "cost")],
    "pin-memory-call": [("torch.zeros(2).pin_memory()", "")],
    # raises only in a job (a process group started), as a training script runs it
    "sync-batchnorm": [("import torch.distributed as dist\n"
                        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
                        "try:\n    torch.nn.SyncBatchNorm(4).train()(torch.randn(8, 4))\n"
                        "finally:\n    dist.destroy_process_group()", "")],
    "vendor-locked": [("torch.zeros(2).npu()", ""), ("torch.npu.synchronize()", "")],
}
DOCUMENTED = {
    "process-group-setup": "works when the device was set first: advice only",
    "nccl-string": "a string comparison: the wrong branch, silently (transfer_to_npu documentation)",
    "ddp-wrap": "device_ids are CUDA indices; strict HCCL refuses bf16 buckets (npudist.comm constraints)",
    "visible-devices": "CANN environment variable reference: ASCEND_RT_VISIBLE_DEVICES",
    "local-rank-env": "works; skips the vendor's visible-devices mapping",
    "jit-script": "transfer_to_npu documentation: torch.jit.script disabled",
    "channels-last": "transfer_to_npu documentation: channels_last unsupported",
    "nccl-env": "HCCL environment variable reference: NCCL_* ignored",
    "cuda-env": "CANN environment variable reference: CUDA_* runtime variables ignored",
    "direct-collective": "works; dtype adaptation is npudist.comm's",
    "bf16-collective": "raises under the hccl-strict row (tests/comm)",
    "single-process": "runs, as separate trainings: measured in test_corpus.py on word_language_model, 2 ranks",
    "device-gate": "exits 0 without training on CPU ranks: measured in test_corpus.py on pytorch/examples' FSDP2 "
                   "example (verify_min_gpu_count)",
}
_MEASURED = {"": "error", "wrong": "warning", "cost": "info"}


def _behaviour(code: str) -> str:
    """'error' when the call raises on this torch, else ''."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            exec(compile(code, "<probe>", "exec"), {"torch": torch})
        except Exception:
            return "error"
    return ""


def test_every_rule_is_measured_or_documented() -> None:
    assert set(PROBES) | set(DOCUMENTED) == set(RULES)
    assert not set(PROBES) & set(DOCUMENTED)


@pytest.mark.parametrize("rule", sorted(PROBES))
def test_severity_is_what_the_calls_do_on_this_torch(rule: str) -> None:
    assert not torch.cuda.is_available(), "a CPU torch measures what a port off CUDA meets"
    measured = []
    for code, otherwise in PROBES[rule]:
        raised = _behaviour(code)
        assert raised or otherwise, f"{code!r} was expected to raise here and did not"
        measured.append("error" if raised else _MEASURED[otherwise])
    worst = max(measured, key=SEVERITIES.index)
    assert RULES[rule].severity == worst, f"{rule}: table says {RULES[rule].severity}, torch does {measured}"
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("simulate", [None, "npu"], ids=["cpu", "simulated-npu"])
def test_every_use_instead_runs(simulate: str | None) -> None:
    sim = ["--simulate", simulate] if simulate else []
    r = run_npudist(["launch", *sim, "--nproc-per-node", "1", str(REPO / "tests" / "migrate" / "advice_probe.py")],
                    cwd=REPO, env=child_env(), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    doc = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT ")).split(" ", 1)[1])
    assert doc["device"].startswith("npu" if simulate else "cpu")
    assert doc["ran"] == sorted(RULES) and all(RULES[r].example for r in RULES)
    assert doc["failed"] == {}
