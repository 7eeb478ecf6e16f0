"""Run one member model: RKNN Lite on an RK3588 board, rknn-toolkit2's simulator on a PC (both in
npudist.edge.rknn_runtime), torch elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from npudist.accelerators import Accelerator, accelerator, rknpu
from npudist.edge.rknn_runtime import RKNNLiteRunner, RKNNSimulatorRunner, RunnerError

__all__ = ["RKNNLiteRunner", "RKNNSimulatorRunner", "Runner", "RunnerError", "TorchRunner", "select_runner"]


@dataclass
class TorchRunner:
    """A torch module in eval mode on this rank's device; inputs move there, logits come back to the CPU."""

    model: nn.Module
    device: torch.device
    sync: Callable[[], None] = field(default=lambda: None, repr=False)
    kind: str = "torch"
    core_mask: str = "none"
    """No NPU cores: torch runs on the rank's device."""

    def __post_init__(self) -> None:
        self.model = self.model.to(self.device).eval()

    @torch.inference_mode()
    def __call__(self, batch: Tensor) -> Tensor:
        out = self.model(batch.to(self.device))
        self.sync()  # so compute latency is the device's, not the launch's
        return out.float().cpu()

    def release(self) -> None:
        """Nothing to free: the module goes with the runner."""


class Runner(Protocol):
    """What the ensemble needs from a member: a name, logits for a batch, and the NPU core mask it uses."""

    kind: str
    core_mask: str

    def __call__(self, batch: Tensor) -> Tensor: ...

    def release(self) -> None: ...


def select_runner(model: nn.Module | None, *, rknn_path: str | None = None, core_mask: str = "auto",
                  acc: Accelerator | None = None) -> Runner:
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
