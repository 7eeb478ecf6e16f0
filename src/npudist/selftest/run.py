"""The parent of `npudist test`: start the ranks under `npudist launch`, print each check's verdict as soon as
every rank of this node has ended it, stop the job at the deadline, and sum up.

The ranks run in their own session so a hung collective can be stopped as a group; Ctrl-C here stops them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from npudist.selftest.records import CHECKS, FAIL, SKIP, Verdict, read_records, verdicts

RANK_MODULE = "npudist.selftest.rank"
POLL_S = 0.2
STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 25


@dataclass(frozen=True, kw_only=True)
class SelfTestOptions:
    nproc_per_node: int = 2
    simulate: str | None = None
    """--simulate MODE for the ranks (npu, npu:strict)."""
    accelerator: str | None = None
    """--accelerator NAME (cpu runs the ranks over gloo whatever the host has)."""
    launch_args: tuple[str, ...] = field(default_factory=tuple)
    """torchrun options for several hosts: --nnodes, --node-rank, --master-addr, --master-port."""
    timeout_s: float = 120.0
    """The whole job's deadline; a check still running then is reported as hung."""
    out: Path | None = None
    """Folder for the rank records and the launch log (None: a temporary one, removed when all pass)."""
    checkpoint_dir: Path | None = None
    """Where the checkpoint check saves (several hosts: a folder every node shares)."""
    rank_module: str = RANK_MODULE
    """The module the ranks run; tests name a wrapper that breaks one check on purpose."""


def launch_command(opts: SelfTestOptions, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "npudist", "launch"]
    if opts.simulate:
        cmd += ["--simulate", opts.simulate]
    if opts.accelerator:
        cmd += ["--accelerator", opts.accelerator]
    cmd += ["--nproc-per-node", str(opts.nproc_per_node), *opts.launch_args, "-m", opts.rank_module,
            "--out", str(out), "--timeout", str(max(int(opts.timeout_s), 1))]
    if opts.checkpoint_dir is not None:
        cmd += ["--checkpoint-dir", str(opts.checkpoint_dir)]
    return cmd


def verdict_line(v: Verdict) -> str:
    took = f" ({v.seconds:.2f} s)" if v.seconds else ""
    return f"  {v.status:<7} {v.check:<16} {v.detail}{took}"


def summary_line(found: list[Verdict], nproc: int, seconds: float, returncode: int | None = 0) -> str:
    bad = [v.check for v in found if not v.ok]
    if not bad and len(found) == len(CHECKS):
        if returncode:
            return (f"npudist test: every check passed, but the launch exited with {returncode} after them "
                    "(the launch output above says why)")
        skipped = [v.check for v in found if v.status == SKIP]
        if skipped:
            return (f"npudist test: {len(CHECKS) - len(skipped)} checks passed and {len(skipped)} skipped "
                    f"({', '.join(skipped)}: why is above) on {nproc} ranks per node in {seconds:.1f} s")
        return f"npudist test: all {len(CHECKS)} checks passed on {nproc} ranks per node in {seconds:.1f} s"
    failed = [v.check for v in found if v.status == FAIL]
    return (f"npudist test: {len(CHECKS) - len(bad)} of {len(CHECKS)} checks passed in {seconds:.1f} s; "
            f"failed: {', '.join(failed) or 'none'}"
            + (f"; not run: {', '.join(c for c in bad if c not in failed)}" if len(bad) > len(failed) else ""))


def _stop(proc: subprocess.Popen) -> None:
    """The launcher and its ranks, as a group: SIGTERM (torchrun passes it on), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def run_selftest(opts: SelfTestOptions, say: Callable[[str], None] = print) -> int:
    """Run the checks; 0 when every one passed (or was skipped with a reason), 1 otherwise."""
    own = opts.out is None
    out = Path(tempfile.mkdtemp(prefix="npudist-test-")) if own else opts.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.jsonl"):  # an earlier run's records would read as this one's
        stale.unlink()
    log_path = out / "launch.log"
    began = time.monotonic()
    how = " ".join(x for x in (f"--simulate {opts.simulate}" if opts.simulate else "",
                               f"--accelerator {opts.accelerator}" if opts.accelerator else "") if x)
    say(f"npudist test: {opts.nproc_per_node} ranks per node under npudist launch{f' {how}' if how else ''} "
        f"(deadline {opts.timeout_s:.0f} s)")
    shown: list[Verdict] = []
    with log_path.open("w") as log:
        proc = subprocess.Popen(launch_command(opts, out), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while True:
                finished = proc.poll() is not None
                late = time.monotonic() - began > opts.timeout_s
                if late and not finished:
                    say(f"npudist test: the deadline ({opts.timeout_s:.0f} s) passed; stopping the ranks")
                    _stop(proc)
                    finished = True
                found = verdicts(read_records(out), expected=opts.nproc_per_node, finished=finished)
                for v in found[len(shown):]:
                    say(verdict_line(v))
                shown = found
                if finished:
                    break
                time.sleep(POLL_S)
        except BaseException:
            _stop(proc)
            raise
    ok = len(shown) == len(CHECKS) and all(v.ok for v in shown) and proc.returncode == 0
    if not ok:
        tail = _tail(log_path, LOG_TAIL_LINES)
        if tail:
            say(f"npudist test: the last lines of the launch output ({log_path}):")
            for line in tail:
                say(f"    {line}")
    say(summary_line(shown, opts.nproc_per_node, time.monotonic() - began, proc.returncode))
    if ok and own:
        shutil.rmtree(out, ignore_errors=True)
    elif not ok:
        say(f"npudist test: the ranks' records and the launch log are in {out}")
    return 0 if ok else 1
