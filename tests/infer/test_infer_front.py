"""The ensemble's HTTP front against hostile bodies and slow clients, served in-process by a one-rank ensemble."""

from __future__ import annotations

import contextlib
import json
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from npudist.httpserve import Limits
from npudist.infer import EnsembleServer, TorchRunner
from npudist.infer.http import MAX_BODY_BYTES, BadRequest, parse_batch, serve
from tests.httpserve.clients import Crowd, body, exchange, post, status

DEEP = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
HOSTILE = [  # (body or raw request, status, words of the message)
    (DEEP, 400, "nested too deeply"),
    (b'{"inputs": [[' + b"9" * 400 + b", 1]]}", 400, "float32's range"),  # too large for a float
    (b'{"inputs": [[' + b"9" * 5000 + b", 1]]}", 400, "limit"),  # past the int-string limit
    (b'{"inputs": [[1e39, 1]]}', 400, "float32's range"),  # finite float64, inf float32
    (b'{"inputs": [[-3.5e38, 1]]}', 400, "float32's range"),
    (b'{"inputs": [[1e400, 1]]}', 400, "finite number"),  # json reads it as inf
    (b'{"inputs": [[1, 2]], "x": "\xff"}', 400, "not JSON"),
]


class Doubler(nn.Module):
    def forward(self, x):
        return torch.stack([x[:, 0] * 2, x[:, 1]], dim=1)


@pytest.fixture
def front():
    """A one-rank ensemble served on a thread; yields (port, lines of the thread's outcome)."""
    server = EnsembleServer(TorchRunner(Doubler(), torch.device("cpu")), 2, input_features=2,
                            combine="mean_logits", max_batch=8)
    ready, outcome = threading.Event(), []
    port = []

    def run():
        try:
            serve(server, "127.0.0.1", 0, allow_shutdown=True, idle_seconds=0.5,
                  on_ready=lambda p: (port.append(p), ready.set()),
                  limits=Limits(max_connections=16, request_timeout_s=2.0, max_body_bytes=MAX_BODY_BYTES))
            outcome.append("stopped")
        except BaseException as exc:
            outcome.append(repr(exc))
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30) and port, outcome
    yield port[0], outcome
    with contextlib.suppress(OSError):
        exchange(port[0], post("/shutdown", b""))
    thread.join(10)
    assert outcome == ["stopped"]


GOOD = post("/predict", b'{"inputs": [[1, 5]]}')


def _good(port: int) -> dict:
    answer = exchange(port, GOOD)
    assert status(answer) == 200, answer
    return json.loads(body(answer))


def _stats(port: int) -> dict:
    return json.loads(body(exchange(port, b"GET /stats HTTP/1.1\r\n\r\n")))


def test_hostile_bodies_get_a_counted_4xx_and_the_server_keeps_serving(front):
    port, _ = front
    for payload, code, words in HOSTILE:
        answer = exchange(port, post("/predict", payload))
        assert (status(answer), words in json.loads(body(answer))["error"]) == (code, True), answer[:300]
        assert _good(port)["labels"] == [1]  # [2, 5] -> class 1
    for raw, code in [(post("/predict", b"{}", "\u00b2".encode()), 400),  # non-ASCII digit
                      (post("/predict", b"", str(MAX_BODY_BYTES + 1)), 413),
                      (b"POST /predict HTTP/1.1\r\n\r\n", 411)]:
        assert status(exchange(port, raw)) == code
        _good(port)
    assert _stats(port)["bad_requests"] == len(HOSTILE) + 3


def test_trickling_clients_neither_hold_the_front_nor_starve_good_requests(front):
    port, outcome = front
    crowd = Crowd(port, 12, how="body", pace=0.2)
    try:
        for _ in range(3):  # answered while twelve clients trickle bodies, with idle pings between
            assert _good(port)["ranks"] == 1
            assert _stats(port)["requests"] >= 1
        assert crowd.wait_answered(12, timeout=20) == 12  # cut off at the 2 s whole-request deadline
        assert all(status(a) == 408 for a in crowd.answers)
    finally:
        crowd.close()
    assert _stats(port)["timed_out_requests"] == 12 and outcome == []


def test_past_the_connection_cap_the_slowest_is_refused_and_good_requests_answered(front):
    port, _ = front
    crowd = Crowd(port, 16, how="idle")
    try:
        _good(port)
        assert crowd.wait_answered(1, timeout=10) >= 1
        assert status(crowd.answers[0]) == 503
    finally:
        crowd.close()
    assert _stats(port)["refused_busy"] >= 1


def test_nan_scores_are_a_500_never_nan_in_json():
    from npudist.infer.http import result_reply

    server = EnsembleServer(TorchRunner(Doubler(), torch.device("cpu")), 2, combine="mean_logits")
    result = server.predict(torch.tensor([[float("nan"), 1.0]]))
    reply = result_reply(server, result)
    assert reply.status == 500 and "non-finite" in json.loads(reply.body, parse_constant=pytest.fail)["error"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                               max_size=3), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON.map(lambda d: json.dumps({"inputs": d}).encode()),
                 st.lists(st.lists(st.integers() | st.floats(), min_size=2, max_size=2), min_size=1, max_size=3)
                 .map(lambda rows: json.dumps({"inputs": rows}).encode()),
                 st.binary(max_size=60)))
def test_parse_batch_returns_finite_float32_or_bad_request(payload):
    try:
        batch = parse_batch(payload, 2, 8)
    except BadRequest:
        return
    assert batch.dtype == torch.float32 and batch.shape[1] == 2 and bool(torch.isfinite(batch).all())
