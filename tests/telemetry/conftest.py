import os

import pytest

from tests.conftest import fakes_path


@pytest.fixture
def fake_path(monkeypatch, tmp_path):
    """The fake npu-smi first on PATH, its defaults restored; returns the file it logs its arguments to."""
    monkeypatch.setenv("PATH", fakes_path())
    for var in [k for k in os.environ if k.startswith("NPUDIST_FAKE_NPU_SMI")]:
        monkeypatch.delenv(var)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_ARGS", str(log))
    return log


@pytest.fixture
def ascend_path(monkeypatch, tmp_path):
    """The fake npu-smi and hccn_tool first on PATH (run by this test's interpreter); their variables cleared."""
    monkeypatch.setenv("PATH", fakes_path())
    for var in [k for k in os.environ if k.startswith(("NPUDIST_FAKE_NPU_SMI", "NPUDIST_FAKE_HCCN"))]:
        monkeypatch.delenv(var)
    return tmp_path
