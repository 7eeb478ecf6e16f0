"""The fan-out's wire between the front and its members: float32 batches with a shape header, the job's
token, and one HTTP request as the front makes it (fanout.py has the protocol's story).

Wire (member side): ``POST /member`` with the batch as little-endian float32 (``X-Npudist-Shape: n,f``)
answers this member's [n, classes] contribution the same way (422 with the reason when the member
failed); ``GET /ping`` answers ``ok``; ``POST /stop`` ends the member's wait. Every request carries the
job's token (``X-Npudist-Token``).
"""

from __future__ import annotations

import http.client
import os
import socket

import torch
from torch import Tensor

from npudist.httpserve import Reply

SHAPE, TOKEN, COMPUTE = "X-Npudist-Shape", "X-Npudist-Token", "X-Npudist-Compute-Seconds"


class WireError(ValueError):
    """A member request or answer that does not hold what its header says."""


def encode(t: Tensor) -> tuple[str, bytes]:
    """A 2-D tensor as (shape header, little-endian float32 bytes)."""
    if t.dim() != 2:
        raise WireError(f"only [rows, columns] tensors travel, got shape {tuple(t.shape)}")
    data = t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()
    return f"{t.shape[0]},{t.shape[1]}", data


def decode(shape: str | None, body: bytes, columns: int | None = None) -> Tensor:
    """The [n, f] float32 tensor of ``encode``; WireError naming what does not fit."""
    try:
        n, f = (int(v) for v in (shape or "").split(","))
    except ValueError:
        raise WireError(f"{SHAPE} must be 'rows,columns', got {str(shape)[:40]!r}") from None
    if n < 1 or f < 1:
        raise WireError(f"{SHAPE} {n},{f}: rows and columns must be at least 1")
    if columns is not None and f != columns:
        raise WireError(f"{f} columns where {columns} were expected")
    if len(body) != 4 * n * f:
        raise WireError(f"body has {len(body)} bytes; {SHAPE} {n},{f} needs {4 * n * f} (float32)")
    return torch.frombuffer(bytearray(body), dtype=torch.float32).reshape(n, f)


def text_reply(status: int, message: str) -> Reply:
    return Reply(status, f"{message}\n".encode(), (("Content-Type", "text/plain; charset=utf-8"),))


class MemberFailed(RuntimeError):
    """The member answered, with a failure on this request: it is alive and stays in."""


def call(where: tuple[str, int], method: str, path: str, *, token: str, timeout: float, body: bytes = b"",
         shape: str = "") -> tuple[bytes, dict[str, str]]:
    """One request to the member at ``where`` (host, port): its body and headers; MemberFailed on a 422 (the
    member is alive and failed on this input), OSError on any other failure to answer."""
    conn = http.client.HTTPConnection(*where, timeout=timeout)
    try:
        headers = {TOKEN: token, "Content-Length": str(len(body))}
        if shape:
            headers[SHAPE] = shape
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status == 422:
            raise MemberFailed(data.decode("utf-8", "replace").strip())
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}: {data.decode('utf-8', 'replace').strip()[:200]}")
        return data, {k: v for k, v in resp.getheaders()}
    finally:
        conn.close()


def why(exc: BaseException) -> str:
    """A lost member's reason, as the front's stats and log lines give it."""
    if isinstance(exc, socket.timeout | TimeoutError):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens: the member process is gone)"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"unreachable: {os.strerror(exc.errno)}"
    return f"{type(exc).__name__}: {exc}"
