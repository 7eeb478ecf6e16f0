"""hypothesis: whatever text reaches an Ascend reliability parser, it returns finite Measurements of known
families with the labels their catalogue row declares, or raises its own ParseError, nothing else."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npudist.telemetry import ParseError
from npudist.telemetry.exposition.catalogue import BY_NAME, DEVICE_LABELS, LINK_LABELS
from npudist.telemetry.sources.hccn import PARSERS as HCCN
from npudist.telemetry.sources.npu_smi.reliability import parse_ecc, parse_health, parse_usages

REC = Path(__file__).resolve().parents[1] / "fakes" / "ascend-tools"
RECORDINGS = sorted(p.read_text() for p in REC.glob("*.txt"))
PARSERS = {**{f"hccn_{k}": v for k, v in HCCN.items()}, "ecc": parse_ecc, "health": parse_health,
           "usages": parse_usages}
PIECES = st.sampled_from([*" :\n\t0123456789.-x|+", "0x", "ff", "mW", "dBm", "mV", "mA", "C", "NA", "[devid 0]",
                          "LINK UP", "Mb/s", " G ", "Health Status", "Error Code", "Tx Power0", "Rx Los Flag",
                          "roce_rx_err_pkt_num", "mac_tx_pfc_pri3_pkt_num", "HBM Double Bit Error Count",
                          "ipaddr", "netmask", "9" * 30])


@st.composite
def mutated_recording(draw):
    text = draw(st.sampled_from(RECORDINGS))
    a = draw(st.integers(0, len(text)))
    b = draw(st.integers(a, len(text)))
    return text[:a] + "".join(draw(st.lists(PIECES, max_size=20))) + text[b:]


TEXTS = st.one_of(st.text(max_size=400), st.lists(PIECES, max_size=60).map("".join), mutated_recording())


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS)
def test_parsers_return_catalogued_finite_values_or_parse_error(name, text):
    try:
        found = PARSERS[name](text)
    except ParseError:
        return
    assert found
    for x in found:
        row = BY_NAME[x.metric]
        base = LINK_LABELS if x.metric.startswith("npudist_link_") else DEVICE_LABELS
        assert {k for k, _ in x.labels} <= set(row.labels[len(base):]) | {"port"}, (x, row.labels)
        assert math.isfinite(x.value)
        if row.type == "counter":
            assert x.value >= 0
