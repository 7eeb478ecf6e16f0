"""examples/edge_ensemble.py on 4 CPU ranks: the combination is the members' mean, and it helps."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_npudist

pytestmark = pytest.mark.e2e


@pytest.mark.slow
def test_four_rank_ensemble_is_the_mean_of_its_members(tmp_path: Path) -> None:
    proc = run_npudist(["launch", "--nproc-per-node", "4", str(REPO / "examples" / "edge_ensemble.py"),
                        "--dump", str(tmp_path), "--test-samples", "1000"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    members = [torch.load(tmp_path / f"member{r}.pt") for r in range(4)]
    ensemble = torch.load(tmp_path / "ensemble.pt")
    labels = members[0]["labels"]
    # The mean of the four members' softmax probabilities, computed here from what each rank dumped.
    mean = torch.stack([torch.softmax(m["logits"], dim=-1) for m in members]).mean(dim=0)
    torch.testing.assert_close(ensemble["scores"], mean, rtol=1e-5, atol=1e-6)
    assert torch.equal(ensemble["labels"], mean.argmax(dim=-1))
    member_acc = [float((m["logits"].argmax(-1) == labels).float().mean()) for m in members]
    ensemble_acc = float((ensemble["labels"] == labels).float().mean())
    assert len({round(a, 4) for a in member_acc}) > 1  # differently seeded members really differ
    assert ensemble_acc >= min(member_acc)
    printed = re.search(r"ensemble members=4 combine=mean_probs accuracy=([\d.]+) .*worst_member=([\d.]+)",
                        proc.stdout)
    assert printed, proc.stdout
    assert float(printed.group(1)) == pytest.approx(ensemble_acc, abs=1e-4)
    assert float(printed.group(2)) == pytest.approx(min(member_acc), abs=1e-4)
    for r, acc in enumerate(member_acc):
        assert f"member rank={r} runner=torch accuracy={acc:.4f}" in proc.stdout
