"""Collectives that honour every backend's constraints, with the adaptations they cost accounted for."""

from npudist.comm import bucketing as _bucketing
from npudist.comm import collectives as _collectives
from npudist.comm.collectives import Handle
from npudist.comm.constraints import PROFILE_VAR, PROFILES, Constraints, constraints, describe, profile
from npudist.comm.context import set_debug, set_profile
from npudist.comm.handshake import MismatchError
from npudist.comm.stats import DURATION_BUCKETS, CommStats, OpStats, reset_stats, set_recording, stats
from npudist.comm.watchdog import CollectiveHangError, set_run_dir, watched

# The public collectives are numbered and watched, so a hang names the rank that never arrived.
all_reduce = watched("all_reduce", _collectives.all_reduce)
broadcast = watched("broadcast", _collectives.broadcast)
all_gather = watched("all_gather", _collectives.all_gather)
reduce_scatter = watched("reduce_scatter", _collectives.reduce_scatter)
all_reduce_many = watched("all_reduce_many", _bucketing.all_reduce_many)

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
    "all_gather",
    "all_reduce",
    "all_reduce_many",
    "broadcast",
    "constraints",
    "describe",
    "profile",
    "reduce_scatter",
    "reset_stats",
    "set_debug",
    "set_profile",
    "set_recording",
    "set_run_dir",
    "stats",
]
