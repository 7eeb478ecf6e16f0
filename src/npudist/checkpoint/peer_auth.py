"""The peer snapshot holder's per-job secret: where it comes from, and the MAC that proves a message knows it.

Why a secret and not the network alone: a holder keeps a job's model and optimizer state, and the job
resumes from what it hands back; anyone who can connect could otherwise read the state or plant a copy.
Why not the rendezvous store: torch's TCPStore has no authentication, so anyone who can reach the job
could read a secret kept there (docs/reference/security.md).

Where the secret comes from, first match wins (``launch_secret``):

1. ``NPUDIST_PEER_SECRET``: set by the user or the scheduler, the same value on every node (hex, at
   least 32 digits);
2. ``NPUDIST_PEER_SECRET_FILE``: a file on storage every node shares (the run directory), mode 0600 and
   owned by this user; the first node's launch creates it (atomically, so every node reads one value);
3. on one node only: a fresh secret made by this `npudist launch`.

A job over several nodes with neither 1 nor 2 is refused at start: each node's launch would make its own,
and no node's copy would reach another's holder. The ranks get the secret from their launcher's
environment (``SECRET_VAR``), never over the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

SECRET_VAR = "NPUDIST_PEER_SECRET"
"""The job's peer snapshot secret (hex); `npudist launch` sets it for its ranks and holder."""
SECRET_FILE_VAR = "NPUDIST_PEER_SECRET_FILE"
"""A mode-0600 file on shared storage holding the secret, for jobs over several nodes."""
MIN_HEX_DIGITS = 32
"""128 bits: HMAC-SHA256's key needs no more to be out of reach of guessing."""
MAC_BYTES = 32
_DOMAINS = MappingProxyType({"request": b"npudist-peer-request\0", "reply": b"npudist-peer-reply\0"})
"""A request's MAC never verifies as a reply's and the other way round, so neither can be reflected."""


class PeerSecretError(ValueError):
    """The job's secret cannot be had or is unsafe; the message says what to set."""


def mac(secret: bytes, kind: str, header: bytes) -> bytes:
    """HMAC-SHA256 of a raw header; the header names the payload's sha256 and size, so it covers both."""
    return hmac.new(secret, _DOMAINS[kind] + header, hashlib.sha256).digest()


def verify(secret: bytes, kind: str, header: bytes, tag: bytes) -> bool:
    """Constant-time: how much of ``tag`` matched does not show in the time the answer takes."""
    return hmac.compare_digest(mac(secret, kind, header), tag)


def parse(raw: str, source: str) -> bytes:
    """The key bytes of a hex secret; PeerSecretError naming ``source`` when it is short or not hex."""
    text = raw.strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(text) < MIN_HEX_DIGITS or not key:
        raise PeerSecretError(f"{source}: the peer snapshot secret must be at least {MIN_HEX_DIGITS} hex digits "
                              f"(make one with: python -c 'import secrets; print(secrets.token_hex(32))')")
    return key


def from_env(env: Mapping[str, str] | None = None) -> bytes:
    """A rank's secret, as its launcher set it; PeerSecretError when it did not."""
    env = os.environ if env is None else env
    raw = env.get(SECRET_VAR, "")
    if not raw.strip():
        raise PeerSecretError(f"{SECRET_VAR} is not set: peer snapshots need the job's secret, which "
                              "`npudist launch --peer-snapshots K` gives its ranks")
    return parse(raw, SECRET_VAR)


def launch_secret(env: Mapping[str, str], *, multi_node: bool) -> tuple[str, str]:
    """(the secret as hex, where it came from) for this node's holder and ranks."""
    raw = env.get(SECRET_VAR, "").strip()
    if raw:
        parse(raw, SECRET_VAR)
        return raw, SECRET_VAR
    path = env.get(SECRET_FILE_VAR, "").strip()
    if path:
        return _from_file(Path(path)), f"{SECRET_FILE_VAR}={path}"
    if multi_node:
        raise PeerSecretError(missing_on_several_nodes())
    return secrets.token_hex(32), "made by this launch (one node)"


def missing_on_several_nodes() -> str:
    return (f"--peer-snapshots on several nodes needs one secret shared by every node's launch: export "
            f"{SECRET_VAR}=$(python -c 'import secrets; print(secrets.token_hex(32))') with the same value on "
            f"every node (a scheduler's job secret), or {SECRET_FILE_VAR}=PATH on storage every node shares "
            "(the run directory; the first launch creates it, mode 0600)")


def _from_file(path: Path) -> str:
    """Read the secret file, or create it when absent: written to a private temporary name, then linked into
    place, which fails when another node's launch linked its own first (then that one is read)."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            with contextlib.suppress(FileExistsError):  # another node's launch linked its secret first
                os.link(tmp, path)
        except OSError as exc:
            raise PeerSecretError(f"{SECRET_FILE_VAR}={path}: cannot create it ({exc}); make the directory "
                                  f"writable or set {SECRET_VAR} instead") from None
        finally:
            tmp.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise PeerSecretError(f"{SECRET_FILE_VAR}={path}: cannot read it ({exc}; a link is not followed)") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PeerSecretError(f"{SECRET_FILE_VAR}={path}: mode {stat.S_IMODE(st.st_mode):o}, owner uid "
                                  f"{st.st_uid}; it must be a file of this user (uid {os.getuid()}) that no one "
                                  f"else can read: chmod 600 {path}")
        raw = f.read(4096)
    parse(raw, f"{SECRET_FILE_VAR}={path}")
    return raw.strip()
