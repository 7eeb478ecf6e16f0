"""Run one member model on this rank's device: RKNN Lite on an RK3588 board, torch elsewhere."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor, nn

from npudist.accelerators import Accelerator, accelerator, rknpu

# rknn-toolkit-lite2 core masks, the RKNNLite.NPU_CORE_* names of rknnlite/api/rknn_lite.py (2.5.0): 0 auto,
# 1/2/4 one core, 3 cores 0&1, 7 cores 0&1&2 (RK3588 only), 0xffff all cores.
CORE_MASKS = MappingProxyType({"auto": "NPU_CORE_AUTO", "0": "NPU_CORE_0", "1": "NPU_CORE_1", "2": "NPU_CORE_2",
              "0_1": "NPU_CORE_0_1", "0_1_2": "NPU_CORE_0_1_2", "all": "NPU_CORE_ALL"})


class RunnerError(RuntimeError):
    """A member model cannot be loaded or run; the message says which and why."""


@dataclass
class TorchRunner:
    """A torch module in eval mode on this rank's device; inputs move there, logits come back to the CPU."""

    model: nn.Module
    device: torch.device
    sync: Callable[[], None] = field(default=lambda: None, repr=False)
    kind: str = "torch"

    def __post_init__(self) -> None:
        self.model = self.model.to(self.device).eval()

    @torch.inference_mode()
    def __call__(self, batch: Tensor) -> Tensor:
        out = self.model(batch.to(self.device))
        self.sync()  # so compute latency is the device's, not the launch's
        return out.float().cpu()


class RKNNLiteRunner:
    """An ``.rknn`` model on the board's NPU through rknn-toolkit-lite2.

    API as documented in airockchip/rknn-toolkit2 (rknn-toolkit-lite2 user guide and examples):
    ``RKNNLite()``, ``load_rknn(path)`` and ``init_runtime(core_mask=...)`` return 0 on success,
    ``inference(inputs=[ndarray])`` returns a list of output arrays, ``release()`` frees the NPU.
    .rknn models are converted for a fixed input shape, usually batch 1, hence ``batch_size``.
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
        self.path, self.batch_size = path, batch_size
        self.rknn: Any = api.RKNNLite()
        if self.rknn.load_rknn(path) != 0:
            raise RunnerError(f"RKNNLite.load_rknn({path!r}) failed: is it an .rknn file for this SoC?")
        mask = getattr(api.RKNNLite, CORE_MASKS[core_mask])
        if self.rknn.init_runtime(core_mask=mask) != 0:
            self.rknn.release()
            raise RunnerError(f"RKNNLite.init_runtime(core_mask={core_mask}) failed for {path}: check the "
                              "rknpu driver (dmesg | grep -i rknpu) and that librknnrt.so matches the "
                              "toolkit")

    def __call__(self, batch: Tensor) -> Tensor:
        outs = []
        for chunk in batch.split(self.batch_size):
            result = self.rknn.inference(inputs=[chunk.float().numpy()])
            if not result:  # the real inference() logs its error and returns None instead of raising
                raise RunnerError(f"RKNNLite.inference returned no outputs for {self.path} (batch of "
                                  f"{chunk.shape[0]}; its log above says why)")
            outs.append(torch.as_tensor(result[0]).float().reshape(chunk.shape[0], -1))
        return torch.cat(outs)

    def release(self) -> None:
        self.rknn.release()


def select_runner(model: nn.Module | None, *, rknn_path: str | None = None, core_mask: str = "auto",
                  acc: Accelerator | None = None) -> TorchRunner | RKNNLiteRunner:
    """RKNN Lite when on an RK board with the runtime installed and an .rknn model given; else torch on
    the detected accelerator (``model`` is then required)."""
    acc = acc or accelerator()
    if rknn_path and acc.name == "rknpu" and rknpu.runtime_available():
        return RKNNLiteRunner(rknn_path, core_mask=core_mask)
    if model is None:
        raise RunnerError(f"no torch model given and RKNN Lite cannot be used here (accelerator "
                          f"{acc.name!r}, rknnlite installed: {rknpu.runtime_available()}, "
                          f".rknn model: {rknn_path!r})")
    device = acc.device() if acc.device_type != "cpu" else torch.device("cpu")
    return TorchRunner(model, device, sync=acc.synchronize)
