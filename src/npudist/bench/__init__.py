"""`npudist bench`: the command (cli.py, importing torch only to run) and the rank that times the collectives
under torchrun (rank.py). The command's names (``npudist.bench.app``, ``parse_size``, ``summarise``...) are
still found here, loaded on first use, so that a rank running rank.py does not load typer and rich."""

from __future__ import annotations

from types import MappingProxyType

from npudist._lazy import exports, listing

_WHERE = MappingProxyType(dict.fromkeys(
    ("COLLECTIVES", "DTYPES", "ROW_HEADER", "app", "average_busbw_line", "bus_factor", "collective", "parse_size",
     "rank_command", "row_line", "run_ranks", "sizes", "summarise", "table"), "npudist.bench.cli"))

__getattr__ = exports(__name__, _WHERE)
__dir__ = listing(__name__, _WHERE)
__all__ = sorted(_WHERE)
