"""npudist.ddp on real gloo ranks: two launches (2 ranks: every case; 3 ranks: strict bf16, then a hang).

What each rank compares against is plain torch (rank_ddp.py): DDP with its default hook, or DDP with a
hand-written hook that reduces each bucket in float32 and casts it back.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import psutil
import pytest
import torch

import npudist
from npudist.runtime import compat
from npudist.telemetry import StepTimer, watch_ddp
from tests.conftest import child_env, run_npudist

SCRIPT = str(Path(__file__).parent / "rank_ddp.py")
TIMEOUT_S = 4


def test_ddp_before_init_says_to_call_init():
    with pytest.raises(RuntimeError, match=r"npudist.ddp needs a process group: call npudist.init\(\) first"):
        npudist.ddp(torch.nn.Linear(2, 2))


def test_watch_ddp_refuses_a_model_npudist_did_not_wrap():
    with pytest.raises(ValueError, match=r"Linear was not made by npudist.ddp\(\)"):
        watch_ddp(torch.nn.Linear(2, 2), StepTimer(exchange_every=0))


def _results(out: Path, world: int, proc) -> dict[int, dict]:
    files = sorted(out.glob("rank*.json"))
    assert len(files) == world, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {r["rank"]: r for r in (json.loads(f.read_text()) for f in files)}


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("ddp2")
    proc = run_npudist(["launch", "--nproc-per-node", "2", SCRIPT, str(out)], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _results(out, 2, proc)


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> dict:
    """3 ranks: the strict cases, then rank 2 stalls before a backward and the job must fail naming it."""
    out = tmp_path_factory.mktemp("ddp3")
    start = time.monotonic()
    proc = run_npudist(["launch", "--nproc-per-node", "3", SCRIPT, str(out), "hang"],
                       env=child_env({"NPUDIST_TIMEOUT": str(TIMEOUT_S)}), timeout=180)
    elapsed = time.monotonic() - start
    time.sleep(1)
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if SCRIPT in " ".join(p.info["cmdline"] or []) and str(out) in " ".join(p.info["cmdline"] or [])]
    return {"ranks": _results(out, 3, proc), "proc": proc, "elapsed": elapsed, "out": out, "left": left}


@pytest.mark.ranks
@pytest.mark.slow
def test_fp32_default_profile_is_bitwise_plain_ddp_with_every_option(two):
    for rank in (0, 1):
        cases = two[rank]["default"]
        assert set(cases) == {"defaults", "find_unused_parameters", "gradient_as_bucket_view", "static_graph",
                              "bucket_cap_mb"}
        for name, case in cases.items():
            assert case["differ"] == [], (rank, name)
            assert case["buckets"] >= 4, (rank, name)  # 4 steps, at least one bucket each went through npudist


@pytest.mark.ranks
@pytest.mark.slow
def test_fp32_is_bitwise_plain_ddp_in_a_world_of_three(three):
    # Power-of-two worlds scale after the sum, others before it (DDP's order): both must keep DDP's bits.
    for rank, r in three["ranks"].items():
        assert set(r["default"]) == {"defaults", "bucket_cap_mb"}
        for name, case in r["default"].items():
            assert case["differ"] == [], (rank, name)
            assert case["buckets"] >= 4, (rank, name)


@pytest.mark.ranks
@pytest.mark.slow
def test_every_bucket_is_counted_by_comm(two):
    for rank in (0, 1):
        a = two[rank]["accounting"]
        # bucket count x steps, as plain DDP's hook was called on the same model and bucket size
        assert a["reference_reductions"] > a["steps"]  # several buckets per step
        assert a["calls"] == a["duration_count"] == a["reference_reductions"]
        assert a["bytes"] == a["grad_bytes"] * a["steps"]
        assert a["inflight"] == 0
        assert a["wait_seconds"] > 0  # what telemetry reads as time waiting in gradient all-reduce
        # the end of backward blocked on its buckets (the comm phases): part of the last bucket's issue to
        # completion, so at most the sum over buckets
        assert 0 < a["blocked_seconds"] <= a["wait_seconds"]


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.skipif(not compat.has("gloo_bf16"), reason="the reference, plain DDP of a bf16 model, needs gloo "
                    "bfloat16 (torch >= 2.5)")
@pytest.mark.parametrize("world", [2, 3])
def test_strict_bf16_trains_and_matches_an_fp32_reduction(world, two, three):
    ranks = two if world == 2 else three["ranks"]
    for rank, r in ranks.items():
        s = r["strict"]
        assert s["differ"] == [], rank
        assert s["losses"][-1] < 0.8 * s["losses"][0], s["losses"]
        assert s["adaptations"]["cast"] == s["reference_reductions"] == s["buckets"]
        assert s["adaptations"]["pad"] == s["reference_reductions"]  # odd sizes, 128-element multiple
        assert s["reference_reductions"] > 8  # 8 steps, several buckets each


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.skipif(not compat.has("ddp_init_sync"), reason="DDP(init_sync=) arrived in torch 2.7; before it "
                    "DDP copies rank 0's weights itself")
@pytest.mark.parametrize("world", [2, 3])
def test_start_up_copy_of_rank0_weights_goes_through_npudist(world, two, three):
    ranks = two if world == 2 else three["ranks"]
    for rank in range(world):
        r = ranks[rank]["start_sync"]
        assert r["differ"] == [], rank  # every rank now holds rank 0's bf16 weights, bit for bit
        assert r["broadcasts"] == r["tensors"] == 4  # two Linear layers: weight and bias each
        assert r["adapted"] >= 4  # bf16 is not in hccl-strict's copy row: each copy was adapted


@pytest.mark.ranks
@pytest.mark.slow
def test_options_a_hook_cannot_serve_are_refused_by_name(two):
    errors = two[0]["refusals"]
    assert errors["mixed_precision"].startswith("ValueError: npudist.ddp: the DDP option mixed_precision=")
    assert errors["delay"].startswith("ValueError: npudist.ddp: the DDP option delay_all_reduce_named_params=")
    assert errors["sparse"].startswith("ValueError: npudist.ddp: module '0' (Embedding) has sparse=True")


@pytest.mark.ranks
@pytest.mark.slow
def test_a_users_hook_replaces_npudists_with_one_warning(two):
    r = two[0]["replaced"]
    assert len(r["warnings"]) == 1 and "replaces npudist.ddp's hook" in r["warnings"][0]
    assert r["npudist_calls"] == 0  # the user's hook (DDP's allreduce_hook) did the reducing
    assert r["differ"] == []


@pytest.mark.ranks
@pytest.mark.slow
def test_a_rank_stalled_before_backward_is_named_and_nothing_is_left(three):
    proc = three["proc"]
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert three["left"] == []
    raised = {int(m.group(1)): (m.group(2), float(m.group(3)), m.group(4))
              for m in re.finditer(r"RANK (\d) RAISED (\w+) after ([\d.]+) s: (.*)", text)}
    # Both waiting ranks time out together; the first to exit makes torchrun stop the other, which may be
    # killed before it prints. Every rank that did report must name rank 2.
    assert raised and set(raised) <= {0, 1}, text[-3000:]
    for kind, seconds, message in raised.values():
        assert kind == "CollectiveHangError"
        assert seconds <= TIMEOUT_S + 5
        assert "rank(s) 2 never reached it" in message
    report = json.loads(next(three["out"].glob("hang-rank*.json")).read_text())
    assert report["not_reached"] == [2] and report["reached"] == [0, 1]
    seq = report["seq"]
    assert report["ranks"]["2"]["seq"] < seq and f"all_reduce #{seq} " in text
