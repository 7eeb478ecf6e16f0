import re
from pathlib import Path

import pytest

from npudist.telemetry.exposition import catalogue
from npudist.telemetry.exposition.catalogue import CATALOGUE, MetricDef, family, markdown_table, problems, validate

NOTES = Path(__file__).resolve().parents[2] / "docs" / "reference" / "telemetry.md"


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
        # issue 25: reliability and network (Ascend npu-smi/hccn_tool, NVIDIA NVML)
        "npudist_device_ecc_corrected_errors_total", "npudist_device_ecc_uncorrected_errors_total",
        "npudist_device_ecc_aggregate_corrected_errors_total",
        "npudist_device_ecc_aggregate_uncorrected_errors_total", "npudist_device_memory_retired_pages",
        "npudist_device_memory_pending_retirement_pages", "npudist_device_memory_retirement_pending",
        "npudist_device_memory_remapped_rows", "npudist_device_memory_remap_pending",
        "npudist_device_memory_remap_failed", "npudist_device_xid_errors_total",
        "npudist_device_clock_throttle_active", "npudist_device_alarm_level", "npudist_device_error_codes",
        "npudist_device_error_code_info", "npudist_device_aivector_utilization_ratio",
        "npudist_device_aicube_utilization_ratio", "npudist_device_aicpu_utilization_ratio",
        "npudist_device_ctrlcpu_utilization_ratio", "npudist_device_overall_utilization_ratio",
        "npudist_device_hbm_bandwidth_utilization_ratio", "npudist_device_ddr_bandwidth_utilization_ratio",
        "npudist_link_up", "npudist_link_up_events_total", "npudist_link_down_events_total",
        "npudist_link_speed_bytes_per_second", "npudist_link_net_healthy", "npudist_link_net_health_info",
        "npudist_link_info", "npudist_link_pause_frames_total", "npudist_link_pfc_frames_total",
        "npudist_link_pfc_priority_frames_total", "npudist_link_mac_packets_total", "npudist_link_mac_bytes_total",
        "npudist_link_mac_bad_packets_total", "npudist_link_mac_bad_bytes_total",
        "npudist_link_mac_fcs_errors_total", "npudist_link_roce_packets_total", "npudist_link_roce_rc_packets_total",
        "npudist_link_roce_error_packets_total", "npudist_link_roce_cnp_packets_total",
        "npudist_link_roce_completions_total", "npudist_link_roce_retransmits_total",
        "npudist_link_roce_ecn_marked_packets_total", "npudist_link_roce_verification_errors_total",
        "npudist_link_roce_unexpected_acks_total", "npudist_link_roce_out_of_order_packets_total",
        "npudist_link_roce_qp_status_errors_total", "npudist_link_nic_packets_total", "npudist_link_nic_bytes_total",
        "npudist_link_optical_present", "npudist_link_optical_temperature_celsius",
        "npudist_link_optical_supply_voltage_volts", "npudist_link_optical_tx_power_watts",
        "npudist_link_optical_rx_power_watts", "npudist_link_optical_tx_bias_amperes",
        "npudist_link_optical_media_snr_decibels", "npudist_link_optical_host_snr_decibels",
        "npudist_link_optical_signal_lost", "npudist_link_optical_lock_lost",
        "npudist_link_optical_temperature_limit_celsius", "npudist_link_optical_supply_voltage_limit_volts",
        "npudist_link_optical_tx_power_limit_watts", "npudist_link_optical_rx_power_limit_watts",
        # issue 26: edge inference (latency histogram and failures per rank, the NPU core mask in use)
        "npudist_edge_inference_duration_seconds", "npudist_edge_inference_failures_total",
        "npudist_edge_runtime_info",
        # issue 20: hangs
        "npudist_hang_stall_seconds",
        # issue 20: per-rank straggler signal
        "npudist_rank_slowdown_ratio", "npudist_rank_straggler",
        # issue 24: what the training loop reports
        "npudist_training_loss", "npudist_training_samples_per_second",
        # issue 44: the script's own numbers (npudist.log)
        "npudist_training_scalar",
        # issue 44: where each rank's step goes (the issue's npudist_rank_phase_seconds, a counter: _total)
        "npudist_rank_phase_seconds_total",
        # issue 36: in-memory peer snapshots and where restarts resumed from
        "npudist_peer_snapshot_age_steps", "npudist_peer_snapshot_interval_steps", "npudist_peer_snapshot_bytes",
        "npudist_peer_snapshot_blocking_seconds_total", "npudist_peer_snapshot_failures_total",
        "npudist_recoveries_total",
        # issue 35: the edge front that answers without a lost board
        "npudist_edge_members_expected", "npudist_edge_members_answering", "npudist_edge_degraded_answers_total",
        # issue 35: a node behind a slow link
        "npudist_rank_store_rtt_seconds"]
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
    assert begin in text and end in text, "docs/reference/telemetry.md lost its metric-table markers"
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table == markdown_table(), "regenerate with: python -m npudist.telemetry.exposition.catalogue"


def test_readme_threshold_table_is_generated_from_the_catalogue():
    from npudist.telemetry.exposition.thresholds import thresholds_table

    text = (NOTES.parents[1] / "guide" / "observing.md").read_text()
    table = text.split("<!-- threshold-table:begin -->\n", 1)[1].split("<!-- threshold-table:end -->", 1)[0]
    assert table == thresholds_table(), "regenerate with: python -m npudist.telemetry.exposition.thresholds"


def test_the_straggler_alert_follows_the_jobs_own_flag():
    from npudist.telemetry.exposition.thresholds import THRESHOLDS

    t = THRESHOLDS["straggler"]
    assert t.metric == "npudist_rank_straggler" and catalogue.BY_NAME[t.metric].type == "gauge"
    assert "skew" not in THRESHOLDS  # stddev/mean stays a dashboard panel only: it dilutes with world size
