"""The HTTP front: pure head parsing against hostile bytes, then a served front under slow and idle clients."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npudist.httpserve import Front, HttpError, Limits, Reply, binds_everything_unasked, parse_head
from npudist.httpserve.request import head_end
from tests.httpserve.clients import Crowd, exchange, status

GOOD = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"


@pytest.mark.parametrize(("head", "code", "text"), [
    (b"GET /x\r\n\r\n", 400, "malformed request line"),
    (b"get /x HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    (b"GET /x HTTP/2.0\r\n\r\n", 400, "malformed request line"),
    (b"POST /x HTTP/1.1\r\nContent-Length: \xc2\xb2\r\n\r\n", 400, "ASCII digits"),  # "²": int() reads it
    (b"POST /x HTTP/1.1\r\nContent-Length: \xd9\xa3\r\n\r\n", 400, "ASCII digits"),  # Arabic-Indic 3
    (b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "ASCII digits"),
    (b"POST /x HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", 400, "ASCII digits"),
    (b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "conflicting"),
    (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411, "Content-Length"),
    (b"POST /x HTTP/1.1\r\nContent-Length: 11\r\n\r\n", 413, "over this server's 10-byte limit"),
    (b"GET /x HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(200)) + b"\r\n", 431, "headers"),
])
def test_parse_head_rejects_with_status_and_reason(head, code, text):
    with pytest.raises(HttpError) as info:
        parse_head(head, max_body=10)
    assert info.value.status == code and text in str(info.value)


def test_parse_head_reads_a_good_head():
    head = parse_head(b"POST /predict?a=1 HTTP/1.1\r\nContent-Length: 7\r\nAccept: x\r\n\r\n", max_body=10)
    assert (head.method, head.path, head.query, head.content_length, head.headers["accept"]) == (
        "POST", "/predict", "a=1", 7, "x")
    assert parse_head(GOOD, 0).content_length is None


def test_head_end_waits_then_caps():
    assert head_end(b"GET / HTTP/1.1\r\nHost", 100) is None
    assert head_end(GOOD, 100) == len(GOOD)
    with pytest.raises(HttpError, match="over 20 bytes") as info:
        head_end(b"GET /" + b"a" * 30, 20)
    assert info.value.status == 431


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=200).map(lambda t: ("GET / HTTP/1.1\r\n" + t).encode()))
def test_head_parsing_raises_only_http_error(data):
    with contextlib.suppress(HttpError):
        end = head_end(data, 256)
        if end is not None:
            parse_head(data[:end], max_body=1000)


@pytest.mark.parametrize(("host", "widened"), [
    ("0", True), ("0.0", True), ("0x0", True), ("000.0.0.0", True), ("::0", True), ("0:0::0", True),
    ("0.0.0.0", False), ("::", False), ("127.0.0.1", False), ("::1", False), ("localhost", False), ("", True),
])
def test_only_spelled_out_addresses_bind_every_interface(host, widened):
    assert binds_everything_unasked(host) is widened


@pytest.fixture
def gated_front():
    """A front whose handler waits for ``gate`` before answering 200 (requests stay in flight)."""
    gate = threading.Event()

    def handle(request):
        gate.wait(10)
        return Reply(200, b"ok")

    front = Front("127.0.0.1", 0, Limits(max_connections=4, request_timeout_s=1.5, workers=4)).start(handle)
    yield front, gate
    gate.set()
    front.close()


def test_idle_and_trickling_clients_are_cut_off_and_good_ones_answered(gated_front):
    front, gate = gated_front
    gate.set()
    crowd = Crowd(front.port, 3, how="head", pace=0.2)
    try:
        assert status(exchange(front.port, GOOD)) == 200  # answered while three trickle
        assert crowd.wait_answered(3, timeout=15) == 3  # every trickler cut off, whatever its pace
        assert all(status(a) == 408 for a in crowd.answers), crowd.answers
    finally:
        crowd.close()
    assert status(exchange(front.port, GOOD)) == 200


def test_at_the_cap_the_slowest_request_makes_room(gated_front):
    front, gate = gated_front
    gate.set()
    crowd = Crowd(front.port, 4, how="idle")  # fills the cap of 4 with idle connections
    try:
        assert status(exchange(front.port, GOOD)) == 200
        assert crowd.wait_answered(1, timeout=10) >= 1
        assert status(crowd.answers[0]) == 503
    finally:
        crowd.close()


def test_when_every_connection_is_being_answered_a_newcomer_gets_503(gated_front):
    front, gate = gated_front
    busy = [socket.create_connection(("127.0.0.1", front.port), timeout=10) for _ in range(4)]
    try:
        for s in busy:
            s.sendall(GOOD)
        deadline_loops = 200
        while front.open_connections < 4 and deadline_loops:
            threading.Event().wait(0.02)
            deadline_loops -= 1
        answer = exchange(front.port, GOOD)
        assert status(answer) == 503 and b"4 connections open" in answer
        gate.set()
        assert all(status(s.recv(4096)) == 200 for s in busy)
    finally:
        for s in busy:
            s.close()
    assert front.refused[503] == 1


def test_a_handler_that_raises_is_a_500_and_the_front_keeps_serving():
    calls = []

    def handle(request):
        calls.append(request.head.path)
        if request.head.path == "/boom":
            raise RuntimeError("collector exploded")
        return Reply(200, b"ok")

    front = Front("127.0.0.1", 0).start(handle)
    try:
        answer = exchange(front.port, b"GET /boom HTTP/1.1\r\n\r\n")
        assert status(answer) == 500 and b"collector exploded" in answer
        assert status(exchange(front.port, GOOD)) == 200
    finally:
        front.close()
