"""The per-node holder of in-memory peer snapshots: a small TCP server in the `npudist launch` process.

Why here: torchrun restarts every worker of the job as new processes when one fails, so a copy held in a
worker's memory dies with the restart; the launcher (torchrun's agent runs in its process) lives until
the node itself goes. The TCPStore is not used for the copies: it is the job's control plane, served by
one process, and a model's state through it would stall every rank's heartbeats and rendezvous.

The holder keeps, per owner rank, the last ``KEEP`` copies (of this node's own ranks and of the ranks whose
partner lives here) that arrived whole with the sha256 their sender
computed (a copy whose bytes do not match is refused on arrival). Two, so that a rank killed while its
newest copy was in flight still has the previous step that the other ranks also hold. The reader checks
the sha256 again on fetch (peer.py): memory that changed after arrival is refused there.

Wire format, both ways: 4-byte big-endian header length, a JSON header, then ``nbytes`` payload bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import socket
import socketserver
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("npudist.checkpoint")

KEEP = 2
"""Copies kept per owner rank: the newest and the one before it."""
TIMEOUT_S = 120.0
"""Socket timeout of one request: a peer that stops sending mid-copy frees its handler thread."""
_MAX_HEADER = 64 * 1024


class PeerProtocolError(RuntimeError):
    """A holder request or reply that was not what the protocol says."""


@dataclass(frozen=True)
class Copy:
    step: int
    world: int
    sha256: str
    payload: bytes


def send_message(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    raw = json.dumps({**header, "nbytes": len(payload)}).encode()
    sock.sendall(struct.pack(">I", len(raw)) + raw)
    if payload:
        sock.sendall(payload)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerProtocolError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    (size,) = struct.unpack(">I", _read_exact(sock, 4))
    if size > _MAX_HEADER:
        raise PeerProtocolError(f"header of {size} bytes (at most {_MAX_HEADER})")
    header = json.loads(_read_exact(sock, size))
    if not isinstance(header, dict) or not isinstance(header.get("nbytes"), int) or header["nbytes"] < 0:
        raise PeerProtocolError(f"bad header {header!r}")
    return header, _read_exact(sock, header["nbytes"])


class Holder:
    """The copies, by owner rank; thread-safe. Separate from the server so that tests can reach it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._copies: dict[int, list[Copy]] = {}

    def put(self, owner: int, copy: Copy) -> str | None:
        """Keep ``copy``; the reason it was refused otherwise."""
        actual = hashlib.sha256(copy.payload).hexdigest()
        if actual != copy.sha256:
            return f"sha256 {actual[:12]} of the bytes received is not the sender's {copy.sha256[:12]}"
        with self._lock:
            kept = [c for c in self._copies.get(owner, []) if c.world == copy.world and c.step != copy.step]
            self._copies[owner] = sorted([*kept, copy], key=lambda c: c.step)[-KEEP:]
        return None

    def listing(self, owner: int, world: int | None) -> list[tuple[int, str, int]]:
        """(step, sha256, world) of each copy of ``owner``; of one world size, or of any when None."""
        with self._lock:
            return [(c.step, c.sha256, c.world) for c in self._copies.get(owner, [])
                    if world is None or c.world == world]

    def get(self, owner: int, world: int, step: int) -> Copy | None:
        with self._lock:
            return next((c for c in self._copies.get(owner, []) if c.world == world and c.step == step), None)

    def nbytes(self) -> int:
        with self._lock:
            return sum(len(c.payload) for cs in self._copies.values() for c in cs)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        holder: Holder = self.server.holder  # type: ignore[attr-defined]
        self.request.settimeout(TIMEOUT_S)
        try:
            header, payload = recv_message(self.request)
            send_message(self.request, *_answer(holder, header, payload))
        except (OSError, PeerProtocolError, ValueError, KeyError, TypeError) as exc:
            log.warning("peer snapshot holder: request from %s dropped: %s", self.client_address, exc)


def _answer(holder: Holder, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    op, owner = header["op"], int(header["owner"])
    world = None if header.get("world") is None else int(header["world"])
    if op == "put" and world is not None:
        why = holder.put(owner, Copy(int(header["step"]), world, str(header["sha256"]), payload))
        return ({"ok": True} if why is None else {"ok": False, "error": why}), b""
    if op == "list":
        return {"ok": True, "copies": holder.listing(owner, world)}, b""
    if op == "get" and world is not None:
        found = holder.get(owner, world, int(header["step"]))
        if found is None:
            return {"ok": False, "error": f"no copy of step {header['step']}"}, b""
        return {"ok": True, "step": found.step, "sha256": found.sha256}, found.payload
    if op in ("put", "get"):
        return {"ok": False, "error": f"{op} names no world size: send the sender's world (an int)"}, b""
    return {"ok": False, "error": f"unknown op {op!r}: one of put, list, get"}, b""


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class HolderServer:
    """The holder behind a TCP port, served by one thread (and one per request in flight)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.holder = Holder()
        self._server = _Server((host, port), _Handler)
        self._server.holder = self.holder  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="npudist-peer-holder",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        """Stop serving, close the port, drop the copies; safe to call twice."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
        self.holder = Holder()


@contextlib.contextmanager
def serving(host: str, port: int = 0) -> Iterator[HolderServer]:
    server = HolderServer(host, port)
    try:
        yield server
    finally:
        server.close()


def request(address: str, header: dict[str, Any], payload: bytes = b"", *,
            timeout: float = TIMEOUT_S) -> tuple[dict[str, Any], bytes]:
    """One request to the holder at ``address`` (host:port); OSError when it cannot be reached."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        send_message(sock, header, payload)
        return recv_message(sock)
