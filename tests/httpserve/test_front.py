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
    # RFC 9112 5.1: whitespace between a field name and its colon is a 400, whatever the field.
    (b"POST /x HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n", 400, "no space before it"),
    (b"POST /x HTTP/1.1\r\nContent-Length\t: 3\r\n\r\n", 400, "no space before it"),
    (b"GET /x HTTP/1.1\r\nHost: a\r\n folded: value\r\n\r\n", 400, "no folded lines"),  # RFC 9112 5.2
    (b"GET /x HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed header line"),
    (b"GET /x HTTP/1.1\r\n: empty name\r\n\r\n", 400, "malformed header line"),
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


def test_the_end_of_a_head_sent_a_byte_at_a_time_is_searched_for_once(monkeypatch):
    """Each read searches only the new bytes (and the 3 before them), not the head from byte 0 again."""
    from npudist.httpserve import front as front_mod
    from npudist.httpserve import request as request_mod

    searched = []
    real = request_mod._HEAD_END

    class Counting:
        def search(self, buf, pos=0, endpos=None):
            searched.append(min(len(buf), endpos) - pos)
            return real.search(buf, pos, endpos)

    monkeypatch.setattr(request_mod, "_HEAD_END", Counting())
    head = b"GET /x HTTP/1.1\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"v" * 60) for i in range(60)) + b"\r\n"
    front = Front("127.0.0.1", 0, Limits(max_head_bytes=16 * 1024))
    conn = front_mod._Conn(socket.socket(), ("127.0.0.1", 1), deadline=0)
    try:
        for i in range(len(head)):
            conn.buf += head[i:i + 1]
            request = front._complete(conn)
        assert request is not None and request.head.path == "/x" and conn.head.size == len(head)
    finally:
        conn.sock.close()
        front.close()
    assert sum(searched) <= 4 * len(head)  # from byte 0 each time: len(head)**2 / 2 bytes


def test_a_client_that_expects_100_continue_gets_it_before_sending_its_body():
    front = Front("127.0.0.1", 0, Limits(max_body_bytes=100)).start(lambda r: Reply(200, b"got " + r.body))
    try:
        with socket.create_connection(("127.0.0.1", front.port), timeout=10) as s:
            s.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
            interim = b""
            while not interim.endswith(b"\r\n\r\n"):
                chunk = s.recv(1)  # times out (10 s) when the server stays silent, as curl waits 1 s
                assert chunk, interim
                interim += chunk
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            s.sendall(b"hello")
            answer = b"".join(iter(lambda: s.recv(65536), b""))
        assert status(answer) == 200 and answer.endswith(b"got hello")
        # Without the expectation (or in HTTP/1.0, RFC 9110 10.1.1) no interim reply comes first.
        answer = exchange(front.port, b"POST /x HTTP/1.0\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nhi")
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"got hi")
    finally:
        front.close()
