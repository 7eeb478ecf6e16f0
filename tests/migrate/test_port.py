"""The port: every CUDA device form becomes the one ``ctx`` device, no rewrite makes dead code live, and the
idioms script (corpus/idioms/train.py, the forms the PyTorch docs and examples use) trains after ``fix``.

Expected texts are the ported forms as docs/guide/migrating.md states them, written before running the tool.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from npudist.migrate import analyse, apply
from tests.conftest import REPO, child_env, run_npudist

IDIOMS = REPO / "tests" / "migrate" / "corpus" / "idioms" / "train.py"


def _fix(code: str):
    return apply(analyse(textwrap.dedent(code)))


@pytest.mark.parametrize(("cuda", "ported"), [
    ("x = torch.randn(4, 4).cuda()", "x = torch.randn(4, 4).to(npudist.accelerator().device())"),
    ("m = nn.Linear(4, 4).cuda()", "m = nn.Linear(4, 4).to(npudist.accelerator().device())"),
    ("m = nn.Sequential(nn.ReLU()).cuda()", "m = nn.Sequential(nn.ReLU()).to(npudist.accelerator().device())"),
    ("z = torch.zeros(3).cuda(non_blocking=True)",
     "z = torch.zeros(3).to(npudist.accelerator().device(), non_blocking=True)"),
    ("c = nn.CrossEntropyLoss().cuda(args.gpu)", "c = nn.CrossEntropyLoss().to(npudist.accelerator().device())"),
    ("q = model.cuda(device=rank)", "q = model.to(npudist.accelerator().device())"),
    ("q = model.cuda(1)", "q = model.to(npudist.accelerator().device(1))"),
    ("t = torch.tensor([1]).to(0)", "t = torch.tensor([1]).to(npudist.accelerator().device(0))"),
    ('b = torch.zeros(2, device="cuda")', "b = torch.zeros(2, device=npudist.accelerator().device())"),
    ('s = torch.load(p, map_location="cuda:0")', "s = torch.load(p, map_location=npudist.accelerator().device(0))"),
    ('s = torch.load(p, map_location=f"cuda:{gpu}")', "s = torch.load(p, map_location=npudist.accelerator().device())"),
    ('loc = "cuda:{}".format(args.gpu)', "loc = str(npudist.accelerator().device())"),
    ('d = torch.device("cuda" if use else "cpu")',
     'd = torch.device(npudist.accelerator().device_type if use else "cpu")'),
    ("with torch.cuda.amp.autocast(use_amp):\n    pass",
     "with torch.autocast(npudist.accelerator().device_type, enabled=use_amp):\n    pass"),
    ("m = DDP(model, device_ids=[r], **kw)", "m = npudist.ddp(model, **kw)"),
    ("with torch.autocast('cuda', enabled=use_amp):\n    pass",
     "with torch.autocast(npudist.accelerator().device_type, enabled=use_amp):\n    pass"),
    ("b = torch.cuda.max_memory_allocated(0)", "b = npudist.accelerator().max_memory_allocated(0)"),
    ("torch.cuda.reset_peak_memory_stats()", "npudist.accelerator().reset_peak_memory_stats()"),
    ("e = torch.cuda.Event(enable_timing=True)", "e = npudist.accelerator().event(enable_timing=True)"),
    ("m = nn.SyncBatchNorm.convert_sync_batchnorm(m)",
     'm = ((nn.SyncBatchNorm.convert_sync_batchnorm(m)) if npudist.accelerator().device_type != "cpu" else m)'),
])
def test_each_device_form_is_ported(cuda: str, ported: str) -> None:
    head = "import torch\nimport torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    out = _fix(head + cuda + "\n").code
    assert ported in out, out
    assert "cuda" not in out.replace("torch.cuda.amp", "")


def test_a_gated_sync_batchnorm_is_not_ported_twice() -> None:
    once = _fix("import torch.nn as nn\nm = nn.SyncBatchNorm.convert_sync_batchnorm(m)\n").code
    assert "npudist.accelerator().device_type" in once
    assert apply(analyse(once)).code == once and not analyse(once).findings


def test_set_device_group_and_device_fold_into_one_ctx_keeping_the_layout() -> None:
    out = _fix('''
        import os
        import torch
        import torch.distributed as dist

        def main(args):
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl", init_method=args.url, world_size=args.world, rank=args.rank)
            device = torch.device("cuda", local_rank)
            model = Net().cuda()
            batch = batch.to(f"cuda:{local_rank}")

        def evaluate(x):
            return x.cuda()
    ''').code
    # rank, world size and rendezvous survive: dropping them would start N worlds of one
    assert "dist.init_process_group(npudist.accelerator().backend, init_method=args.url, world_size=args.world, " \
           "rank=args.rank)\n    ctx = npudist.init()\n    device = ctx.device\n" in out
    assert "set_device" not in out and out.count("npudist.init()") == 1
    assert "model = Net().to(ctx.device)" in out and "batch = batch.to(ctx.device)" in out
    # another function does not see ctx: the current device, which init() set
    assert "return x.to(npudist.accelerator().device())" in out


def test_a_plain_group_becomes_ctx_and_unused_imports_go() -> None:
    out = _fix('''
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group(backend="nccl")
        model = DDP(Net().cuda())
    ''').code
    assert out.split() == ["import", "torch", "import", "npudist", "ctx", "=", "npudist.init()", "model", "=",
                           "npudist.ddp(Net().to(ctx.device))"]


def test_is_available_guarding_an_unported_call_is_left_with_the_line_it_guards() -> None:
    result = _fix('''
        import torch
        if rank == 0 and torch.cuda.is_available():
            print(torch.cuda.get_device_capability(0))
        x = torch.ones(1).cuda() if torch.cuda.is_available() else torch.ones(1)
        use_cuda = torch.cuda.is_available()
    ''')
    assert "if rank == 0 and torch.cuda.is_available():" in result.code  # dead off CUDA, and stays dead
    assert 'x = torch.ones(1).to(npudist.accelerator().device()) if (npudist.accelerator().device_type != ' \
           '"cpu") else torch.ones(1)' in result.code
    assert "use_cuda = torch.cuda.is_available()" in result.code
    left = {f.line: f.detail for f in result.left if "is_available" in f.code}
    assert left[3] == "guards line 4: torch.cuda.get_device_capability(0) (left)"
    assert left[6].startswith("its value is kept")


def test_cuda_or_cpu_choice_stays_right_on_every_device() -> None:
    out = _fix('import torch\ndevice_type = "cuda" if torch.cuda.is_available() else "cpu"\n').code
    assert 'device_type = npudist.accelerator().device_type if (npudist.accelerator().device_type != "cpu") ' \
           'else "cpu"' in out
    ported = _fix('import torch\nok = "cuda" in device\n').code
    assert ported == 'import torch\nok = torch.device(device).type != "cpu"\n'


def test_nanogpts_device_type_takes_the_accelerator_branch_on_every_accelerator() -> None:
    """karpathy/nanoGPT train.py: the test on the device string, and model.py's fused-AdamW condition."""
    out = _fix("""
        import torch
        device_type = 'cuda' if 'cuda' in device else 'cpu' # for later use in torch.autocast
        if device_type == 'cuda':
            x = x.pin_memory().to(device, non_blocking=True)
        use_fused = fused_available and device_type == 'cuda'
        slow = not device.startswith('cuda')
        cpu_only = 'cuda' not in device
    """)
    assert "device_type = npudist.accelerator().device_type if torch.device(device).type != \"cpu\" else 'cpu'" \
        in out.code
    assert 'if device_type != "cpu":' in out.code and 'use_fused = fused_available and device_type != "cpu"' \
        in out.code
    assert 'slow = not torch.device(device).type != "cpu"' in out.code
    assert 'cpu_only = torch.device(device).type == "cpu"' in out.code
    assert out.left == ()  # pin_memory() runs only behind the accelerator test
    line = next(x for x in out.code.splitlines() if x.startswith("device_type ="))
    # ("npu" is a device type only once torch_npu or the simulation has registered it; xpu stands for any)
    for device, accelerator in (("xpu:0", "xpu"), ("cuda:1", "cuda"), ("cpu", "cpu")):
        acc = SimpleNamespace(device_type=accelerator)
        names = {"torch": torch, "device": device, "npudist": SimpleNamespace(accelerator=lambda a=acc: a)}
        exec(line, names)
        assert names["device_type"] == accelerator


def test_device_queries_become_the_accelerators() -> None:
    out = _fix("""
        import torch
        print(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(device).total_memory)
        free, total = torch.cuda.mem_get_info()
    """).code
    assert "print(npudist.accelerator().device_name(0), npudist.accelerator().device_properties(device)" \
           ".total_memory)" in out
    assert "free, total = npudist.accelerator().mem_get_info()" in out


def test_the_device_queries_answer_on_cpu() -> None:
    import npudist

    acc = npudist.Accelerator(npudist.accelerators.BY_NAME["cpu"])
    props = acc.device_properties()
    free, total = acc.mem_get_info()
    assert acc.device_name() == props.name and props.total_memory == total and 0 < free <= total
    assert props.multi_processor_count >= 1 and (props.major, props.minor) == (0, 0)


def test_a_gate_on_the_accelerator_count_is_kept_for_accelerators_only() -> None:
    """pytorch/examples distributed/FSDP2/example.py's verify_min_gpu_count gate."""
    out = _fix("""
        import torch
        def verify_min_gpu_count(min_gpus: int = 2) -> bool:
            has_gpu = torch.accelerator.is_available()
            gpu_count = torch.accelerator.device_count()
            return has_gpu and gpu_count >= min_gpus
        def main():
            if not verify_min_gpu_count(min_gpus=2):
                print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
                exit()
            torch.distributed.init_process_group(backend=backend, device_id=device)
    """)
    assert 'if npudist.accelerator().device_type != "cpu" and not verify_min_gpu_count(min_gpus=2):' in out.code
    assert "device_id" not in out.code and "npudist.init()" in out.code
    assert [f.detail for f in out.applied if f.rule == "process-group-setup"] == \
        ["backend chosen at run time; device_id dropped: npudist.init() sets the device"]
    assert [f.rule for f in out.applied if f.rule == "device-gate"] == ["device-gate"]
    assert _fix(out.code).applied == ()  # the gate as written by fix is not reported again


def test_a_device_mesh_on_cuda_is_on_the_ranks_device_type() -> None:
    out = _fix("""
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cuda", (2,), mesh_dim_names=("dp",))
        tp = init_device_mesh(device_type="cuda", mesh_shape=(2,))
    """)
    assert 'mesh = init_device_mesh(npudist.accelerator().device_type, (2,), mesh_dim_names=("dp",))' in out.code
    assert "tp = init_device_mesh(device_type=npudist.accelerator().device_type, mesh_shape=(2,))" in out.code
    assert out.left == ()


def _run_fixed(tmp_path: Path, simulate: str | None) -> str:
    work = tmp_path / "w"
    work.mkdir()
    (work / "idioms.py").write_text(IDIOMS.read_text())  # the migrate command, as a user runs it
    r = run_npudist(["migrate", "fix", "--write", "idioms.py"], cwd=work, env=child_env())
    assert r.returncode == 0, r.stderr
    sim = ["--simulate", simulate] if simulate else []
    r = run_npudist(["launch", *sim, "--nproc-per-node", "2", "idioms.py"], cwd=work, env=child_env(), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r.stdout


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("simulate", [None, "npu"], ids=["cpu", "simulated-npu"])
def test_fixed_idioms_train_as_one_world_of_two(tmp_path: Path, simulate: str | None) -> None:
    out = _run_fixed(tmp_path, simulate)
    # two ranks print to one pipe: a line may hold both, so the pattern is matched, not the lines
    rows = re.findall(r"rank (\d) first ([\d.]+) last ([\d.]+) sum ([\d.]+) probe (True|False)", out)
    assert sorted(r[0] for r in rows) == ["0", "1"], out
    for _, first, last, total, probe in rows:
        assert float(last) < float(first) / 2
        assert float(total) == pytest.approx(2 * float(last), abs=2e-3)  # all_reduce over 2 ranks, not 1
        assert probe == "True"  # "cuda" if is_available else "cpu" picked this rank's device type


AMP_TIMING = REPO / "tests" / "migrate" / "corpus" / "idioms" / "amp_timing.py"


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("simulate", [None, "npu"], ids=["cpu", "simulated-npu"])
def test_fixed_amp_events_and_allocator_stats_run_on_two_ranks(tmp_path: Path, simulate: str | None) -> None:
    """autocast(enabled=True) in both spellings, GradScaler, events' elapsed_time and the allocator counters,
    ported: bf16 matmuls and float32 losses (autocast's lists), time between events, bytes on the device."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "amp_timing.py").write_text(AMP_TIMING.read_text())
    r = run_npudist(["migrate", "fix", "--write", "amp_timing.py"], cwd=work, env=child_env())
    assert r.returncode == 0, r.stderr
    assert "torch.cuda" not in (work / "amp_timing.py").read_text().split('"""', 2)[2]  # the code, not the docstring
    sim = ["--simulate", simulate] if simulate else []
    r = run_npudist(["launch", *sim, "--nproc-per-node", "2", "amp_timing.py"], cwd=work, env=child_env(),
                    timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    rows = re.findall(r"rank (\d) autocast (\S+) (\S+) loss (\S+) ms ([\d.]+) allocated (\d+) peak (\d+) "
                      r"reserved (\d+)", r.stdout)
    assert sorted(row[0] for row in rows) == ["0", "1"], r.stdout
    for _, out, probe, loss, ms, allocated, peak, reserved in rows:
        assert (out, probe, loss) == ("torch.bfloat16", "torch.bfloat16", "torch.float32")
        assert float(ms) > 0
        if simulate:  # the simulated device's memory is counted; the model and batch are on it
            assert 0 < int(allocated) <= int(peak) <= int(reserved)
        else:  # no accelerator: no accelerator bytes, not the host's
            assert (allocated, peak, reserved) == ("0", "0", "0")


FINETUNE = REPO / "tests" / "migrate" / "corpus" / "idioms" / "finetune.py"


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("simulate", [None, "npu"], ids=["cpu", "simulated-npu"])
def test_fixed_fine_tune_reports_its_device_and_keeps_bf16_autocast(tmp_path: Path, simulate: str | None) -> None:
    """The LLM fine-tune idioms: device queries that raised off CUDA, autocast switched on by
    device.startswith("cuda"), and a bf16 loss averaged with ReduceOp.AVG (the default hccl row takes it)."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "finetune.py").write_text(FINETUNE.read_text())
    r = run_npudist(["migrate", "fix", "--write", "finetune.py"], cwd=work, env=child_env())
    assert r.returncode == 0, r.stderr
    assert "torch.cuda" not in (work / "finetune.py").read_text().split('"""', 2)[2]
    sim = ["--simulate", simulate] if simulate else []
    r = run_npudist(["launch", *sim, "--nproc-per-node", "2", "finetune.py"], cwd=work, env=child_env(), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    names = re.findall(r"rank \d on (.+?): [\d.]+ GiB, ([\d.]+) GiB free of ([\d.]+)", r.stdout)
    assert len(names) == 2, r.stdout
    # two ranks share one pipe: a line may run into the next rank's, so each field is matched by its form
    steps = re.findall(r"rank (\d) step (\d+) loss ([\d.]+) logits (torch\.(?:bfloat16|float16|float32))", r.stdout)
    assert len(steps) == 24, r.stdout
    by_step = {}
    for _rank, step, loss, dtype in steps:
        by_step.setdefault(int(step), set()).add(loss)
        assert dtype == ("torch.bfloat16" if simulate else "torch.float32")  # autocast on the accelerator only
    assert all(len(losses) == 1 for losses in by_step.values())  # the AVG all-reduce: one value on both ranks
    assert float(next(iter(by_step[11]))) < 0.5 * float(next(iter(by_step[0])))
    if simulate:
        assert sorted(n for n, _, _ in names) == ["simulated Ascend NPU (chip 0)", "simulated Ascend NPU (chip 1)"]
        assert all(total == "64.0" for _, _, total in names)
