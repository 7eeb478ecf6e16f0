import contextlib
import socket
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npudist.telemetry.exposition.node_exporter import build, parse_interval
from npudist.telemetry.exposition.server import ExporterError, parse_listen, serve
from tests.telemetry.exp_helpers import ScriptedSource, eight_ascend, families, samples, scrape


@pytest.mark.parametrize(("text", "want"), [
    ("127.0.0.1:9400", ("127.0.0.1", 9400)), (":9401", ("127.0.0.1", 9401)), ("9402", ("127.0.0.1", 9402)),
    ("0.0.0.0:9403", ("0.0.0.0", 9403)), ("[::1]:9404", ("::1", 9404)), ("node7:80", ("node7", 80)),
])
def test_parse_listen(text, want):
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["", "host:", "127.0.0.1:99999", "127.0.0.1:0", "a:b:c", "host:port"])
def test_parse_listen_rejects_with_the_expected_form(text):
    with pytest.raises(ExporterError, match=r"--listen|port"):
        parse_listen(text)


@pytest.mark.parametrize(("text", "seconds"), [("5s", 5.0), ("500ms", 0.5), ("1m", 60.0), ("2.5", 2.5)])
def test_parse_interval(text, seconds):
    assert parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "-1s", "5h", "fast", "1e3"])
def test_parse_interval_rejects(text):
    with pytest.raises(ExporterError, match="--interval"):
        parse_interval(text)


@given(st.text(max_size=40))
def test_parsers_raise_only_their_own_error(text):
    for parse in (parse_listen, parse_interval):
        with contextlib.suppress(ExporterError):
            parse(text)


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        ex = build([], 1.0)
        with pytest.raises(ExporterError, match=f"127.0.0.1:{port} is already in use"):
            serve(ex.registry, "127.0.0.1", port)


def test_server_binds_loopback_by_default_and_serves_parseable_text():
    ex = build([ScriptedSource([eight_ascend()])], 1.0, node="n1")
    ex.pollers[0].poll_once()
    server = serve(ex.registry, port=0)
    try:
        assert server.host == "127.0.0.1"
        fams = families(scrape(server.url))
        assert len(samples(fams, "npudist_device_power_watts")) == 8
    finally:
        server.close()


def test_twenty_concurrent_scrapers_while_the_source_hangs():
    source = ScriptedSource([eight_ascend(), "hang"])
    ex = build([source], interval_s=0.05, node="n1", timeout_s=0.1)
    ex.pollers[0].poll_once()
    ex.pollers[0].start()  # now hung in its second read
    hung_by = time.monotonic() + 10
    while not ex.health.errors("fake").get("timeout") and time.monotonic() < hung_by:
        time.sleep(0.02)
    assert ex.health.errors("fake").get("timeout"), "the source never hung past its timeout"
    server = serve(ex.registry, port=0)
    results: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def scraper():
        try:
            for _ in range(5):
                text = scrape(server.url, timeout=5)
                with lock:
                    results.append(text)
        except BaseException as exc:
            failures.append(exc)

    began = time.monotonic()
    threads = [threading.Thread(target=scraper) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - began
    source.release.set()
    ex.close()
    server.close()
    assert failures == [] and len(results) == 100
    assert elapsed < 20  # 100 scrapes; a scrape that waited on the hung source would take >= 0.1 s each
    last = families(results[-1])
    assert samples(last, "npudist_device_power_watts")[
        (("chip", "0"), ("device", "4"), ("model", "910B3"), ("node", "n1"), ("vendor", "npu"))] == 94.0


@pytest.mark.parametrize("text", ["0:9400", "0.0:9400", "[::0]:9400", "0x0:9400"])
def test_listen_shorthands_for_every_interface_are_refused(text):
    with pytest.raises(ExporterError, match=r"would listen on every interface; write 0\.0\.0\.0"):
        parse_listen(text)


def test_serve_refuses_an_unasked_every_interface_host():
    ex = build([], 1.0)
    with pytest.raises(ExporterError, match="'0' would listen on every interface"):
        serve(ex.registry, "0", 0)
