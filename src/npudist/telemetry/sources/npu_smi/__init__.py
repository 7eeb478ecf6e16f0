"""Huawei Ascend ``npu-smi``: pure parsers for its outputs and a reader that runs it.

``parse`` (the ``info`` table or JSON), ``parse_processes`` (its process table), ``parse_kv``
(``info -t ...`` key/value outputs), ``parse_mapping`` (``info -m``), ``rank_chip`` (which chip a rank's
device index is under ASCEND_RT_VISIBLE_DEVICES), and ``NpuSmiSource``.
"""

from npudist.telemetry.sources.merge import merge_readings
from npudist.telemetry.sources.npu_smi.kv import parse_kv, parse_kv_blocks
from npudist.telemetry.sources.npu_smi.mapping import (
    VisibleDevicesError,
    parse_mapping,
    rank_chip,
    with_logical_ids,
)
from npudist.telemetry.sources.npu_smi.source import QUERIES, NpuSmiSource
from npudist.telemetry.sources.npu_smi.table import NpuSmiTable, parse, parse_processes, parse_table

__all__ = [
    "QUERIES",
    "NpuSmiSource",
    "NpuSmiTable",
    "VisibleDevicesError",
    "merge_readings",
    "parse",
    "parse_kv",
    "parse_kv_blocks",
    "parse_mapping",
    "parse_processes",
    "parse_table",
    "rank_chip",
    "with_logical_ids",
]
