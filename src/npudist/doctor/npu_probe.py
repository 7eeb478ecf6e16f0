"""How many NPUs ``torch.npu.device_count()`` reports under a given environment, asked in a child process.

Why a child: the count is what a job will see (the CANN runtime applies ``ASCEND_RT_VISIBLE_DEVICES`` and drops
a list it cannot read, and the NPU silently disappears: issue 46), but importing torch_npu and asking it starts
the ACL runtime, which can hang on a broken driver or abort on a missing library. The doctor must report
that, not share it: the child runs with the environment under test and a timeout, and its death is a finding.
Where neither torch_npu nor the simulated NPU (NPUDIST_SIMULATE) is importable there is nothing to ask.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Mapping

PROBE_TIMEOUT_S = 60.0
"""Importing torch and torch_npu takes 5-20 s on a loaded host; a runtime that has not answered by then hangs."""
_MARK = "npudist-npu-count="

_REAL = f"import torch, torch_npu\nprint('{_MARK}%d' % torch.npu.device_count())\n"
_SIMULATED = ("import sys\nfrom npudist.sim import activate\nwhy = activate()\n"
              "if why:\n    sys.exit('simulated NPU unavailable: ' + why)\n"
              f"import torch\nprint('{_MARK}%d' % torch.npu.device_count())\n")


class ProbeError(RuntimeError):
    """The child did not answer: it timed out, crashed or printed no count; the message says which."""


def probe_code(env: Mapping[str, str]) -> str | None:
    """The child's program for this environment: the simulated NPU's, torch_npu's, or None (nothing to ask)."""
    if env.get("NPUDIST_SIMULATE", "").strip():
        return _SIMULATED
    return _REAL if importlib.util.find_spec("torch_npu") is not None else None


def parse_count(stdout: str) -> int | None:
    """The count the child printed (its last marked line), or None."""
    counts = [line[len(_MARK):] for line in stdout.splitlines() if line.startswith(_MARK)]
    return int(counts[-1]) if counts and counts[-1].isdigit() else None


def npu_count(env: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> int | None:
    """``torch.npu.device_count()`` in a child with ``env``; None when there is nothing to ask, ProbeError when
    the child does not answer in ``timeout_s``."""
    code = probe_code(env)
    if code is None:
        return None
    try:
        done = subprocess.run([sys.executable, "-c", code], env=dict(env), capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"torch.npu.device_count() did not answer in {timeout_s:.0f} s (the runtime hangs: "
                         "see `npu-smi info`)") from None
    except OSError as exc:
        raise ProbeError(f"could not start {sys.executable}: {exc}") from None
    count = parse_count(done.stdout)
    if count is None:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:200]
        raise ProbeError(f"torch.npu.device_count() failed: {tail}")
    return count
