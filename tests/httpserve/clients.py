"""Hostile and good HTTP clients over raw sockets, shared by the tests of every server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` and read the whole answer (the servers close after one reply)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0


def body(answer: bytes) -> bytes:
    return answer.partition(b"\r\n\r\n")[2]


def post(path: str, payload: bytes, content_length: str | None = None) -> bytes:
    length = str(len(payload)) if content_length is None else content_length
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode() + payload


OPENINGS = {
    "idle": b"GET /metrics HTTP/1.1\r\n",  # then nothing
    "head": b"GET /metrics HTTP/1.1\r\nX-Slow: ",  # then one header byte every pace
    "body": post("/predict", b"", "100000"),  # then one body byte every pace
}


class Crowd:
    """``n`` connections that idle or trickle one byte every ``pace`` s (``how``: a key of OPENINGS).

    Each records what the server answered; ``close()`` stops them and closes their sockets.
    """

    def __init__(self, port: int, n: int, *, how: str, pace: float = 0.3) -> None:
        trickle = how != "idle"
        self.answers: list[bytes] = []
        self.opened = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            self._socks.append(s)
            s.sendall(OPENINGS[how])
            self.opened += 1
        self._threads = [threading.Thread(target=self._hold, args=(s, trickle, how, pace), daemon=True)
                         for s in self._socks]
        for t in self._threads:
            t.start()

    def _hold(self, s: socket.socket, trickle: bool, how: str, pace: float) -> None:
        s.settimeout(pace)
        got = b""
        while not self._stop.is_set():
            try:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            except TimeoutError:
                if trickle:
                    with contextlib.suppress(OSError):
                        s.send(b"1" if how == "body" else b"a")
            except OSError:
                break
        with self._lock:
            self.answers.append(got)

    def wait_answered(self, count: int, timeout: float) -> int:
        """Wait (bounded) until ``count`` connections got an answer or were closed; how many did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.answers) >= count:
                    break
            time.sleep(0.05)
        with self._lock:
            return len(self.answers)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for s in self._socks:
            s.close()
