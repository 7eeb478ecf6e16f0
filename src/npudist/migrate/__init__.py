"""`npudist migrate`: find the CUDA-only code of a training script and rewrite it for any accelerator.

The names load on first use, so the `npudist` command (which registers `migrate`) starts in environments
without libcst, such as the RKNN toolkit's.
"""

from types import MappingProxyType

from npudist._lazy import exports, listing

_WHERE = MappingProxyType({
    "RULES": "npudist.migrate.rules",
    "Rule": "npudist.migrate.rules",
    "Analysis": "npudist.migrate.scan",
    "Finding": "npudist.migrate.scan",
    "analyse": "npudist.migrate.scan",
    "Fixed": "npudist.migrate.fix",
    "apply": "npudist.migrate.fix",
})
__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
__dir__ = listing(__name__, _WHERE)
