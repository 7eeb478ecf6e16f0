"""Distributed init from any launcher's environment."""

from npudist.dist.env import EnvError, RankInfo, rank_info, torchrun_env
from npudist.dist.init import DistContext, DistInitError, context, init, shutdown

__all__ = [
    "DistContext",
    "DistInitError",
    "EnvError",
    "RankInfo",
    "context",
    "init",
    "rank_info",
    "shutdown",
    "torchrun_env",
]
