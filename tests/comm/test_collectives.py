"""Every collective, op, dtype, shape and layout against a locally computed reference, on real gloo ranks.

Hypothesis draws the cases here (a bounded number, no shrinking: each run starts real ranks); one
launch per world size runs them all. Expected answers come from rank_cases.py's reference rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.conftest import run_npudist

pytestmark = pytest.mark.ranks

HERE = Path(__file__).parent
FLOATS = ("float32", "float16", "bfloat16", "float64")
INTS = ("int16", "int32", "int64", "uint8", "bool")


@st.composite
def case(draw: st.DrawFn) -> dict:
    coll = draw(st.sampled_from(["all_reduce", "all_reduce", "reduce_scatter", "all_gather", "broadcast"]))
    dtype = draw(st.sampled_from(FLOATS + INTS))
    redops = ["sum", "max", "min", "product", "avg", "band"]
    redop = draw(st.sampled_from(redops)) if coll in ("all_reduce", "reduce_scatter") else "sum"
    ndim = draw(st.integers(0 if coll != "reduce_scatter" else 1, 3))
    shape = draw(st.lists(st.integers(0 if draw(st.booleans()) else 1, 9), min_size=ndim, max_size=ndim))
    view = draw(st.sampled_from(["contig", "transpose", "step", "offset"]))
    return {"coll": coll, "dtype": dtype, "redop": redop, "shape": shape, "view": view,
            "profile": draw(st.sampled_from(["gloo", "hccl-strict"])), "seed": draw(st.integers(0, 10**6)),
            "src": draw(st.integers(0, 2))}


def expected_error(c: dict) -> str | None:
    """Hand-written from the profile rows: which cases no adaptation can serve."""
    if c["coll"] not in ("all_reduce", "reduce_scatter"):
        return None
    if c["profile"] == "hccl-strict":
        if c["redop"] == "band" or c["dtype"] not in ("float32", "float16", "bfloat16"):
            return "TypeError"
        return None
    if c["redop"] == "avg" and c["dtype"] not in FLOATS:
        return "TypeError"
    if c["redop"] == "band" and c["dtype"] in FLOATS:
        return "TypeError"
    return None


FIXED = [  # large and odd, under both profiles
    {"coll": "all_reduce", "dtype": "bfloat16", "redop": "sum", "shape": [1000, 1001], "view": "transpose",
     "profile": "hccl-strict", "seed": 1, "src": 0},
    {"coll": "all_reduce", "dtype": "float32", "redop": "max", "shape": [300_007], "view": "offset",
     "profile": "hccl-strict", "seed": 2, "src": 0},
    {"coll": "reduce_scatter", "dtype": "bfloat16", "redop": "avg", "shape": [3, 4097], "view": "step",
     "profile": "hccl-strict", "seed": 3, "src": 0},
    {"coll": "all_gather", "dtype": "int64", "redop": "sum", "shape": [5, 3], "view": "transpose",
     "profile": "hccl-strict", "seed": 4, "src": 0},
    {"coll": "broadcast", "dtype": "bool", "redop": "sum", "shape": [129], "view": "step",
     "profile": "hccl-strict", "seed": 5, "src": 1},
    {"coll": "all_reduce", "dtype": "int16", "redop": "product", "shape": [2, 3], "view": "transpose",
     "profile": "gloo", "seed": 6, "src": 0},
    {"coll": "all_reduce", "dtype": "float16", "redop": "avg", "shape": [], "view": "contig",
     "profile": "hccl-strict", "seed": 7, "src": 0},
]


def run_world(tmp_path: Path, world: int, cases: list[dict]) -> list[dict]:
    for i, c in enumerate(cases):
        c["id"] = i
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps({"cases": cases}))
    proc = run_npudist(["launch", "--nproc-per-node", str(world), str(HERE / "rank_cases.py"), str(spec),
                        str(tmp_path)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def check_results(cases: list[dict], reports: list[dict]) -> None:
    failures = []
    for rank, report in enumerate(reports):
        for c, res in zip(cases, report["results"], strict=True):
            want = expected_error(c)
            if want:
                if not res.get("error", "").startswith(want):
                    failures.append((rank, c, res))
            elif not res.get("ok"):
                failures.append((rank, c, res))
    assert not failures, "\n".join(map(str, failures[:10]))


def draw_cases(n: int) -> list[dict]:
    """n hypothesis-drawn cases; collected first so that one launch of real ranks runs them all."""
    drawn: list[dict] = []

    @settings(max_examples=n, phases=[Phase.generate], deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case())
    def collect(c: dict) -> None:
        drawn.append(c)

    collect()
    return drawn


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_cases_against_reference(tmp_path, world):
    cases = [dict(c) for c in FIXED] + draw_cases(60)
    reports = run_world(tmp_path, world, cases)
    check_results(cases, reports)
    checks = reports[0]["checks"]
    zero = {"cast": 0, "contiguous": 0, "pad": 0, "align": 0, "stage": 0}
    assert checks["strict_bf16"] == {**zero, "cast": 1}
    assert checks["strict_strided_odd"] == {**zero, "contiguous": 1, "pad": 1}
    assert checks["strict_misaligned"] == {**zero, "align": 1}
    assert checks["gloo_int16"] == {**zero, "cast": 1}
    assert checks["inflight_before_wait"] == 1
    assert checks["after_wait"] == [0, 1, 4000, float(world)]
    assert checks["many_builds"] == 1
    # avg over ranks of (rank + 1), rank, rank: 2 ranks -> 1.5, 0.5, 0.5; 3 ranks -> 2, 1, 1.
    mean = (world - 1) / 2
    assert checks["many_values"] == [mean + 1, mean, mean, [1, 2]]


@pytest.mark.slow
def test_emulated_gloo_reduce_scatter_meets_the_reference(tmp_path):
    """The path older torch takes for gloo reduce_scatter (all_reduce, keep this rank's slice)."""
    cases = [c for c in draw_cases(80) if c["coll"] == "reduce_scatter" and c["profile"] == "gloo"]
    cases += [{"coll": "reduce_scatter", "dtype": dtype, "redop": op, "shape": [4, 3], "view": "contig",
               "profile": "gloo", "seed": 11 + i, "src": 0}
              for i, (dtype, op) in enumerate([("float32", "min"), ("int64", "max"), ("float32", "product"),
                                               ("bfloat16", "avg"), ("int32", "sum")])]
    for i, c in enumerate(cases):
        c["id"] = i
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps({"cases": cases}))
    proc = run_npudist(["launch", "--nproc-per-node", "2", str(HERE / "rank_cases_emulated.py"), str(spec),
                        str(tmp_path)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_results(cases, [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)])
