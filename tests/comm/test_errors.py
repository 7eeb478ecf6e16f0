"""Error cases on real gloo ranks: clear messages, and never a hang."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import child_env, run_npudist

pytestmark = pytest.mark.ranks

SCRIPT = str(Path(__file__).parent / "rank_errors.py")


def reports(stdout: str) -> dict[int, dict]:
    found = [json.loads(line.split("REPORT ", 1)[1]) for line in stdout.splitlines() if "REPORT " in line]
    return {r["rank"]: r for r in found}


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory) -> dict[int, dict]:
    """One launch: local errors first, then a size mismatch under the debug handshake."""
    out = tmp_path_factory.mktemp("errors")
    proc = run_npudist(["launch", "--nproc-per-node", "2", SCRIPT, "debug", str(out)], timeout=120)
    files = sorted(out.glob("rank*.json"))
    assert len(files) == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {r["rank"]: r for r in (json.loads(f.read_text()) for f in files)}


@pytest.mark.slow
def test_errors_raised_before_communication_name_what_is_wrong(debug_run):
    errors = debug_run[0]["errors"]
    assert errors["band_float"].startswith("TypeError: op='band' on torch.float32")
    assert "backend gloo" in errors["band_float"]
    assert "{bool, int32, int64, int8, uint8}" in errors["band_float"]
    assert errors["strict_int"].startswith("TypeError: op='sum' on torch.int32")
    assert "profile 'hccl-strict'" in errors["strict_int"] and "{float16, float32}" in errors["strict_int"]
    assert errors["bad_op"] == ("ValueError: unknown reduce op 'mean'; "
                                "choose one of sum, avg, max, min, product, band, bor, bxor")
    assert "shape [3, 2] must be divisible by the world size 2" in errors["rs_shape"]
    assert errors["not_tensor"] == "TypeError: broadcast expects a torch.Tensor, got list"


@pytest.mark.slow
def test_debug_handshake_names_ranks_and_sizes(debug_run):
    for r in (0, 1):
        msg = debug_run[r]["error"]
        assert msg.startswith("MismatchError: all_reduce: ranks passed different tensors")
        assert "rank 0 has 10 elements (shape [10], float32)" in msg
        assert "rank 1 has 1010 elements (shape [1010], float32)" in msg


@pytest.mark.slow
def test_mismatch_without_debug_ends_in_an_error_within_the_timeout():
    start = time.monotonic()
    proc = run_npudist(["launch", "--nproc-per-node", "2", SCRIPT, "mismatch"],
                       env=child_env({"NPUDIST_TIMEOUT": "10"}), timeout=90)
    elapsed = time.monotonic() - start
    # Gloo aborts or resets the connection; either way the job fails instead of waiting forever.
    assert proc.returncode != 0
    assert elapsed < 60
    assert "no error" not in proc.stdout
