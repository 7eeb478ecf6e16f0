"""An HTTP/1.x request head, read from bytes: pure functions, so hostile input is tested without sockets."""

from __future__ import annotations

import http.client
import io
import re
from dataclasses import dataclass
from email.message import Message
from urllib.parse import urlsplit

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_HEAD_END_MAX = 4
"""Bytes of the longest end of head (CRLF CRLF): a search resumes that far before the new bytes."""
# field-line = field-name ":" OWS field-value OWS; field-name is a token (RFC 9110 5.1, 5.6.2). No space
# before the colon: a server MUST reject that with 400 (RFC 9112 5.1), as it MUST an obs-fold line
# (leading whitespace) unless it unfolds it (RFC 9112 5.2).
_FIELD_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n]*")
_REQUEST_LINE = re.compile(r"([A-Z]{1,20}) (\S{1,8000}) HTTP/(1\.[01])")
# ASCII digits only: int() also reads "²" or Arabic-Indic digits, which no client sends (RFC 9110 8.6).
_CONTENT_LENGTH = re.compile(r"[0-9]{1,15}")


class HttpError(Exception):
    """The request cannot be served; ``status`` and the message go back to the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Head:
    method: str
    target: str
    version: str
    headers: Message
    size: int
    """Bytes of the head, blank line included: the body starts here."""
    content_length: int | None
    """None when the request sent no Content-Length (then it has no body)."""

    @property
    def expects_continue(self) -> bool:
        """The client waits for '100 Continue' before sending its body (RFC 9110 10.1.1; ignored in
        HTTP/1.0 requests, as that section requires)."""
        return self.version == "1.1" and (self.headers.get("Expect") or "").strip().lower() == "100-continue"

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> str:
        return urlsplit(self.target).query


def head_end(buf: bytes | bytearray, max_head: int, scanned: int = 0) -> int | None:
    """Where the head ends (after its blank line), None while incomplete; 431 once it outgrows max_head.

    ``scanned``: how many bytes of ``buf`` an earlier call already searched, so a head arriving a byte
    at a time costs linear, not quadratic, time.
    """
    found = _HEAD_END.search(buf, max(0, scanned - _HEAD_END_MAX + 1), max_head + 4)
    if found is not None:
        return found.end()
    if len(buf) > max_head:
        raise HttpError(431, f"request head is over {max_head} bytes; send a shorter request line and headers")
    return None


def parse_head(data: bytes, max_body: int) -> Head:
    """Request line, headers and body length of a complete head; HttpError naming what is wrong."""
    line, _, rest = data.partition(b"\n")
    request_line = line.rstrip(b"\r").decode("latin-1")
    m = _REQUEST_LINE.fullmatch(request_line)
    if m is None:
        raise HttpError(400, f"malformed request line {request_line[:80]!r}; expected e.g. 'GET /metrics HTTP/1.1'")
    for field_line in rest.split(b"\n"):
        field_line = field_line.rstrip(b"\r")
        if not field_line:
            break
        if not _FIELD_LINE.fullmatch(field_line):
            raise HttpError(400, f"malformed header line {field_line[:80].decode('latin-1')!r}: a field name, "
                                 "then ':' with no space before it (RFC 9112 5.1), and no folded lines")
    try:
        headers = http.client.parse_headers(io.BytesIO(rest))
    except http.client.HTTPException as exc:
        raise HttpError(431, f"request headers unreadable: {type(exc).__name__}") from None
    return Head(m.group(1), m.group(2), m.group(3), headers, len(data), _body_length(headers, max_body))


def _body_length(headers: Message, max_body: int) -> int | None:
    if headers.get("Transfer-Encoding") is not None:
        raise HttpError(411, "chunked bodies are not accepted; send the body with a Content-Length header")
    values = {v.strip() for v in headers.get_all("Content-Length") or []}
    if not values:
        return None
    if len(values) > 1:
        raise HttpError(400, f"conflicting Content-Length headers {sorted(values)}")
    (raw,) = values
    if not _CONTENT_LENGTH.fullmatch(raw):
        raise HttpError(400, f"Content-Length {raw[:40]!r} is not a number of bytes in ASCII digits")
    length = int(raw)
    if length > max_body:
        raise HttpError(413, f"body of {length} bytes is over this server's {max_body}-byte limit")
    return length
