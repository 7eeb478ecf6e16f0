"""The example job on the simulated NPU: it trains, checkpoints, resumes and ends where the CPU run ends.

Small model and few steps: every op of the simulated device goes through Python dispatch (README,
"Simulated NPU", for the measured cost).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npudist.runtime import compat
from tests.conftest import child_env, run_npudist
from tests.sim import chips

# Each job starts real ranks whose every op goes through Python dispatch: minutes on a loaded CI host.
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(1200),
              pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")]

EXAMPLE = "examples/train_ddp.py"
SMALL = ["--d-model", "32", "--layers", "1", "--seq-len", "16", "--vocab", "32", "--log-every", "1",
         "--exchange-every", "2"]
TELEMETRY = child_env({"NPUDIST_METRICS_PORT": "0"})  # each rank serves on a free port


def _final(proc) -> tuple[float, str]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = re.search(r"final step=\d+ loss=([\d.]+) params_sha256=([0-9a-f]{64})", proc.stdout)
    assert m, proc.stdout[-2000:]
    return float(m.group(1)), m.group(2)


def _losses(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"^step=\d+ loss=([\d.]+)", text, re.M)]


def _launch(args: list[str], nproc: int, simulate: str | None, timeout: float = 600):
    sim = ["--simulate", simulate] if simulate else []
    return run_npudist(["launch", *sim, "--nproc-per-node", str(nproc), EXAMPLE, *args], env=TELEMETRY,
                       timeout=timeout)


@pytest.fixture(scope="module")
def cpu_two():
    return _launch(["--steps", "12", "--global-batch-size", "8", *SMALL], 2, None)


def test_sim_trains_checkpoints_resumes_and_ends_with_the_cpu_params(cpu_two, tmp_path: Path):
    run_dir = tmp_path / "run"
    first = _launch(["--steps", "8", "--global-batch-size", "8", "--checkpoint-every", "4", "--sync-checkpoints",
                     "--run-dir", str(run_dir), *SMALL], 2, "npu")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "accelerator=npu-sim backend=hccl" in first.stdout
    assert sorted(p.name for p in run_dir.glob("step-*")) == ["step-00000004", "step-00000008"]
    losses = _losses(first.stdout)
    assert losses[-1] < losses[0]
    second = _launch(["--steps", "12", "--global-batch-size", "8", "--checkpoint-every", "4",
                      "--run-dir", str(run_dir), *SMALL], 2, "npu")  # asynchronous checkpoints
    assert "resumed from step=8" in second.stdout
    assert (run_dir / "step-00000012").is_dir()
    assert _final(second) == _final(cpu_two)
    assert (run_dir / "metrics" / "rank0.jsonl").is_file()  # the run log: telemetry ran on the device


def test_strict_three_ranks_end_with_the_cpu_params():
    # A skew exchange every 2 steps: the control door's rows of a few floats must meet the strict row too.
    args = ["--steps", "4", "--global-batch-size", "12", *SMALL, "--exchange-every", "2"]
    sim = _launch(args, 3, "npu:strict")
    assert "accelerator=npu-sim backend=hccl" in sim.stdout
    assert _final(sim) == _final(_launch(args, 3, None))


def test_a_torch_npu_script_trains_unchanged_under_simulate():
    proc = run_npudist(["launch", "--simulate", "npu", "--nproc-per-node", "2", "tests/sim/torch_npu_script.py"],
                       timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    results = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert r["device"] == chips.device(r["rank"]) and r["backend"] == "hccl"
        assert r["torch_npu"].endswith("+npudist.sim")
        assert r["last"] < 0.2 * r["first"]
        assert r["memory_allocated"] > 0


def test_the_stand_in_is_not_on_the_path_without_simulate():
    proc = run_npudist(["launch", "--nproc-per-node", "1", "tests/sim/torch_npu_script.py"], timeout=120)
    assert proc.returncode != 0
    assert "No module named 'torch_npu'" in proc.stdout + proc.stderr


def _reference_last_bias() -> float:
    """The Ascend-style script's model trained in one CPU process on the whole batch: DDP's average of the
    two ranks' half-batch gradients is the full batch's gradient."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    y = x.sum(dim=1, keepdim=True)
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(list(model.parameters())[-1].item())


def test_an_ascend_style_script_with_local_rank_devices_and_object_collectives_trains_unchanged():
    """set_device(local_rank), f"npu:{local_rank}", device_ids=[local_rank], device_count() and the four
    object collectives on hccl: what issue 33's held-out script did and what failed on rank 1 before."""
    import json

    proc = run_npudist(["launch", "--simulate", "npu", "--nproc-per-node", "2", "tests/sim/ascend_ddp_script.py"],
                       timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {r["rank"]: r for r in (json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                                      if line.startswith("RESULT "))}
    assert sorted(results) == [0, 1]
    for rank, r in results.items():
        assert r["local_rank"] == rank and r["current_device"] == rank
        assert r["device_count"] == 8  # the chips of the simulated host, as a rank of a real one sees them
        assert r["config"] == {"lr": 0.05, "steps": 20, "seed": 0}  # broadcast_object_list from rank 0
        assert r["all_reduce"] == 2.0
        assert r["all_gather_object"] == [{"rank": 0, "last": results[0]["last"]},
                                          {"rank": 1, "last": results[1]["last"]}]
        assert r["scatter_object_list"] == f"shard-{rank}"
        assert r["last"] < 0.05 * r["first"]
    assert results[0]["gather_object"] == [results[0]["last"], results[1]["last"]]
    assert results[1]["gather_object"] is None
    assert results[0]["params"] == results[1]["params"]
    assert abs(results[0]["params"][0] - _reference_last_bias()) < 1e-4
