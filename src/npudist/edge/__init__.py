"""Edge models for Rockchip NPUs: convert a torch module or ONNX file to ``.rknn`` with rknn-toolkit2 and
check what accuracy it keeps. Runs inside the toolkit's own environment (``make rknn-env``)."""

from npudist.edge.convert import ConversionError, ConvertResult, convert
from npudist.edge.recipe import DTYPES, TARGETS, Recipe
from npudist.edge.toolkit import ToolkitMissing, require_toolkit

__all__ = ["DTYPES", "TARGETS", "ConversionError", "ConvertResult", "Recipe", "ToolkitMissing", "convert",
           "require_toolkit"]
