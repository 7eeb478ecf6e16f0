"""`npudist migrate`: find the CUDA-only code of a training script and rewrite it for any accelerator."""

from npudist.migrate.fix import Fixed, apply
from npudist.migrate.rules import RULES, Rule
from npudist.migrate.scan import Analysis, Finding, analyse

__all__ = ["RULES", "Analysis", "Finding", "Fixed", "Rule", "analyse", "apply"]
