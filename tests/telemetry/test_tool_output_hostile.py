"""Hostile vendor-tool output (third audit): a tool that prints without end, and a line built to make a
backtracking regex quadratic. Either must cost a counted error, never the exporter's memory or its GIL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from npudist.runtime.toolrun import ToolOutputTooLarge, run_tool
from npudist.telemetry import SourceError
from npudist.telemetry.sources.npu_smi import NpuSmiSource
from tests.conftest import child_env


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.subprocess
def test_endless_output_is_cut_at_the_cap_and_the_wrapper_group_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    wrapper = tmp_path / "npu-smi"  # a wrapper script whose child floods stdout
    wrapper.write_text(f"#!/bin/sh\nyes 0123456789012345678901234567890123456789 &\necho $! > {pid_file}\nwait\n")
    wrapper.chmod(0o755)
    with pytest.raises(SourceError) as err:
        NpuSmiSource(binary=str(wrapper), timeout=30.0).read()
    assert err.value.reason == "too_large" and "killed with its children" in str(err.value)
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), f"the flooding child {child} outlived the cap"


@pytest.mark.subprocess
def test_output_under_the_cap_is_returned_whole(tmp_path):
    done = run_tool([sys.executable, "-c", "import sys; sys.stdout.write('x' * 300000); "
                     "sys.stderr.write('e' * 300000)"], timeout=30, limit=300000)
    assert (len(done.stdout), len(done.stderr), done.returncode) == (300000, 300000, 0)
    with pytest.raises(ToolOutputTooLarge, match="more than 299999 bytes"):
        run_tool([sys.executable, "-c", "print('x' * 300000)"], timeout=30, limit=299999)


@pytest.mark.subprocess
@pytest.mark.parametrize("line", ["Tx Power0 : 1{pad}!", "Temperature : 1{pad}!", "Vcc : 1{pad}mV{pad}!"])
def test_a_long_optical_line_is_parsed_in_linear_time(line):
    """120k blanks between a number and a stray character: a pair of adjacent ``\\s*`` held the GIL for
    minutes. Run in a child so a regression fails at the timeout instead of hanging the suite."""
    code = ("from npudist.telemetry.sources.hccn.parse import parse_optical\n"
            f"text = {line!r}.replace('{{pad}}', ' ' * 120_000) + '\\nTx Power1 : 0.5 mW\\n'\n"
            "print(len(parse_optical(text)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                          env=child_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"  # the good lane after it is kept; the hostile one is dropped
