"""One call of a vendor command-line tool, with every way it can fail turned into a SourceError reason.

npu-smi and hccn_tool readers share it, so missing / timeout / too_large / exit_code mean the same in
npudist_collector_errors_total whichever tool failed (toolrun does the timeout and the process-group kill).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from npudist.runtime.toolrun import ToolOutputTooLarge, run_tool
from npudist.telemetry.sources.readings import SourceError


def call_tool(binary: str, args: Sequence[str], timeout: float, install_hint: str) -> str:
    """stdout of ``binary ARGS``; SourceError reason missing (with ``install_hint``) / timeout /
    too_large / exit_code."""
    cmd = [binary, *args]
    try:
        proc = run_tool(cmd, timeout)
    except FileNotFoundError:
        raise SourceError("missing", f"{binary!r} not found on PATH: {install_hint}") from None
    except subprocess.TimeoutExpired:
        raise SourceError("timeout", f"`{' '.join(cmd)}` gave no answer within {timeout:g} s (driver busy or "
                          "hung); it was killed with its children") from None
    except ToolOutputTooLarge as exc:
        raise SourceError("too_large", str(exc)) from None
    except OSError as exc:
        raise SourceError("missing", f"cannot run {binary!r}: {exc}") from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SourceError("exit_code", f"`{' '.join(cmd)}` exited with {proc.returncode}: {detail[0][:200]}")
    return proc.stdout
