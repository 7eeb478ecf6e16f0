"""`npudist bench collective`: an nccl-tests style table for npudist's collectives, optionally beside
plain torch.distributed in the same run.

The parent only plans, starts the ranks (through `npudist launch`, i.e. torchrun), shows progress and
prints; the timing happens in rank.py. Bandwidth follows nccl-tests (doc/PERFORMANCE.md):
algbw = size / time, busbw = algbw * factor, with the per-collective factors below.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import IO

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DTYPES = ("float32", "bfloat16", "float16")
_UNITS = MappingProxyType({"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30})


def parse_size(text: str) -> int:
    """'1K' -> 1024, '64M' -> 67108864, '4096' -> 4096 (binary units, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text.upper())
    if not m:
        raise ValueError(f"size {text!r}: give a number of bytes with an optional K, M or G suffix, e.g. 64M")
    return int(m.group(1)) * _UNITS[m.group(2)]


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from min to max, both included (nccl-tests -f 2)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"--min-bytes {min_bytes} / --max-bytes {max_bytes}: need 1 <= min <= max")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= 2
    return out


def bus_factor(op: str, world: int) -> float:
    """nccl-tests' busbw factor: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1."""
    return {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world,
            "reduce_scatter": (world - 1) / world, "broadcast": 1.0}[op]


def summarise(result: dict) -> list[dict]:
    """Rows with time in µs, algbw/busbw in GB/s (1e9 bytes/s) and, with a baseline, time_ratio."""
    meta, out = result["meta"], []
    factor = bus_factor(meta["op"], meta["world"])
    for r in result["rows"]:
        t = r["npudist_median_s"]
        row = {"size_bytes": r["size_bytes"], "count": r["count"], "type": r["type"], "redop": r["redop"],
               "time_us": t * 1e6, "algbw_gbps": r["size_bytes"] / t / 1e9,
               "busbw_gbps": r["size_bytes"] / t / 1e9 * factor, "wrong": r["wrong"],
               "samples": r["npudist_samples"]}
        if "raw_median_s" in r:
            raw = r["raw_median_s"]
            row.update(raw_time_us=raw * 1e6, raw_busbw_gbps=r["size_bytes"] / raw / 1e9 * factor,
                       raw_wrong=r["raw_wrong"], time_ratio=t / raw)
        out.append(row)
    return out


def table(meta: dict, rows: list[dict]) -> Table:
    title = (f"{meta['op']} on {meta['world']} ranks ({meta['backend']}, profile "
             f"{meta['profile'] or 'backend'}, medians of {meta['blocks']} blocks x {meta['iters']} samples)")
    t = Table(title=title)
    for col in ("size (B)", "count", "type", "redop", "time (µs)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"):
        t.add_column(col, justify="right")
    baseline = rows and "time_ratio" in rows[0]
    if baseline:
        for col in ("raw time (µs)", "raw busbw", "ratio"):
            t.add_column(col, justify="right")
    for r in rows:
        cells = [str(r["size_bytes"]), str(r["count"]), r["type"], r["redop"], f"{r['time_us']:.1f}",
                 f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}", str(r["wrong"])]
        if baseline:
            cells += [f"{r['raw_time_us']:.1f}", f"{r['raw_busbw_gbps']:.3f}", f"{r['time_ratio']:.3f}"]
        t.add_row(*cells)
    return t


def rank_command(op: str, nproc: int, size_list: list[int], dtype: str, out: str, *, profile: str | None,
                 baseline: bool, baseline_dtype: str | None, odd: bool, blocks: int, iters: int,
                 redop: str) -> list[str]:
    cmd = [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", str(nproc), "-m",
           "npudist.bench.rank", "--op", op, "--dtype", dtype, "--sizes", ",".join(map(str, size_list)),
           "--blocks", str(blocks), "--iters", str(iters), "--redop", redop, "--out", out]
    if profile:
        cmd += ["--profile", profile]
    if baseline:
        cmd.append("--baseline")
    if baseline_dtype:
        cmd += ["--baseline-dtype", baseline_dtype]
    if odd:
        cmd.append("--odd")
    return cmd


def _lines(stream: IO[str], out: queue.Queue) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


ROW_HEADER = f"{'size (B)':>12} {'count':>12} {'type':>9} {'redop':>6} {'time (us)':>11} {'algbw (GB/s)':>12} " \
             f"{'busbw (GB/s)':>12} {'#wrong':>6}"


def row_line(r: dict) -> str:
    """One result row as nccl-tests prints it while it runs: fixed-width columns, one line per size."""
    return (f"{r['size_bytes']:>12} {r['count']:>12} {r['type']:>9} {r['redop']:>6} {r['time_us']:>11.1f} "
            f"{r['algbw_gbps']:>12.3f} {r['busbw_gbps']:>12.3f} {r['wrong']:>6}")


def average_busbw_line(rows: list[dict]) -> str:
    """nccl-tests' closing line: the mean bus bandwidth over every size."""
    avg = sum(r["busbw_gbps"] for r in rows) / len(rows) if rows else 0.0
    return f"# Avg bus bandwidth    : {avg:.3f} GB/s"


def run_ranks(cmd: list[str], total: int, timeout: float, console: Console, show: bool,
              on_row: Callable[[dict], None] | None = None) -> None:
    """Start the ranks, follow rank 0's progress lines, and stop everything at the timeout.

    The lines are read on a thread, so the deadline holds even when a hung rank prints nothing.
    ``on_row`` gets each size's raw row as soon as rank 0 measured it.
    """
    from npudist.bench.rank import PROGRESS

    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        deadline = time.monotonic() + timeout
        lines: queue.Queue = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
        with Progress(console=console, disable=not show, transient=True) as progress:
            task = progress.add_task("sizes", total=total)
            while (left := deadline - time.monotonic()) > 0:
                try:
                    line = lines.get(timeout=left)
                except queue.Empty:
                    break
                if line is None:
                    break
                if line.startswith(PROGRESS):
                    parts = line.split(maxsplit=4)
                    done = int(parts[1])
                    progress.update(task, completed=done, description=f"{done}/{total} sizes")
                    if on_row is not None and len(parts) == 5:
                        on_row(json.loads(parts[4]))
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            raise RuntimeError(f"benchmark ranks did not finish within {timeout:.0f} s; stopped") from None
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"benchmark ranks failed (exit {proc.returncode}):\n{err.read()[-3000:]}")


app = typer.Typer(help="Benchmarks.", no_args_is_help=True)


@app.command("collective")
def collective(
    op: str = typer.Option("all_reduce", help="all_reduce, all_gather, reduce_scatter or broadcast."),
    nproc: int = typer.Option(2, help="Ranks to start on this machine."),
    min_bytes: str = typer.Option("1K", help="Smallest size (bytes, K/M/G suffixes)."),
    max_bytes: str = typer.Option("64M", help="Largest size; sizes double from min to max."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    profile: str = typer.Option(None, help="Constraint profile to apply (e.g. hccl-strict)."),
    baseline: bool = typer.Option(False, help="Also time plain torch.distributed, interleaved."),
    baseline_dtype: str = typer.Option(None, help="dtype of the baseline tensors (default: --dtype)."),
    odd: bool = typer.Option(False, help="One element more per rank than the size implies."),
    redop: str = typer.Option("sum", help="Reduce op for all_reduce/reduce_scatter."),
    blocks: int = typer.Option(3, help="Interleaved blocks per implementation."),
    iters: int = typer.Option(30, help="Samples per block."),
    timeout: float = typer.Option(1800, help="Seconds before the ranks are stopped."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    out_file: str = typer.Option(None, "--out", help="Also write the JSON document to this file, e.g. "
                                  "RUN_DIR/bench/all_reduce.json for `npudist report`."),
) -> None:
    """Time a collective over a range of sizes: the nccl-tests table, #wrong from a correctness check.

    Examples: `npudist bench collective --op all_reduce --max-bytes 64M`; `npudist bench collective --op
    all_gather --nproc 4 --baseline` (beside plain torch.distributed)."""
    # A pipe or CI log has no width; the table needs about 150 columns.
    console = Console(stderr=as_json, width=None if sys.stdout.isatty() else 160)
    try:
        if op not in COLLECTIVES:
            raise ValueError(f"--op {op!r}: choose one of {', '.join(COLLECTIVES)}")
        for name, value in (("--dtype", dtype), ("--baseline-dtype", baseline_dtype)):
            if value is not None and value not in DTYPES:
                raise ValueError(f"{name} {value!r}: choose one of {', '.join(DTYPES)}")
        if profile is not None:
            from npudist.comm.constraints import profile as lookup

            lookup(profile)
        # One rank is allowed, as in nccl-tests on one GPU: the time and algbw are real, busbw is 0.
        if nproc < 1 or blocks < 1 or iters < 1:
            raise ValueError("--nproc, --blocks and --iters must be at least 1")
        size_list = sizes(parse_size(min_bytes), parse_size(max_bytes))
    except ValueError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]npudist bench collective:[/] {exc}")
        raise typer.Exit(2) from None
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        cmd = rank_command(op, nproc, size_list, dtype, out, profile=profile, baseline=baseline,
                           baseline_dtype=baseline_dtype, odd=odd, blocks=blocks, iters=iters, redop=redop)
        # Off a terminal (a log, CI, a pipe), print each size's row as it completes, as nccl-tests does.
        streaming = not as_json and not sys.stdout.isatty()

        def on_row(raw: dict) -> None:
            typer.echo(row_line(summarise({"meta": {"op": op, "world": nproc}, "rows": [raw]})[0]))

        if streaming:
            typer.echo(f"# npudist bench collective {op} on {nproc} ranks")
            typer.echo(ROW_HEADER)
        try:
            run_ranks(cmd, len(size_list), timeout, console, show=not as_json and not streaming,
                      on_row=on_row if streaming else None)
        except RuntimeError as exc:
            Console(stderr=True, soft_wrap=True).print(f"[bold red]npudist bench collective:[/] {exc}")
            raise typer.Exit(1) from None
        result = json.loads(Path(out).read_text())
    rows = summarise(result)
    document = json.dumps({"meta": result["meta"], "rows": rows}, indent=2)
    if out_file is not None:
        try:
            Path(out_file).parent.mkdir(parents=True, exist_ok=True)
            Path(out_file).write_text(document + "\n")
        except OSError as exc:
            Console(stderr=True, soft_wrap=True).print(
                f"[bold red]npudist bench collective:[/] --out {out_file}: {exc}")
            raise typer.Exit(1) from None
    if as_json:
        typer.echo(document)
        return
    if not streaming:
        console.print(table(result["meta"], rows))
    typer.echo(average_busbw_line(rows))
