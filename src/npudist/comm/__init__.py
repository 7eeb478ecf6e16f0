"""Collectives that honour every backend's constraints, with the adaptations they cost accounted for."""

from npudist.comm.bucketing import all_reduce_many
from npudist.comm.collectives import Handle, all_gather, all_reduce, broadcast, reduce_scatter
from npudist.comm.constraints import PROFILE_VAR, PROFILES, Constraints, constraints, describe, profile
from npudist.comm.context import set_debug, set_profile
from npudist.comm.handshake import MismatchError
from npudist.comm.stats import DURATION_BUCKETS, CommStats, OpStats, reset_stats, set_recording, stats

__all__ = [
    "DURATION_BUCKETS",
    "PROFILES",
    "PROFILE_VAR",
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
    "stats",
]
