"""Run an external tool (npu-smi, a vendor probe) with a hard timeout that also ends its children.

Vendor tools are often wrapper scripts (a shell that runs the real binary); killing only the wrapper at
the timeout leaves the hung child running, orphaned, after the exporter or doctor has moved on. So the
tool gets its own process group and the whole group is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def run_tool(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``argv``'s exit code and output (undecodable bytes replaced); TimeoutExpired once its process
    group has been killed. FileNotFoundError/OSError as subprocess.run raises them."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (it leads one: start_new_session) and reap ``proc``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a child that left the group still holds the pipes: stop reading
        proc.kill()
