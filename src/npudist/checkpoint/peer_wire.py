"""The peer snapshot holder's wire: how a request and its reply are framed and signed, and the client side.

Both ways: a 4-byte big-endian header length, the 32-byte MAC of the header under the job's secret
(peer_auth.py), the JSON header (it names ``nbytes``), then ``nbytes`` payload bytes. A reply is signed over
the request's nonce, so a rank never takes a copy from an impostor or a replayed reply. The server side is
peer_holder.py.
"""

from __future__ import annotations

import json
import secrets
import socket
import struct
from typing import Any

from npudist.checkpoint.peer_auth import MAC_BYTES, mac, verify

TIMEOUT_S = 120.0
"""A request that moves no byte for this long is dropped (a peer that stopped sending mid-copy)."""
MAX_HEADER = 64 * 1024
LEN = ">I"
"""Format of the header's length: 4 bytes, big-endian."""
LEN_BYTES = 4
CHUNK = 1 << 20


class PeerProtocolError(OSError):
    """A holder request or reply that was not what the protocol says: to a caller, a holder it cannot use."""


class PeerAuthError(PeerProtocolError):
    """A message whose MAC is not the job's: another job's holder, or a node with another secret."""


def frame(secret: bytes, kind: str, header: dict[str, Any], payload: bytes | bytearray) -> bytes:
    raw = json.dumps({**header, "nbytes": len(payload)}).encode()
    return struct.pack(LEN, len(raw)) + mac(secret, kind, raw) + raw


def unsigned(header: dict[str, Any]) -> bytes:
    """A refusal to a request that did not authenticate: nothing it said is echoed, nothing signed."""
    raw = json.dumps({**header, "nbytes": 0}).encode()
    return struct.pack(LEN, len(raw)) + bytes(MAC_BYTES) + raw


def read_exact(sock: socket.socket, n: int) -> bytearray:
    """``n`` bytes, kept as they arrive (the buffer grows with what was received, not with what was claimed)."""
    buf, chunk = bytearray(), bytearray(min(n, CHUNK))
    view = memoryview(chunk)
    while len(buf) < n:
        k = sock.recv_into(view, min(len(chunk), n - len(buf)))
        if k == 0:
            raise PeerProtocolError(f"connection closed after {len(buf)} of {n} bytes")
        buf += view[:k]
    return buf




def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def request(address: str, header: dict[str, Any], payload: bytes | bytearray = b"", *, secret: bytes,
            timeout: float = TIMEOUT_S) -> tuple[dict[str, Any], bytearray]:
    """One request to the holder at ``address`` (host:port), signed with the job's ``secret``; the reply is
    checked the same way. OSError (PeerProtocolError, PeerAuthError) when it cannot be reached or used."""
    nonce = secrets.token_hex(8)
    with socket.create_connection(_split(address), timeout=timeout) as sock:
        sock.sendall(frame(secret, "request", {**header, "nonce": nonce}, payload))
        if payload:
            sock.sendall(payload)
        fixed = read_exact(sock, LEN_BYTES + MAC_BYTES)
        (size,) = struct.unpack_from(LEN, fixed)
        if size > MAX_HEADER:
            raise PeerProtocolError(f"reply header of {size} bytes (at most {MAX_HEADER})")
        raw = bytes(read_exact(sock, size))
        if not verify(secret, "reply", raw, bytes(fixed[LEN_BYTES:])):
            claim = raw[:200].decode("utf-8", "replace")
            raise PeerAuthError(f"the reply of {address} is not signed with this job's secret (it said, unverified: "
                                f"{claim}): another job's holder, or its node has another NPUDIST_PEER_SECRET")
        try:
            reply = json.loads(raw)
            nbytes = int(reply["nbytes"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PeerProtocolError(f"bad reply header from {address}: {exc}") from None
        if reply.get("re") != nonce:
            raise PeerAuthError(f"the reply of {address} answers another request (a replayed reply)")
        # A payload's bytes are checked against the sha256 its listing named by the caller (peer._fetch).
        return reply, read_exact(sock, nbytes) if nbytes else bytearray()
