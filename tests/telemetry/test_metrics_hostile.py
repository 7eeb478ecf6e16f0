"""Metrics servers under hostile clients: slow and idle connections, a descriptor limit, a failing render,
and prometheus_client's negotiation (OpenMetrics, gzip, name[]) through the coalescing front."""

from __future__ import annotations

import gzip
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from npudist.telemetry.exposition import server as metrics_server
from npudist.telemetry.exposition.node_exporter import build
from npudist.telemetry.exposition.server import CoalescedApp, serve
from tests.conftest import REPO, child_env, fakes_path
from tests.httpserve.clients import Crowd, exchange, status
from tests.telemetry.exp_helpers import ScriptedSource, eight_ascend, families, samples, scrape


@pytest.fixture
def exporter():
    ex = build([ScriptedSource([eight_ascend()])], 1.0, node="n1")
    ex.pollers[0].poll_once()
    ex.server = serve(ex.registry, port=0)
    yield ex
    ex.close()


def test_scrapes_answered_while_fifty_clients_idle_or_trickle(exporter):
    port = exporter.server.port
    crowds = [Crowd(port, 25, how="idle"), Crowd(port, 25, how="head", pace=0.2)]
    try:
        for _ in range(5):
            fams = families(scrape(exporter.server.url, timeout=10))
            assert len(samples(fams, "npudist_device_power_watts")) == 8
    finally:
        for c in crowds:
            c.close()
    assert len(samples(families(scrape(exporter.server.url)), "npudist_device_up")) == 8


def test_prometheus_client_negotiates_format_gzip_and_name_filter(exporter):
    req = urllib.request.Request(exporter.server.url + "?name[]=npudist_device_power_watts", headers={
        "Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        text = gzip.decompress(resp.read()).decode()
    assert text.rstrip().endswith("# EOF")
    names = {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}
    assert names == {"npudist_device_power_watts"}
    answer = exchange(exporter.server.port, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert status(answer) == 405


class Exploding:
    def __init__(self) -> None:
        self.armed = True

    def collect(self):
        if self.armed:
            raise RuntimeError("collector exploded")
        return iter(())


def test_a_render_that_raised_is_a_500_then_scrapes_recover():
    registry, bomb = CollectorRegistry(auto_describe=False), Exploding()
    registry.register(bomb)
    server = serve(registry, port=0)
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            scrape(server.url)
        assert info.value.code == 500 and "collector exploded" in info.value.read().decode()
        bomb.armed = False
        scrape(server.url)
    finally:
        server.close()


def test_a_scrape_waiting_on_a_render_that_raised_gets_the_error(monkeypatch):
    waiting, release, calls = threading.Event(), threading.Event(), []

    class SpyEvent(threading.Event):
        def wait(self, timeout=None):
            waiting.set()
            return super().wait(timeout)

    @dataclass
    class SpyRender(metrics_server._Render):
        done: threading.Event = field(default_factory=SpyEvent)

    monkeypatch.setattr(metrics_server, "_Render", SpyRender)

    def app(environ, start_response):
        calls.append(1)
        release.wait(10)
        raise RuntimeError("render failed")

    coalesced, errors = CoalescedApp(app), []

    def scrape_once():
        try:
            coalesced({"REQUEST_METHOD": "GET"}, lambda *a: None)
        except RuntimeError as exc:
            errors.append(exc)

    leader = threading.Thread(target=scrape_once)
    leader.start()
    while not calls:
        time.sleep(0.01)
    follower = threading.Thread(target=scrape_once)
    follower.start()
    assert waiting.wait(10)
    release.set()
    leader.join(10)
    follower.join(10)
    assert len(calls) == 1 and len(errors) == 2  # one render, both scrapes failed with it



def test_kept_answers_are_reused_then_refreshed_in_the_background():
    now = [100.0]
    renders = []
    refreshed = threading.Event()

    def app(environ, start_response):
        renders.append(environ.get("QUERY_STRING", ""))
        if len(renders) > 1:
            refreshed.set()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"render {len(renders)}".encode()]

    coalesced = CoalescedApp(app, max_age_s=1.0)
    clock = time.monotonic
    try:
        time.monotonic = lambda: now[0]  # the kept answers' ages, under test control
        get = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics"}
        assert coalesced(dict(get), lambda *a: None) == [b"render 1"]
        now[0] += 0.5
        assert coalesced(dict(get), lambda *a: None) == [b"render 1"] and len(renders) == 1  # fresh enough
        now[0] += 1.0  # 1.5 s old: still served, while a background render replaces it
        assert coalesced(dict(get), lambda *a: None) == [b"render 1"]
        assert refreshed.wait(10)
        deadline = clock() + 10
        while coalesced(dict(get), lambda *a: None) != [b"render 2"] and clock() < deadline:
            time.sleep(0.01)
        assert coalesced(dict(get), lambda *a: None) == [b"render 2"]
        filtered = {**get, "QUERY_STRING": "name[]=npudist_link_up"}
        coalesced(dict(filtered), lambda *a: None)
        coalesced(dict(filtered), lambda *a: None)
        assert renders.count("name[]=npudist_link_up") == 2  # name[] answers are never kept
    finally:
        time.monotonic = clock

EXPORTER = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    from npudist.telemetry.exposition.node_exporter import build
    from npudist.telemetry.exposition.server import serve
    from npudist.telemetry.sources.npu_smi import NpuSmiSource
    ex = build([NpuSmiSource(timeout=20)], 0.5, node="n1", timeout_s=20)  # slow machines: no timeouts
    ex.server = serve(ex.registry, "127.0.0.1", 0)
    for p in ex.pollers:
        p.start()
    print(ex.server.port, flush=True)
    sys.stdin.read()
    ex.close()
""")


def _last_success(url: str) -> float:
    fams = families(scrape(url, timeout=10))
    return samples(fams, "npudist_collector_last_success_timestamp_seconds").get((("collector", "npu-smi"),), 0.0)


@pytest.mark.subprocess
@pytest.mark.slow
def test_sixty_half_sent_requests_under_a_64_descriptor_limit():
    env = child_env({"PATH": fakes_path()})
    proc = subprocess.Popen([sys.executable, "-c", EXPORTER], env=env, cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    crowds = []
    try:
        port = int(proc.stdout.readline())
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while not _last_success(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        crowds = [Crowd(port, 30, how="idle"), Crowd(port, 30, how="head", pace=0.5)]
        before = _last_success(url)
        deadline = time.monotonic() + 30
        while _last_success(url) <= before and time.monotonic() < deadline:
            time.sleep(0.2)
        text = scrape(url, timeout=10)
        assert _last_success(url) > before, "the poller stopped reading npu-smi while connections were held"
        assert samples(families(text), "npudist_device_up")
        errors = samples(families(text), "npudist_collector_errors", "npudist_collector_errors_total")
        # Out of descriptors, running npu-smi fails as reason "missing" (EMFILE); a loaded machine may
        # still time a read out, which is not what this test is about.
        assert not [labels for labels in errors if labels[0] == ("collector", "npu-smi")
                    and labels[1][1] != "timeout"], errors
    finally:
        for c in crowds:
            c.close()
        _, err = proc.communicate("", timeout=30)
    assert proc.returncode == 0, err
    assert "Too many open files" not in err
