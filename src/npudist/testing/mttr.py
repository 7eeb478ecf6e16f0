"""One fault on an elastic job in a namespace cluster, timed from the fault to training again.

The job is examples/train_ddp.py under ``npudist launch --nnodes 1:N`` (c10d rendezvous at node 0, 3
restarts) with checkpoints every few steps in the run directory every node sees. The logs are read as they
grow and every line gets the time it appeared, so no clock inside the job is trusted. A trial answers the
MTTR table's columns: seconds to detect (the first hang verdict, a rank's failure or torchrun's restart),
what the verdict named (as nodes), what happened, seconds until a step ran again, and the steps lost (last
step before the fault minus the step resumed from).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from npudist.testing.cluster import Cluster
from npudist.testing.cluster_monitor import RANK_PORT, Fired, Monitor

FAULTS = ("kill_node", "partition", "kill_rank", "stop_rank", "slow_rank", "slow_link")
SLOW_FACTOR = 1.3
"""slow_rank: the last rank's steps take this many times as long from the fault on (train_ddp --slow-factor,
--slow-when: the harness makes the file at the fault)."""
_STEP = re.compile(r"^step=(\d+) .*\bworld=(\d+)")
_RESUMED = re.compile(r"^resumed from step=(\d+)")
_SOURCE = re.compile(r"^resume: source=([\w-]+)")
_DETECT = re.compile(r"npudist hang:|never reached it|CollectiveHangError|ChildFailedError|Connection reset|"
                     r"straggler diagnosis:|^straggler: rank \d+(?: \([^)]*\))? works")
_STRAGGLER = re.compile(r"^straggler: rank (\d+)(?: \([^)]*\))? works .*; cause: (\w+)")


@dataclass
class Trial:
    fault: str
    detect_s: float | None = None
    named: str = ""
    action: str = ""
    recover_s: float | None = None
    steps_lost: int | None = None
    world_after: int | None = None
    layout: str = ""
    recovery: str = "disk"
    """Where a restart may resume from: "disk" (checkpoints only) or "memory K=n" (`--peer-snapshots n`)."""
    source: str = ""
    """The source the restarted job said it resumed from (resume: source=...)."""
    named_right: str | bool | None = None
    """right (the faulted node or rank, nothing else), also names others, or wrong."""
    alerts: list = field(default_factory=list)
    """npudist.testing.cluster_monitor.Fired: each alert first seen firing after the fault."""
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


def _worker_pid(c: Cluster, node, rank: int) -> int | None:
    """The pid of the training worker of global ``rank`` on ``node`` (torchrun sets RANK in its environment)."""
    import psutil

    for pid in c.pids(node):
        try:
            proc = psutil.Process(pid)
            cmd, env = " ".join(proc.cmdline()), proc.environ()
        except psutil.Error:
            continue
        if "train_ddp.py" in cmd and " launch " not in cmd and env.get("RANK") == str(rank):
            return pid
    return None


SLOW_LINK_ALERT = "NpudistSlowNodeLink"


def _alerted_rank(c: Cluster, fired: Fired, nproc: int) -> int | None:
    """The global rank behind an alert on a rank target (``NODE_ADDRESS:RANK_PORT+local_rank``)."""
    address, _, port = fired.where.rpartition(":")
    node = next((n for n in c.nodes if n.address == address), None)
    if node is None or not port.isdigit() or not 0 <= int(port) - RANK_PORT < nproc:
        return None
    return node.index * nproc + int(port) - RANK_PORT


def _survivors_reports(run: Path, victim_ranks: range) -> list[Path]:
    """Verdicts of the ranks outside the faulted node (a partitioned node writes its own to the shared dir):
    each rank's report (hang-rankN.json, what its CollectiveHangError says), then rank 0's reader verdicts
    (hang-attempt*.json), then straggler diagnoses."""
    victims = {f"hang-rank{v}" for v in victim_ranks}
    ranks = sorted(r for r in run.glob("hang-rank*.json") if r.stem not in victims)
    return ranks + sorted(run.glob("hang-attempt*.json")) + sorted(run.glob("straggler-step*.json"))


def _blamed(report: Path) -> tuple[list[int], str]:
    """The ranks a verdict names, and the straggler cause when it is a straggler diagnosis."""
    doc = json.loads(report.read_text())
    if report.name.startswith("straggler"):
        return [doc["straggler_rank"]], f", cause {doc.get('cause')}"
    if report.name.startswith("hang-attempt"):  # rank 0's verdict: the culprits, not the live ranks held back
        return list(doc.get("culprits") or doc.get("not_reached") or []), ""
    return list(doc.get("not_reached") or []), ""


def run_trial(fault: str, script: str, *, nodes: int = 2, nproc: int = 2, warm_steps: int = 10,
              observe_s: float = 120.0, env: dict[str, str] | None = None, keep: str | None = None,
              prometheus: bool = True, subnet: str | None = None, peer_snapshots: int = 0,
              checkpoint_every: int = 5) -> Trial:
    """Start the job, apply ``fault`` to the last node (its last rank for stop_rank/slow_rank) after
    ``warm_steps`` steps, watch node 0 for ``observe_s``; with ``prometheus`` a real Prometheus scrapes every
    node (npudist.testing.cluster_monitor) and the whole window is watched for alerts, else the trial ends at
    the first step after the restart. ``peer_snapshots`` K > 0 adds ``--peer-snapshots K`` with each node's
    holder on its own address, so a restart may resume from another node's memory. ``checkpoint_every``: steps
    between the job's disk checkpoints."""
    if fault not in FAULTS:
        raise ValueError(f"fault {fault!r}: choose one of {', '.join(FAULTS)}")
    run = Path(keep or tempfile.mkdtemp(prefix="npudist-mttr-"))
    env = dict(os.environ if env is None else env)
    if peer_snapshots:  # one secret for every node's launch, as a scheduler gives it (checkpoint/peer_auth.py)
        env.setdefault("NPUDIST_PEER_SECRET", secrets.token_hex(32))
    trial = Trial(fault, layout=f"{nodes}x{nproc}",
                  recovery=f"memory K={peer_snapshots}" if peer_snapshots else "disk")
    last = nodes * nproc - 1
    # 48 sequences divide over every world an elastic 4-node job can shrink to (4, 3, 2, 1 ranks).
    job = [script, "--global-batch-size", "48", "--steps", "100000", "--log-every", "1", "--run-dir", str(run),
           "--checkpoint-every", str(checkpoint_every),
           "--sync-checkpoints", "--exchange-every", "5", "--straggler-diagnosis", "3"]
    if fault == "slow_rank":
        job += ["--slow-rank", str(last), "--slow-factor", str(SLOW_FACTOR), "--slow-when", str(run / "slow-now")]
    with contextlib.ExitStack() as stack:
        c = stack.enter_context(Cluster(nodes, subnet=subnet))
        mon = stack.enter_context(Monitor(c, run)) if prometheus else None
        victim = c.nodes[-1]
        logs = [_Log(run / f"{n.hostname}.log") for n in c.nodes]
        for n in c.nodes:
            # What a user types: each node's holder finds its own address (launch.multinode.peer_holder_bind).
            extra = ["--peer-snapshots", str(peer_snapshots)] if peer_snapshots else []
            c.launch(n, job if mon else [*job, "--no-telemetry"], nproc=nproc, elastic=True,
                     env=mon.env(n, env) if mon else env,
                     launch_args=[*(mon.launch_args(n) if mon else ()), *extra], log=run / f"{n.hostname}.log")
        deadline = time.monotonic() + 300
        # Warm: the steps ran and, when watched, Prometheus scrapes every node's exporter and every rank.
        while logs[0].last_step() < warm_steps or (mon and sum(mon.up().values()) < nodes * (nproc + 1)):
            if time.monotonic() > deadline:
                trial.notes.append(f"never reached the warm-up steps; logs in {run}")
                return trial
            time.sleep(0.2)
            logs[0].poll()
        before = logs[0].last_step()
        victim_ranks = range(victim.index * nproc, (victim.index + 1) * nproc)
        if mon:
            mon.mark()
        start = time.monotonic()
        if fault == "kill_node":
            c.kill_node(victim)
        elif fault == "partition":
            c.partition(victim)
        elif fault == "slow_link":
            c.slow(victim, "1mbit")
        elif fault == "slow_rank":
            (run / "slow-now").touch()  # the rank is slow from its next step on
        elif fault in ("stop_rank", "kill_rank"):
            pid = _worker_pid(c, victim, last)
            if pid is None:
                trial.notes.append("no worker found to signal")
                return trial
            os.kill(pid, signal.SIGSTOP if fault == "stop_rank" else signal.SIGKILL)
        mark = len(logs[0].lines)
        while time.monotonic() - start < observe_s:
            time.sleep(0.5)
            logs[0].poll()
            if mon:
                mon.poll()
            new = logs[0].lines[mark:]
            if trial.detect_s is None:
                hit = next((t for t, ln in new if _DETECT.search(ln)), None)
                if hit is not None or _survivors_reports(run, victim_ranks):
                    trial.detect_s = round((hit or time.monotonic()) - start, 1)
            resumed = [(t, int(m[1])) for t, ln in new if (m := _RESUMED.match(ln))]
            if resumed and trial.recover_s is None:
                after = [(t, int(m[2])) for t, ln in new if t >= resumed[-1][0] and (m := _STEP.match(ln))]
                if after:
                    trial.recover_s = round(after[0][0] - start, 1)
                    reached = max((int(m[1]) for t, ln in logs[0].lines if t < resumed[-1][0]
                                   and (m := _STEP.match(ln))), default=before)
                    # A step's console line is printed when the next step begins (telemetry/job/loop.py), so the
                    # newest finished step, the one a peer snapshot holds, can be one past the last line seen.
                    lost = reached - resumed[-1][1]
                    trial.steps_lost = 0 if lost == -1 else lost
                    trial.world_after = after[0][1]
                    said = [m[1] for t, ln in new if t >= resumed[-1][0] and (m := _SOURCE.match(ln))]
                    trial.source = said[0] if said else "disk"
                    trial.action = (f"torchrun restarted the workers; resumed from step {resumed[-1][1]} "
                                    f"({trial.source}) at world {after[0][1]}")
                    if not mon:
                        break
        reports = _survivors_reports(run, victim_ranks)
        flagged = [m for _, ln in logs[0].lines[mark:] if (m := _STRAGGLER.match(ln))]
        slow_link = mon.fired.get(SLOW_LINK_ALERT) if mon else None
        link_rank = _alerted_rank(c, slow_link, nproc) if slow_link else None
        if reports or flagged or link_rank is not None:
            # The job's own first word on it: a verdict file, else the straggler line rank 0 logs, else
            # the slow-link alert (a slow link makes no straggler: every rank's steps slow alike).
            if reports or flagged:
                ranks, cause = _blamed(reports[0]) if reports else ([int(flagged[0][1])], f", cause {flagged[0][2]}")
            else:
                assert slow_link is not None and link_rank is not None
                ranks, cause = [link_rank], f", alert {SLOW_LINK_ALERT}"
                if trial.detect_s is None:
                    trial.detect_s = slow_link.after_s
            trial.named = c.describe(ranks, nproc) + cause
            culprit = set(victim_ranks if fault in ("kill_node", "partition", "slow_link") else [last])
            trial.named_right = "right" if set(ranks) == culprit else "also names others" \
                if culprit <= set(ranks) else "right (a rank of it)" \
                if fault == "slow_link" and set(ranks) <= culprit else "wrong"
            reader = [_blamed(r)[0] for r in reports if r.name.startswith("hang-attempt")]
            if reader and sorted(reader[0]) != sorted(ranks):
                trial.notes.append(f"rank 0's reader verdict named {c.describe(reader[0], nproc)}")
        if mon:
            trial.alerts = sorted(mon.fired.values(), key=lambda f: f.after_s)
        if not trial.action:
            rate = [ln for _, ln in logs[0].lines[mark:] if _STEP.match(ln)]
            trial.action = f"no restart in {observe_s:.0f} s ({len(rate)} steps ran after the fault)"
    trial.notes.append(f"logs in {run}")
    return trial


def _right(ok: str | bool | None) -> str:
    return "" if ok is None else f" ({ {True: 'right', False: 'wrong'}.get(ok, ok) })"


def _alert(a: object) -> str:
    if isinstance(a, dict):  # a trial read back from JSON
        return f"{a['name']} ({a['severity']}, {a['after_s']:.0f} s{', ' + a['where'] if a['where'] else ''})"
    return str(a)


def summary(trials: list[Trial]) -> str:
    """One row per (layout, fault, recovery): every trial's value, in trial order, separated by " / "."""
    rows = {}
    for t in trials:
        rows.setdefault((t.layout, t.fault, t.recovery), []).append(t)
    fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    out = ["| layout | fault | recovery from | trials | detect (s) | named | training again after (s) | world after "
           "| steps lost | resumed from | alerts fired (s after the fault) |", "|---" * 11 + "|"]
    for (layout, fault, recovery), ts in rows.items():
        named = sorted({t.named for t in ts if t.named})
        checks = [{True: "right", False: "wrong"}.get(t.named_right, t.named_right) or "nothing" for t in ts]
        alerts: dict[str, list[str]] = {}
        for i, t in enumerate(ts):
            for a in t.alerts:
                name, after = (a["name"], a["after_s"]) if isinstance(a, dict) else (a.name, a.after_s)
                alerts.setdefault(name, ["-"] * len(ts))[i] = f"{after:.0f}"
        out.append(f"| {layout} | {fault} | {recovery} | {len(ts)} | {' / '.join(fmt(t.detect_s) for t in ts)} | "
                   f"{'; '.join(named) or '-'} ({', '.join(checks)}) | {' / '.join(fmt(t.recover_s) for t in ts)} | "
                   f"{' / '.join(fmt(t.world_after) for t in ts)} | {' / '.join(fmt(t.steps_lost) for t in ts)} | "
                   f"{' / '.join(t.source or '-' for t in ts)} | "
                   f"{'; '.join(f'{n} {chr(47).join(v)}' for n, v in alerts.items()) or '-'} |")
    return "\n".join(out)


def table(trials: list[Trial]) -> str:
    head = ("| layout | fault | detect (s) | named | action | training again after (s) | steps lost | alerts fired "
            "(severity, s after the fault) |\n|---|---|---|---|---|---|---|---|")
    fmt = lambda v: "-" if v is None else str(v)  # noqa: E731
    rows = [f"| {t.layout} | {t.fault}, from {t.recovery} | {fmt(t.detect_s)} | {t.named or '-'}"
            f"{_right(t.named_right)} | {t.action} | "
            f"{fmt(t.recover_s)} | {fmt(t.steps_lost)} | {'; '.join(map(_alert, t.alerts)) or '-'} |" for t in trials]
    return "\n".join([head, *rows])


if __name__ == "__main__":  # pragma: no cover
    print(run_trial(sys.argv[1], sys.argv[2]))
