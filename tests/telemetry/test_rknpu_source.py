"""Rockchip NPU parsers and RknpuSource over fake sysfs/debugfs trees built in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from npudist.telemetry import ParseError, SourceError
from npudist.telemetry.sources.rknpu_sysfs import RknpuSource, parse_load, parse_version

REC = Path(__file__).resolve().parents[1] / "fakes" / "rknpu"


def put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_parse_load_recordings():
    busy = parse_load((REC / "load-rk3588-busy.txt").read_text())
    assert busy == {"Core0": 0.21, "Core1": 0.11, "Core2": 0.0}
    heavy = parse_load((REC / "load-rk3588-heavy.txt").read_text())
    assert heavy == {"Core0": 0.86, "Core1": 0.84, "Core2": 0.61}


@pytest.mark.parametrize(("text", "expected"), [
    ("NPU load:  0%\n", {"Core0": 0.0}),
    ("NPU load:  37%,\n", {"Core0": 0.37}),
    ("NPU load:  Core0:   %, Core1:  4%, Core2:  0%,", {"Core0": None, "Core1": 0.04, "Core2": 0.0}),
    ("NPU load:  Core0: 429496%, Core1: 100%, Core2: -1%,", {"Core0": None, "Core1": 1.0, "Core2": None}),
    ("NPU load:  Core0: 12%, Core1:  0%, Core2:  0%,", {"Core0": 0.12, "Core1": 0.0, "Core2": 0.0}),
])
def test_parse_load_blank_and_impossible(text, expected):
    assert parse_load(text) == expected


@pytest.mark.parametrize("text", ["", "load: 3%", "NPU load:", "NPU load: busy"])
def test_parse_load_errors(text):
    with pytest.raises(ParseError):
        parse_load(text)


def test_parse_version():
    assert parse_version((REC / "version.txt").read_text()) == "0.9.6"
    with pytest.raises(ParseError):
        parse_version("RKNPU driver:")


def rk3588_tree(root: Path) -> None:
    put(root, "sys/kernel/debug/rknpu/load", (REC / "load-rk3588-busy.txt").read_text())
    put(root, "sys/kernel/debug/rknpu/version", (REC / "version.txt").read_text())
    put(root, "sys/class/devfreq/fdab0000.npu/cur_freq", (REC / "devfreq-cur_freq.txt").read_text())
    put(root, "sys/class/devfreq/fdab0000.npu/max_freq", "1000000000\n")
    put(root, "sys/class/thermal/thermal_zone0/type", "soc-thermal\n")
    put(root, "sys/class/thermal/thermal_zone0/temp", "45000\n")
    put(root, "sys/class/thermal/thermal_zone6/type", "npu_thermal\n")
    put(root, "sys/class/thermal/thermal_zone6/temp", "38846\n")
    put(root, "sys/class/thermal/thermal_zone5/type", "gpu_thermal\n")
    put(root, "sys/class/thermal/thermal_zone5/temp", "99000\n")


def test_rk3588_one_reading_per_core(tmp_path):
    rk3588_tree(tmp_path)
    src = RknpuSource(root=str(tmp_path))
    readings = src.read()
    assert [(r.vendor, r.device_id, r.chip_id) for r in readings] == [("rknpu", 0, 0), ("rknpu", 0, 1),
                                                                       ("rknpu", 0, 2)]
    assert [r.utilization_ratio for r in readings] == [0.21, 0.11, 0.0]
    assert all(r.frequency_hertz == 1e9 for r in readings)
    assert all(r.temperature_celsius == 38.846 for r in readings)  # npu_thermal, not soc or gpu
    assert all(r.power_watts is None for r in readings)  # RK3588 has no NPU power sensor
    assert src.driver_version() == "0.9.6"
    assert src.max_frequency_hertz() == 1e9


def test_rk3576_devfreq_name_and_soc_thermal_fallback(tmp_path):
    put(tmp_path, "sys/class/devfreq/27700000.npu/cur_freq", "800000000\n")
    put(tmp_path, "sys/class/thermal/thermal_zone0/type", "soc_thermal\n")
    put(tmp_path, "sys/class/thermal/thermal_zone0/temp", "41250\n")
    (r,) = RknpuSource(root=str(tmp_path)).read()  # no load file: driver < 0.7.2 or not root
    assert (r.chip_id, r.utilization_ratio, r.frequency_hertz, r.temperature_celsius) == (0, None, 8e8, 41.25)


def test_missing_and_malformed_files_are_none(tmp_path):
    put(tmp_path, "sys/kernel/debug/rknpu/load", "NPU load:  Core0: abc%, Core1: 5%,")
    put(tmp_path, "sys/class/devfreq/fdab0000.npu/cur_freq", "fast\n")
    put(tmp_path, "sys/class/thermal/thermal_zone0/type", "npu_thermal\n")
    put(tmp_path, "sys/class/thermal/thermal_zone0/temp", "\n")
    src = RknpuSource(root=str(tmp_path))
    a, b = src.read()
    assert (a.utilization_ratio, b.utilization_ratio) == (None, 0.05)
    assert a.frequency_hertz is None and a.temperature_celsius is None
    assert src.driver_version() is None and src.max_frequency_hertz() is None


def test_unreadable_load_file_is_not_an_error(tmp_path):
    put(tmp_path, "sys/kernel/debug/rknpu/load", "garbage")
    (r,) = RknpuSource(root=str(tmp_path)).read()
    assert r.utilization_ratio is None


def test_generic_class_npu_layout(tmp_path):
    put(tmp_path, "sys/class/npu/npu0/device/power_usage", "2500\n")  # mW
    put(tmp_path, "sys/class/npu/npu0/device/memory_usage", "1048576\n")  # bytes
    put(tmp_path, "sys/class/npu/npu0/device/frequency", "1000\n")  # MHz
    put(tmp_path, "sys/class/npu/npu1/device/power_usage", "-5\n")
    put(tmp_path, "sys/class/npu/npu1/device/frequency", "800 MHz\n")
    rk3588_tree(tmp_path)  # the generic layout wins when both exist
    a, b = RknpuSource(root=str(tmp_path)).read()
    assert (a.device_id, a.power_watts, a.memory_used_bytes, a.frequency_hertz) == (0, 2.5, 1048576, 1e9)
    assert (b.device_id, b.power_watts, b.memory_used_bytes, b.frequency_hertz) == (1, None, None, None)


def test_nothing_there_is_missing(tmp_path):
    put(tmp_path, "sys/class/thermal/thermal_zone0/type", "soc_thermal\n")
    put(tmp_path, "sys/class/thermal/thermal_zone0/temp", "41250\n")
    with pytest.raises(SourceError) as err:
        RknpuSource(root=str(tmp_path)).read()
    assert err.value.reason == "missing"


def test_root_defaults_to_env(tmp_path, monkeypatch):
    put(tmp_path, "sys/class/devfreq/fdab0000.npu/cur_freq", "300000000\n")
    monkeypatch.setenv("NPUDIST_SYSFS_ROOT", str(tmp_path))
    assert RknpuSource().read()[0].frequency_hertz == 3e8
