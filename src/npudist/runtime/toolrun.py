"""Run an external tool (npu-smi, a vendor probe) with a hard timeout and an output cap that both end its
children.

Vendor tools are often wrapper scripts (a shell that runs the real binary); killing only the wrapper at
the timeout leaves the hung child running, orphaned, after the exporter or doctor has moved on. So the
tool gets its own process group and the whole group is killed. Output is read in chunks up to
OUTPUT_LIMIT_BYTES per stream: a tool that prints without end must not grow the exporter's memory (its
DaemonSet has a fixed limit), so past the cap the group is killed and ToolOutputTooLarge raised.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time

OUTPUT_LIMIT_BYTES = 4 * 1024 * 1024
"""Per stream. ``npu-smi info`` for 16 chips prints about 20 KiB; ``hccn_tool -stat`` about 3 KiB."""

_CHUNK = 64 * 1024


class ToolOutputTooLarge(Exception):
    """The tool printed more than ``limit`` bytes on one stream; its process group was killed."""

    def __init__(self, argv: list[str], limit: int) -> None:
        super().__init__(f"`{' '.join(argv)}` printed more than {limit} bytes; it was killed with its children "
                         "and its output dropped")
        self.limit = limit


def run_tool(argv: list[str], timeout: float,
             limit: int = OUTPUT_LIMIT_BYTES) -> subprocess.CompletedProcess[str]:
    """``argv``'s exit code and output (undecodable bytes replaced); TimeoutExpired or ToolOutputTooLarge
    once its process group has been killed. FileNotFoundError/OSError as subprocess.run raises them."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True) as proc:
        try:
            out, err = _read_capped(proc, argv, timeout, limit)
        except (subprocess.TimeoutExpired, ToolOutputTooLarge):
            kill_group(proc)
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


def _read_capped(proc: subprocess.Popen, argv: list[str], timeout: float, limit: int) -> tuple[bytes, bytes]:
    """stdout and stderr read to EOF, then the exit awaited, all within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    sizes = dict.fromkeys(chunks, 0)
    with selectors.DefaultSelector() as sel:
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(argv, timeout)
            for key, _ in sel.select(left):
                data = os.read(key.fd, _CHUNK)
                if not data:
                    sel.unregister(key.fd)
                    continue
                sizes[key.fd] += len(data)
                if sizes[key.fd] > limit:
                    raise ToolOutputTooLarge(argv, limit)
                chunks[key.fd].append(data)
    proc.wait(timeout=max(deadline - time.monotonic(), 0.001))
    return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (it leads one: start_new_session) and reap ``proc``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a child that left the group still holds the pipes: stop reading
        proc.kill()
