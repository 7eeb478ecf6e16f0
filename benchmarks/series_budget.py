"""Series one node exporter serves with every reliability collector on, for an 8-chip Ascend node.

    python benchmarks/series_budget.py [--chips 8]

Each chip answers with the fullest recorded outputs (tests/fakes/ascend-tools/): 950 ECC (HBM, 8 rows) plus the
MindCluster doc's DDR rows, the 950 usages split, an Alarm with 3 error codes, the 4-lane optical module, and
a `-stat` holding every counter the 910B hccn_tool prints (constructed from the counter table: no full
recording exists). Prints samples per family group and the total, against SERIES_BUDGET_PER_NODE.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.node_exporter import SERIES_BUDGET_PER_NODE, collectors
from npudist.telemetry.exposition.reliability_metrics import ReliabilityCollector
from npudist.telemetry.exposition.selection import parse_selection
from npudist.telemetry.sources.hccn import PARSERS, STAT_COUNTERS
from npudist.telemetry.sources.measurements import ChipMeasurements
from npudist.telemetry.sources.npu_smi.reliability import parse_ecc, parse_health, parse_usages

REC = Path(__file__).resolve().parents[1] / "tests" / "fakes" / "ascend-tools"


def full_chip() -> tuple[list, list]:
    """(chip measurements, NIC measurements) of one fully reporting chip."""
    def rec(name: str) -> str:
        return (REC / name).read_text()

    chip = (parse_ecc(rec("npu-smi-ecc-driver950doc-1.txt"))
            + [x for x in parse_ecc(rec("npu-smi-ecc-mindclusterdoc-1.txt")) if dict(x.labels)["memory"] == "ddr"]
            + parse_health(rec("npu-smi-health-mindcluster-2.txt"))
            + parse_usages(rec("npu-smi-usages-driver950doc-1.txt")))
    stat = "packet statistics:\n" + "".join(f"{name}:0\n" for name in STAT_COUNTERS)
    nic = (PARSERS["link"](rec("hccn_tool-link-mindclusterdoc-1.txt"))
           + PARSERS["link_stat"](rec("hccn_tool-link_stat-hccldoc-1.txt")) + PARSERS["stat"](stat)
           + PARSERS["optical"](rec("hccn_tool-optical-mindcluster-1.txt"))
           + PARSERS["net_health"](rec("hccn_tool-net_health-mindclusterdoc-3.txt"))
           + PARSERS["speed"]("Speed: 200000 Mb/s\n") + PARSERS["ip"](rec("hccn_tool-ip-mindcluster-1.txt")))
    return [x.__class__(x.metric, x.value, x.labels) for x in chip], nic


class _Snapshot:
    def __init__(self, readings: list) -> None:
        self.readings, self.fresh = tuple(readings), True


class _Poller:
    name = "budget"

    def __init__(self, readings: list) -> None:
        self._snap = _Snapshot(readings)

    def snapshot(self) -> _Snapshot:
        return self._snap


def count(chips: int) -> Counter:
    chip, nic = full_chip()
    readings = []
    for i in range(chips):
        readings.append(ChipMeasurements("npu", i, 0, "", tuple(chip)))
        readings.append(ChipMeasurements("npu", i, 0, str(i), tuple(nic)))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReliabilityCollector([_Poller(readings)], CollectorHealth(), parse_selection("all", collectors()),
                                           node="bench"))
    per: Counter = Counter()
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        group = fam.name.split("_")[1] + ("_optical" if "_optical_" in fam.name else "")
        per[group] += len(fam.samples)
    return per


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chips", type=int, default=8)
    args = p.parse_args()
    per = count(args.chips)
    for group, n in sorted(per.items()):
        print(f"{group:14s} {n:6d}")
    total = sum(per.values())
    print(f"{'total':14s} {total:6d}  ({total / args.chips:.0f} per chip; budget {SERIES_BUDGET_PER_NODE} per node)")


if __name__ == "__main__":
    main()
