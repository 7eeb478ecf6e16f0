"""What `npudist migrate` found in one source: each CUDA-only construct with its rule, place and rewrite."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from npudist.migrate.rewrites import Rewrite
from npudist.migrate.rules import RULES


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    column: int
    code: str
    """The source text of the construct (first line)."""
    detail: str = ""
    """What is specific to this occurrence (the HCCL counterpart of an NCCL variable, say)."""
    fix: Rewrite | None = None
    """Makes the node that replaces the matched one; None where a person must decide."""
    node: cst.CSTNode | None = None

    @property
    def severity(self) -> str:
        return RULES[self.rule].severity


@dataclass(frozen=True)
class Analysis:
    module: cst.Module
    findings: tuple[Finding, ...]
