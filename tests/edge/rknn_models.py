"""Models for the toolkit tests, loaded by `npudist edge convert FILE.py:FUNCTION`."""

from __future__ import annotations

import torch
from torch import nn


class _WithUnique(nn.Module):
    """torch.unique exports to ONNX Unique, whose output size depends on the data: rknn-toolkit2 2.5.0 builds
    static graphs only and refuses it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.unique(self.fc(x)).sum().reshape(1, 1) + x[:, :1]


def with_unique() -> nn.Module:
    return _WithUnique()
