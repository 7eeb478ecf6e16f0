"""A rank killed under torchrun resumes from the in-memory copy held by its node's holder, bitwise, on CPU
(gloo) and on the simulated NPU (its strict hccl; the device state staged the way host_copy stages it).

The style of tests/fault/test_restart.py: examples/train_ddp.py under `npudist launch --max-restarts`, the
final params_sha256 compared with an unbroken run of the same arguments, run at the same time.
"""

import re
import subprocess
import sys

import pytest

from npudist.runtime import compat
from tests.conftest import REPO, child_env

pytestmark = pytest.mark.e2e

FINAL = re.compile(r"^final step=(\d+) loss=([\d.]+) params_sha256=([0-9a-f]{64})$", re.MULTILINE)
FAULT = re.compile(r"^FAULT sigkill rank=1 step=(\d+) ", re.MULTILINE)
SOURCE = re.compile(r"^resume: source=(\S+) step=(\d+) ", re.MULTILINE)
EVERY, KILL_AT, STEPS = 4, 10, 16


def _launch(run_dir, fault_step: int, simulate: list[str]) -> subprocess.Popen:
    # Disk checkpoints only at the end: before it, the in-memory copies are the only ones there are.
    args = ["examples/train_ddp.py", "--steps", str(STEPS), "--run-dir", str(run_dir), "--checkpoint-every", "100",
            "--log-every", "1", "--no-telemetry", "--d-model", "32", "--layers", "1", "--global-batch-size", "8",
            "--fault", "sigkill", "--fault-rank", "1", "--fault-step", str(fault_step)]
    return subprocess.Popen([sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "--max-restarts",
                             "1", "--peer-snapshots", str(EVERY), *simulate, *args], cwd=REPO, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


SIM = pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")


@pytest.mark.parametrize("simulate", [[], pytest.param(["--simulate", "npu"], marks=SIM, id="sim-npu")],
                         ids=lambda v: "cpu" if v == [] else None)
def test_a_killed_rank_resumes_from_the_in_memory_copy_bitwise_and_counts_the_steps_lost(tmp_path, simulate):
    reference, killed = _launch(tmp_path / "ref", STEPS + 100, simulate), _launch(tmp_path / "run", KILL_AT, simulate)
    try:
        ref_out, _ = reference.communicate(timeout=240)
        out, _ = killed.communicate(timeout=240)
    finally:
        reference.kill()
        killed.kill()
    assert reference.returncode == 0, ref_out[-3000:]
    assert killed.returncode == 0, out[-3000:]
    assert int(FAULT.search(out).group(1)) == KILL_AT
    on = "accelerator=npu-sim backend=hccl" if simulate else "accelerator=cpu backend=gloo"
    assert on in out and on in ref_out, out[-3000:]
    source, resumed = SOURCE.search(out).groups()
    # One node: the partner is the rank itself, its copy in this node's holder (the launch process).
    assert source == "local-memory"
    # The copy of step 8 normally; step 4 when the kill fell while step 8's copy was still being sent.
    assert int(resumed) in (KILL_AT - KILL_AT % EVERY, KILL_AT - KILL_AT % EVERY - EVERY)
    steps_lost = KILL_AT - int(resumed)
    assert steps_lost < 2 * EVERY  # a disk resume would have lost all KILL_AT steps (no checkpoint yet)
    assert FINAL.search(out).groups() == FINAL.search(ref_out).groups()  # bitwise: loss text and parameters
    runlog = (tmp_path / "run" / "metrics" / "rank1.jsonl").read_text()
    assert '"resume_source": "local-memory"' in runlog
