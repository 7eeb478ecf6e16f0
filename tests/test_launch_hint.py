"""A CUDA script whose ranks fail on another accelerator (the simulated NPU here) is pointed at `npudist
migrate`; torch's `Torch not compiled with CUDA enabled` alone said nothing of it."""

from __future__ import annotations

import pytest

from npudist.launch.hint import cuda_hint
from tests.conftest import run_npudist

CUDA_SCRIPT = 'import torch\nimport torch.distributed as dist\ndist.init_process_group("nccl")\n' \
              "x = torch.zeros(1).cuda()\n"


def test_the_first_cuda_only_line_and_the_commands_are_named(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CUDA_SCRIPT)
    hint = cuda_hint(str(script), "npu")
    assert hint is not None and 'line 3: `dist.init_process_group("nccl")` and 1 more' in hint
    assert f"npudist migrate check {script}" in hint and f"npudist migrate fix {script}" in hint


def test_no_hint_on_cuda_for_ported_code_or_what_cannot_be_read(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CUDA_SCRIPT)
    assert cuda_hint(str(script), "cuda") is None
    script.write_text("import npudist\nctx = npudist.init()\n")
    assert cuda_hint(str(script), "npu") is None
    script.write_text("def broken(:\n")
    assert cuda_hint(str(script), "npu") is None  # the ranks' own syntax error stands alone
    assert cuda_hint(str(tmp_path / "missing.py"), "npu") is None and cuda_hint(None, "npu") is None


@pytest.mark.ranks
@pytest.mark.slow
def test_a_cuda_script_under_the_simulated_npu_fails_with_the_pointer(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CUDA_SCRIPT)
    done = run_npudist(["launch", "--simulate", "npu", "--nproc-per-node", "1", str(script)], timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"npudist launch: {script} has CUDA-only code that fails on npu" in done.stderr
