"""Scrape latency of a full exporter: 8 simulated Ascend chips plus every collector (the reliability and
network families too: 992 more series), 20 concurrent scrapers.

    python benchmarks/scrape_latency.py [--seconds 10] [--scrapers 20] [--period 0.25] [--hostile 300]
    python benchmarks/scrape_latency.py --ab 6 [--block 3] [--hostile 300]   # same-run A/B, see _ab

The exporter runs in its own process (as in production, scrapers do not share its interpreter).
Phases: the device source answering, then the same source hung (as a stuck npu-smi, with the fake
hccn_tool hanging under the real hccn_tool sweep, which kills it every 2 s), each measured
paced (every scraper every --period s) and closed-loop (every scraper back to back, saturation);
then both again with --hostile connections held open the whole time (half send a request line and
idle, half trickle one header byte a second; each reconnects when the server cuts it off, as an
attacker would). Target: median <= 5 ms and p99 <= 20 ms under 20 concurrent scrapers, including while
the source hangs; p99 <= 20 ms with 300 idle or trickling connections open.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import threading
import time
from dataclasses import dataclass, field

GIB = 1024**3


def _exporter(port_out: mp.Queue, hang: bool, reliability: bool = True) -> None:
    from prometheus_client import CollectorRegistry

    from npudist.telemetry.exposition.collector_health import CollectorHealth
    from npudist.telemetry.exposition.device_metrics import DeviceCollector
    from npudist.telemetry.exposition.server import serve
    from npudist.telemetry.job.allocator import AllocatorCollector
    from npudist.telemetry.job.comm_metrics import CommCollector
    from npudist.telemetry.job.step_timer import TrainingMetrics
    from npudist.telemetry.sources.poller import Poller
    from npudist.telemetry.sources.readings import DeviceReading, Source

    readings = [DeviceReading("npu", i, 0, name="910B3", health="OK", power_watts=90.0 + i,
                              temperature_celsius=40.0 + i, utilization_ratio=0.5, frequency_hertz=1.8e9,
                              memory_used_bytes=3 * GIB, memory_total_bytes=64 * GIB,
                              bus_id=f"0000:C{i}:00.0", logical_id=i) for i in range(8)]

    class FakeNpuSmi(Source):
        name, vendor, calls = "npu-smi", "npu", 0

        def read(self):
            self.calls += 1
            if hang and self.calls > 1:
                threading.Event().wait()  # hangs for good, like npu-smi stuck in the driver
            return readings

    @dataclass(frozen=True)
    class Op:
        op: str
        backend: str = "hccl"
        calls: int = 1000
        bytes: int = 4096000
        duration_sum_seconds: float = 0.5
        duration_count: int = 1000
        duration_buckets: tuple = tuple((b, 1000) for b in (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01,
                                                             0.05, 0.1, 0.5, 1.0, 5.0, 30.0, float("inf")))
        inflight: int = 0
        adaptations: dict = field(default_factory=lambda: {"cast": 2, "contiguous": 5})

    @dataclass(frozen=True)
    class Stats:
        ops: tuple

    comm = Stats(tuple(Op(name) for name in ("all_reduce", "all_gather", "broadcast", "reduce_scatter")))
    health = CollectorHealth()
    poller = Poller(FakeNpuSmi(), health, interval_s=1.0, timeout_s=0.5)
    poller.poll_once()
    poller.start()
    labels = ["0", "0", "bench", "", ""]  # catalogue.RANK_LABELS: rank, local_rank, node, device, chip
    training = TrainingMetrics(labels)
    for i in range(1000):
        training.steps.observe(0.03 + i * 1e-5)
    for op in ("matmul", "softmax", "layer_norm", "attention"):
        training.observe_op(op, 1e-4)
    reg = CollectorRegistry(auto_describe=False)
    allocator = {"allocated_bytes": 3 * GIB, "reserved_bytes": 4 * GIB}
    for c in (DeviceCollector([poller], health, "bench"), health, training,
              AllocatorCollector(lambda: allocator, health, labels),
              CommCollector(health, labels, stats=lambda: comm)):
        reg.register(c)
    from npudist.telemetry.exposition.node_exporter import RENDER_MAX_AGE_S

    for c in _reliability(health, hang) if reliability else []:
        reg.register(c)
    # As `npudist exporter` serves: answers kept up to RENDER_MAX_AGE_S, refreshed in the background.
    server = serve(reg, "127.0.0.1", 0, max_age_s=RENDER_MAX_AGE_S if reliability else 0.0)
    port_out.put(server.port)
    threading.Event().wait()


def _reliability(health, hang: bool) -> list:
    """Every reliability collector on for 8 chips: the fullest recorded answers (benchmarks/series_budget.py,
    992 series) served from the last good sweep, and beside it the real hccn_tool sweep against the fake
    hccn_tool; with --hang that tool hangs, so every sweep times out, kills its process group and skips."""
    import os
    import sys
    import tempfile
    from pathlib import Path

    from npudist.telemetry.exposition.node_exporter import collectors
    from npudist.telemetry.exposition.reliability_metrics import ReliabilityCollector
    from npudist.telemetry.exposition.selection import parse_selection
    from npudist.telemetry.sources.ascend_sweep import HCCN_QUERIES, AscendSweep, Chip
    from npudist.telemetry.sources.measurements import ChipMeasurements
    from npudist.telemetry.sources.poller import Poller
    from npudist.telemetry.sources.readings import Source

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    from series_budget import full_chip

    chip, nic = full_chip()
    full = [m for i in range(8) for m in (ChipMeasurements("npu", i, 0, "", tuple(chip)),
                                          ChipMeasurements("npu", i, 0, str(i), tuple(nic)))]

    class LastGood(Source):
        name, vendor, calls = "npu-smi-reliability", "npu", 0

        def read(self):
            self.calls += 1
            if hang and self.calls > 1:
                threading.Event().wait()
            return full

    shim = Path(tempfile.mkdtemp(prefix="npudist-bench-"))
    (shim / "python3").symlink_to(sys.executable)
    os.environ["PATH"] = os.pathsep.join([str(shim), str(root / "tests" / "fakes" / "bin"), os.environ["PATH"]])
    os.environ["NPUDIST_FAKE_HCCN_MODE"] = "hang" if hang else "print"
    hccn = AscendSweep(HCCN_QUERIES, health, name="hccn_tool", hccn_tool=str(root / "tests/fakes/bin/hccn_tool"),
                       timeout=0.5, chips=[Chip(i, 0, i) for i in range(8)])
    pollers = [Poller(LastGood(), health, interval_s=1.0, timeout_s=0.5, record=ChipMeasurements),
               Poller(hccn, health, interval_s=2.0, timeout_s=2.0, record=ChipMeasurements)]
    pollers[0].poll_once()
    for p in pollers:
        p.start()
    return [ReliabilityCollector(pollers, health, parse_selection("all", collectors()), "bench")]


async def _scrape(port: int) -> float:
    began = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    await writer.drain()
    body = await reader.read()
    writer.close()
    if b"npudist_device_power_watts{" not in body:
        raise RuntimeError("scrape lacks device metrics")
    return time.perf_counter() - began


async def _load(port: int, scrapers: int, seconds: float, period: float | None) -> list[float]:
    out: list[float] = []
    stop = time.perf_counter() + seconds

    async def one(offset: float) -> None:
        if period:
            await asyncio.sleep(offset)
        while time.perf_counter() < stop:
            began = time.perf_counter()
            out.append(await _scrape(port))
            if period:
                await asyncio.sleep(max(0.0, period - (time.perf_counter() - began)))

    await asyncio.gather(*(one(i * (period or 0) / scrapers) for i in range(scrapers)))
    return out


@dataclass
class Hostile:
    """Connections held open against the server for a whole phase."""

    port: int
    count: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    open_now: int = 0
    cut_off: int = 0

    async def _one(self, trickle: bool) -> None:
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.5)
                continue
            self.open_now += 1
            writer.write(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            while not self.stop.is_set():
                try:
                    if trickle:
                        writer.write(b"a")
                    if not await asyncio.wait_for(reader.read(4096), 1.0):
                        break
                except asyncio.TimeoutError:
                    continue
                except OSError:
                    break
            self.open_now -= 1
            self.cut_off += not self.stop.is_set()
            writer.close()

    async def hold(self) -> None:
        await asyncio.gather(*(self._one(i % 2 == 1) for i in range(self.count)))


async def _phase(port: int, scrapers: int, seconds: float, period: float | None, hostile: int
                 ) -> tuple[list[float], str]:
    crowd = Hostile(port, hostile)
    holder = asyncio.ensure_future(crowd.hold())
    await asyncio.sleep(1.0 if hostile else 0)  # connections open before the clock starts
    lat = await _load(port, scrapers, seconds, period)
    held = f", {crowd.open_now} hostile open at the end, {crowd.cut_off} cut off" if hostile else ""
    crowd.stop.set()
    await holder
    return lat, held


def _summary(lat: list[float]) -> str:
    lat = sorted(lat)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    return f"n={len(lat):5d} median={statistics.median(lat) * 1e3:6.2f} ms  p99={p99 * 1e3:6.2f} ms"


def _p99(lat: list[float]) -> float:
    lat = sorted(lat)
    return lat[min(len(lat) - 1, int(0.99 * len(lat)))]


def _ab(port: int, args: argparse.Namespace) -> None:
    """Paced scraping in alternating blocks without and with the hostile connections (ABBA order), so
    both conditions see the same machine load; prints each condition's pooled figures and their ratio."""
    pooled: dict[int, list[float]] = {0: [], args.hostile: []}
    for block in range(args.ab):
        order = (0, args.hostile) if block % 2 == 0 else (args.hostile, 0)
        for hostile in order:
            lat, _ = asyncio.run(_phase(port, args.scrapers, args.block, args.period, hostile))
            pooled[hostile].extend(lat)
    base, loaded = pooled[0], pooled[args.hostile]
    print(f"A/B {args.ab} blocks of {args.block}s, paced x{args.scrapers}: no hostile {_summary(base)}")
    print(f"A/B {args.ab} blocks of {args.block}s, paced x{args.scrapers}: +{args.hostile} hostile {_summary(loaded)}")
    print(f"A/B ratio with/without hostile: median {statistics.median(loaded) / statistics.median(base):.2f}, "
          f"p99 {_p99(loaded) / _p99(base):.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--scrapers", type=int, default=20)
    p.add_argument("--period", type=float, default=0.25)
    p.add_argument("--hostile", type=int, default=300, help="idle/trickling connections in the last phases")
    p.add_argument("--ab", type=int, default=0, help="instead: this many interleaved blocks without/with hostile")
    p.add_argument("--block", type=float, default=3.0, help="seconds per --ab block")
    p.add_argument("--no-reliability", action="store_true",
                   help="without the reliability families and without kept renders (the rank exporter's setup)")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    if args.ab:
        q = ctx.Queue()
        proc = ctx.Process(target=_exporter, args=(q, False, not args.no_reliability), daemon=True)
        proc.start()
        port = q.get(timeout=60)
        asyncio.run(_load(port, args.scrapers, 1.0, args.period))  # warm-up
        _ab(port, args)
        proc.terminate()
        proc.join(5)
        return
    for hostile in sorted({0, args.hostile}):
        for hang in (False, True):
            q = ctx.Queue()
            proc = ctx.Process(target=_exporter, args=(q, hang, not args.no_reliability), daemon=True)
            proc.start()
            port = q.get(timeout=60)
            time.sleep(1.5 if hang else 0.2)  # with --hang the second read is stuck by now
            asyncio.run(_load(port, args.scrapers, 1.0, args.period))  # warm-up
            paced, held_p = asyncio.run(_phase(port, args.scrapers, args.seconds, args.period, hostile))
            closed, held_c = asyncio.run(_phase(port, args.scrapers, args.seconds, None, hostile))
            proc.terminate()
            proc.join(5)
            state = ("source hung" if hang else "source ok  ") + (f" +{hostile} hostile" if hostile else "")
            print(f"{state} paced every {args.period}s x{args.scrapers}: {_summary(paced)}{held_p}")
            print(f"{state} closed loop      x{args.scrapers}: {_summary(closed)}{held_c}", flush=True)


if __name__ == "__main__":
    main()
