"""Edge models for Rockchip NPUs: convert a torch module or ONNX file to ``.rknn`` with rknn-toolkit2 and
check what accuracy it keeps. Runs inside the toolkit's own environment (``make rknn-env``).

Names load on first use, so `npudist edge --help` does not import numpy.
"""

from types import MappingProxyType

from npudist._lazy import exports, listing

_WHERE = MappingProxyType({
    "ConversionError": "npudist.edge.conversion",
    "ConvertResult": "npudist.edge.conversion",
    "convert": "npudist.edge.conversion",
    "DTYPES": "npudist.edge.recipe",
    "TARGETS": "npudist.edge.recipe",
    "Recipe": "npudist.edge.recipe",
    "ToolkitMissing": "npudist.edge.toolkit",
    "require_toolkit": "npudist.edge.toolkit",
})

__all__ = sorted(_WHERE)

__getattr__ = exports(__name__, _WHERE)
__dir__ = listing(__name__, _WHERE)
