"""Load and build one recipe with rknn-toolkit2, naming the operator the toolkit refuses.

Shared by ``convert`` (which writes the recipe) and the simulator runner (which rebuilds from it, since the
toolkit's simulator refuses a model loaded from a ``.rknn`` file).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from npudist.edge.recipe import Recipe
from npudist.edge.toolkit import require_toolkit


class ConversionError(RuntimeError):
    """The toolkit could not convert the model; ``op`` names the operator when the toolkit's message does."""

    def __init__(self, message: str, op: str | None = None) -> None:
        super().__init__(message)
        self.op = op


def toolkit_message(exc: BaseException) -> str:
    """The toolkit's own words: it raises ValueError whose text is a whole traceback; its last error line."""
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[\w.]*(Error|Exception|Fail)\b.*?:", lines[i]):
            return " ".join(lines[i:])
    return lines[-1] if lines else type(exc).__name__


def name_op(message: str, nodes: Sequence[tuple[str, str]]) -> str | None:
    """The ``OpType('node')`` the toolkit's message is about, from the ONNX graph's (op_type, name) pairs.

    The toolkit names a node as ``Unique('y')`` or by its node name alone; an op type named without a node is
    matched last, so "Op (Det)" from onnxruntime's shape inference still finds it.
    """
    for op_type, name in nodes:
        if name and (f"'{name}'" in message or f"({name})" in message):
            return f"{op_type}('{name}')"
    for op_type, name in nodes:
        if re.search(rf"\b{re.escape(op_type)}\b", message):
            return f"{op_type}('{name}')" if name else op_type
    return None


def _onnx_nodes(path: str) -> list[tuple[str, str]]:
    import onnx

    return [(n.op_type, n.name or (n.output[0] if n.output else "")) for n in onnx.load(path).graph.node]


def build(recipe: Recipe, *, verbose: bool = False) -> Any:
    """An ``RKNN`` object with ``recipe`` loaded and built (the caller exports, runs or releases it).

    Raises ConversionError naming the op and quoting the toolkit when load_onnx or build fails.
    """
    api = require_toolkit()
    rknn = api.RKNN(verbose=verbose)
    steps: list[tuple[str, Callable[[], int]]] = [
        ("config", lambda: rknn.config(target_platform=recipe.target)),
        ("load_onnx", lambda: rknn.load_onnx(recipe.onnx, inputs=[_onnx_input_name(recipe.onnx)],
                                             input_size_list=[list(recipe.input_shape)])),
        ("build", lambda: rknn.build(do_quantization=recipe.dtype == "int8", dataset=recipe.dataset)),
    ]
    for step, call in steps:
        try:
            code, message = call(), ""
        except Exception as exc:  # the toolkit raises ValueError with its log text for a refused model
            code, message = -1, toolkit_message(exc)
        if code != 0:
            rknn.release()
            op = name_op(message, _onnx_nodes(recipe.onnx)) if message else None
            what = f"operator {op} cannot be converted" if op else "the model cannot be converted"
            raise ConversionError(f"rknn-toolkit2 {step} for {recipe.target} ({recipe.dtype}): {what}. "
                                  f"Toolkit: {message or f'returned {code}, see its log above'}", op)
    return rknn


def _onnx_input_name(path: str) -> str:
    import onnx

    return onnx.load(path).graph.input[0].name
