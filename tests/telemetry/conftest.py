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
