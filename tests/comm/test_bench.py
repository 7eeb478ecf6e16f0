"""`npudist bench collective`: size parsing, nccl-tests bandwidth factors, and one short real run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from rich.console import Console

from npudist.bench import bus_factor, parse_size, run_ranks, sizes, summarise
from npudist.runtime import compat
from tests.conftest import run_npudist


def test_sizes_parse_and_double():
    assert parse_size("1K") == 1024 and parse_size("64M") == 67108864 and parse_size("4096") == 4096
    assert sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    with pytest.raises(ValueError, match="K, M or G"):
        parse_size("12Q")


def test_bus_factors_are_nccl_tests_ones():
    # nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n, allgather and reducescatter (n-1)/n, broadcast 1.
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_gather", 4) == 0.75
    assert bus_factor("reduce_scatter", 2) == 0.5
    assert bus_factor("broadcast", 8) == 1.0


def test_summary_turns_medians_into_the_table_columns():
    result = {"meta": {"op": "all_reduce", "world": 2}, "rows": [{
        "size_bytes": 1_000_000, "count": 250_000, "type": "float32", "redop": "sum", "npudist_samples": 90,
        "npudist_median_s": 0.002, "raw_median_s": 0.0016, "wrong": 0, "raw_wrong": 0}]}
    row = summarise(result)[0]
    # 1e6 bytes in 2 ms = 0.5 GB/s; busbw factor 2(2-1)/2 = 1; ratio 2 / 1.6.
    assert row["time_us"] == pytest.approx(2000)
    assert row["algbw_gbps"] == pytest.approx(0.5) and row["busbw_gbps"] == pytest.approx(0.5)
    assert row["raw_time_us"] == pytest.approx(1600) and row["time_ratio"] == pytest.approx(1.25)


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.skipif(not compat.has("gloo_reduce_scatter"), reason="the baseline calls gloo reduce_scatter_tensor "
                    "(absent on torch 2.1.2)")
def test_strict_bf16_odd_sizes_are_right_beside_a_baseline():
    proc = run_npudist(["bench", "collective", "--op", "reduce_scatter", "--nproc", "2", "--min-bytes", "1K",
                        "--max-bytes", "2K", "--dtype", "bfloat16", "--profile", "hccl-strict", "--odd",
                        "--baseline", "--blocks", "1", "--iters", "2", "--json"], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["meta"]["profile"] == "hccl-strict" and out["meta"]["world"] == 2
    rows = out["rows"]
    assert [r["size_bytes"] for r in rows] == [1024, 2048]
    # reduce_scatter: 1 KiB of bf16 = 512 elements, 256 per rank, plus one for --odd.
    assert [r["count"] for r in rows] == [514, 1026]
    assert all(r["wrong"] == 0 and r["raw_wrong"] == 0 and r["time_ratio"] > 0 for r in rows)
    for r in rows:
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 0.5)


@pytest.mark.subprocess
def test_bad_options_are_named():
    proc = run_npudist(["bench", "collective", "--op", "all_to_all"], timeout=60)
    assert proc.returncode == 2 and "--op 'all_to_all'" in proc.stderr


@pytest.mark.subprocess
def test_a_silent_hung_rank_is_stopped_at_the_deadline(tmp_path):
    """No progress line ever comes: the deadline must still fire, and the rank's group is stopped."""
    pid_file = tmp_path / "pid"
    hung = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                                  "time.sleep(120)"]
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish within 1 s"):
        run_ranks(hung, 1, 1.0, Console(quiet=True), show=False)
    assert time.monotonic() - began < 60  # bounded; before the fix it waited on the silent pipe for 120 s
    pid = int(pid_file.read_text())
    assert subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True,
                          timeout=10).stdout.strip() in ("", "Z")


@pytest.mark.ranks
@pytest.mark.slow
def test_off_a_terminal_rows_stream_and_end_with_the_average_bus_bandwidth():
    proc = run_npudist(["bench", "collective", "--nproc", "2", "--min-bytes", "1K", "--max-bytes", "4K",
                        "--blocks", "1", "--iters", "2"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    rows = [line.split() for line in lines if re.match(r"^\s+\d+\s+\d+\s+float32", line)]
    assert [r[0] for r in rows] == ["1024", "2048", "4096"]  # one line per size, in order, no table
    assert "┃" not in proc.stdout and "│" not in proc.stdout
    avg = re.fullmatch(r"# Avg bus bandwidth    : ([\d.]+) GB/s", lines[-1])
    assert avg is not None and float(avg.group(1)) == pytest.approx(
        sum(float(r[6]) for r in rows) / 3, abs=2e-3)
