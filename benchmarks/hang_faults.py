"""Injected faults on real gloo ranks of examples/train_ddp.py: is the right rank named, and how fast?

    PYTHONPATH=src python benchmarks/hang_faults.py --trials 5 --nproc 4 --port 29720

Each trial launches the example with ``--fault KIND --fault-rank R --fault-step S`` and the collective
timeout left at its default (600 s), waits for a verdict and kills the job's process group. The verdict
is npudist's (``RUN_DIR/hang-attempt0.json``, written by rank 0) or, for a rank that dies outright,
torchrun's own failure line (its agent tears the job down within its monitor interval, before any
collective notices). A verdict is correct when it names exactly rank R and, for npudist's, the
culprit's last collective as the faulty rank printed it just before the fault (``FAULT ... last=``): its
record, or for a stopped rank (whose record lags its stop by up to a second) the call the verdict says it
never reached is the next one.

``--fr`` runs the same faults with torch's flight recorder (TORCH_FR_BUFFER_SIZE, a dump per rank on
a collective timeout of ``--fr-timeout`` s, then ``python -m torch.distributed.flight_recorder.fr_trace``).
Prints one table row per fault kind; ``--json`` writes every trial.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_ddp.py"
KINDS = ("sigstop", "sleep", "stall", "skip", "mismatch", "sigkill")
# stall sleeps before the forward of step 2: "right after step 1", where the others wait inside DDP's
# bucket rebuild. The other faults strike mid-run.
STEP = {"stall": 2}
DEFAULT_STEP = 12
FAULT = re.compile(r"FAULT (\w+) rank=(\d+) step=(\d+) time=([\d.]+) last=(\S+) #(\S+) (\S+)")
TORCHRUN_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


@dataclass
class Trial:
    kind: str
    rank: int
    tool: str
    named: list[int]
    correct: bool
    last_ok: bool | None
    """The culprit's last collective named: its record (a live, closed or mismatched rank), or, for a
    stopped rank whose record lags, the call the verdict says it never reached is the one after it."""
    seconds: float | None
    """Fault to verdict (None: no verdict before the trial's deadline)."""
    detail: str


def _launch(args: argparse.Namespace, kind: str, rank: int, port: int, run_dir: Path, env: dict[str, str],
            log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", str(args.nproc), "--master-port",
           str(port), str(EXAMPLE), "--steps", "100000", "--no-telemetry", "--log-every", "100000",
           "--fault", kind, "--fault-rank", str(rank), "--fault-step", str(STEP.get(kind, DEFAULT_STEP))]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _expected_last(kind: str, m: re.Match) -> tuple[str, int]:
    op, seq = m.group(5), int(m.group(6)) if m.group(6).isdigit() else 0
    return ("all_reduce", seq + 1) if kind == "mismatch" else (op, seq)


def npudist_trial(args: argparse.Namespace, kind: str, rank: int, port: int) -> Trial:
    with tempfile.TemporaryDirectory(prefix="hang-") as tmp:
        run_dir = Path(tmp)
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "NPUDIST_RUN_DIR": str(run_dir)}
        env.pop("NPUDIST_TIMEOUT", None)
        out = run_dir / "out.txt"
        with out.open("w") as log:
            proc = _launch(args, kind, rank, port, run_dir, env, log)
            deadline, fault, seen = time.monotonic() + args.deadline, None, None
            try:
                while time.monotonic() < deadline:
                    text = out.read_text(errors="replace")
                    fault = fault or FAULT.search(text)
                    report = run_dir / "hang-attempt0.json"
                    if report.exists():
                        time.sleep(0.5)
                        seen = ("npudist", json.loads(report.read_text()), time.time())
                        break
                    failed = TORCHRUN_FAILED.search(text)
                    if failed:
                        seen = ("torchrun", failed, time.time())
                        break
                    if proc.poll() is not None:
                        break
                    time.sleep(0.2)
            finally:
                _stop(proc)
        text = out.read_text(errors="replace")
        fault = fault or FAULT.search(text)
    if fault is None:
        return Trial(kind, rank, "npudist", [], False, None, None, "the fault never struck: " + text[-500:])
    t0 = float(fault.group(4))
    if seen is None:
        return Trial(kind, rank, "npudist", [], False, None, None, "no verdict")
    if seen[0] == "torchrun":
        named = [int(seen[1].group(2))]
        return Trial(kind, rank, "torchrun", named, named == [rank], None, seen[2] - t0,
                     f"torchrun: exitcode {seen[1].group(1)} local_rank {named[0]}")
    verdict = seen[1]
    named = list(verdict.get("culprits", []))
    record = (verdict.get("ranks") or {}).get(str(rank)) or {}
    op, seq = _expected_last(kind, fault)
    if kind == "sigstop":
        last_ok = verdict.get("seq") == seq + 1 and verdict.get("kind") == "behind"
    else:
        last_ok = (record.get("op"), record.get("seq")) == (op, seq)
    return Trial(kind, rank, "npudist", named, named == [rank], last_ok, float(verdict["time"]) - t0,
                 verdict.get("line", "")[:400])


def fr_trial(args: argparse.Namespace, kind: str, rank: int, port: int) -> Trial:
    """The same fault under torch's flight recorder: dumps on the collective timeout, then fr_trace."""
    with tempfile.TemporaryDirectory(prefix="fr-") as tmp:
        run_dir = Path(tmp)
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "NPUDIST_HANG_ACTION": "off",
               "NPUDIST_TIMEOUT": str(args.fr_timeout), "TORCH_FR_BUFFER_SIZE": "2000",
               "TORCH_FR_DUMP_TEMP_FILE": str(run_dir / "fr_")}
        out = run_dir / "out.txt"
        with out.open("w") as log:
            proc = _launch(args, kind, rank, port, run_dir, env, log)
            try:
                proc.wait(timeout=args.fr_timeout + 90)
            except subprocess.TimeoutExpired:
                pass
            finally:
                _stop(proc)
        text = out.read_text(errors="replace")
        fault = FAULT.search(text)
        dumps = sorted(run_dir.glob("fr_*"))
        if fault is None or not dumps:
            return Trial(kind, rank, "flight recorder", [], False, None, None,
                         f"{len(dumps)} dumps: no rank failed in Python before the launcher stopped the job"
                         if fault else "no fault")
        analysis = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(run_dir),
                                   "-p", "fr_", "--allow-incomplete-ranks"], capture_output=True, text=True,
                                  timeout=120)
        (Path(args.fr_keep) / f"{kind}-{rank}.txt").write_text(analysis.stdout + analysis.stderr) \
            if args.fr_keep else None
        found = sorted({int(r) for r in re.findall(r"[Mm]issing ranks?.*?(\d+)", analysis.stdout)})
        seconds = max(p.stat().st_mtime for p in dumps) - float(fault.group(4))
        return Trial(kind, rank, "flight recorder", found, found == [rank], None, seconds,
                     (analysis.stdout + analysis.stderr)[-400:])


def summarise(trials: list[Trial]) -> list[str]:
    rows = ["| fault | tool | culprit correct | last collective correct | seconds to verdict (median, max) |",
            "|---|---|---|---|---|"]
    for kind in KINDS:
        for tool in ("npudist", "torchrun", "flight recorder"):
            ts = [t for t in trials if t.kind == kind and t.tool == tool]
            if not ts:
                continue
            secs = sorted(t.seconds for t in ts if t.seconds is not None)
            lasts = [t.last_ok for t in ts if t.last_ok is not None]
            med = f"{secs[len(secs) // 2]:.1f}, {secs[-1]:.1f}" if secs else "none"
            last = f"{sum(lasts)}/{len(lasts)}" if lasts else "n/a"
            rows.append(f"| {kind} | {tool} | {sum(t.correct for t in ts)}/{len(ts)} | {last} | {med} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--port", type=int, default=29720, help="first master port; each trial takes the next")
    p.add_argument("--faults", default=",".join(KINDS))
    p.add_argument("--deadline", type=float, default=120.0, help="seconds a trial may take")
    p.add_argument("--fr", action="store_true", help="also run torch's flight recorder on the same faults")
    p.add_argument("--fr-timeout", type=float, default=60.0, help="collective timeout of the --fr runs")
    p.add_argument("--fr-keep", default=None, help="write fr_trace's output per trial into this directory")
    p.add_argument("--fr-only", action="store_true", help="run only the flight recorder trials")
    p.add_argument("--json", default=None, help="write every trial here")
    args = p.parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or args.trials < 1 or args.nproc < 2:
        p.error(f"faults from {', '.join(KINDS)}; --trials >= 1; --nproc >= 2 (unknown: {unknown})")
    trials: list[Trial] = []
    port = args.port
    for kind in kinds:
        for i in range(args.trials):
            rank = 1 + i % (args.nproc - 1)  # never rank 0: it is the reader
            if not args.fr_only:
                t = npudist_trial(args, kind, rank, port)
                port += 1
                print(json.dumps(asdict(t)), flush=True)
                trials.append(t)
            if args.fr or args.fr_only:
                t = fr_trial(args, kind, rank, port)
                port += 1
                print(json.dumps(asdict(t)), flush=True)
                trials.append(t)
    print("\n".join(summarise(trials)))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(t) for t in trials], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
