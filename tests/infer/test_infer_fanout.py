"""The fan-out front (npudist.infer.fanout) in one process: members served on threads over real HTTP, one lost,
late, failing or back, and the answers combined from those that answered, worked out by hand."""

from __future__ import annotations

import http.client
import threading

import pytest
import torch
from torch import nn

from npudist.infer import EnsembleError, EnsembleServer, TorchRunner, fanout
from npudist.infer.fanout import FanoutFront, Member, MemberEndpoint, WireError, decode, encode

TOKEN = "t0ken"


class Shift(nn.Module):
    """Member r answers logits [x0 + r, x1]: with mean_logits, the ensemble of members S answers
    [x0 + mean(S), x1], so which members were combined shows in the scores."""

    def __init__(self, r: int, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.r, self.gate = r, gate

    def forward(self, x):
        if self.gate is not None:
            self.gate.wait(30)
        if self.r == 1 and (x == 999).any():
            raise ValueError("member 1 refuses 999")
        return torch.stack([x[:, 0] + self.r, x[:, 1]], dim=1)


def _server(r: int, gate: threading.Event | None = None) -> EnsembleServer:
    return EnsembleServer(TorchRunner(Shift(r, gate), torch.device("cpu")), 2, input_features=2,
                          combine="mean_logits")


@pytest.fixture
def ensemble():
    """Rank 0's front and members 1-3 on their own endpoints; member 3 blocks while ``gate`` is clear."""
    gate = threading.Event()
    gate.set()
    endpoints = [MemberEndpoint(_server(r, gate if r == 3 else None), "127.0.0.1").start(TOKEN) for r in (1, 2, 3)]
    members = [Member(r, f"board{r}", "127.0.0.1", e.front.port) for r, e in zip((1, 2, 3), endpoints, strict=True)]
    front = FanoutFront(_server(0), members, TOKEN, deadline_s=1.0)
    yield front, endpoints, gate
    gate.set()
    front.stop()
    for e in endpoints:
        e.close()


X = torch.tensor([[1.0, 2.0], [-3.0, 0.5]])


def _expected(ranks: list[int]) -> list[list[float]]:
    shift = sum(ranks) / len(ranks)
    return [[1.0 + shift, 2.0], [-3.0 + shift, 0.5]]


def test_the_wire_carries_float32_and_names_what_does_not_fit():
    t = torch.tensor([[1.5, -2.0, 3.25]])
    shape, body = encode(t)
    assert torch.equal(decode(shape, body), t)
    for args, words in [(("3", body), "rows,columns"), (("1,2", body), "needs 8"), (("1,3", body, 2), "3 columns"),
                        (("0,3", b""), "at least 1"), ((None, body), "rows,columns")]:
        with pytest.raises(WireError, match=words):
            decode(*args)


def test_every_member_answering_gives_the_mean_of_all(ensemble):
    front, _, _ = ensemble
    result = front.request(X)
    assert (result.world_size, result.degraded, result.missing) == (4, False, ())
    assert torch.allclose(result.scores, torch.tensor(_expected([0, 1, 2, 3])))
    assert front.stats.members_answering == front.stats.members_expected == 4


def test_a_lost_member_degrades_the_answers_and_is_skipped_while_down(ensemble):
    front, endpoints, _ = ensemble
    endpoints[1].close()  # member 2's process is gone: nothing listens on its port
    first = front.request(X)
    assert (first.world_size, first.degraded) == (3, True)
    assert torch.allclose(first.scores, torch.tensor(_expected([0, 1, 3])))
    (why,) = first.missing
    assert "rank 2 on board2" in why and "refused" in why
    second = front.request(X)
    assert "skipped for" in second.missing[0] and torch.allclose(second.scores, first.scores)
    assert (front.stats.degraded, front.stats.members_answering, front.stats.errors) == (2, 3, 0)


def test_a_member_past_the_deadline_is_left_out_then_taken_back_by_the_idle_probe(ensemble):
    front, _, gate = ensemble
    gate.clear()  # member 3 now hangs inside its model
    late = front.request(X)
    assert late.missing == (f"rank 3 on board3 (127.0.0.1:{front.members[2].port}): no answer within 1 s",)
    assert torch.allclose(late.scores, torch.tensor(_expected([0, 1, 2])))
    assert "skipped" in front.request(X).missing[0]  # not waited for again while it is down
    gate.set()
    front.members[2].down_until = 0.0  # its skip has run out
    front.idle()
    assert front.stats.members_answering == 4
    back = front.request(X)
    assert (back.world_size, back.degraded) == (4, False)


def test_a_member_failing_on_the_input_is_left_out_of_that_answer_only(ensemble):
    front, _, _ = ensemble
    bad = front.request(torch.tensor([[999.0, 1.0]]))
    assert bad.world_size == 3 and bad.missing[0].endswith("member failed: ValueError: member 1 refuses 999")
    assert torch.allclose(bad.scores, torch.tensor([[999.0 + 5 / 3, 1.0]]))
    good = front.request(X)  # an alive member is never skipped for failing on one input
    assert (good.world_size, good.degraded) == (4, False)


def test_fewer_members_than_required_is_a_503_that_names_them(ensemble):
    front, endpoints, _ = ensemble
    strict = FanoutFront(front.server, front.members, TOKEN, deadline_s=1.0, min_members=4)
    endpoints[0].close()
    with pytest.raises(EnsembleError, match=r"only 3 of 4 .* \(at least 4 needed\): rank 1 on board1") as info:
        strict.request(X)
    assert info.value.status == 503
    strict.stop()
    with pytest.raises(ValueError, match="give 1 to 4"):
        FanoutFront(front.server, front.members, TOKEN, min_members=5)


def _raw(port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Length": str(len(body)), **headers})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_member_answers_its_front_only_and_stops_when_told(ensemble):
    _, endpoints, _ = ensemble
    port = endpoints[0].front.port
    shape, body = encode(X)
    assert _raw(port, "POST", "/member", {fanout.SHAPE: shape}, body)[0] == 403
    assert _raw(port, "POST", "/member", {fanout.SHAPE: shape, fanout.TOKEN: "guess"}, body)[0] == 403
    status, text = _raw(port, "POST", "/member", {fanout.SHAPE: "3,2", fanout.TOKEN: TOKEN}, body)
    assert (status, b"needs 24" in text) == (400, True)
    status, answer = _raw(port, "POST", "/member", {fanout.SHAPE: shape, fanout.TOKEN: TOKEN}, body)
    assert status == 200 and torch.equal(decode("2,2", answer), X + torch.tensor([1.0, 0.0]))
    assert not endpoints[0].stopped.is_set()
    assert _raw(port, "POST", "/stop", {fanout.TOKEN: TOKEN})[0] == 200
    assert endpoints[0].wait(orphan_s=5) is True


def test_a_request_without_the_token_is_refused_from_its_head_before_its_body_arrives(ensemble):
    """A stranger announcing 60 MiB gets its 403 at once: the member neither waits for nor buffers the body."""
    import socket

    _, endpoints, _ = ensemble
    for token in ("", f"{fanout.TOKEN}: guess\r\n"):
        with socket.create_connection(("127.0.0.1", endpoints[0].front.port), timeout=5) as s:
            s.sendall(f"POST /member HTTP/1.1\r\nHost: x\r\n{token}{fanout.SHAPE}: 1,2\r\n"
                      f"Content-Length: {60 << 20}\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 403 ")  # no body byte sent: the head alone decided
    assert endpoints[0].front.refused[403] == 2


def test_an_unspecified_member_address_and_a_deadline_that_is_not_finite_are_refused():
    for host in ("0.0.0.0", "::", "0"):
        with pytest.raises(ValueError, match=r"every interface.*--member-host auto"):
            fanout.member_address(host)
    for deadline in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError, match="finite"):
            FanoutFront(_server(0), [], TOKEN, deadline_s=deadline)


def test_a_member_whose_front_is_silent_leaves():
    endpoint = MemberEndpoint(_server(1), "127.0.0.1").start(TOKEN)
    try:
        assert endpoint.wait(orphan_s=0.3) is False
    finally:
        endpoint.close()


def test_a_member_on_another_node_listening_on_loopback_is_refused_at_start(monkeypatch):
    rows = [("node0", "127.0.0.1:0", "tok"), ("node1", "127.0.0.1:4100", "")]
    monkeypatch.setattr(fanout, "world", lambda: (0, 2))
    monkeypatch.setattr(fanout, "gather_objects", lambda row: rows)
    with pytest.raises(ValueError, match=r"rank 1 on node1 serves its member on 127\.0\.0\.1.*--member-host auto"):
        fanout.start(_server(0), "127.0.0.1")
    rows[1] = ("node1", "", "")  # rank 1 could not bind its address: every rank raises, naming it
    with pytest.raises(ValueError, match="no member address on rank 1 on node1"):
        fanout.start(_server(0), "127.0.0.1")
    rows[1] = ("node0", "127.0.0.1:4100", "")  # the same host: loopback reaches it
    # refused on every rank, before any member serves; inf and nan passed a `<= 0` test
    for bad in ({"min_members": 3}, {"deadline_s": 0.0}, {"deadline_s": float("inf")}, {"deadline_s": float("nan")}):
        with pytest.raises(ValueError, match="1 to 2 members"):
            fanout.start(_server(0), "127.0.0.1", **bad)
    endpoint, front = fanout.start(_server(0), "127.0.0.1")
    assert endpoint is None and [(m.rank, m.port) for m in front.members] == [(1, 4100)]
    front.stop()


def test_the_front_exports_its_members_and_degraded_answers_and_a_member_does_not(ensemble):
    from prometheus_client import CollectorRegistry, generate_latest

    from npudist.telemetry.exposition.collector_health import CollectorHealth
    from npudist.telemetry.job.edge_metrics import EdgeCollector

    front, endpoints, _ = ensemble
    front.request(X)
    endpoints[1].close()
    front.request(X)
    front.request(X)
    text = {}
    for who, stats in (("front", lambda: front.stats), ("member", lambda: endpoints[0].server.stats)):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(EdgeCollector(CollectorHealth(), ("0", "0", "board0", "", "", ""), stats))
        text[who] = generate_latest(registry).decode()
    labels = 'chip="",device="",local_rank="0",node="board0",rank="0",run=""'
    assert f"npudist_edge_members_expected{{{labels}}} 4.0" in text["front"]
    assert f"npudist_edge_members_answering{{{labels}}} 3.0" in text["front"]
    assert f"npudist_edge_degraded_answers_total{{{labels}}} 2.0" in text["front"]
    assert "npudist_edge_inference_duration_seconds_count" in text["member"]
    assert "npudist_edge_members" not in text["member"] and "degraded" not in text["member"]
