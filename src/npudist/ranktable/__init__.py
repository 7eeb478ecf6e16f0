"""HCCL rank tables: write one from each node's device NICs, merge the nodes', and check one field by field."""

from npudist.ranktable.table import Defect, Device, Node, RankTableError, build, check

__all__ = ["Defect", "Device", "Node", "RankTableError", "build", "check"]
