"""One job per run directory: an exclusive lock on RUN_DIR/.npudist.lock, held by the job's rank 0.

Two jobs writing one run directory would prune and overwrite each other's checkpoints and interleave
their run logs. The training script takes the lock right after ``npudist.init()``, because the run
directory is the script's argument (torchrun knows nothing of it). Rank 0 tries the lock and tells
every rank the outcome, so all ranks of a refused job stop together, on any launcher (torchrun,
mpirun, srun) and whatever node rank 0 lands on.

What it relies on: ``flock(2)`` locks are released by the kernel when the holding process dies,
however it dies, so a lock that can be taken is stale by definition and the file's text only names
who held it. (flock, not POSIX ``lockf``: a record lock vanishes when the process closes *any*
descriptor of the file, and two opens in one process never conflict.) Between nodes this needs
locks that are coherent across clients: local disks; NFS, where Linux implements flock with the
server's byte-range locks (NFSv4, or NFSv3 with lockd); CephFS; GPFS; Lustre mounted with
``-o flock``. Not NFS mounted ``nolock``/``local_lock=flock`` or Lustre ``localflock``: each node
then sees only its own locks. On NFS the server frees the lock of a crashed client when its lease expires (90 s by
default for NFSv4), so a restart of the same torchrun job (same ``TORCHELASTIC_RUN_ID``) waits for
that instead of refusing.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import stat
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from npudist.checkpoint.writer import CheckpointError
from npudist.runtime.env import launcher_env

log = logging.getLogger("npudist.checkpoint")
LOCK_FILE = ".npudist.lock"
SAME_JOB_WAIT_S = 150.0
# The lock file is opened, never followed: a symlink planted there would have the holder's record
# written over (and the release truncate) whatever it points to. O_NONBLOCK: a FIFO never blocks.
_OPEN_LOCK = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_PID = 1 << 22  # Linux's PID_MAX_LIMIT (include/linux/threads.h)


class RunDirLockError(CheckpointError):
    """The run directory's lock could not be taken; raised on every rank, the message says why."""


class RunDirBusy(RunDirLockError):
    """Another live job holds the run directory; the message names it (host, pid, start time)."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    started: str
    """ISO 8601 UTC time the lock was taken."""
    job: str = ""
    """TORCHELASTIC_RUN_ID of the holding job ("" when not under torchrun or with the default "none")."""
    restart: int = 0

    def describe(self) -> str:
        job = f", torchrun job {self.job!r} restart {self.restart}" if self.job else ""
        return f"host {self.host}, pid {self.pid}, started {self.started}{job}"


def _field(raw: dict, name: str, kind: type, default: object = None) -> object:
    value = raw.get(name, default)
    if type(value) is not kind:  # exact: bool is an int, and json turns 1e999 into a float
        raise ValueError(name)
    if kind is str and len(value) > 256:
        raise ValueError(name)
    return value


def parse_holder(text: str) -> Holder | None:
    """The holder recorded in a lock file, or None for an empty, unreadable or implausible one (pure):
    anyone can write the file, so only a record of the right types and ranges names a holder."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            return None
        holder = Holder(_field(raw, "host", str), _field(raw, "pid", int), _field(raw, "started", str),
                        _field(raw, "job", str, ""), _field(raw, "restart", int, 0))
    except (ValueError, RecursionError):
        return None
    return holder if 0 < holder.pid <= _MAX_PID and 0 <= holder.restart < 1 << 31 else None


def this_process(env: dict[str, str] | None = None) -> Holder:
    launcher = launcher_env(os.environ if env is None else env)
    return Holder(socket.gethostname(), os.getpid(), datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  launcher.run_id, launcher.restart_count)


class RunDirLock:
    """The lock on one run directory, held by this process until ``release()`` or its exit."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, me: Holder | None = None, same_job_wait_s: float = SAME_JOB_WAIT_S) -> Holder | None:
        """Take the lock; return the dead holder it took over from (None when it was free).

        Raises RunDirBusy naming the holder when a live one has it. A holder from this same torchrun
        job (an earlier attempt whose lock a shared filesystem has not yet freed) is waited for.
        """
        me = me or this_process()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, _OPEN_LOCK, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise RunDirLockError(f"{self.path} is a symlink; a run directory's lock file must be a regular "
                                  "file (following the link would overwrite its target). Remove it.") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RunDirLockError(f"{self.path} is not a regular file; remove it")
        deadline = time.monotonic() + same_job_wait_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                        raise
                holder = parse_holder(_read(fd))
                if holder and me.job and holder.job == me.job and time.monotonic() < deadline:
                    time.sleep(1.0)
                    continue
                who = holder.describe() if holder else "a process that has not yet written its name"
                raise RunDirBusy(f"run directory {self.path.parent} is in use by another job ({who}). "
                                 "Stop that job, or give this one its own --run-dir.")
            previous = parse_holder(_read(fd))
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(asdict(me)).encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        if previous is not None:
            log.warning("run directory %s: took over the lock of a job that is no longer running (%s); it "
                        "ended without releasing it (killed or crashed)", self.path.parent, previous.describe())
        return previous

    def release(self) -> None:
        """Empty the file (a clean end leaves no holder's name behind) and drop the lock."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # the last descriptor closed releases the lock


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", "replace")


def lock_run_dir(run_dir: str | os.PathLike) -> RunDirLock | None:
    """Claim ``run_dir`` for this job: rank 0 takes the lock, every rank learns the outcome.

    Call on every rank after ``npudist.init()`` (it is a collective when a process group exists).
    Returns the held lock on rank 0, None on the others; raises RunDirBusy on every rank when
    another live job holds the directory, RunDirLockError on every rank when the lock cannot be taken.
    The process's Runtime owns the lock: ``npudist.shutdown()`` releases it last, after the last
    checkpoint write and the other ranks' end (runtime.state.CLOSE_ORDER).
    """
    from npudist.comm import control
    from npudist.runtime.state import current

    lock, outcome = None, [None]
    if control.rank() == 0:
        lock = RunDirLock(run_dir)
        try:
            lock.acquire()
        except RunDirBusy as exc:
            lock, outcome = None, [("busy", str(exc))]
        except RunDirLockError as exc:
            lock, outcome = None, [("error", str(exc))]
        except Exception as exc:  # every failure reaches the broadcast: no rank may be left waiting in it
            lock, outcome = None, [("error", f"cannot lock run directory {run_dir}: {type(exc).__name__}: {exc}")]
    outcome = [control.broadcast_object(outcome[0], src=0)]
    if outcome[0] is not None:
        kind, message = outcome[0]
        raise (RunDirBusy if kind == "busy" else RunDirLockError)(message)
    if lock is not None:
        current().own("run_dir_locks", lock.release)
    return lock
