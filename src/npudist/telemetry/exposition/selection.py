"""Which reliability and network families a node exporter serves: ``--collectors`` and a counters file.

dcgm-exporter lets a site list the fields it wants in a counters CSV; the same idea here, by name. Entries are
collector names (a tool query: ``ecc``, ``health``, ``usages``, ``link``, ``link_stat``, ``stat``, ``optical``,
``net_health``, ``speed``, ``ip``, ``nvml_ecc``, ``nvml_pages``, ``nvml_xid``, ``nvml_throttle``) or family
names (``npudist_link_pfc_priority_frames_total``); ``all`` or ``none`` start the list, ``-NAME`` switches
one off. ``--collectors all,-optical,-npudist_link_pfc_priority_frames_total`` serves everything but the
optical module and per-priority PFC. A file holds the same entries, one per line, ``#`` comments allowed.
A query whose families are all off is not run at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


class SelectionError(ValueError):
    """A --collectors entry names nothing known; the message lists what is."""


@dataclass(frozen=True)
class Selection:
    families: frozenset[str]
    """Families switched on."""

    def on(self, family: str) -> bool:
        return family in self.families

    def any_on(self, families: Iterable[str]) -> bool:
        return any(f in self.families for f in families)


def parse_selection(spec: str | Iterable[str], collectors: Mapping[str, tuple[str, ...]]) -> Selection:
    """``spec`` (comma-separated, or entries) against ``collectors`` {collector name: its families}."""
    entries = [e.strip() for e in (spec.split(",") if isinstance(spec, str) else spec) if e.strip()]
    every = frozenset(f for fams in collectors.values() for f in fams)
    chosen: set[str] = set(every)
    for i, entry in enumerate(entries or ["all"]):
        off = entry.startswith("-")
        name = entry.lstrip("-+")
        if name in ("all", "none") and not off:
            chosen = set(every) if name == "all" else set()
            continue
        if name in collectors:
            names = set(collectors[name])
        elif name in every:
            names = {name}
        else:
            raise SelectionError(f"--collectors entry {entry!r} is neither a collector ({', '.join(collectors)}) "
                                 f"nor a family they serve (`npudist exporter --list-collectors`)")
        if i == 0 and not off:
            chosen = set()  # a list that starts with names serves only those
        chosen = chosen - names if off else chosen | names
    return Selection(frozenset(chosen))


def read_selection_file(path: str | Path) -> list[str]:
    """Entries of a counters file: one per line, blank lines and ``#`` comments ignored."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SelectionError(f"--collectors-file {str(path)!r}: cannot read it ({exc.strerror or exc})") from None
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]
