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

Only the job may use it (docs/reference/security.md): every request carries an HMAC of its header under the job's
secret (peer_auth.py), checked before anything else is read; the header names the payload's size and
sha256, so the MAC covers the payload too. A copy larger than the job declared (``MAX_BYTES_VAR``) is
refused from its header, and a body is kept only as its bytes arrive, so no claim makes the holder
allocate. One selector thread serves at most ``MAX_CONNECTIONS`` connections; one that has not
authenticated within ``AUTH_TIMEOUT_S`` is dropped, and at the cap the oldest of those makes room.
Replies carry an HMAC too, over the request's nonce, so a rank never takes a copy from an impostor.

The wire format and the client side are peer_wire.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from npudist.checkpoint.peer_auth import MAC_BYTES, verify
from npudist.checkpoint.peer_wire import (  # noqa: F401  (request and the errors: the holder's callers import them here)
    CHUNK,
    LEN,
    LEN_BYTES,
    MAX_HEADER,
    TIMEOUT_S,
    PeerAuthError,
    PeerProtocolError,
    frame,
    request,
    unsigned,
)

log = logging.getLogger("npudist.checkpoint")

KEEP = 2
"""Copies kept per owner rank: the newest and the one before it."""
AUTH_TIMEOUT_S = 10.0
"""From accept to an authenticated header: a connection that has not proven it is the job's goes."""
MAX_CONNECTIONS = 64
"""Open connections at most: a node's ranks and their partners each send one copy at a time."""
MAX_BYTES_VAR = "NPUDIST_PEER_SNAPSHOT_MAX_BYTES"
"""The largest copy (bytes) this job declares; default: a quarter of the host's memory."""
@dataclass(frozen=True)
class Copy:
    step: int
    world: int
    sha256: str
    payload: bytes | bytearray


def max_copy_bytes(env: Mapping[str, str] | None = None) -> int:
    """What the job declared (``MAX_BYTES_VAR``), else a quarter of physical memory (at least 1 GiB)."""
    env = os.environ if env is None else env
    raw = env.get(MAX_BYTES_VAR, "").strip()
    if raw:
        if not raw.isascii() or not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{MAX_BYTES_VAR}={raw!r}: give the largest peer snapshot in bytes (a positive integer)")
        return int(raw)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        total = 16 << 30
    return max(1 << 30, total // 4)


class Holder:
    """The copies, by owner rank; thread-safe. Separate from the server so that tests can reach it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._copies: dict[int, list[Copy]] = {}
        self.accepted = 0
        """Copies kept since the start: 0 at the end of a job means no rank ever sent one."""

    def put(self, owner: int, copy: Copy, actual: str | None = None) -> str | None:
        """Keep ``copy``; the reason it was refused otherwise. ``actual``: the payload's sha256 when the caller
        already hashed it as it arrived."""
        actual = actual or hashlib.sha256(copy.payload).hexdigest()
        if actual != copy.sha256:
            return f"sha256 {actual[:12]} of the bytes received is not the sender's {copy.sha256[:12]}"
        with self._lock:
            kept = [c for c in self._copies.get(owner, []) if c.world == copy.world and c.step != copy.step]
            self._copies[owner] = sorted([*kept, copy], key=lambda c: c.step)[-KEEP:]
            self.accepted += 1
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


def _answer(holder: Holder, header: dict[str, Any], payload: bytes | bytearray,
            actual: str | None) -> tuple[dict[str, Any], bytes | bytearray]:
    op, owner = header["op"], int(header["owner"])
    world = None if header.get("world") is None else int(header["world"])
    if op == "put" and world is not None:
        why = holder.put(owner, Copy(int(header["step"]), world, str(header["sha256"]), payload), actual)
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


class _Conn:
    """One connection's progress: the head (length, MAC, header), then the body, then the reply."""

    def __init__(self, sock: socket.socket, peer: str, now: float) -> None:
        self.sock, self.peer = sock, peer
        self.opened = self.moved = now
        self.head = bytearray()
        self.header: dict[str, Any] | None = None
        """Set once the header authenticated: from then on the connection is the job's."""
        self.body = bytearray()
        self.need = 0
        self.digest = hashlib.sha256()
        self.out: list[memoryview] = []
        self.draining = False
        """The reply is sent: what the client still sends (a refused body) is read and dropped until it closes,
        so that closing with unread bytes does not reset the connection before the client read the reply."""

    def head_wanted(self) -> int:
        fixed = LEN_BYTES + MAC_BYTES
        if len(self.head) < fixed:
            return fixed - len(self.head)
        return fixed + struct.unpack_from(LEN, self.head)[0] - len(self.head)


class HolderServer:
    """The holder behind a TCP port, served by one selector thread for every connection."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, secret: bytes,
                 max_bytes: int | None = None) -> None:
        if not secret:
            raise ValueError("the holder needs the job's secret (peer_auth.launch_secret)")
        self.holder = Holder()
        self.secret, self.max_bytes = secret, max_bytes or max_copy_bytes()
        self.started = time.monotonic()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
            self._listener.listen(MAX_CONNECTIONS)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._conns: dict[socket.socket, _Conn] = {}
        self._chunk = bytearray(CHUNK)
        self._stop = threading.Event()
        self._refused_from: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="npudist-peer-holder", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def open_connections(self) -> int:
        return len(self._conns)

    def close(self) -> None:
        """Stop serving, close the port, drop the copies; safe to call twice."""
        if self._thread.is_alive():
            self._stop.set()
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
            self._thread.join()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self.holder = Holder()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for key, events in self._sel.select(timeout=1.0):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        continue
                    elif key.fileobj in self._conns:
                        conn = self._conns[key.fileobj]  # type: ignore[index]
                        try:
                            self._write(conn) if events & selectors.EVENT_WRITE else self._read(conn)
                        except (OSError, ValueError, KeyError, TypeError) as exc:
                            log.warning("peer snapshot holder: request from %s dropped: %s", conn.peer, exc)
                            self._drop(conn)
                self._sweep(time.monotonic())
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            self._sel.close()

    def _accept(self) -> None:
        try:
            sock, addr = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of descriptors: the listen queue keeps the connection for later
            log.warning("peer snapshot holder: accept failed: %s", exc)
            return
        if len(self._conns) >= MAX_CONNECTIONS:
            waiting = [c for c in self._conns.values() if c.header is None]
            if not waiting:
                sock.close()  # every slot is the job's, busy: this one (never a copy in flight) goes
                return
            self._drop(min(waiting, key=lambda c: c.opened))
        sock.setblocking(False)
        conn = _Conn(sock, f"{addr[0]}:{addr[1]}", time.monotonic())
        self._conns[sock] = conn
        self._sel.register(sock, selectors.EVENT_READ, None)

    def _read(self, conn: _Conn) -> None:
        if conn.draining:
            if not conn.sock.recv_into(self._chunk):
                self._drop(conn)
            return
        if conn.header is None:
            want = conn.head_wanted()
            data = conn.sock.recv(want)
            if not data:
                raise PeerProtocolError("closed before its header")
            conn.head += data
            conn.moved = time.monotonic()
            if len(conn.head) == LEN_BYTES + MAC_BYTES and struct.unpack_from(LEN, conn.head)[0] > MAX_HEADER:
                raise PeerProtocolError(f"header of {struct.unpack_from(LEN, conn.head)[0]} bytes "
                                        f"(at most {MAX_HEADER})")
            if len(conn.head) >= LEN_BYTES + MAC_BYTES and conn.head_wanted() == 0:
                self._authenticate(conn)
            return
        view = memoryview(self._chunk)
        k = conn.sock.recv_into(view, min(len(self._chunk), conn.need - len(conn.body)))
        if k == 0:
            raise PeerProtocolError(f"connection closed after {len(conn.body)} of {conn.need} bytes")
        conn.body += view[:k]
        conn.digest.update(view[:k])
        conn.moved = time.monotonic()
        if len(conn.body) == conn.need:
            self._reply(conn, *_answer(self.holder, conn.header, conn.body, conn.digest.hexdigest()))

    def _authenticate(self, conn: _Conn) -> None:
        start = LEN_BYTES + MAC_BYTES
        tag, raw = bytes(conn.head[LEN_BYTES:start]), bytes(conn.head[start:])
        if not verify(self.secret, "request", raw, tag):
            if len(self._refused_from) < 100 and conn.peer.rsplit(":", 1)[0] not in self._refused_from:
                self._refused_from.add(conn.peer.rsplit(":", 1)[0])
                log.warning("peer snapshot holder: refused %s: its request is not signed with this job's secret "
                            "(another job, or a node with another NPUDIST_PEER_SECRET)", conn.peer)
            self._send(conn, unsigned({"ok": False, "error": "not signed with this holder's job secret"}))
            return
        header = json.loads(raw)
        if not isinstance(header, dict) or not isinstance(header.get("nbytes"), int) or header["nbytes"] < 0:
            raise PeerProtocolError(f"bad header {str(header)[:200]}")
        conn.header = header
        if header["nbytes"] > self.max_bytes:
            self._reply(conn, {"ok": False, "error": f"a copy of {header['nbytes']} bytes is over the "
                                                     f"{self.max_bytes} this job declared ({MAX_BYTES_VAR})"}, b"")
            return
        conn.need = header["nbytes"]
        if conn.need == 0:
            self._reply(conn, *_answer(self.holder, header, b"", None))

    def _reply(self, conn: _Conn, header: dict[str, Any], payload: bytes | bytearray) -> None:
        nonce = (conn.header or {}).get("nonce")
        head = frame(self.secret, "reply", {**header, "re": nonce}, payload)
        self._send(conn, head, payload)

    def _send(self, conn: _Conn, head: bytes, payload: bytes | bytearray = b"") -> None:
        conn.body = bytearray()  # a put's bytes now live in the holder (or were refused)
        conn.out = [memoryview(head), *([memoryview(payload)] if payload else [])]
        conn.need = -1  # no more reading
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, None)

    def _write(self, conn: _Conn) -> None:
        while conn.out:
            sent = conn.sock.send(conn.out[0][:CHUNK * 4])
            conn.moved = time.monotonic()
            conn.out[0] = conn.out[0][sent:]
            if len(conn.out[0]):
                return
            conn.out.pop(0)
        conn.sock.shutdown(socket.SHUT_WR)
        conn.draining = True
        self._sel.modify(conn.sock, selectors.EVENT_READ, None)

    def _sweep(self, now: float) -> None:
        for conn in list(self._conns.values()):
            late = conn.header is None and now - conn.opened > AUTH_TIMEOUT_S
            if late or now - conn.moved > TIMEOUT_S:
                log.warning("peer snapshot holder: dropped %s: %s", conn.peer,
                            f"no authenticated request within {AUTH_TIMEOUT_S:g} s" if late else
                            f"no byte moved in {TIMEOUT_S:g} s")
                self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()


@contextlib.contextmanager
def serving(host: str, port: int = 0, *, secret: bytes, max_bytes: int | None = None) -> Iterator[HolderServer]:
    server = HolderServer(host, port, secret=secret, max_bytes=max_bytes)
    try:
        yield server
    finally:
        server.close()
