"""hypothesis: whatever text reaches a parser, it returns or raises its own ParseError, nothing else."""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npudist.telemetry import DeviceReading, ParseError
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.device_metrics import DeviceCollector
from npudist.telemetry.sources import rknpu_sysfs as rk
from npudist.telemetry.sources.npu_smi import parse, parse_kv, parse_mapping, parse_processes, parse_table
from npudist.telemetry.sources.poller import Poller
from tests.telemetry.exp_helpers import ScriptedSource

FAKES = Path(__file__).resolve().parents[1] / "fakes"
RECORDINGS = sorted(p.read_text() for p in (FAKES / "npu-smi").glob("*.txt")) + sorted(
    p.read_text() for p in (FAKES / "rknpu").glob("*.txt"))

PARSERS = {
    "parse": parse,
    "parse_table": parse_table,
    "parse_processes": parse_processes,
    "parse_kv": lambda t: parse_kv(t, npu_id=0),
    "parse_kv_no_ids": parse_kv,
    "parse_mapping": parse_mapping,
    "parse_load": rk.parse_load,
    "parse_version": rk.parse_version,
    "hertz": rk.hertz,
    "millicelsius": rk.millicelsius,
    "milliwatts": rk.milliwatts,
    "megahertz": rk.megahertz,
}
TABLE_CHARS = st.sampled_from([*"|+-=/ \n\t0123456789.%:NA[]-", "OK", "NPU", "Chip", "Name", "Health",
                               "HBM-Usage(MB)", "Core0:", "NPU load:"])


@st.composite
def mutated_recording(draw):
    """A real recording with a slice cut out and fragments of table syntax spliced in."""
    text = draw(st.sampled_from(RECORDINGS))
    a = draw(st.integers(0, len(text)))
    b = draw(st.integers(a, len(text)))
    insert = "".join(draw(st.lists(TABLE_CHARS, max_size=20)))
    return text[:a] + insert + text[b:]


TEXTS = st.one_of(st.text(max_size=400), st.lists(TABLE_CHARS, max_size=60).map("".join),
                  mutated_recording())


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS)
def test_parser_raises_only_parse_error(name, text):
    with contextlib.suppress(ParseError):
        PARSERS[name](text)


@settings(max_examples=150, deadline=None)
@given(text=mutated_recording())
def test_table_results_stay_in_base_unit_ranges(text):
    try:
        readings = parse(text)
    except ParseError:
        return
    for r in readings:
        assert r.utilization_ratio is None or 0.0 <= r.utilization_ratio <= 1.0
        assert r.power_watts is None or r.power_watts >= 0
        pairs = ((r.memory_used_bytes, r.memory_total_bytes), (r.hbm_used_bytes, r.hbm_total_bytes))
        for used, total in pairs:
            assert total is None or total > 0
            assert used is None or used >= 0


ABSURD = ["9" * 400, "9" * 5000, "1" + "0" * 320 + ".5", "4" * 19 + "0", "-" + "9" * 400]
NUMERIC_FIELDS = ("power_watts", "temperature_celsius", "utilization_ratio", "frequency_hertz", "memory_used_bytes",
                  "memory_total_bytes", "hbm_used_bytes", "hbm_total_bytes", "ddr_used_bytes", "ddr_total_bytes")


@st.composite
def absurd_number_in_recording(draw):
    """A real recording with one of its numbers replaced by hundreds of digits (or past int-string limits)."""
    text = draw(st.sampled_from([r for r in RECORDINGS if re.search(r"\d", r)]))
    spots = [m.span() for m in re.finditer(r"\d+(?:\.\d+)?", text)]
    a, b = draw(st.sampled_from(spots))
    return text[:a] + draw(st.sampled_from(ABSURD)) + text[b:]


def _exported(readings) -> list[float]:
    health = CollectorHealth()
    poller = Poller(ScriptedSource([list(readings)]), health, interval_s=1.0)
    poller.poll_once()
    return [s.value for fam in DeviceCollector([poller], health, "n").collect() for s in fam.samples]


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=absurd_number_in_recording())
def test_absurd_numbers_are_skipped_never_raised_or_inf(name, text):
    try:
        out = PARSERS[name](text)
    except ParseError:
        return
    readings = out if isinstance(out, list) else getattr(out, "devices", [])
    for r in readings:
        if isinstance(r, DeviceReading):
            assert all(getattr(r, f) is None or math.isfinite(getattr(r, f)) for f in NUMERIC_FIELDS), r
    assert all(math.isfinite(v) for v in _exported(r for r in readings if isinstance(r, DeviceReading)))


@pytest.mark.parametrize("value", [10**400, -(10**30), 1e308 * 10, "9" * 400],
                         ids=["400-digit-int", "minus-1e30-int", "inf-float", "400-digit-literal"])
def test_json_readings_with_absurd_numbers_export_no_inf(value):
    doc = json.dumps([{"device_id": 0, "power_watts": value, "memory_used_bytes": value, "chip_id": 0}])
    readings = parse(doc.replace('"' + "9" * 400 + '"', "9" * 400))
    assert readings[0].power_watts is None and readings[0].memory_used_bytes is None
    assert all(math.isfinite(v) for v in _exported(readings))


def test_a_reading_that_cannot_be_exported_is_counted_not_a_failed_scrape():
    health = CollectorHealth()
    bad = DeviceReading("npu", 0, power_watts=float("inf"), memory_used_bytes=10**400, temperature_celsius=40.0)
    poller = Poller(ScriptedSource([[bad]]), health, interval_s=1.0)
    poller.poll_once()
    families = list(DeviceCollector([poller], health, "n").collect())
    values = {fam.name: [s.value for s in fam.samples] for fam in families}
    assert values["npudist_device_temperature_celsius"] == [40.0]
    assert values["npudist_device_power_watts"] == [] and values["npudist_device_memory_used_bytes"] == []
    assert health.errors("fake") == {"collect": 1}


def test_npu_smi_with_a_400_digit_power_still_scrapes(tmp_path):
    recording = (FAKES / "npu-smi" / "910b2c-23.0.2.1-with-processes.txt").read_text()
    power = re.search(r"OK\s+\|\s+(\d+\.\d+)", recording)
    assert power is not None
    readings = parse(recording[:power.start(1)] + "9" * 400 + recording[power.end(1):])
    assert readings[0].power_watts is None and readings[1].power_watts is not None
    assert all(math.isfinite(v) for v in _exported(readings))
