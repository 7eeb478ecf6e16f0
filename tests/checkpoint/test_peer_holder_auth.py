"""The peer snapshot holder serves its own job only (issue 46): on real sockets on 127.0.0.1, a request
without the job's secret or with another is refused and changes nothing, a claimed size makes the holder
allocate nothing, connections are capped and share one thread, and the secret's sources are checked."""

import hashlib
import json
import os
import socket
import struct
import threading
import time
import tracemalloc

import pytest

from npudist.checkpoint import peer_auth
from npudist.checkpoint import peer_holder as ph
from npudist.checkpoint.peer_holder import Copy, PeerAuthError, request, serving

SECRET = bytes.fromhex("a1" * 32)
OTHER = bytes.fromhex("b2" * 32)
PAYLOAD = b"model and optimizer state" * 40


def _frame(header: dict, tag: bytes | None = None, secret: bytes = SECRET) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack(">I", len(raw)) + (tag if tag is not None else peer_auth.mac(secret, "request", raw)) + raw


def _raw_reply(sock: socket.socket) -> dict:
    sock.settimeout(10)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    (size,) = struct.unpack(">I", data[:4])
    return json.loads(data[36:36 + size])


@pytest.fixture
def holder():
    with serving("127.0.0.1", secret=SECRET, max_bytes=1 << 20) as server:
        server.holder.put(0, Copy(7, 2, hashlib.sha256(PAYLOAD).hexdigest(), PAYLOAD))
        yield server


def test_the_job_s_own_requests_are_answered(holder):
    reply, _ = request(holder.address, {"op": "list", "owner": 0, "world": 2}, secret=SECRET)
    assert reply["copies"] == [[7, hashlib.sha256(PAYLOAD).hexdigest(), 2]]
    reply, payload = request(holder.address, {"op": "get", "owner": 0, "world": 2, "step": 7}, secret=SECRET)
    assert bytes(payload) == PAYLOAD


def test_a_request_without_the_secret_or_with_another_is_refused_and_reads_or_plants_nothing(holder):
    planted = b"a copy the job would resume from"
    put = {"op": "put", "owner": 0, "world": 2, "step": 9, "sha256": hashlib.sha256(planted).hexdigest(),
           "nbytes": len(planted)}
    for tag in (bytes(32), None):  # no MAC; a MAC under another job's secret
        with socket.create_connection(_split(holder.address)) as s:
            s.sendall(_frame(put, tag, OTHER) + planted)
            reply = _raw_reply(s)
        assert reply["ok"] is False and "secret" in reply["error"] and "copies" not in reply
    with pytest.raises(PeerAuthError, match="not signed with this job's secret"):
        request(holder.address, {"op": "get", "owner": 0, "world": 2, "step": 7}, secret=OTHER)
    with pytest.raises(PeerAuthError):
        request(holder.address, put, planted, secret=OTHER)
    # A header changed after it was signed (a bigger step) does not verify either.
    signed = json.dumps(put).encode()
    forged = json.dumps({**put, "step": 99}).encode()
    with socket.create_connection(_split(holder.address)) as s:
        s.sendall(struct.pack(">I", len(forged)) + peer_auth.mac(SECRET, "request", signed) + forged + planted)
        assert _raw_reply(s)["ok"] is False
    assert [step for step, _, _ in holder.holder.listing(0, 2)] == [7]


def test_a_reply_not_signed_by_the_job_s_holder_is_refused_by_the_rank():
    """An impostor on the holder's port (another job's holder) cannot hand a rank a copy to resume from."""
    with serving("127.0.0.1", secret=OTHER) as impostor:
        impostor.holder.put(0, Copy(7, 2, hashlib.sha256(PAYLOAD).hexdigest(), PAYLOAD))
        with pytest.raises(PeerAuthError):
            request(impostor.address, {"op": "list", "owner": 0, "world": 2}, secret=SECRET)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def test_a_huge_claimed_size_is_refused_without_allocation(holder):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        claim = {"op": "put", "owner": 0, "world": 2, "step": 8, "sha256": "0" * 64, "nbytes": 1 << 40}
        for tag in (bytes(32), None):  # unsigned: refused at the MAC; signed: over what the job declared
            with socket.create_connection(_split(holder.address)) as s:
                s.sendall(_frame(claim, tag))
                reply = _raw_reply(s)
            assert reply["ok"] is False
        assert ph.MAX_BYTES_VAR in reply["error"] and str(1 << 40) in reply["error"]
        # Signed and within the limit, but only 1000 of 900 KiB sent: the holder keeps what arrived.
        with socket.create_connection(_split(holder.address)) as s:
            s.sendall(_frame({**claim, "nbytes": 900 * 1024}) + b"x" * 1000)
            time.sleep(0.3)
            _, peak = tracemalloc.get_traced_memory()
        assert peak < 256 * 1024, peak
    finally:
        tracemalloc.stop()
    assert holder.holder.listing(0, 2)[-1][0] == 7


def test_connections_are_capped_share_one_thread_and_a_stranger_cannot_crowd_out_the_job(holder, monkeypatch):
    threads = threading.active_count()
    strangers = [socket.create_connection(_split(holder.address)) for _ in range(ph.MAX_CONNECTIONS + 8)]
    try:
        deadline = time.monotonic() + 10
        while holder.open_connections() < ph.MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holder.open_connections() == ph.MAX_CONNECTIONS
        assert threading.active_count() == threads  # no thread per connection
        reply, _ = request(holder.address, {"op": "list", "owner": 0, "world": 2}, secret=SECRET, timeout=10)
        assert reply["ok"] and holder.open_connections() <= ph.MAX_CONNECTIONS
    finally:
        for s in strangers:
            s.close()


def test_a_connection_that_does_not_authenticate_in_time_is_dropped(monkeypatch):
    monkeypatch.setattr(ph, "AUTH_TIMEOUT_S", 0.3)
    with serving("127.0.0.1", secret=SECRET) as server, socket.create_connection(_split(server.address)) as s:
        s.sendall(b"\x00\x00")  # a trickle that never completes its header
        s.settimeout(5)
        assert s.recv(10) == b""  # closed by the holder
        assert server.open_connections() == 0


def test_the_secret_comes_from_the_environment_or_a_private_shared_file(tmp_path):
    key = "c3" * 32
    assert peer_auth.launch_secret({peer_auth.SECRET_VAR: key}, multi_node=True) == (key, peer_auth.SECRET_VAR)
    with pytest.raises(peer_auth.PeerSecretError, match="at least 32 hex digits"):
        peer_auth.launch_secret({peer_auth.SECRET_VAR: "short"}, multi_node=False)
    with pytest.raises(peer_auth.PeerSecretError, match=peer_auth.SECRET_FILE_VAR):
        peer_auth.launch_secret({}, multi_node=True)  # each node would make its own
    one, _ = peer_auth.launch_secret({}, multi_node=False)
    assert one != peer_auth.launch_secret({}, multi_node=False)[0] and len(bytes.fromhex(one)) == 32

    shared = tmp_path / "peer-secret"
    env = {peer_auth.SECRET_FILE_VAR: str(shared)}
    first, _ = peer_auth.launch_secret(env, multi_node=True)  # node 0 creates it
    assert (shared.stat().st_mode & 0o777) == 0o600
    assert peer_auth.launch_secret(env, multi_node=True)[0] == first  # node 1 reads the same
    assert [p.name for p in tmp_path.iterdir()] == ["peer-secret"]  # no temporary file left
    os.chmod(shared, 0o644)
    with pytest.raises(peer_auth.PeerSecretError, match="chmod 600"):
        peer_auth.launch_secret(env, multi_node=True)


def _launch_plan(**kw):
    from types import SimpleNamespace

    return SimpleNamespace(peer_snapshots=2, peer_bind="127.0.0.1", multi_node=False, **kw)


def test_launch_says_once_that_no_rank_sent_a_snapshot(monkeypatch, capsys):
    """A script that never calls the snapshot API runs unprotected: launch says so once, when the quiet
    time passes (and not again at the end), and not at all when copies arrived."""
    from npudist.checkpoint import peer
    from npudist.launch import scope as launch_scope

    for var in (peer.HOLDER_VAR, peer.EVERY_VAR, peer_auth.SECRET_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(launch_scope, "QUIET_S", 0.2)
    with launch_scope.peer_holder(_launch_plan()):
        time.sleep(0.6)
    err = capsys.readouterr().err
    assert err.count("no rank has sent a peer snapshot") == 1 and "peer_snapshots()" in err
    assert "signed with the job's secret (made by this launch (one node))" in err

    monkeypatch.setattr(launch_scope, "QUIET_S", 60.0)
    with launch_scope.peer_holder(_launch_plan()):
        secret = bytes.fromhex(os.environ[peer_auth.SECRET_VAR])
        reply, _ = request(os.environ[peer.HOLDER_VAR], {"op": "put", "owner": 0, "world": 1, "step": 2,
                                                          "sha256": hashlib.sha256(b"s").hexdigest()}, b"s",
                           secret=secret)
        assert reply["ok"]
    assert "no rank has sent" not in capsys.readouterr().err
