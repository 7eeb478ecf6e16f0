import os
import sys

import pytest

from tests.conftest import FAKES


@pytest.fixture
def fake_path(monkeypatch, tmp_path):
    """The fake npu-smi first on PATH, its defaults restored; returns the file it logs its arguments to."""
    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for var in [k for k in os.environ if k.startswith("NPUDIST_FAKE_NPU_SMI")]:
        monkeypatch.delenv(var)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_ARGS", str(log))
    return log


@pytest.fixture
def ascend_path(monkeypatch, tmp_path):
    """The fake npu-smi and hccn_tool first on PATH, behind a `python3` that is this test's interpreter (the
    fakes' `#!/usr/bin/env python3` must not depend on the machine's python3); their variables cleared."""
    shim = tmp_path / "python-shim"
    shim.mkdir()
    (shim / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", os.pathsep.join([str(shim), str(FAKES / "bin"), os.environ["PATH"]]))
    for var in [k for k in os.environ if k.startswith(("NPUDIST_FAKE_NPU_SMI", "NPUDIST_FAKE_HCCN"))]:
        monkeypatch.delenv(var)
    return tmp_path
