"""Three public training scripts (tests/migrate/corpus/README.md): findings per rule, then the fixed scripts train.

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
        "cuda-device-string": 5,   # 72 device = 'cuda', 88 f'cuda:{...}', 109 twice, 126
        "cuda-device-api": 2,      # 73 is_available, 89 set_device
        "cuda-api": 1,             # 73 is_bf16_supported
        "init-process-group": 0,
        "process-group-setup": 1,  # 84 init_process_group(backend=backend)
        "local-rank-env": 1,       # 86
        "cuda-backend-flags": 2,   # 107 torch.backends.cuda.matmul, 108 cudnn
        "pin-memory": 2,           # 128 x.pin_memory(), y.pin_memory()
        "cuda-amp": 1,             # 196 torch.cuda.amp.GradScaler
        "ddp-wrap": 1,             # 212
    },
    "nanogpt/model.py": {"cuda-device-string": 1},  # 282 device_type == 'cuda'
    # Written for torch.accelerator already: only the hand-made group and the LOCAL_RANK read remain.
    "pytorch_fsdp2/example.py": {"local-rank-env": 1, "process-group-setup": 1},
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


@pytest.mark.slow
def test_fixed_ddp_tutorial_trains_on_two_cpu_ranks(tmp_path: Path) -> None:
    work = _fixed_copy(CORPUS / "pytorch_ddp_tutorial", tmp_path / "tutorial")
    r = run_npudist(["launch", "--nproc-per-node", "2", "multigpu_torchrun.py", "2", "1", "--batch_size", "64"],
                    cwd=work, env=child_env(), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "[GPU0] Epoch 1 | Batchsize: 64 | Steps: 16" in out and "[GPU1] Epoch 1" in out
    assert "Epoch 1 | Training snapshot saved" in out


@pytest.mark.slow
@pytest.mark.parametrize("simulate", [None, "npu"], ids=["cpu", "simulated-npu"])
def test_fixed_nanogpt_trains_on_two_ranks_with_falling_loss(tmp_path: Path, simulate: str | None) -> None:
    """On CPU + gloo, and on the simulated NPU behind its simulated hccl (device tensors only)."""
    work = _fixed_copy(CORPUS / "nanogpt", tmp_path / "nanogpt")
    (work / "data" / "tiny").mkdir(parents=True)
    tokens = np.tile(np.arange(16, dtype=np.uint16), 2000)  # a cycle: learnable in a few steps
    tokens.tofile(work / "data" / "tiny" / "train.bin")
    tokens.tofile(work / "data" / "tiny" / "val.bin")
    args = ["--dataset=tiny", "--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=1", "--n_head=2",
            "--n_embd=32", "--block_size=32", "--batch_size=4", "--gradient_accumulation_steps=2",
            "--max_iters=6", "--eval_interval=100", "--eval_iters=1", "--log_interval=1", "--warmup_iters=0",
            "--learning_rate=1e-2", "--out_dir=out"]
    sim = ["--simulate", simulate] if simulate else []
    r = run_npudist(["launch", *sim, "--nproc-per-node", "2", "train.py", *args], cwd=work, env=child_env(),
                    timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(x) for x in re.findall(r"iter \d+: loss ([\d.]+)", r.stdout)]
    assert len(losses) == 7, r.stdout
    assert losses[-1] < losses[0] - 1.0
