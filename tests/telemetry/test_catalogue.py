import re
from pathlib import Path

import pytest

from npudist.telemetry.exposition import catalogue
from npudist.telemetry.exposition.catalogue import CATALOGUE, MetricDef, family, markdown_table, problems, validate

NOTES = Path(__file__).resolve().parents[2] / "README.md"


def test_catalogue_follows_the_naming_rules():
    validate()
    assert problems() == []


def test_issue_metric_names_are_all_catalogued():
    # The list from the telemetry issue, parts 3 and the collectives issue, typed out by hand.
    wanted = ["npudist_device_up", "npudist_device_info", "npudist_device_utilization_ratio",
        "npudist_device_memory_used_bytes", "npudist_device_memory_total_bytes",
        "npudist_device_power_watts", "npudist_device_temperature_celsius",
        "npudist_device_frequency_hertz", "npudist_allocator_allocated_bytes",
        "npudist_allocator_reserved_bytes", "npudist_allocator_fragmentation_ratio",
        "npudist_step_duration_seconds", "npudist_steps_total", "npudist_step_skew_ratio",
        "npudist_straggler_rank", "npudist_op_duration_seconds", "npudist_collective_calls_total",
        "npudist_collective_bytes_total", "npudist_collective_duration_seconds",
        "npudist_collective_inflight", "npudist_collective_adaptations_total",
        "npudist_collector_errors_total", "npudist_collector_last_success_timestamp_seconds",
        "npudist_collector_duration_seconds",
        # issue 15: checkpoints
        "npudist_checkpoint_snapshot_duration_seconds", "npudist_checkpoint_write_duration_seconds",
        "npudist_checkpoint_bytes_total", "npudist_checkpoint_inflight", "npudist_checkpoint_waits_total",
        "npudist_checkpoint_failures_total",
        # issue 24: what the training loop reports
        "npudist_training_loss", "npudist_training_samples_per_second"]
    assert sorted(catalogue.BY_NAME) == sorted(wanted)
    assert catalogue.BY_NAME["npudist_step_duration_seconds"].type == "histogram"
    assert catalogue.BY_NAME["npudist_collective_adaptations_total"].labels[-1] == "kind"


@pytest.mark.parametrize(("row", "complaint"), [
    (MetricDef("npudist_power_milliwatts", "gauge", "milliwatts", "h", (), "s"), "not a base unit"),
    (MetricDef("npudist_temp", "gauge", "celsius", "h", (), "s"), "must end in its unit"),
    (MetricDef("npudist_calls", "counter", "", "h", (), "s"), "counters end in _total"),
    (MetricDef("npudist_up_total", "gauge", "", "h", (), "s"), "only counters end in _total"),
    (MetricDef("npudist_latency_ms", "gauge", "", "h", (), "s"), "non-base unit"),
    (MetricDef("npudist_x_seconds", "gauge", "", "h", (), "s"), "ends in a unit but the row has none"),
    (MetricDef("gpu_x_bytes", "gauge", "bytes", "h", (), "s"), "npudist_ prefix"),
    (MetricDef("npudist_x_bytes", "gauge", "bytes", "h", ("job",), "s"), "reserved name"),
    (MetricDef("npudist_x_bytes", "summary", "bytes", "h", (), "s"), "type 'summary'"),
])
def test_broken_rows_are_named(row, complaint):
    found = problems([row])
    assert any(complaint in p for p in found), found
    with pytest.raises(ValueError, match=re.escape(row.name)):
        validate([row])


def test_families_come_from_the_row():
    fam = family("npudist_collective_bytes_total")
    assert fam.type == "counter" and fam.name == "npudist_collective_bytes"  # client appends _total
    assert fam.documentation == catalogue.BY_NAME["npudist_collective_bytes_total"].help
    assert family("npudist_op_duration_seconds").type == "histogram"
    assert family("npudist_device_power_watts").type == "gauge"


def test_markdown_table_has_one_row_per_metric():
    lines = markdown_table().splitlines()
    assert lines[0] == "| name | type | unit | labels | source |"
    assert len(lines) == 2 + len(CATALOGUE)
    assert "| `npudist_device_power_watts` | gauge | watts | node, vendor, device, chip, model |" in lines[7]


def test_notes_table_is_generated_from_the_catalogue():
    text = NOTES.read_text()
    begin, end = "<!-- metric-table:begin -->\n", "<!-- metric-table:end -->"
    assert begin in text and end in text, "docs/telemetry-exporter.md lost its metric-table markers"
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table == markdown_table(), "regenerate with: python -m npudist.telemetry.exposition.catalogue"


def test_readme_threshold_table_is_generated_from_the_catalogue():
    from npudist.telemetry.exposition.catalogue import thresholds_table

    text = NOTES.read_text()
    table = text.split("<!-- threshold-table:begin -->\n", 1)[1].split("<!-- threshold-table:end -->", 1)[0]
    assert table == thresholds_table(), "regenerate with: python -m npudist.telemetry.exposition.catalogue --thresholds"


def test_the_job_uses_the_catalogue_skew_threshold():
    from npudist.telemetry.exposition.catalogue import THRESHOLDS
    from npudist.telemetry.job.step_timer import StepTimer
    from npudist.telemetry.job.straggler import StragglerDiagnosis

    assert StepTimer().threshold == StragglerDiagnosis(".").threshold == THRESHOLDS["skew"].value == 0.12
