"""How an ``.rknn`` file was built, written next to it as ``<file>.rknn.json``.

Why a recipe: rknn-toolkit2's simulator cannot run a loaded ``.rknn`` (``init_runtime()`` without a target
refuses models from ``load_rknn``: "use 'load_xxx' & 'build' instead", toolkit 2.5.0), so a simulator run
rebuilds the model from the same ONNX, target, dtype and calibration set; the board loads the ``.rknn``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType

# Platforms npudist offers for RKNN.config(target_platform=...): each one built and run in rknn-toolkit2
# 2.5.0's simulator (tests/edge/test_rknn_toolkit.py). Value: NPU cores on the SoC.
TARGETS = MappingProxyType({"rk3588": 3, "rk3576": 2, "rk3566": 1})
# fp16: the toolkit's float build (config float_dtype='float16'); int8: w8a8 quantised with a calibration set.
DTYPES = ("fp16", "int8")
ONNX_OPSET = 19
"""rknn-toolkit2 2.5.0's load_onnx refuses opsets above 19 ("Unsupport onnx opset 20, need <= 19")."""


@dataclass(frozen=True)
class Recipe:
    """Everything ``RKNN.config/load_onnx/build`` need to make the same model again."""

    onnx: str
    """The source model, exported from torch at ONNX_OPSET or given as ONNX."""
    input_shape: tuple[int, ...]
    """The fixed input shape the model is built for (its first dimension is the batch the runtime takes)."""
    target: str = "rk3588"
    dtype: str = "fp16"
    dataset: str | None = None
    """int8 only: the toolkit's dataset file, one ``.npy`` calibration input per line."""
    accuracy: dict[str, float] = field(default_factory=dict)
    """max_abs_error, top1_agreement and samples from the conversion's check against torch."""

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target {self.target!r}: choose one of {', '.join(TARGETS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.dtype == "int8" and not self.dataset:
            raise ValueError("int8 needs a calibration set (a directory of .npy samples or a dataset callable)")
        if not self.input_shape or any(int(d) < 1 for d in self.input_shape):
            raise ValueError(f"input_shape {self.input_shape}: every dimension must be at least 1")

    @property
    def batch(self) -> int:
        return int(self.input_shape[0])

    def save(self, rknn_path: str | Path) -> Path:
        path = Path(f"{rknn_path}.json")
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Recipe:
        """From ``model.rknn.json``, or from ``model.rknn`` (its recipe next to it)."""
        path = Path(path)
        if path.suffix != ".json":
            path = Path(f"{path}.json")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the conversion recipe {path}: {exc} (written by "
                             "`npudist edge convert` next to the .rknn)") from exc
        data["input_shape"] = tuple(data["input_shape"])
        return cls(**data)
