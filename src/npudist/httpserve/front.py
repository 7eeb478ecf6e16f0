"""Accept HTTP connections and read each request whole in one selector thread, under a deadline and a cap.

No thread waits on a client: a connection costs a buffer until its whole request (head and body) has
arrived, and only complete requests reach the worker pool. So a client that trickles or idles cannot
hold a worker, and is cut off at ``request_timeout_s`` whatever its pace. At ``max_connections`` the
connection that has waited longest for its request is answered 503 to make room (a slow client, never
a scrape that is being answered); when every open connection is being answered, the newcomer gets 503.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus

from npudist.httpserve.request import Head, HttpError, head_end, parse_head

log = logging.getLogger("npudist.http")

ALL_INTERFACES = ("0.0.0.0", "::")
"""The only spellings that may bind every interface; "0", "0.0" or "::0" bind it too, unasked."""


def binds_everything_unasked(host: str) -> bool:
    """True for an unspecified-address shorthand (``0``, ``0x0``, ``::0``, and "" as bind() reads it)
    other than 0.0.0.0 and ::."""
    if host in ALL_INTERFACES:
        return False
    if not host.strip():
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        pass
    try:  # inet_aton takes the legacy forms bind() takes: "0", "0.0", "0x0", "00"
        return socket.inet_aton(host) == bytes(4)
    except OSError:
        return False


def default_max_connections() -> int:
    """A quarter of the descriptor limit, at most 1024: the rest stay free for pipes to tools, files, logs.
    An idle connection costs a descriptor and a buffer here, no thread, so the cap can be generous."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 64
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(4, min(1024, soft // 4))


@dataclass(frozen=True)
class Limits:
    max_connections: int = field(default_factory=default_max_connections)
    request_timeout_s: float = 5.0
    """Whole request, head and body, from accept."""
    reply_timeout_s: float = 10.0
    """Whole reply, for a client that stops reading."""
    max_head_bytes: int = 16 * 1024
    max_body_bytes: int = 0
    workers: int = 4


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self, head_only: bool = False) -> bytes:
        own = {"content-length", "connection"}
        lines = [f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}",
                 *(f"{k}: {v}" for k, v in self.headers if k.lower() not in own),
                 f"Content-Length: {len(self.body)}", "Connection: close", "", ""]
        return "\r\n".join(lines).encode("latin-1") + (b"" if head_only else self.body)


@dataclass(eq=False)
class Request:
    head: Head
    body: bytes
    peer: tuple
    sock: socket.socket
    answered: bool = False


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    peer: tuple
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    head: Head | None = None
    scanned: int = 0
    """Bytes of buf already searched for the end of the head."""


@dataclass(eq=False)
class _Linger:
    """A refused connection, read and discarded until the client closes: closing with its request
    still unread would reset the connection and lose the error page (the lingering close of RFC 9112 9.6)."""

    sock: socket.socket
    deadline: float


LINGER_S = 2.0
BATCH = 16
"""Connections accepted or expired per turn of the loop, so ready scrapes are read in between."""


Handler = Callable[[Request], "Reply | None"]
"""Runs on a worker; returns the reply, or None when it will call ``reply``/``reply_later`` itself."""
ErrorPage = Callable[[int, str], Reply]
Admit = Callable[[Head], "tuple[int, str] | None"]
"""Runs on the selector thread as soon as a request's head has arrived, before any of its body is waited
for: (status, message) refuses the request there (a client without credentials never gets its body
buffered), None lets it on."""


def text_error(status: int, message: str) -> Reply:
    return Reply(status, f"{message}\n".encode(), (("Content-Type", "text/plain; charset=utf-8"),))


def _listen(host: str, port: int) -> socket.socket:
    if binds_everything_unasked(host):
        raise OSError(errno.EINVAL, f"{host!r} would listen on every interface; write 0.0.0.0 (or ::) "
                                    "to mean that, or 127.0.0.1 for this host only")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=128)  # SYN bursts of 20 scrapers
    sock.setblocking(False)
    return sock


class Front:
    """Runs ``handle(request)`` on a worker thread for each complete request and sends what it returns."""

    def __init__(self, host: str, port: int, limits: Limits | None = None, error_page: ErrorPage = text_error,
                 name: str = "npudist-http", admit: Admit | None = None) -> None:
        """Listen now (OSError when the address cannot be bound); serve after ``start``."""
        self.limits = limits or Limits()
        self._admit = admit
        self._error_page = error_page
        self._handle: Handler = lambda request: error_page(503, "starting")
        self._listener = _listen(host, port)
        self.host, self.port = host, int(self._listener.getsockname()[1])
        self.refused: Counter[int] = Counter()
        """Requests the front answered itself, by status (400/411/413/431 malformed, 408 late, 503 full)."""
        self._reading: dict[socket.socket, _Conn] = {}  # arrival order: oldest first
        self._lingering: dict[socket.socket, _Linger] = {}
        self._busy = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-worker")
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self, handle: Handler) -> Front:
        self._handle = handle
        self._thread.start()
        return self

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._reading) + self._busy

    def close(self, *, wait: bool = False) -> None:
        """Stop listening and drop queued requests; ``wait``: also wait for the workers, whose running
        replies are bounded by reply_timeout_s (a closing owner that must leave no thread behind)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(5)
        else:
            self._shut()
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def reply(self, request: Request, reply: Reply) -> None:
        """Send ``reply`` and close the connection; blocks up to reply_timeout_s on a client that stops reading."""
        if request.answered:
            return
        request.answered = True
        try:
            request.sock.setblocking(True)
            request.sock.settimeout(self.limits.reply_timeout_s)  # bounds the whole sendall (Python >= 3.5)
            request.sock.sendall(reply.encode(head_only=request.head.method == "HEAD"))
        except OSError:
            pass
        finally:
            request.sock.close()
            with self._lock:
                self._busy -= 1

    def reply_later(self, request: Request, reply: Reply) -> None:
        """``reply`` from a worker, for callers (a collective loop) that must not wait on a client."""
        try:
            self._pool.submit(self.reply, request, reply)
        except RuntimeError:  # pool shut down: the front is closing
            self.reply(request, reply)

    # The selector thread: everything below runs there and never blocks on a client.

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(self._sweep()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    elif isinstance(key.data, _Linger):
                        self._discard(key.data)
                    else:
                        self._read(key.data)
        except Exception:  # pragma: no cover - a bug here must not leave the port open and silent
            log.exception("HTTP front %s:%d stopped", self.host, self.port)
        finally:
            self._shut()

    def _shut(self) -> None:
        for conn in list(self._reading.values()):
            self._drop(conn)
        for linger in list(self._lingering.values()):
            self._unlinger(linger)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()

    def _sweep(self) -> float:
        """Answer 408 to connections past their deadline, a batch at a time so that a crowd expiring
        together does not hold up the scrapes between batches; seconds until the next one is due."""
        now = time.monotonic()
        for linger in [x for x in self._lingering.values() if x.deadline <= now][:BATCH]:
            self._unlinger(linger)
        for done, conn in enumerate(list(self._reading.values())):
            if conn.deadline > now:
                return min(0.5, conn.deadline - now)
            if done == BATCH:
                return 0.0
            self._refuse(conn, 408, f"the whole request must arrive within {self.limits.request_timeout_s:g} s")
        return 0.5

    def _accept(self) -> None:
        for _ in range(BATCH):
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError:  # EMFILE/ENFILE: out of descriptors; free one, or give the others time
                if not self._evict_oldest():
                    time.sleep(0.05)
                return
            sock.setblocking(False)
            if self.open_connections >= self.limits.max_connections and not self._evict_oldest():
                self._send_now(sock, 503, f"server busy: {self.limits.max_connections} connections open; retry")
                continue
            conn = _Conn(sock, peer, time.monotonic() + self.limits.request_timeout_s)
            with self._lock:
                self._reading[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _evict_oldest(self) -> bool:
        oldest = next(iter(self._reading.values()), None)
        if oldest is None:
            return False
        self._refuse(oldest, 503, "server at its connection limit and this request was the slowest to arrive")
        return True

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.buf += data
        try:
            request = self._complete(conn)
        except HttpError as exc:
            self._refuse(conn, exc.status, str(exc))
            return
        if request is not None:
            self._forget(conn, busy=True)
            self._pool.submit(self._run, request)

    def _complete(self, conn: _Conn) -> Request | None:
        if conn.head is None:
            end = head_end(conn.buf, self.limits.max_head_bytes, conn.scanned)
            if end is None:
                conn.scanned = len(conn.buf)
                return None
            conn.head = parse_head(bytes(conn.buf[:end]), self.limits.max_body_bytes)
            refusal = self._admit(conn.head) if self._admit else None
            if refusal:
                raise HttpError(*refusal)
            if conn.head.expects_continue and conn.head.content_length and len(conn.buf) == end:
                self._send_continue(conn.sock)
        total = conn.head.size + (conn.head.content_length or 0)
        if len(conn.buf) < total:
            return None
        return Request(conn.head, bytes(conn.buf[conn.head.size:total]), conn.peer, conn.sock)

    @staticmethod
    def _send_continue(sock: socket.socket) -> None:
        """The interim reply a client that sent 'Expect: 100-continue' waits for (curl: 1 s) before its body.
        One non-blocking send of 25 bytes to a fresh connection; if it does not go, the client sends anyway."""
        with contextlib.suppress(OSError):
            sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _run(self, request: Request) -> None:
        try:
            reply = self._handle(request)
        except Exception as exc:
            log.exception("HTTP handler failed on %s %s", request.head.method, request.head.path)
            reply = self._error_page(500, f"internal error: {type(exc).__name__}: {exc}")
        if reply is not None:
            self.reply(request, reply)

    def _forget(self, conn: _Conn, busy: bool = False) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        with self._lock:
            self._reading.pop(conn.sock, None)
            self._busy += busy

    def _drop(self, conn: _Conn) -> None:
        self._forget(conn)
        conn.sock.close()

    def _refuse(self, conn: _Conn, status: int, message: str) -> None:
        self._forget(conn)
        self._send_now(conn.sock, status, message)

    def _send_now(self, sock: socket.socket, status: int, message: str) -> None:
        """One non-blocking send of a short error page, then a lingering close: never waits on the client."""
        self.refused[status] += 1
        try:
            sock.send(self._error_page(status, message).encode())
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self._lingering) >= max(1, self.limits.max_connections // 4):  # descriptors stay bounded
            sock.close()
            return
        linger = self._lingering[sock] = _Linger(sock, time.monotonic() + LINGER_S)
        self._sel.register(sock, selectors.EVENT_READ, linger)

    def _discard(self, linger: _Linger) -> None:
        try:
            if linger.sock.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._unlinger(linger)

    def _unlinger(self, linger: _Linger) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(linger.sock)
        self._lingering.pop(linger.sock, None)
        linger.sock.close()
