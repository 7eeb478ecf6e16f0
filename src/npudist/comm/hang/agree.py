"""The job's timeouts compared once at start, through the store the watchdog already uses.

Each rank publishes its values of diagnosis.timeouts.TIMEOUT_VARS once, beside where it runs (one ``set`` and
one ``add`` per rank); rank 0's watchdog thread counts the arrivals with one ``add(key, 0)`` a period and, once
every rank is in, reads them all with one ``multi_get`` and prints one line naming the ranks that differ from
the majority (diagnosis/timeouts.py says why it matters). O(1) store calls per rank, O(N) keys read once.
A difference is never fatal, and a store fault here only drops the comparison.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from npudist.comm.hang.store import _key, read_places
from npudist.diagnosis import timeouts

log = logging.getLogger("npudist.comm")
WAIT_S = 600.0
"""Rank 0 stops counting arrivals after this (a rank that never publishes: its watchdog is off)."""


def env_key(rank: int) -> str:
    return _key(f"env/{rank}")


def count_key() -> str:
    return _key("env_n")


def publish(store: Any, rank: int, env: Mapping[str, str]) -> None:
    """This rank's timeouts, once: its key, then the arrival count (so a counted rank's key is there)."""
    store.set(env_key(rank), json.dumps(timeouts.mine(env)))
    store.add(count_key(), 1)


def _values(raw: bytes | str) -> dict[str, str]:
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return {k: v for k, v in doc.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(doc, dict) else {}


class TimeoutsCheck:
    """Rank 0's one comparison; ``tick`` once a period until it returns True (compared, or given up)."""

    def __init__(self, world: int, *, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.world, self._out, self._clock = world, out, clock
        self._began = clock()
        self.said: str | None = None
        """The line printed, if the ranks differed."""

    def tick(self, store: Any) -> bool:
        try:
            if int(store.add(count_key(), 0)) < self.world:
                if self._clock() - self._began < WAIT_S:
                    return False
                log.debug("npudist: not every rank published its timeouts in %.0f s; not compared", WAIT_S)
                return True
            ranks = list(range(self.world))
            values = {r: _values(raw) for r, raw in zip(ranks, store.multi_get([env_key(r) for r in ranks]),
                                                          strict=True)}
            found = timeouts.disagreements(values)
            if found:
                odd = sorted({r for d in found for _, rs in d.odd for r in rs})
                hosts = {r: p.host for r, p in read_places(store, odd).items() if p.host}
                self.said = timeouts.line(found, hosts)
                print(self.said, file=self._out or sys.stderr, flush=True)
        except Exception as exc:  # a courtesy: the job goes on without the comparison
            log.debug("npudist: timeouts not compared: %s: %s", type(exc).__name__, exc)
        return True
