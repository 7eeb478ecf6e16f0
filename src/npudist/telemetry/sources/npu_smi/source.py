"""The reader: runs ``npu-smi`` with a hard timeout and hands its text to the pure parsers."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from npudist.telemetry.sources.npu_smi.kv import parse_kv
from npudist.telemetry.sources.npu_smi.mapping import (
    VISIBLE_DEVICES_VAR,
    parse_mapping,
    rank_chip,
    with_logical_ids,
)
from npudist.telemetry.sources.npu_smi.table import NpuSmiTable, parse_table
from npudist.telemetry.sources.readings import (
    DeviceReading,
    ParseError,
    ProcessReading,
    RankDevice,
    Source,
    SourceError,
)
from npudist.telemetry.sources.tool_call import call_tool

QUERIES = ("usages", "power", "temp", "memory", "health", "common")
"""``npu-smi info -t TYPE`` values parse_kv understands (Ascend npu-smi reference, "info -t")."""
MAPPING_RETRY_READS = 20
"""After a failed ``info -m``, reads without logical IDs before asking again (a hung call costs a timeout)."""

log = logging.getLogger("npudist.telemetry")


class NpuSmiSource(Source):
    """Huawei Ascend devices via ``npu-smi info``; every failure is a SourceError with a short reason."""

    name = "npu-smi"
    vendor = "npu"

    def __init__(self, binary: str = "npu-smi", timeout: float = 5.0) -> None:
        self.binary = binary
        self.timeout = timeout
        self._mapping: dict[tuple[int, int], int] | None = None
        self._mapping_wait = 0

    def run(self, *args: str) -> str:
        """stdout of ``npu-smi ARGS``; SourceError reason missing / timeout / exit_code."""
        return call_tool(self.binary, args, self.timeout,
                         "install the Ascend driver (it ships npu-smi) or pass the binary's full path")

    def table(self) -> NpuSmiTable:
        """Devices, processes and skipped rows from one ``npu-smi info`` run."""
        text = self.run("info")
        try:
            return parse_table(text)
        except ParseError as exc:
            raise SourceError("parse", f"`{self.binary} info` output unreadable: {exc}") from None

    def read(self) -> list[DeviceReading]:
        """Devices from ``npu-smi info``, with logical IDs from ``info -m`` where the table has none (910B
        tables print only NPU and chip), so ``npudist_device_info{logical_id}`` joins ranks to chips."""
        devices = self.table().devices
        mapping = self._cached_mapping()
        return with_logical_ids(devices, mapping) if mapping else list(devices)

    def _cached_mapping(self) -> dict[tuple[int, int], int] | None:
        # The mapping is fixed while the driver is loaded: read it once, and after a failure only every
        # MAPPING_RETRY_READS reads, so a broken `info -m` never doubles the cost of every poll.
        if self._mapping is None:
            if self._mapping_wait > 0:
                self._mapping_wait -= 1
                return None
            try:
                self._mapping = self.logical_ids()
            except SourceError as exc:
                log.debug("no logical device ids: %s", exc)
                self._mapping_wait = MAPPING_RETRY_READS
        return self._mapping

    def locate(self, env: Mapping[str, str], device_index: int) -> RankDevice:
        """The chip behind ``npu:device_index`` under ``env``'s ASCEND_RT_VISIBLE_DEVICES; SourceError when
        ``info -m`` fails, VisibleDevicesError when the variable names no chip of this node."""
        return rank_chip(self.logical_ids(), env.get(VISIBLE_DEVICES_VAR), device_index, VISIBLE_DEVICES_VAR)

    def processes(self) -> list[ProcessReading]:
        """Processes holding NPUs (for the doctor's "accelerators still busy" check)."""
        return list(self.table().processes)

    def logical_ids(self) -> dict[tuple[int, int], int]:
        """(NPU ID, Chip ID) -> Chip Logic ID from ``npu-smi info -m``."""
        text = self.run("info", "-m")
        try:
            return parse_mapping(text)
        except ParseError as exc:
            raise SourceError("parse", f"`{self.binary} info -m` output unreadable: {exc}") from None

    def query(self, kind: str, npu_id: int, chip_id: int | None = None) -> list[DeviceReading]:
        """Partial readings from ``npu-smi info -t KIND -i NPU_ID [-c CHIP_ID]``."""
        if kind not in QUERIES:
            raise ValueError(f"unknown npu-smi query {kind!r}; use one of {', '.join(QUERIES)}")
        args = ["info", "-t", kind, "-i", str(npu_id)] + (["-c", str(chip_id)] if chip_id is not None else [])
        text = self.run(*args)
        try:
            return parse_kv(text, npu_id=npu_id, chip_id=chip_id)
        except ParseError as exc:
            raise SourceError("parse", f"`{self.binary} {' '.join(args)}` output unreadable: {exc}") from None
