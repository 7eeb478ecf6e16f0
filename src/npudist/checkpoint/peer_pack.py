"""The bytes of a peer snapshot: the optimizers' tensors in one flat host buffer per dtype.

``torch.save`` pickles every tensor through Python (``Tensor.__reduce_ex__`` and a persistent id per
storage): for the example's 112 tensors it held the stager thread, and with it the GIL the training loop
needs, 3-10 ms per snapshot on this project's 2-core hosts, longer than the example's step; and it
writes a large storage with the GIL held too (25 ms for 25 MB, a CRC included). So the optimizers'
tensors, the bulk of the state, are copied into one reused buffer per dtype (one
``torch._foreach_copy_``); the payload is MAGIC, the length of a header, the header (``torch.save`` of
the state with those tensors taken out, ``None`` in their place, and a table of where each one lies in
the flat buffers), then the flat buffers' bytes as they are. ``unpack`` puts a copy of each tensor back;
a payload without MAGIC (a plain saved state, as copies were before) loads as it is.
"""

from __future__ import annotations

import io
import math
import warnings
from typing import Any

import torch

from npudist.checkpoint.peer_view import Path, assemble

MAGIC = b"npudist-peer-flat-1\n"


class FlatCopy:
    """Copies a list of host tensors into one buffer per dtype, kept while the list's layout (the shapes
    and dtypes, in order) holds; the caller must not copy again before it has serialised the last one."""

    def __init__(self) -> None:
        self._layout: tuple[tuple[Any, ...], ...] | None = None
        self.buffers: list[torch.Tensor] = []
        self.slots: list[tuple[int, int, tuple[int, ...]]] = []
        """Per tensor: the index of its dtype's buffer, its offset in elements there, and its shape."""
        self._views: list[torch.Tensor] = []
        self.allocations = 0
        """How many times the buffers were (re)allocated: once per new layout."""

    def copy(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Views of the flat buffers holding each tensor's values now, in order."""
        layout = tuple((tuple(t.shape), t.dtype) for t in tensors)
        if layout != self._layout:
            sizes: dict[torch.dtype, int] = {}
            at: list[tuple[torch.dtype, int]] = []
            for t in tensors:
                at.append((t.dtype, sizes.get(t.dtype, 0)))
                sizes[t.dtype] = at[-1][1] + t.numel()
            dtypes = list(sizes)
            self.buffers = [torch.empty(sizes[d], dtype=d) for d in dtypes]
            self.slots = [(dtypes.index(d), off, tuple(t.shape)) for (d, off), t in zip(at, tensors, strict=True)]
            self._views = [self.buffers[i][off:off + math.prod(shape)].view(shape) for i, off, shape in self.slots]
            self._layout = layout
            self.allocations += 1
        sources = [t.detach() for t in tensors]
        if sources and hasattr(torch, "_foreach_copy_"):  # torch >= 2.1: one call, not one per tensor
            torch._foreach_copy_(self._views, sources)
        else:
            for view, src in zip(self._views, sources, strict=True):
                view.copy_(src)
        return self._views

    def close(self) -> None:
        self._layout, self.buffers, self.slots, self._views = None, [], [], []


def pack(state: Any, early: dict[Path, Any], owned: list[torch.Tensor], flat: FlatCopy) -> dict[str, Any]:
    """What ``torch.save`` writes for a snapshot: ``state`` with the copies made at the call in place, and
    each tensor of ``owned`` (found in ``state`` by ``peer_view.walk``) copied into ``flat`` now."""
    flat.copy(owned)
    slot = {id(t): s for t, s in zip(owned, flat.slots, strict=True)}
    table: list[tuple[Path, int, int, tuple[int, ...]]] = []

    def take_out(t: torch.Tensor, path: Path) -> None:
        table.append((path, *slot[id(t)]))

    return {"state": assemble(state, early, take_out), "tensors": table, "flat": list(flat.buffers)}


def to_bytes(packed: dict[str, Any]) -> bytes:
    """The payload of what ``pack`` returned (module docstring)."""
    head = io.BytesIO()
    torch.save({"state": packed["state"], "tensors": packed["tensors"],
                "flat": [(str(b.dtype).removeprefix("torch."), b.numel() * b.element_size()) for b in packed["flat"]]},
               head)
    header = head.getvalue()
    raw = [memoryview(b.view(torch.uint8).numpy()) for b in packed["flat"] if b.numel()]
    return b"".join([MAGIC, len(header).to_bytes(8, "little"), header, *raw])


def unpack(payload: bytes) -> Any:
    """The state a payload holds, each tensor its own copy; ValueError when the bytes do not add up."""
    if not payload.startswith(MAGIC):
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    start = len(MAGIC) + 8
    end = start + int.from_bytes(payload[len(MAGIC):start], "little")
    head = torch.load(io.BytesIO(payload[start:end]), map_location="cpu", weights_only=True)
    flat, offset = [], end
    for name, nbytes in head["flat"]:
        if offset + nbytes > len(payload):
            raise ValueError(f"peer snapshot payload cut short: {len(payload)} bytes, its header says more")
        with warnings.catch_warnings():  # read-only bytes: copied at once, never written through
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(payload, dtype=torch.uint8, offset=offset, count=nbytes) if nbytes else \
                torch.empty(0, dtype=torch.uint8)
        flat.append(raw.clone().view(getattr(torch, name)))
        offset += nbytes
    state = head["state"]
    for path, i, off, shape in head["tensors"]:
        state = _put(state, tuple(path), flat[i][off:off + math.prod(shape)].view(tuple(shape)).clone())
    return state


def _put(obj: Any, path: Path, value: Any) -> Any:
    """``obj`` with ``value`` at ``path``; dicts and lists changed in place, tuples rebuilt."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    child = _put(obj[key], rest, value)
    if isinstance(obj, tuple):
        return tuple(child if i == key else v for i, v in enumerate(obj))
    obj[key] = child
    return obj
