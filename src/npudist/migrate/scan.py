"""Find the CUDA-only constructs of one Python source, with the rewrite for each one that has a mechanical fix.

libcst, not the stdlib ast: ``fix`` must keep comments and formatting, and sharing one concrete tree
between ``check`` and ``fix`` keeps what is reported and what is rewritten the same nodes. Names are
resolved through the file's imports (``from torch.distributed import init_process_group`` is found as
``torch.distributed.init_process_group``); nothing the file names is imported or run.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper

from npudist.migrate.findings import Analysis, Finding
from npudist.migrate.visitor import CudaFinder

__all__ = ["Analysis", "Finding", "analyse", "uses_transfer_to_npu"]


def analyse(source: str, *, bf16_refused: bool = False) -> Analysis:
    """Parse ``source`` (raises ``libcst.ParserSyntaxError``) and report its findings in line order.

    ``bf16_refused``: the active constraint row cannot reduce bfloat16, so a direct collective in a file
    that uses bfloat16 is an error rather than advice.
    """
    wrapper = MetadataWrapper(cst.parse_module(source))
    visitor = CudaFinder(bf16_refused="bfloat16" in source and bf16_refused)
    wrapper.visit(visitor)
    found = sorted(visitor.found, key=lambda f: (f.line, f.column, f.rule))
    return Analysis(wrapper.module, tuple(found))


def uses_transfer_to_npu(analysis: Analysis) -> bool:
    """The file imports ``torch_npu.contrib.transfer_to_npu``, which patches torch.cuda onto the NPU at
    import (Ascend "PyTorch Model Migration: automatic migration"): it runs on Ascend unchanged."""
    return any("transfer_to_npu" in cst.Module([]).code_for_node(line) for line in analysis.module.body
               if isinstance(line, cst.SimpleStatementLine) and
               any(isinstance(s, cst.Import | cst.ImportFrom) for s in line.body))
