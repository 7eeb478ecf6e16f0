"""hypothesis: whatever text reaches a parser, it returns or raises its own ParseError, nothing else."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npudist.telemetry import ParseError
from npudist.telemetry import rknpu as rk
from npudist.telemetry.npu_smi import parse, parse_kv, parse_mapping, parse_processes, parse_table

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
