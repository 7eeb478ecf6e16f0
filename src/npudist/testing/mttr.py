"""One fault on an elastic job in a namespace cluster, timed from the fault to training again.

The job is examples/train_ddp.py under ``npudist launch --nnodes 1:N`` (c10d rendezvous at node 0, 3
restarts) with checkpoints every few steps in the run directory every node sees. The logs are read as they
grow and every line gets the time it appeared, so no clock inside the job is trusted. A trial answers the
MTTR table's columns: seconds to detect (the first hang verdict, a rank's failure or torchrun's restart),
what the verdict named (as nodes), what happened, seconds until a step ran again, and the steps lost (last
step before the fault minus the step resumed from).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from npudist.testing.cluster import Cluster

FAULTS = ("kill_node", "partition", "stop_rank", "slow_link")
_STEP = re.compile(r"^step=(\d+) .*\bworld=(\d+)")
_RESUMED = re.compile(r"^resumed from step=(\d+)")
_DETECT = re.compile(r"npudist hang:|never reached it|CollectiveHangError|ChildFailedError|Connection reset")


@dataclass
class Trial:
    fault: str
    detect_s: float | None = None
    named: str = ""
    action: str = ""
    recover_s: float | None = None
    steps_lost: int | None = None
    world_after: int | None = None
    notes: list[str] = field(default_factory=list)


class _Log:
    """A growing log file, each complete line stamped with the time it was first seen."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.lines = path, 0, []

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
        cut = data.rfind(b"\n") + 1
        self.pos += cut
        now = time.monotonic()
        self.lines += [(now, ln) for ln in data[:cut].decode(errors="replace").splitlines()]

    def last_step(self) -> int:
        return max((int(m[1]) for _, ln in self.lines if (m := _STEP.match(ln))), default=0)


def _worker_pid(c: Cluster, node) -> int | None:
    import psutil

    for pid in c.pids(node):
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        if "train_ddp.py" in cmd and "npudist launch" not in cmd and " launch " not in cmd:
            return pid
    return None


def _survivors_reports(run: Path, victim_ranks: range) -> list[Path]:
    """Verdicts of the ranks outside the faulted node (a partitioned node writes its own to the shared dir)."""
    return sorted(r for r in run.glob("hang-*.json") if r.stem not in {f"hang-rank{v}" for v in victim_ranks})


def run_trial(fault: str, script: str, *, nodes: int = 2, nproc: int = 2, warm_steps: int = 10,
              observe_s: float = 120.0, env: dict[str, str] | None = None, keep: str | None = None) -> Trial:
    """Start the job, apply ``fault`` to the last node after ``warm_steps`` steps, watch node 0 for ``observe_s``."""
    if fault not in FAULTS:
        raise ValueError(f"fault {fault!r}: choose one of {', '.join(FAULTS)}")
    run = Path(keep or tempfile.mkdtemp(prefix="npudist-mttr-"))
    env = dict(os.environ if env is None else env)
    trial = Trial(fault)
    with Cluster(nodes) as c:
        victim = c.nodes[-1]
        logs = [_Log(run / f"{n.hostname}.log") for n in c.nodes]
        for n in c.nodes:
            c.launch(n, [script, "--steps", "100000", "--log-every", "1", "--no-telemetry", "--run-dir", str(run),
                         "--checkpoint-every", "5", "--sync-checkpoints"], nproc=nproc, elastic=True, env=env,
                     log=run / f"{n.hostname}.log")
        deadline = time.monotonic() + 240
        while logs[0].last_step() < warm_steps:
            if time.monotonic() > deadline:
                trial.notes.append("never reached the warm-up steps")
                return trial
            time.sleep(0.2)
            logs[0].poll()
        before = logs[0].last_step()
        victim_ranks = range(victim.index * nproc, (victim.index + 1) * nproc)
        start = time.monotonic()
        if fault == "kill_node":
            c.kill_node(victim)
        elif fault == "partition":
            c.partition(victim)
        elif fault == "slow_link":
            c.slow(victim, "1mbit")
        else:
            pid = _worker_pid(c, victim)
            if pid is None:
                trial.notes.append("no worker found to stop")
                return trial
            os.kill(pid, signal.SIGSTOP)
        mark = len(logs[0].lines)
        while time.monotonic() - start < observe_s:
            time.sleep(0.2)
            logs[0].poll()
            new = logs[0].lines[mark:]
            if trial.detect_s is None:
                hit = next((t for t, ln in new if _DETECT.search(ln)), None)
                if hit is not None or _survivors_reports(run, victim_ranks):
                    trial.detect_s = round((hit or time.monotonic()) - start, 1)
            resumed = [(t, int(m[1])) for t, ln in new if (m := _RESUMED.match(ln))]
            if resumed:
                after = [(t, int(m[2])) for t, ln in new if t >= resumed[-1][0] and (m := _STEP.match(ln))]
                if after:
                    trial.recover_s = round(after[0][0] - start, 1)
                    trial.steps_lost = before - resumed[-1][1]
                    trial.world_after = after[0][1]
                    trial.action = (f"torchrun restarted the workers; resumed from step {resumed[-1][1]} at "
                                    f"world {after[0][1]}")
                    break
        reports = _survivors_reports(run, victim_ranks)
        if reports:
            verdict = json.loads(reports[0].read_text())
            trial.named = c.describe(verdict.get("culprits") or verdict.get("not_reached") or [], nproc)
        if not trial.action:
            rate = [ln for _, ln in logs[0].lines[mark:] if _STEP.match(ln)]
            trial.action = f"no restart in {observe_s:.0f} s ({len(rate)} steps ran after the fault)"
    trial.notes.append(f"logs in {run}")
    return trial


def table(trials: list[Trial]) -> str:
    head = ("| fault | detect (s) | named | action | training again after (s) | steps lost |\n"
            "|---|---|---|---|---|---|")
    fmt = lambda v: "-" if v is None else str(v)  # noqa: E731
    rows = [f"| {t.fault} | {fmt(t.detect_s)} | {t.named or '-'} | {t.action} | {fmt(t.recover_s)} | "
            f"{fmt(t.steps_lost)} |" for t in trials]
    return "\n".join([head, *rows])


if __name__ == "__main__":  # pragma: no cover
    print(run_trial(sys.argv[1], sys.argv[2]))
