"""What npudist costs a training step, in instructions on the training thread (callgrind), not seconds.

    python benchmarks/cpu_cost.py                 # every variant, a table and the budgets (about 10 minutes here)
    python benchmarks/cpu_cost.py --only ddp,npudist_ddp
    python benchmarks/cpu_cost.py --dry-run       # no valgrind: each variant runs a few steps (CI's check)

Instruction counts are deterministic where wall-clock ratios on a shared 2-core machine are not (an A/A
pair of timed runs spreads 5-15 %). Each variant runs in its own process, one rank in a gloo world of one,
OMP_NUM_THREADS=1, PYTHONHASHSEED=0, under ``valgrind --tool=callgrind --instr-atstart=no
--separate-threads=yes``. A tiny C helper (built here against valgrind's callgrind.h) switches
instrumentation on after the warm-up (buckets built and rebuilt, caches warm) and dumps the counts after
every measured step, so each step has its own count: the median is the ordinary step, and the steps with
periodic work (the timer's exchange, operator sampling, a checkpoint) are reported on their own.
Background threads (gloo's workers, the metrics server, the checkpoint writer) are left out on purpose:
what matters to a launch-bound accelerator job is the CPU work on the thread that launches kernels.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

_HELPER_C = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""
PERIOD = 20
"""Steps between the timer's exchanges and between checkpoints (the example's defaults)."""
OP_EVERY = 25
"""Operator sampling in the measured runs: every 25 steps puts a sampled step in a short window; what one
sampled step costs does not depend on the period, and the budgets amortise it over the default 100."""
OP_EVERY_DEFAULT = 100


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    baseline: str
    """The variant this one is compared with (its ratio and added instructions)."""
    model: str = "mlp"          # mlp: 8 x Linear(256, 256); lm: the example's TinyLM
    wrap: str = "npudist"       # plain: DistributedDataParallel; minhook: plus the least Python hook
    bucket_cap_mb: float = 1.0
    timer: bool = False
    serve: bool = False
    checkpoint: bool = False
    world: int = 1
    """2: a second rank runs beside the measured one, without valgrind (the scaling by 1/world is real)."""
    sentinel: str = "loss"
    """NPUDIST_SENTINEL: the NaN sentinel is on (loss) in every npudist variant unless a variant says off/scan."""

    @property
    def periodic(self) -> bool:
        return self.timer or self.serve or self.checkpoint


VARIANTS = (
    Variant("ddp", "plain DistributedDataParallel", "ddp", wrap="plain"),
    Variant("ddp_minhook", "plain DDP + the least a Python hook can do", "ddp", wrap="minhook"),
    Variant("npudist_ddp", "npudist.ddp(model)", "ddp"),
    Variant("npudist_ddp_nosentinel", "npudist.ddp(model), NaN sentinel off", "ddp", sentinel="off"),
    Variant("npudist_ddp_scan", "npudist.ddp(model), NaN sentinel scanning every bucket", "npudist_ddp",
            sentinel="scan"),
    Variant("ddp_w2", "plain DDP, world of 2 (rank 0 counted)", "ddp_w2", wrap="plain", world=2),
    Variant("npudist_ddp_w2", "npudist.ddp(model), world of 2 (rank 0 counted)", "ddp_w2", world=2),
    Variant("timer", "npudist.ddp + step timer (exchange every 20, operator sampling)", "npudist_ddp", timer=True),
    Variant("served", "... + rank metrics served", "timer", timer=True, serve=True),
    Variant("checkpoint", "... + async checkpoint every 20 steps", "served", timer=True, serve=True,
            checkpoint=True),
    Variant("lm_ddp_small", "example's TinyLM, plain DDP, 0.05 MB buckets", "lm_ddp_small", model="lm",
            wrap="plain", bucket_cap_mb=0.05),
    Variant("lm_npudist_small", "example's TinyLM, npudist.ddp, 0.05 MB buckets", "lm_ddp_small", model="lm",
            bucket_cap_mb=0.05),
    Variant("lm_npudist_small_scan", "example's TinyLM, npudist.ddp, 0.05 MB buckets, sentinel scan",
            "lm_npudist_small", model="lm", bucket_cap_mb=0.05, sentinel="scan"),
    Variant("lm_ddp_25mb", "example's TinyLM, plain DDP, 25 MB buckets", "lm_ddp_25mb", model="lm",
            wrap="plain", bucket_cap_mb=25),
    Variant("lm_npudist_25mb", "example's TinyLM, npudist.ddp, 25 MB buckets", "lm_ddp_25mb", model="lm",
            bucket_cap_mb=25),
)
BY_NAME = {v.name: v for v in VARIANTS}


# ---- the child: one variant, one rank -----------------------------------------------------------------
def _helper(build_dir: Path) -> ctypes.CDLL | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, lib = build_dir / "cgctl.c", build_dir / f"libcgctl.{os.getpid()}.so"
    src.write_text(_HELPER_C)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    return ctypes.CDLL(str(lib))


def _model(v: Variant):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    if v.model == "mlp":
        layers = []
        for _ in range(8):
            layers += [nn.Linear(256, 256), nn.ReLU()]
        return nn.Sequential(*layers), (torch.randn(32, 256), torch.randn(32, 256))
    sys.path.insert(0, str(REPO / "examples"))
    import train_ddp as ex

    model = ex.TinyLM(64, 64, 2, 32)
    # One rank's share of the example's global batch of 32 on 4 ranks, made once (not what is measured).
    return model, (ex.global_batch(0, 1, 8, 32, 64), None)


def _no_buffer_sync(ddp_class: type) -> dict[str, bool]:
    import inspect

    names = inspect.signature(ddp_class).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in names else {"broadcast_buffers": False}


def _least_hook_state(group):
    import torch.distributed as dist

    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    return group, opts


def _first(fut):
    return fut.value()[0]


def _least_hook(state, bucket):  # DDP checks these annotations: they must stay empty
    """The floor of any Python comm hook: issue the bucket's all_reduce on the group itself and hand DDP a
    Python future (DDP takes nothing else from a Python hook). No division: a world of one."""
    group, opts = state
    return group.allreduce([bucket.buffer()], opts).get_future().then(_first)


def child(v: Variant, steps: int, warmup: int, build_dir: Path, run_dir: Path, counted: bool) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    import npudist
    import npudist.telemetry
    from npudist import checkpoint

    cg = _helper(build_dir) if counted else None
    if v.serve:
        os.environ["NPUDIST_METRICS_PORT"] = "0"  # any free port, on 127.0.0.1
    os.environ["NPUDIST_SENTINEL"] = v.sentinel
    ctx = npudist.init()
    model, (x, y) = _model(v)
    # No per-step buffer broadcast (the example's setting: its only buffer is a constant mask).
    kwargs = {"bucket_cap_mb": v.bucket_cap_mb, **_no_buffer_sync(DistributedDataParallel)}
    if v.wrap == "npudist":
        ddp = npudist.ddp(model, **kwargs)
    else:
        ddp = DistributedDataParallel(model, **kwargs)
        if v.wrap == "minhook":
            ddp.register_comm_hook(_least_hook_state(ddp.process_group), _least_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    telemetry = npudist.telemetry.serve_rank_metrics(ctx, device_source=None) if v.periodic else None
    timer = telemetry.step_timer(exchange_every=PERIOD, op_every=OP_EVERY) if v.timer else None
    if timer is not None:
        npudist.telemetry.watch_ddp(ddp, timer)
    end_step = timer.step if timer is not None else (lambda: None)

    def step(i: int) -> None:
        if y is None:  # language model: next-token loss
            out = ddp(x[:, :-1])
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)), x[:, 1:].reshape(-1))
        else:
            loss = F.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        end_step()
        if v.checkpoint and i % PERIOD == 0:
            checkpoint.save({"model": model.state_dict(), "step": i}, str(run_dir), i, keep=1, async_save=True)

    end_step()
    for i in range(1, warmup + 1):
        step(i)
    if cg is not None:
        cg.cg_start()
    for i in range(warmup + 1, warmup + steps + 1):
        step(i)
        if cg is not None:
            cg.cg_dump(f"step{i}".encode())
    if cg is not None:
        cg.cg_stop()
    info = ddp._get_ddp_logging_data()
    sizes = str(info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes") or "")
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if telemetry is not None:
        telemetry.close()
    npudist.shutdown()
    print("CPU_COST " + json.dumps({"buckets": len([s for s in sizes.split(",") if s.strip()]),
                                    "state_bytes": state_bytes}), flush=True)


# ---- the parent: run each variant under callgrind, read the main thread's counts ----------------------
_PART = re.compile(r"^desc: Trigger: Client Request: step(\d+)", re.M)
_TOTAL = re.compile(r"^(?:summary|totals): (\d+)", re.M)


def main_thread_steps(out_dir: Path) -> dict[int, int]:
    """Step -> instructions of the main thread. Callgrind names a dump's files ``<out>.<dump>-<thread>``;
    thread 01 is the main thread, and a dump's header names the client request that made it."""
    counts: dict[int, int] = {}
    for path in out_dir.glob("cg.out.*-01"):
        head = path.read_text(errors="replace")[:4096]
        part, total = _PART.search(head), _TOTAL.search(head)
        if part and total:
            counts[int(part.group(1))] = int(total.group(1))
    return dict(sorted(counts.items()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(world: int, port: int, rank: int = 0) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPUDIST_", "OMPI_", "SLURM_"))}
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "PYTHONHASHSEED": "0", "NPUDIST_ACCELERATOR": "cpu",
                # a rank under valgrind is tens of times slower than its peer: not a hang
                "NPUDIST_HANG_TIMEOUT": "3600",
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)})
    return env


@dataclass(frozen=True)
class Result:
    variant: str
    steps: dict[int, int]
    """Measured step -> main-thread instructions (empty in a dry run)."""
    buckets: int
    state_bytes: int

    @property
    def typical(self) -> float:
        """The median step: what every step costs, periodic work aside."""
        return statistics.median(self.steps.values()) if self.steps else 0.0

    def periodic(self, tolerance: float = 0.02) -> dict[int, int]:
        """Steps over the median by more than ``tolerance`` of it -> their excess instructions."""
        med = self.typical
        return {s: n - round(med) for s, n in self.steps.items() if n > med * (1 + tolerance)}


def _schedule(v: Variant, dry_run: bool) -> tuple[int, int]:
    """(warm-up, measured) steps. Periodic variants measure steps P-3 .. P+7: the exchange (and checkpoint)
    at P and the operator-sampled step at OP_EVERY, each beside ordinary steps."""
    if dry_run:
        return (1, OP_EVERY + 1) if v.periodic else (1, 2)
    return (PERIOD - 4, OP_EVERY - PERIOD + 7) if v.periodic else (3, 6)


def run_variant(v: Variant, work: Path, dry_run: bool, timeout: float) -> Result:
    out_dir = work / v.name
    out_dir.mkdir(parents=True, exist_ok=True)
    warmup, steps = _schedule(v, dry_run)
    cmd = [sys.executable, __file__, "--child", v.name, "--steps", str(steps), "--warmup", str(warmup),
           "--build-dir", str(out_dir), "--run-dir", str(out_dir / "run")]
    if not dry_run:
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
               f"--callgrind-out-file={out_dir}/cg.out", *cmd]
    port = _free_port()
    peers = [subprocess.Popen(cmd[cmd.index(sys.executable):], env=_env(v.world, port, rank),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for rank in range(1, v.world)]  # the other ranks: not counted, so not under valgrind
    try:
        r = subprocess.run(cmd, env=_env(v.world, port), capture_output=True, text=True, timeout=timeout,
                           check=False)
    finally:
        for peer in peers:
            try:
                peer.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                peer.kill()
                peer.communicate()
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("CPU_COST ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"{v.name}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    info = json.loads(line.split(" ", 1)[1])
    counts = {} if dry_run else main_thread_steps(out_dir)
    if not dry_run and len(counts) != steps:
        raise RuntimeError(f"{v.name}: expected {steps} step dumps of the main thread in {out_dir}, "
                           f"found {sorted(counts)}")
    return Result(v.name, counts, info["buckets"], info["state_bytes"])


def table(results: list[Result]) -> str:
    by = {r.variant: r for r in results}
    lines = ["| variant | instructions per step (median) | vs | ratio | added per step | added per bucket "
             "| periodic steps (excess over the median) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        v = BY_NAME[r.variant]
        ref = by.get(v.baseline)
        periodic = ", ".join(f"{s}: +{n / 1e6:.2f} M" for s, n in r.periodic().items()) if v.periodic else ""
        if ref is None or ref is r or not ref.typical:
            lines.append(f"| {v.description} | {r.typical / 1e6:.3f} M | | | | | {periodic} |")
            continue
        added = r.typical - ref.typical
        per_bucket = f"{added / r.buckets / 1e3:+.1f} k ({r.buckets})" if r.buckets else ""
        lines.append(f"| {v.description} | {r.typical / 1e6:.3f} M | {v.baseline} | {r.typical / ref.typical:.3f} "
                     f"| {added / 1e3:+.1f} k | {per_bucket} | {periodic} |")
    return "\n".join(lines)


BUDGET_RATIO = 1.005
BUDGET_PER_BUCKET = 10_000
"""npudist.ddp against plain DDP, both under npudist.init() (so the process-group watch counts both's buckets;
its own cost is benchmarks/pg_watch_cost.py's): issue 42's budget."""
BUDGET_TIMER = 0.01
BUDGET_SCAN = 0.01
"""The sentinel's opt-in scan of every bucket: <= 1 % of the example's step (issue 44)."""


def budgets(results: list[Result]) -> list[tuple[str, bool | None, str]]:
    """(budget, met?, the figure) for each budget whose variants were measured."""
    by = {r.variant: r for r in results if r.steps}
    out: list[tuple[str, bool | None, str]] = []
    for name, base in (("npudist_ddp", "ddp"), ("npudist_ddp_w2", "ddp_w2"), ("lm_npudist_small", "lm_ddp_small"),
                       ("lm_npudist_25mb", "lm_ddp_25mb")):
        if name in by and base in by:
            r, b = by[name], by[base]
            ratio, per_bucket = r.typical / b.typical, (r.typical - b.typical) / max(r.buckets, 1)
            out.append((f"{name}: <= {BUDGET_RATIO}x {base}", ratio <= BUDGET_RATIO, f"{ratio:.4f}x"))
            out.append((f"{name}: <= {BUDGET_PER_BUCKET // 1000} k added per bucket",
                        per_bucket <= BUDGET_PER_BUCKET, f"{per_bucket / 1e3:+.1f} k x {r.buckets} buckets"))
    for name, what in (("npudist_ddp", "NaN sentinel (loss check, flag in the last bucket)"),
                       ("npudist_ddp_scan", "NaN sentinel scan mode (every bucket checked)")):
        if {name, "npudist_ddp_nosentinel", "ddp"} <= by.keys():
            added = by[name].typical - by["npudist_ddp_nosentinel"].typical
            out.append((f"{what}: added per step (reported)", None,
                        f"{added / 1e3:+.1f} k = {added / by['ddp'].typical * 100:+.3f} % of plain DDP's step"))
    if {"lm_npudist_small_scan", "lm_npudist_small"} <= by.keys():
        share = by["lm_npudist_small_scan"].typical / by["lm_npudist_small"].typical - 1
        out.append(("NaN sentinel scan on the example's TinyLM: <= 1 % of its step", share <= BUDGET_SCAN,
                    f"{share * 100:+.2f} %"))
    if {"timer", "npudist_ddp", "ddp"} <= by.keys():
        share = (by["timer"].typical - by["npudist_ddp"].typical) / by["ddp"].typical
        out.append(("step timer, off-exchange step: <= 1 % of plain DDP's step", share <= BUDGET_TIMER,
                    f"{share * 100:+.2f} %"))
        timer, base = by["timer"], by["ddp"].typical
        extra = timer.periodic()
        # In the window the exchange falls on step PERIOD and the operator sampling around OP_EVERY.
        exchange = sum(n for st, n in extra.items() if st % PERIOD == 0)
        sampled = sum(n for st, n in extra.items() if st % PERIOD)
        amortised = exchange / PERIOD + sampled / OP_EVERY_DEFAULT
        out.append(("step timer, periodic steps (reported)", None,
                    f"exchange step +{exchange / 1e6:.2f} M, operator-sampled step(s) +{sampled / 1e6:.2f} M; "
                    f"at exchange every {PERIOD} and sampling every {OP_EVERY_DEFAULT}: "
                    f"+{amortised / base * 100:.2f} % of plain DDP's step, amortised"))
    if {"served", "timer"} <= by.keys():
        share = (by["served"].typical - by["timer"].typical) / by["ddp"].typical if "ddp" in by else None
        out.append(("metrics served, idle: ~0 on the training thread (<= 0.2 % of plain DDP's step)",
                    None if share is None else abs(share) <= 0.002,
                    "" if share is None else f"{share * 100:+.3f} %"))
    if {"checkpoint", "served"} <= by.keys():
        ck, sv = by["checkpoint"], by["served"]
        extra = [ck.steps[s] - sv.steps.get(s, ck.typical) for s in ck.steps if s % PERIOD == 0]
        mib = ck.state_bytes / (1 << 20)
        if extra:
            out.append(("async checkpoint snapshot on the training thread (reported, per MiB of state)", None,
                        f"{max(extra) / 1e6:.2f} M per save of {mib:.2f} MiB = {max(extra) / mib / 1e6:.2f} M/MiB"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated variants (default: all): " + ", ".join(BY_NAME))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="variants run at once")
    p.add_argument("--dry-run", action="store_true", help="no valgrind: run each variant briefly")
    p.add_argument("--timeout", type=float, default=900, help="seconds per variant")
    p.add_argument("--json", type=Path, help="also write the per-step counts here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    p.add_argument("--build-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        # Under valgrind (its preload is in the environment) the helper switches counting on and off.
        counted = "vgpreload" in os.environ.get("LD_PRELOAD", "")
        child(BY_NAME[args.child], args.steps, args.warmup, args.build_dir, args.run_dir, counted)
        return 0
    names = [n for n in args.only.split(",") if n] or list(BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    if not args.dry_run and shutil.which("valgrind") is None:
        p.error("valgrind is not installed (Debian: apt-get install valgrind); --dry-run runs without it")
    with tempfile.TemporaryDirectory(prefix="npudist-cpu-cost-") as tmp, \
            ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(run_variant, BY_NAME[n], Path(tmp), args.dry_run, args.timeout) for n in names]
        results = []
        for f in futures:
            results.append(f.result())
            print(f"{results[-1].variant}: {results[-1].typical:,.0f} instructions per step "
                  f"({results[-1].buckets} buckets)", flush=True)
    print(table(results))
    checks = budgets(results)
    for what, ok, figure in checks:
        print(f"{'' if ok is None else 'PASS ' if ok else 'FAIL '}{what}: {figure}")
    if args.json:
        args.json.write_text(json.dumps({r.variant: {"steps": r.steps, "buckets": r.buckets} for r in results}))
    return 1 if any(ok is False for _, ok, _ in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
