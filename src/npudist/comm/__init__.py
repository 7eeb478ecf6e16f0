"""Collectives that honour every backend's constraints, with the adaptations they cost accounted for."""

from npudist.comm import bucketing as _bucketing
from npudist.comm import collectives as _collectives
from npudist.comm import watched as _watched
from npudist.comm.collectives import Handle
from npudist.comm.constraints import PROFILES, Constraints, describe, profile
from npudist.comm.handshake import MismatchError
from npudist.comm.hang.watchdog import CollectiveHangError
from npudist.comm.recorder import DURATION_BUCKETS, CommStats, OpStats
from npudist.comm.state import (
    active_constraints,
    busy,
    hang_stall_seconds,
    progress,
    reset_stats,
    set_debug,
    set_profile,
    set_recording,
    set_run_dir,
    stats,
    store_rtt_seconds,
    where,
)
from npudist.runtime.settings import PROFILE_VAR

# The public collectives are numbered and watched, so a hang names the rank that never arrived.
all_reduce = _watched.watched("all_reduce", _collectives.all_reduce)
broadcast = _watched.watched("broadcast", _collectives.broadcast)
all_gather = _watched.watched("all_gather", _collectives.all_gather)
reduce_scatter = _watched.watched("reduce_scatter", _collectives.reduce_scatter)
all_reduce_many = _watched.watched("all_reduce_many", _bucketing.all_reduce_many)

__all__ = [
    "DURATION_BUCKETS",
    "PROFILES",
    "PROFILE_VAR",
    "CollectiveHangError",
    "CommStats",
    "Constraints",
    "Handle",
    "MismatchError",
    "OpStats",
    "active_constraints",
    "all_gather",
    "all_reduce",
    "all_reduce_many",
    "broadcast",
    "busy",
    "describe",
    "hang_stall_seconds",
    "profile",
    "progress",
    "reduce_scatter",
    "reset_stats",
    "set_debug",
    "set_profile",
    "set_recording",
    "set_run_dir",
    "stats",
    "store_rtt_seconds",
    "where",
]
