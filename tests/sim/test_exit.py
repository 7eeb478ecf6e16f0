"""A simulating process waits, at exit, for autograd's device threads to drop their simulated tensors.

Every simulated tensor is a Python object, so an autograd device thread that drops the last reference to one
after the main thread started to finalize aborts the process (``terminate called without an active
exception``: npudist/sim/__init__.py, comm/quiesce.py). The race is too rare to assert on in a test, so
this asserts the wait is in place for a script that never calls ``npudist.init()`` and that it runs after the
script's last line.
"""

from __future__ import annotations

import textwrap

import pytest

from npudist.runtime import compat
from tests.conftest import run_py

pytestmark = pytest.mark.subprocess


@pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")
def test_a_script_without_init_rests_the_device_threads_after_its_last_line() -> None:
    script = textwrap.dedent("""
        import atexit
        import torch
        from npudist.comm import quiesce as q
        rested = []
        real = q.quiesce
        def watched(*a, **k):
            out = real(*a, **k)
            rested.append(out)
            print("rested quiet=%s waited_ms=%d" % (out.quiet, out.waited_s * 1000), flush=True)
            return out
        q.quiesce = watched
        from npudist.sim import install
        install("npu")
        x = torch.ones(4, device="npu", requires_grad=True)
        (x * 3).sum().backward()
        print("last line", x.grad.device, flush=True)
    """)
    proc = run_py(["-c", script], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "last line npu:0"
    assert len(lines) == 2 and lines[1].startswith("rested quiet=True"), proc.stdout
