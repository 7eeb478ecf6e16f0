import socket
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from npudist.cli import app
from tests.conftest import child_env
from tests.telemetry.exp_helpers import families, samples, scrape

FAKE_SOURCE = '''
from npudist.telemetry.sources.readings import DeviceReading, Source

class TwoChips(Source):
    name = "fake-smi"
    vendor = "npu"

    def read(self):
        return [DeviceReading("npu", 32, c, name="Ascend910", power_watts=None if c else 171.2,
                              temperature_celsius=36.0 + c) for c in (0, 1)]
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_exporter_command_serves_a_fake_source(tmp_path):
    (tmp_path / "fake_two_chips.py").write_text(FAKE_SOURCE)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "npudist", "exporter", "--listen", f"127.0.0.1:{port}",
         "--source", "fake_two_chips:TwoChips", "--interval", "200ms"],
        env=child_env(pythonpath=[tmp_path]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text, deadline = "", time.monotonic() + 30
        while "npudist_device_up{" not in text and time.monotonic() < deadline:
            try:
                text = scrape(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except OSError:
                time.sleep(0.2)
        fams = families(text)
        chip0 = (("chip", "0"), ("device", "32"), ("model", "Ascend910"), ("node", socket.gethostname()),
                 ("vendor", "npu"))
        chip1 = (("chip", "1"), *chip0[1:])
        assert samples(fams, "npudist_device_power_watts") == {chip0: 171.2}  # chip 1 printed "-": no sample
        assert samples(fams, "npudist_device_temperature_celsius")[chip1] == 37.0
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err  # SIGTERM is a clean stop
    assert f"serving http://127.0.0.1:{port}/metrics" in err


def test_exporter_command_errors_name_the_problem():
    runner = CliRunner()
    bad = runner.invoke(app, ["exporter", "--listen", "127.0.0.1:99999"])
    assert bad.exit_code == 2 and "port 99999 is outside 1-65535" in bad.output
    bad = runner.invoke(app, ["exporter", "--source", "gpu"])
    assert bad.exit_code == 2 and "unknown telemetry source 'gpu'" in bad.output
    bad = runner.invoke(app, ["exporter", "--interval", "soon"])
    assert bad.exit_code == 2 and "--interval 'soon'" in bad.output
    bad = runner.invoke(app, ["exporter", "--collectors", "all,-opticals"])
    assert bad.exit_code == 2 and "'-opticals' is neither a collector" in " ".join(bad.output.split())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        bad = runner.invoke(app, ["exporter", "--listen", f"127.0.0.1:{port}", "--source",
                                  "npudist.telemetry:Source"])
    assert bad.exit_code == 2 and "already in use" in bad.output
