"""Each rule on a construct it must find and on the vendor-neutral form it must leave alone.

Positive cases are the CUDA idioms as the PyTorch documentation writes them (torch.cuda, DDP tutorial,
torch.amp migration notes); negative cases are the replacements those documents recommend.
"""

from __future__ import annotations

import textwrap

import pytest

from npudist.migrate import RULES, analyse

H = ("import os\nimport torch\nimport torch.distributed as dist\n"
     "from torch.nn.parallel import DistributedDataParallel as DDP\n")

CASES = [
    ("cuda-device-api", "torch.cuda.set_device(3)", "torch.accelerator.set_device_index(3)"),
    ("cuda-device-api", "n = torch.cuda.device_count()", "n = torch.accelerator.device_count()"),
    ("cuda-device-api", "ok = torch.cuda.is_available()", "ok = torch.accelerator.is_available()"),
    ("cuda-memory-api", "b = torch.cuda.max_memory_allocated()", "b = torch.accelerator.max_memory_allocated()"),
    ("cuda-streams", "s = torch.cuda.Stream()", "s = torch.Stream()"),
    ("cuda-amp", "with torch.cuda.amp.autocast():\n    pass", "with torch.autocast(dev):\n    pass"),
    ("cuda-amp", "from torch.cuda.amp import GradScaler\ns = GradScaler()", "s = torch.amp.GradScaler(dev)"),
    ("cuda-api", "c = torch.cuda.get_device_capability(0)", "p = npudist.accelerator().device()"),
    ("cuda-device-query", "p = torch.cuda.get_device_properties(0)", "p = npudist.accelerator().device_properties()"),
    ("cuda-device-query", "n = torch.cuda.get_device_name()", "n = npudist.accelerator().device_name()"),
    ("cuda-device-query", "free, total = torch.cuda.mem_get_info()",
     "free, total = npudist.accelerator().mem_get_info()"),
    ("cuda-device-test", "t = 'cuda' if 'cuda' in device else 'cpu'", "t = torch.device(device).type"),
    ("cuda-device-test", "if device_type == 'cuda':\n    pass", "if device_type != 'cpu':\n    pass"),
    ("cuda-device-test", "fast = args.device.startswith('cuda')", "fast = args.device.startswith('cpu')"),
    ("device-gate", "def ok():\n    return torch.cuda.device_count() >= 2\nif not ok():\n    exit()",
     "def ok():\n    return torch.cuda.device_count() >= 2\nif not ok():\n    print('few')"),
    ("device-gate", "if torch.accelerator.device_count() < 2:\n    raise SystemExit(0)",
     "if npudist.accelerator().device_type != 'cpu' and torch.accelerator.device_count() < 2:\n    exit()"),
    ("cuda-api", "torch.cuda.reset_peak_memory_stats()", "s = npudist.accelerator().memory_stats()"),
    ("cuda-no-op", "torch.cuda.manual_seed_all(0)", "torch.manual_seed(0)"),
    ("pin-memory-call", "p = x.pin_memory()", "p = x"),
    ("cuda-method", "m = model.cuda()", "m = model.to(dev)"),
    ("cuda-device-string", 'x = torch.zeros(2, device="cuda:1")', "x = torch.zeros(2, device=dev)"),
    ("cuda-device-string", 'd = torch.device("cuda")', 'd = torch.device("cpu")'),
    ("int-device-index", "m = model.to(local_rank)", "m = model.to(device)"),
    ("cuda-backend-flags", "torch.backends.cudnn.benchmark = True", "torch.use_deterministic_algorithms(True)"),
    ("init-process-group", 'dist.init_process_group("nccl")', 'dist.init_process_group("gloo")'),
    ("process-group-setup", 'dist.init_process_group(backend="gloo")', "x = 1"),
    ("nccl-string", 'if dist.get_backend() == "nccl":\n    pass', 'if dist.get_backend() == "hccl2":\n    pass'),
    ("ddp-wrap", "m = DDP(model, device_ids=[0])", "m = model"),
    ("visible-devices", 'v = os.environ["CUDA_VISIBLE_DEVICES"]', 'v = os.environ["HOME"]'),
    ("local-rank-env", 'r = int(os.environ["LOCAL_RANK"])', 'r = int(os.environ["RANK"])'),
    ("pin-memory", "loader = Loader(ds, pin_memory=True)", "loader = Loader(ds, pin_memory=False)"),
    ("jit-script", "@torch.jit.script\ndef f(x):\n    return x", "@torch.compile\ndef f(x):\n    return x"),
    ("channels-last", "m = model.to(memory_format=torch.channels_last)",
     "m = model.to(memory_format=torch.contiguous_format)"),
    ("nccl-env", 'os.environ["NCCL_SOCKET_IFNAME"] = "eth0"', 'os.environ["GLOO_SOCKET_IFNAME"] = "eth0"'),
    ("direct-collective", "dist.all_reduce(t)", "npudist.all_reduce(t)"),
    ("cuda-env", 'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"',
     'os.environ["PYTORCH_NPU_ALLOC_CONF"] = "expandable_segments:True"'),
    ("cuda-env", 'os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")',
     'os.environ.setdefault("ASCEND_LAUNCH_BLOCKING", "1")'),
    ("vendor-locked", "m = model.npu()", "m = model.to(ctx.device)"),
    ("sync-batchnorm", "m = torch.nn.SyncBatchNorm.convert_sync_batchnorm(m)", "m = torch.nn.BatchNorm1d(4)"),
    ("vendor-locked", "torch.npu.synchronize()", "npudist.accelerator().synchronize()"),
    ("vendor-locked", "import torch_npu\ntorch_npu.npu.set_device(0)", "import torch_npu\nx = 1"),
    # word_language_model's shape: an argument parser, the device, no process group (N ranks: N trainings)
    ("single-process", "import argparse\nargs = argparse.ArgumentParser().parse_args()\nm = model.cuda()",
     "import argparse\nargs = argparse.ArgumentParser().parse_args()\ndist.init_process_group('nccl')\n"
     "m = model.cuda()"),
    ("single-process", "if __name__ == '__main__':\n    m = model.cuda()",
     "if __name__ == '__main__':\n    m = DDP(model.cuda())"),
]


def _rules(code: str, **kw) -> list[str]:
    return [f.rule for f in analyse(H + textwrap.dedent(code) + "\n", **kw).findings]


@pytest.mark.parametrize(("rule", "positive", "negative"), CASES, ids=[c[0] for c in CASES])
def test_rule_finds_the_cuda_form_and_not_the_neutral_one(rule: str, positive: str, negative: str) -> None:
    assert rule in _rules(positive)
    assert rule not in _rules(negative)


def test_every_rule_has_a_case() -> None:
    assert {c[0] for c in CASES} | {"bf16-collective"} == set(RULES)


def test_bf16_collective_is_an_error_only_where_the_row_refuses_bf16() -> None:
    code = "t = t.to(torch.bfloat16)\ndist.all_reduce(t)"
    assert _rules(code, bf16_refused=True).count("bf16-collective") == 1
    assert "bf16-collective" not in _rules(code, bf16_refused=False)
    assert "bf16-collective" not in _rules("dist.all_reduce(t)", bf16_refused=True)  # no bf16 in the file


def test_names_resolve_through_imports_not_spelling() -> None:
    assert "init-process-group" in _rules('from torch.distributed import init_process_group as ipg\nipg("nccl")')
    # a user function that happens to share the name is not torch's
    assert _rules("def init_process_group(b):\n    pass\ninit_process_group('x')") == []


def test_a_script_written_for_npudist_has_no_findings() -> None:
    code = """
    import npudist
    ctx = npudist.init()
    model = npudist.ddp(Net().to(ctx.device))
    with torch.autocast(ctx.device.type):
        loss = model(x.to(ctx.device)).sum()
    npudist.all_reduce(loss)
    npudist.shutdown()
    """
    assert _rules(code) == []


def test_positions_are_one_based_lines_and_columns() -> None:
    finding = analyse("import torch\n\nx = 1; torch.cuda.synchronize()\n").findings[0]
    assert (finding.line, finding.column, finding.rule) == (3, 8, "cuda-device-api")
