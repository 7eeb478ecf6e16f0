"""The threads that watch collectives for hangs, and what they keep in the job's store.

``watchdog``: each rank numbers its collectives and publishes its progress record; ``reader``: rank 0's
thread that reads every record, probes the suspects and acts on the verdict; ``store``: the store keys;
``main_thread``: a look at what the main thread is doing; ``process_table``: whether a pid means anything
here; ``abort_note``: what an aborted rank leaves behind. The verdicts themselves are pure and live in
npudist.diagnosis.

Until it became this package, ``npudist.comm.hang`` was the verdict module: its names are still served from
here for one release (``from npudist.comm.hang import judge``).
"""

from types import MappingProxyType

from npudist._lazy import exports, listing

_WHERE = MappingProxyType({name: "npudist.diagnosis.hang" for name in (
    "FLOOR_S", "GAP_WINDOW", "NAMED_IN_LINE", "SAFETY_FACTOR", "ProgressTracker", "Suspects", "Verdict", "judge",
    "suspects", "waiting_groups")})
__getattr__ = exports(__name__, _WHERE)
__dir__ = listing(__name__, _WHERE)
