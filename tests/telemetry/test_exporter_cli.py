import contextlib
import socket
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from npudist.cli import app
from tests.conftest import child_env, free_port
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


@pytest.mark.subprocess
@pytest.mark.slow
def test_exporter_command_serves_a_fake_source(tmp_path):
    (tmp_path / "fake_two_chips.py").write_text(FAKE_SOURCE)
    port = free_port()
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


@pytest.mark.subprocess
@pytest.mark.slow
def test_exporter_serves_the_reliability_families_from_the_fake_tools(tmp_path):
    """`npudist exporter --source npu-smi` with the fake npu-smi and hccn_tool (recorded outputs) serves at
    least 30 reliability and network families, in base units, and honours --collectors."""
    from tests.conftest import fakes_path

    port = free_port()
    env = child_env({"PATH": fakes_path()})
    proc = subprocess.Popen(
        [sys.executable, "-m", "npudist", "exporter", "--listen", f"127.0.0.1:{port}", "--source", "npu-smi",
         "--collectors", "all,-npudist_link_info"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text, deadline = "", time.monotonic() + 120
        while not ("npudist_link_net_healthy{" in text and "npudist_device_alarm_level{" in text) \
                and time.monotonic() < deadline:
            with contextlib.suppress(OSError):  # not listening yet
                text = scrape(f"http://127.0.0.1:{port}/metrics", timeout=5)
            time.sleep(0.5)
        fams = families(text)
        served = {name for name, fam in fams.items() if name.startswith(("npudist_link_", "npudist_device_"))
                  and fam.samples} - {"npudist_device_up", "npudist_device_info", "npudist_device_power_watts",
                                      "npudist_device_temperature_celsius", "npudist_device_utilization_ratio",
                                      "npudist_device_memory_used_bytes", "npudist_device_memory_total_bytes",
                                      "npudist_device_frequency_hertz"}
        assert len(served) >= 30, sorted(served)
        assert "npudist_link_info" not in served  # switched off
        rx = samples(fams, "npudist_link_optical_rx_power_watts")
        assert sorted(rx.values())[0] == pytest.approx(0.0054e-3)  # 0.0054 mW in the recording
        speed = set(samples(fams, "npudist_link_speed_bytes_per_second").values())
        assert speed == {400e9 / 8}  # "400 G" in the 950 speed table
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
