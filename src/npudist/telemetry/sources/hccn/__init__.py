"""Huawei Ascend ``hccn_tool``: pure parsers for its ``-g`` queries (the NPU's RoCE NIC)."""

from npudist.telemetry.sources.hccn.parse import (
    PARSERS,
    STAT_COUNTERS,
    parse_ip,
    parse_link,
    parse_link_stat,
    parse_net_health,
    parse_optical,
    parse_speed,
    parse_stat,
)

__all__ = ["PARSERS", "STAT_COUNTERS", "parse_ip", "parse_link", "parse_link_stat", "parse_net_health",
           "parse_optical", "parse_speed", "parse_stat"]
