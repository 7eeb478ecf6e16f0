"""The store's key check on every supported torch: torch 2.1.2's TCPStore and PrefixStore have no check()
(measured), and the hang reader, the watchdog and the verdict wait ask for keys without waiting on them."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from npudist.runtime import compat


class _Torch21Store:
    """A real store seen through the methods torch 2.1.2's stores have (no check)."""

    def __init__(self, store: dist.Store) -> None:
        self._s = store

    def __getattr__(self, name: str):
        if name == "check":
            raise AttributeError(name)
        return getattr(self._s, name)


@pytest.mark.parametrize("old", [False, True])
def test_a_key_is_found_set_or_missing_without_waiting_and_without_being_written(old):
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=5), wait_for_workers=False)
    store = dist.PrefixStore("npudist/", server)
    store = _Torch21Store(store) if old else store
    keys = server.num_keys()
    assert not compat.store_has(store, "verdict") and not compat.store_has_all(store, ["verdict"])
    assert server.num_keys() == keys  # asking wrote nothing
    store.set("verdict", "{}")
    store.set("empty", "")
    assert compat.store_has(store, "verdict") and compat.store_has(store, "empty")
    assert compat.store_has_all(store, ["verdict", "empty"]) and not compat.store_has_all(store, ["verdict", "x"])
    assert store.get("verdict") == b"{}"
