"""Public training scripts (tests/migrate/corpus/README.md): findings per rule, then the fixed scripts train.

Expected counts were written by reading each script (line numbers in the comments), not from the tool.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from npudist.migrate import analyse, apply
from tests.conftest import REPO, child_env, run_npudist

CORPUS = REPO / "tests" / "migrate" / "corpus"

EXPECTED = {
    "pytorch_ddp_tutorial/multigpu_torchrun.py": {
        "cuda-device-api": 1,      # 14 torch.cuda.set_device
        "local-rank-env": 2,       # 14, 26 os.environ["LOCAL_RANK"]
        "init-process-group": 1,   # 15 backend="nccl"
        "int-device-index": 3,     # 27, 58, 59 .to(self.gpu_id)
        "ddp-wrap": 1,             # 37
        "cuda-device-string": 1,   # 40 f"cuda:{self.gpu_id}" (a map_location through a variable)
        "pin-memory": 1,           # 88
    },
    "nanogpt/train.py": {
        "nccl-string": 1,          # 70 backend = 'nccl'
        "cuda-device-string": 3,   # 72 device = 'cuda', 88 f'cuda:{...}', 109 'cuda' if ...
        "cuda-device-test": 2,     # 109 'cuda' in device, 126 device_type == 'cuda'
        "cuda-device-api": 2,      # 73 is_available, 89 set_device
        "cuda-no-op": 1,           # 73 is_bf16_supported (False without CUDA)
        "init-process-group": 0,
        "process-group-setup": 1,  # 84 init_process_group(backend=backend)
        "local-rank-env": 1,       # 86
        "cuda-backend-flags": 2,   # 107 torch.backends.cuda.matmul, 108 cudnn
        "pin-memory-call": 0,      # 128 x.pin_memory(), y.pin_memory(): only behind 126's accelerator test
        "cuda-amp": 1,             # 196 torch.cuda.amp.GradScaler
        "ddp-wrap": 1,             # 212
    },
    "nanogpt/model.py": {"cuda-device-test": 1},  # 282 use_fused = fused_available and device_type == 'cuda'
    "imagenet/main.py": {
        "cuda-device-api": 12,     # is_available 105 148 154 169 183 208 355 360 442; device_count 106;
                                   # set_device 156 170
        "cuda-method": 7,          # 157 165 171 179 181 (DataParallel(model).cuda()), 356 361 in validate
        "cuda-device-string": 4,   # 185 'cuda:{}'.format, 187 and 443 torch.device("cuda"), 210 loc = ...
        "int-device-index": 1,     # 216 best_acc1.to(args.gpu)
        "process-group-setup": 1,  # 138 init_process_group(backend=args.dist_backend, rank=, world_size=)
        "ddp-wrap": 2,             # 163 168
        "nccl-string": 2,          # 66 --dist-backend default, 107 comparison
        "cuda-backend-flags": 2,   # 88 89 cudnn.deterministic / benchmark
        "pin-memory": 3,           # 264 268 402
        "direct-collective": 1,    # 449 AverageMeter.all_reduce
    },
    "word_language_model/main.py": {"cuda-device-api": 1, "cuda-device-string": 1,  # 58, 67
                                    "single-process": 1},  # 13: argparse, no process group anywhere
    "word_language_model/model.py": {},
    # Written for torch.accelerator already: the hand-made group, the LOCAL_RANK read, and its
    # verify_min_gpu_count gate (38), which exits on CPU ranks.
    "pytorch_fsdp2/example.py": {"local-rank-env": 1, "process-group-setup": 1, "device-gate": 1},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_findings_per_rule(name: str) -> None:
    counts = Counter(f.rule for f in analyse((CORPUS / name).read_text()).findings)
    assert {k: v for k, v in counts.items()} == {k: v for k, v in EXPECTED[name].items() if v}


def _fixed_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for script in dst.glob("*.py"):
        script.write_text(apply(analyse(script.read_text())).code)
    return dst


@pytest.mark.ranks
@pytest.mark.slow
def test_fixed_ddp_tutorial_trains_on_two_cpu_ranks(tmp_path: Path) -> None:
    work = _fixed_copy(CORPUS / "pytorch_ddp_tutorial", tmp_path / "tutorial")
    r = run_npudist(["launch", "--nproc-per-node", "2", "multigpu_torchrun.py", "2", "1", "--batch_size", "64"],
                    cwd=work, env=child_env(), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "[GPU0] Epoch 1 | Batchsize: 64 | Steps: 16" in out and "[GPU1] Epoch 1" in out
    assert "Epoch 1 | Training snapshot saved" in out


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("simulate", [None, "npu"], ids=["cpu", "simulated-npu"])
def test_fixed_nanogpt_trains_on_two_ranks_with_falling_loss(tmp_path: Path, simulate: str | None) -> None:
    """On CPU + gloo, and on the simulated NPU behind its simulated hccl (device tensors only)."""
    work = _fixed_copy(CORPUS / "nanogpt", tmp_path / "nanogpt")
    (work / "data" / "tiny").mkdir(parents=True)
    tokens = np.tile(np.arange(16, dtype=np.uint16), 2000)  # a cycle: learnable in a few steps
    tokens.tofile(work / "data" / "tiny" / "train.bin")
    tokens.tofile(work / "data" / "tiny" / "val.bin")
    # No --device: the fixed default is the rank's device. On the simulated NPU, float16 as on a GPU, which must
    # keep nanoGPT's accelerator branch: autocast, the GradScaler, pinned batches and fused AdamW.
    dtype = "float16" if simulate else "float32"
    args = ["--dataset=tiny", "--compile=False", f"--dtype={dtype}", "--n_layer=1", "--n_head=2",
            "--n_embd=32", "--block_size=32", "--batch_size=4", "--gradient_accumulation_steps=2",
            "--max_iters=6", "--eval_interval=100", "--eval_iters=1", "--log_interval=1", "--warmup_iters=0",
            "--learning_rate=1e-2", "--out_dir=out"]
    # train.py's own globals once it is done, read by a wrapper (train.py itself is nanoGPT's, as fixed)
    (work / "probe.py").write_text(
        "import runpy\ng = runpy.run_path('train.py', run_name='__main__')\n"
        "print(f\"PROBE device_type={g['device_type']} ctx={type(g['ctx']).__name__} "
        "dtype={getattr(g['ctx'], 'fast_dtype', None)} scaler={g['scaler'].is_enabled()}\")\n")
    sim = ["--simulate", simulate] if simulate else []
    r = run_npudist(["launch", *sim, "--nproc-per-node", "2", "probe.py", *args], cwd=work, env=child_env(),
                    timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(x) for x in re.findall(r"iter \d+: loss ([\d.]+)", r.stdout)]
    assert len(losses) == 7, r.stdout
    assert losses[-1] < losses[0] - 1.0
    if simulate:
        assert r.stdout.count("PROBE device_type=npu ctx=autocast dtype=torch.float16 scaler=True") == 2, r.stdout
        assert "using fused AdamW: True" in r.stdout
    else:
        assert r.stdout.count("PROBE device_type=cpu ctx=nullcontext dtype=None scaler=False") == 2, r.stdout


def _fix_with_cli(src: Path, dst: Path) -> Path:
    """`npudist migrate fix --write` on a copy, as a user runs it."""
    shutil.copytree(src, dst)
    r = run_npudist(["migrate", "fix", "--write", "."], cwd=dst, env=child_env())
    assert r.returncode == 0, r.stderr
    return dst


IMAGENET_ARGS = ["--dummy", "-a", "resnet18", "--epochs", "2", "-b", "16", "-j", "0", "--lr", "0.05", "-p", "4",
                 "--dist-url", "env://", "--dist-backend", "nccl"]


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("simulate", [None, "npu"], ids=["cpu", "simulated-npu"])
def test_fixed_imagenet_trainer_trains_on_two_ranks(tmp_path: Path, simulate: str | None) -> None:
    """The pre-torch.accelerator ImageNet trainer, its (kept) explicit init_process_group joining one world."""
    work = _fix_with_cli(CORPUS / "imagenet", tmp_path / "imagenet")
    sim = ["--simulate", simulate] if simulate else []
    r = run_npudist(["launch", *sim, "--nproc-per-node", "2", "main.py", *IMAGENET_ARGS], cwd=work,
                    env=child_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    # Two ranks share one pipe, so a rank's summary may follow the other's line without a newline.
    acc = [float(a) for a in re.findall(r" \*\s+Acc@1 ([\d.]+)", r.stdout)]
    assert len(acc) == 4, r.stdout  # 2 ranks x 2 epochs of validation
    if simulate:
        # DDP on the simulated NPU: the meters are all-reduced, so both ranks print the same accuracy. Not
        # that it rises: --dummy's labels are random, so validation accuracy is chance whatever training does.
        assert acc[0] == acc[1] and acc[2] == acc[3], acc
    else:
        assert "using CPU, this will be slow" in r.stdout  # the original's CPU branch, kept as it was


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("simulate", [None, "npu"], ids=["cpu", "simulated-npu"])
def test_fixed_word_language_model_trains(tmp_path: Path, simulate: str | None) -> None:
    """A single-process script writing one checkpoint name: one rank (two would race on model.pt)."""
    work = _fix_with_cli(CORPUS / "word_language_model", tmp_path / "wlm")
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park"]
    (work / "data" / "tiny").mkdir(parents=True)
    for name, lines in (("train", 200), ("valid", 40), ("test", 40)):
        text = "\n".join(" ".join(words[(i + j) % 10] for j in range(8)) for i in range(lines))
        (work / "data" / "tiny" / f"{name}.txt").write_text(text + "\n")
    args = ["--cuda", "--epochs", "3", "--emsize", "32", "--nhid", "32", "--nlayers", "1", "--nhead", "2", "--bptt",
            "8", "--batch_size", "4", "--lr", "5", "--data", "data/tiny", "--model", "Transformer"]
    sim = ["--simulate", simulate] if simulate else []
    r = run_npudist(["launch", *sim, "--nproc-per-node", "1", "main.py", *args], cwd=work, env=child_env(),
                    timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    valid = [float(v) for v in re.findall(r"valid loss\s+([\d.]+)", r.stdout)]
    assert len(valid) == 3 and valid[-1] < valid[0], r.stdout
    assert "End of training" in r.stdout


@pytest.mark.ranks
@pytest.mark.slow
def test_fixed_fsdp2_example_trains_on_two_cpu_ranks(tmp_path: Path) -> None:
    """pytorch/examples distributed/FSDP2/example.py: its verify_min_gpu_count gate exited with status 0 on CPU
    ranks, having trained nothing; after fix it trains and saves its checkpoint (DCP-style files per rank)."""
    work = _fix_with_cli(CORPUS / "pytorch_fsdp2", tmp_path / "fsdp2")
    r = run_npudist(["launch", "--nproc-per-node", "2", "example.py"], cwd=work, env=child_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert "Unable to locate sufficient" not in r.stdout
    assert r.stdout.count("Running on device cpu") == 2, r.stdout[-3000:]
    saved = sorted(p.name for p in (work / "checkpoints").rglob("*.pt"))
    assert saved == ["model_state_dict.pt", "optim_state_dict.pt"], saved
