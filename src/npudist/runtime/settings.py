"""Every ``NPUDIST_*`` variable npudist reads, parsed in one place into one typed record.

The process's Runtime reads them once, when it starts; code that is handed an environment mapping
(``npudist launch`` planning for its ranks, the exporter) parses that mapping with the same function.
A malformed value is an error naming the variable and what to put there, never a silent default.

Not here, because they are protocol between npudist's own processes rather than settings:
``NPUDIST_BROKEN_BACKEND`` (backend_guard.py: the CLI re-executing itself), ``NPUDIST_BENCH_PROGRESS``
(bench/rank.py: bench ranks reporting to their parent), ``NPUDIST_SD_DIR`` (a shell variable of
the generated sbatch script, deploy/slurm.py) and ``NPUDIST_TEST_CHECKPOINT_DELAY_S`` and
``NPUDIST_TEST_SYNC_CHECKPOINT_DELAY_S`` (checkpoint/writer.py's SlowDisk: a test harness's slow disk, read
once when the process's checkpoint writer is made).
This module imports nothing heavy: the launcher and the CLI read it before torch is imported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

ACCELERATOR_VAR = "NPUDIST_ACCELERATOR"
TIMEOUT_VAR = "NPUDIST_TIMEOUT"
PROFILE_VAR = "NPUDIST_COMM_PROFILE"
DEBUG_VAR = "NPUDIST_COMM_DEBUG"
SYNC_VAR = "NPUDIST_COMM_SYNC_TIMING"
RUN_DIR_VAR = "NPUDIST_RUN_DIR"
RUN_ID_VAR = "NPUDIST_RUN_ID"
RUN_ID_SOURCES = (RUN_ID_VAR, "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
"""Variables naming a run (the metrics' run label), first found wins."""
WATCHDOG_OFF_VAR = "NPUDIST_WATCHDOG_OFF"
HANG_TIMEOUT_VAR = "NPUDIST_HANG_TIMEOUT"
HANG_ACTION_VAR = "NPUDIST_HANG_ACTION"
HANG_ACTIONS = ("abort", "report", "off")
STUCK_TIMEOUT_VAR = "NPUDIST_STUCK_TIMEOUT"
BUSY_TIMEOUT_VAR = "NPUDIST_BUSY_TIMEOUT"
PG_WATCH_VAR = "NPUDIST_PG_WATCH"
PG_WATCH_MODES = ("native", "off")
"""native: every collective on every process group is counted by a small C++ kernel (comm/pg_watch.py),
built once per torch with the host's C++ compiler; off: only npudist's own collectives are numbered."""
DEFAULT_STUCK_TIMEOUT_S = 300.0
"""Five minutes: longer than any one step's data loading or file write we have seen, far below torch's
collective timeouts (10 min NCCL, 30 min gloo and HCCL_EXEC_TIMEOUT) that would end a stuck job anyway."""
PORT_VAR = "NPUDIST_METRICS_PORT"
HOST_VAR = "NPUDIST_METRICS_HOST"
CPU_NPROC_VAR = "NPUDIST_CPU_NPROC"
SYSFS_ROOT_VAR = "NPUDIST_SYSFS_ROOT"
NODE_VAR = "NPUDIST_NODE_NAME"
SIMULATE_VAR = "NPUDIST_SIMULATE"
SIM_CHIPS_VAR = "NPUDIST_SIM_CHIPS"
DRY_RUN_VAR = "NPUDIST_DRY_RUN"
SENTINEL_VAR = "NPUDIST_SENTINEL"
SENTINEL_MODES = ("loss", "scan", "off")
"""loss: each rank's loss (and the first gradient element of DDP's last bucket) is checked every step, the flag
riding in that bucket's reduction; scan: also every gradient bucket before it is reduced (about one pass over
the gradients); off: no check (npudist/training/sentinel.py)."""
SPIKE_FACTOR_VAR = "NPUDIST_SPIKE_FACTOR"
DEFAULT_SPIKE_FACTOR = 10.0
"""A loss above 10x its running maximum is a spike (Megatron-LM's spiky-loss threshold)."""
SKIP_WARN_VAR = "NPUDIST_SKIP_WARN"
DEFAULT_SKIP_WARN = 20
"""GradScaler-skipped steps in a row before a warning: its start-up calibration skips a handful."""
TENSORBOARD_VAR = "NPUDIST_TENSORBOARD"

SIMULATE_MODES = ("npu", "npu:strict")
"""What NPUDIST_SIMULATE and ``npudist launch --simulate`` accept (npudist.sim.MODES says what each does)."""
SIMULATED_ACCELERATOR = "npu-sim"
"""The vendor row (accelerators/vendors.py) a simulating process uses."""

_TRUE = frozenset({"1", "true", "yes", "on"})


class SettingsError(ValueError):
    """An NPUDIST_* variable holds something npudist cannot use; the message names it and the fix."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    accelerator: str | None = None
    """NPUDIST_ACCELERATOR: the accelerator row to use (npu, cuda, mlu, rknpu, cpu) instead of detecting."""
    timeout_s: float | None = None
    """NPUDIST_TIMEOUT: seconds a rendezvous or collective may take before the process group gives up
    (None: init()'s default)."""
    comm_profile: str | None = None
    """NPUDIST_COMM_PROFILE: a constraint profile (comm/constraints.py) applied whatever backend runs."""
    comm_debug: bool = False
    """NPUDIST_COMM_DEBUG: every collective first checks across ranks that sizes and dtypes agree."""
    sync_timing: bool = False
    """NPUDIST_COMM_SYNC_TIMING: collectives synchronise the device before stopping their clock."""
    run_dir: str | None = None
    """NPUDIST_RUN_DIR: where hang reports (and run logs) are written."""
    watchdog: bool = True
    """False when NPUDIST_WATCHDOG_OFF is set: collectives are not numbered and published for hang diagnosis."""
    hang_timeout_s: float | None = None
    """NPUDIST_HANG_TIMEOUT: seconds without progress before rank 0 gives its hang verdict (None: deduced
    from the job's own progress intervals, at least comm/hang.py's FLOOR_S)."""
    hang_action: str = "abort"
    """NPUDIST_HANG_ACTION: after a hang verdict, abort (the live ranks exit so a launcher restarts the job
    at once), report (verdict only; the collective timeout still ends the job) or off (no reader)."""
    stuck_timeout_s: float = DEFAULT_STUCK_TIMEOUT_S
    """NPUDIST_STUCK_TIMEOUT: seconds without progress after which a rank that is alive but does nothing (same
    stack, no CPU time: a deadlocked loader, a hung file system call) is aborted (comm/rank_states.py)."""
    pg_watch: str = "native"
    """NPUDIST_PG_WATCH: native (default) watches every collective on every process group, whoever calls it
    (FSDP2, DTensor, DDP's reducer, raw torch.distributed); off numbers npudist's own collectives only."""
    busy_timeout_s: float | None = None
    """NPUDIST_BUSY_TIMEOUT: seconds without progress after which a rank that is busy outside collectives (or
    declared busy with npudist.busy()) is aborted; None: never by npudist (the collective timeout still ends
    the job, as torch's own default does)."""
    metrics_port: int | None = None
    """NPUDIST_METRICS_PORT: rank i serves its metrics on this port + i (0: any free port; None: not served)."""
    metrics_host: str | None = None
    """NPUDIST_METRICS_HOST: the interface the ranks' metrics servers bind (None: 127.0.0.1)."""
    cpu_nproc: int | None = None
    """NPUDIST_CPU_NPROC: ranks per node for ``npudist launch --nproc-per-node auto`` on CPU."""
    sysfs_root: str = "/"
    """NPUDIST_SYSFS_ROOT: the root under which /sys is read (tests point it at a fake tree)."""
    node_name: str | None = None
    """NPUDIST_NODE_NAME: the ``node`` label of every metric (None: the host name)."""
    simulate: str | None = None
    """NPUDIST_SIMULATE: ``npu`` or ``npu:strict`` makes this process's accelerator the simulated NPU
    (npudist.sim), whatever NPUDIST_ACCELERATOR says; None: real hardware only."""
    sim_chips: int = 8
    """NPUDIST_SIM_CHIPS: chips on the simulated host (an Atlas 800 training server has 8); a rank's
    ASCEND_RT_VISIBLE_DEVICES or local rank must name one of them."""
    dry_run_steps: int | None = None
    """NPUDIST_DRY_RUN: after this many optimizer steps the rank saves and loads back a checkpoint and ends
    the script (``npudist launch --dry-run[=N]``, npudist/dry_run.py); None: the script runs as written."""
    sentinel: str = "loss"
    """NPUDIST_SENTINEL: the NaN/Inf sentinel's mode, loss (default), scan or off (SENTINEL_MODES)."""
    spike_factor: float = DEFAULT_SPIKE_FACTOR
    """NPUDIST_SPIKE_FACTOR: a loss above this multiple of its running maximum warns as a spike."""
    skip_warn: int = DEFAULT_SKIP_WARN
    """NPUDIST_SKIP_WARN: optimizer steps in a row skipped for non-finite gradients (a GradScaler) before a
    warning."""
    tensorboard: str | None = None
    """NPUDIST_TENSORBOARD: a directory for TensorBoard event files of the watched loop's numbers
    (``npudist launch --tensorboard DIR``; needs the ``tensorboard`` package); None: none written."""

    @property
    def forced_accelerator(self) -> str | None:
        """The vendor row to use instead of detecting: the simulated NPU when simulating, else
        NPUDIST_ACCELERATOR."""
        return SIMULATED_ACCELERATOR if self.simulate else self.accelerator

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse ``env`` (default: this process's environment); SettingsError names a malformed variable."""
        env = os.environ if env is None else env

        def text(name: str) -> str | None:
            return env.get(name, "").strip() or None

        return cls(
            accelerator=(text(ACCELERATOR_VAR) or "").lower() or None,
            timeout_s=_seconds(text(TIMEOUT_VAR)),
            hang_timeout_s=_seconds(text(HANG_TIMEOUT_VAR), HANG_TIMEOUT_VAR),
            hang_action=_choice(HANG_ACTION_VAR, text(HANG_ACTION_VAR), HANG_ACTIONS),
            stuck_timeout_s=_seconds(text(STUCK_TIMEOUT_VAR), STUCK_TIMEOUT_VAR) or DEFAULT_STUCK_TIMEOUT_S,
            busy_timeout_s=_seconds(text(BUSY_TIMEOUT_VAR), BUSY_TIMEOUT_VAR),
            pg_watch=_choice(PG_WATCH_VAR, text(PG_WATCH_VAR), PG_WATCH_MODES),
            comm_profile=text(PROFILE_VAR),
            comm_debug=(text(DEBUG_VAR) or "").lower() in _TRUE,
            sync_timing=(text(SYNC_VAR) or "").lower() in _TRUE,
            run_dir=text(RUN_DIR_VAR),
            watchdog=text(WATCHDOG_OFF_VAR) is None,
            metrics_port=_port(text(PORT_VAR)),
            metrics_host=text(HOST_VAR),
            cpu_nproc=_positive(CPU_NPROC_VAR, text(CPU_NPROC_VAR)),
            sysfs_root=env.get(SYSFS_ROOT_VAR) or "/",
            node_name=text(NODE_VAR),
            simulate=_simulate(text(SIMULATE_VAR)),
            sim_chips=_positive(SIM_CHIPS_VAR, text(SIM_CHIPS_VAR)) or 8,
            dry_run_steps=_positive(DRY_RUN_VAR, text(DRY_RUN_VAR)),
            sentinel=_choice(SENTINEL_VAR, text(SENTINEL_VAR), SENTINEL_MODES),
            spike_factor=_factor(text(SPIKE_FACTOR_VAR)),
            skip_warn=_positive(SKIP_WARN_VAR, text(SKIP_WARN_VAR)) or DEFAULT_SKIP_WARN,
            tensorboard=text(TENSORBOARD_VAR),
        )


# The numeric variables: ASCII digits only (str.isdigit() and float() also take '²' and other scripts'
# digits, float() takes 'inf', 'nan' and '1_0'), and each within the range where the code that uses it
# works: (lowest, highest, what it counts).
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,3})?")
_INTEGER = re.compile(r"[0-9]{1,9}")
_RANGES: Mapping[str, tuple[float, float, str]] = MappingProxyType({
    TIMEOUT_VAR: (0.001, 30 * 86400.0, "seconds (at most 30 days)"),
    HANG_TIMEOUT_VAR: (0.001, 30 * 86400.0, "seconds (at most 30 days)"),
    STUCK_TIMEOUT_VAR: (0.001, 30 * 86400.0, "seconds (at most 30 days)"),
    BUSY_TIMEOUT_VAR: (0.001, 30 * 86400.0, "seconds (at most 30 days)"),
    PORT_VAR: (0, 65535, "the base port (0: any free port)"),
    CPU_NPROC_VAR: (1, 1024, "ranks per node"),
    DRY_RUN_VAR: (1, 1_000_000, "optimizer steps"),
    SPIKE_FACTOR_VAR: (1.01, 1e9, "a multiple of the running maximum loss"),
    SKIP_WARN_VAR: (1, 1_000_000, "skipped steps in a row"),
})


def _allowed(name: str) -> str:
    low, high, what = _RANGES[name]
    return f"give {what}, from {low:g} to {int(high) if float(high).is_integer() else high}"


def _in_range(name: str, raw: str, value: float, why: str) -> None:
    low, high, _ = _RANGES[name]
    if not low <= value <= high:
        raise SettingsError(f"{name}={raw!r}: {why}; {_allowed(name)}")


def _seconds(raw: str | None, name: str = TIMEOUT_VAR) -> float | None:
    if raw is None:
        return None
    if not _DECIMAL.fullmatch(raw):
        raise SettingsError(f"{name}={raw!r} is not a number of seconds; {_allowed(name)}")
    value = float(raw)
    _in_range(name, raw, value, "the timeout must be a positive number of seconds")
    return value


def _factor(raw: str | None) -> float:
    if raw is None:
        return DEFAULT_SPIKE_FACTOR
    if not _DECIMAL.fullmatch(raw):
        raise SettingsError(f"{SPIKE_FACTOR_VAR}={raw!r} is not a number; {_allowed(SPIKE_FACTOR_VAR)}")
    _in_range(SPIKE_FACTOR_VAR, raw, float(raw), "a spike must be a loss above its running maximum")
    return float(raw)


def _choice(name: str, raw: str | None, choices: tuple[str, ...]) -> str:
    if raw is None:
        return choices[0]
    if raw.lower() not in choices:
        raise SettingsError(f"{name}={raw!r}: choose one of {', '.join(choices)}")
    return raw.lower()


def _port(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not _INTEGER.fullmatch(raw):
        raise SettingsError(f"{PORT_VAR}={raw!r} is not a port number; unset it or give the base port, 0 to 65535")
    _in_range(PORT_VAR, raw, int(raw), "not a port number")
    return int(raw)


def _positive(name: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    if not _INTEGER.fullmatch(raw) or int(raw) < 1:
        raise SettingsError(f"{name}={raw!r}: give a positive integer; {_allowed(name)}")
    _in_range(name, raw, int(raw), "too many")
    return int(raw)


def _simulate(raw: str | None) -> str | None:
    if raw is None:
        return None
    mode = raw.lower()
    if mode not in SIMULATE_MODES:
        raise SettingsError(f"{SIMULATE_VAR}={raw!r}: give one of {', '.join(SIMULATE_MODES)} (or unset it)")
    return mode
