"""Custom operators that keep one definition across devices, torch.compile and DDP.

``define`` wraps torch.library.custom_op (torch >= 2.4); ``swish``/``Swish`` is the worked example.
"""

from types import MappingProxyType

from npudist._lazy import exports, listing
from npudist.ops.ctypes_kernel import CtypesKernel, KernelConstraints, KernelError, aligned_empty, conform
from npudist.ops.custom import KernelDeclined, Operator, OpsUnavailable, define, require_custom_op

__all__ = [
    "CtypesKernel",
    "KernelConstraints",
    "KernelDeclined",
    "KernelError",
    "Operator",
    "OpsUnavailable",
    "Swish",
    "aligned_empty",
    "conform",
    "define",
    "register_swish_kernel",
    "require_custom_op",
    "swish",
    "swish_backward",
]


# The swish operators are registered with torch on first use of these names, not on `import npudist.ops`,
# so importing the package on torch < 2.4 still works and can report OpsUnavailable where it matters.
_WHERE = MappingProxyType(dict.fromkeys(("Swish", "swish", "swish_backward", "register_swish_kernel"),
                                        "npudist.ops.activations"))

__getattr__ = exports(__name__, _WHERE)
__dir__ = listing(__name__, _WHERE)
