"""The two Rockchip runtimes behind one call: RKNN Lite on an RK3588 board, rknn-toolkit2's simulator on a PC.

Here, one floor below npudist.infer, because `npudist edge convert` checks its .rknn in the simulator and
the ensemble runs members on either: edge does not import infer.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from npudist.edge.recipe import Recipe

# rknn-toolkit-lite2 core masks, the RKNNLite.NPU_CORE_* names of rknnlite/api/rknn_lite.py (2.5.0): 0 auto,
# 1/2/4 one core, 3 cores 0&1, 7 cores 0&1&2 (RK3588 only), 0xffff all cores.
CORE_MASKS = MappingProxyType({"auto": "NPU_CORE_AUTO", "0": "NPU_CORE_0", "1": "NPU_CORE_1", "2": "NPU_CORE_2",
              "0_1": "NPU_CORE_0_1", "0_1_2": "NPU_CORE_0_1_2", "all": "NPU_CORE_ALL"})


class RunnerError(RuntimeError):
    """A member model cannot be loaded or run; the message says which and why."""


class _RKNNRunner:
    """The call both Rockchip runtimes share: ``inference(inputs=[ndarray], data_format=...)`` returns a list
    of outputs, or None after logging its error (RKNN in rknn/api/rknn.py, RKNNLite in rknn_lite.py, 2.5.0).

    An .rknn model is built for a fixed input shape whose first dimension is the batch, hence ``batch_size``:
    a batch is cut into chunks of that size, the last one padded with zeros and its padding dropped.
    """

    kind = "rknn"
    core_mask = "auto"
    path = ""
    batch_size = 1
    rknn: Any = None

    def __call__(self, batch: Tensor) -> Tensor:
        # The toolkit's default data_format for 4-D inputs is nhwc; torch models take nchw.
        data_format = "nchw" if batch.dim() == 4 else None
        outs = []
        for chunk in batch.split(self.batch_size):
            n = chunk.shape[0]
            if n < self.batch_size:
                chunk = torch.cat([chunk, chunk.new_zeros(self.batch_size - n, *chunk.shape[1:])])
            result = self.rknn.inference(inputs=[chunk.float().numpy()], data_format=data_format)
            if not result:  # the runtime logs its error and returns None instead of raising
                raise RunnerError(f"{self.kind} inference returned no outputs for {self.path} (batch of "
                                  f"{chunk.shape[0]}; its log above says why)")
            outs.append(torch.as_tensor(result[0]).float().reshape(chunk.shape[0], -1)[:n])
        return torch.cat(outs)

    def release(self) -> None:
        self.rknn.release()


class RKNNLiteRunner(_RKNNRunner):
    """An ``.rknn`` model on the board's NPU through rknn-toolkit-lite2.

    API as in rknn-toolkit-lite2 2.5.0 rknnlite/api/rknn_lite.py: ``RKNNLite()``, ``load_rknn(path)`` and
    ``init_runtime(core_mask=...)`` return 0 on success, ``inference(inputs=[ndarray])`` returns a list of
    output arrays, ``release()`` frees the NPU.
    """

    kind = "rknnlite"

    def __init__(self, path: str, *, core_mask: str = "auto", batch_size: int = 1) -> None:
        if core_mask not in CORE_MASKS:
            raise RunnerError(f"core_mask {core_mask!r}: choose one of {', '.join(CORE_MASKS)}")
        if batch_size < 1:
            raise RunnerError(f"batch_size must be at least 1, got {batch_size}")
        try:
            api = importlib.import_module("rknnlite.api")
        except ImportError as exc:
            raise RunnerError(f"cannot run {path}: rknn-toolkit-lite2 is not installed ({exc}); "
                              "install the rknn_toolkit_lite2 wheel for this board's Python") from exc
        self.path, self.batch_size, self.core_mask = path, batch_size, core_mask
        self.rknn = api.RKNNLite()
        if self.rknn.load_rknn(path) != 0:
            raise RunnerError(f"RKNNLite.load_rknn({path!r}) failed: is it an .rknn file for this SoC?")
        mask = getattr(api.RKNNLite, CORE_MASKS[core_mask])
        if self.rknn.init_runtime(core_mask=mask) != 0:
            self.rknn.release()
            raise RunnerError(f"RKNNLite.init_runtime(core_mask={core_mask}) failed for {path}: check the "
                              "rknpu driver (dmesg | grep -i rknpu) and that librknnrt.so matches the "
                              "toolkit")


class RKNNSimulatorRunner(_RKNNRunner):
    """The same model in rknn-toolkit2's simulator on a PC (``RKNN.init_runtime()`` with no target).

    The simulator refuses a model from ``load_rknn``, so this rebuilds it from the recipe
    ``npudist edge convert`` wrote next to the ``.rknn`` (same ONNX, target, dtype and calibration set).
    ``built`` hands over an RKNN object that was just built from ``recipe``. No NPU cores: ``core_mask``
    reads "simulator".
    """

    kind = "rknn-sim"
    core_mask = "simulator"

    def __init__(self, recipe: Recipe | str, *, built: Any = None) -> None:
        from npudist.edge.build import build

        self.recipe = recipe if isinstance(recipe, Recipe) else Recipe.load(recipe)
        self.path = str(recipe) if isinstance(recipe, str) else self.recipe.onnx
        self.batch_size = self.recipe.batch
        self.rknn = built if built is not None else build(self.recipe)
        if self.rknn.init_runtime() != 0:
            self.rknn.release()
            raise RunnerError(f"RKNN.init_runtime() (simulator) failed for {self.path}; see the toolkit's log")
