"""Fake ``rknnlite.api.RKNNLite``; see the package docstring for the API it mirrors."""

from __future__ import annotations

import json
import os

import numpy as np

CALLS: list[tuple] = []
"""Every call made on any instance, for tests to assert on."""


class RKNNLite:
    NPU_CORE_AUTO = 0
    NPU_CORE_0 = 1
    NPU_CORE_1 = 2
    NPU_CORE_2 = 4
    NPU_CORE_0_1 = 3
    NPU_CORE_0_1_2 = 7

    def __init__(self, verbose: bool = False, verbose_file: str | None = None) -> None:
        self.model: dict | None = None
        self.ready = False

    def load_rknn(self, path: str) -> int:
        CALLS.append(("load_rknn", path))
        if not os.path.exists(path):
            return -1
        with open(path) as f:
            self.model = json.load(f)
        return 0

    def init_runtime(self, core_mask: int = 0, **kwargs) -> int:
        CALLS.append(("init_runtime", core_mask))
        if self.model is None or core_mask not in (0, 1, 2, 3, 4, 7):
            return -1
        self.ready = True
        return 0

    def inference(self, inputs: list) -> list:
        CALLS.append(("inference", tuple(inputs[0].shape)))
        if not self.ready:
            raise RuntimeError("init_runtime was not called")
        x = np.asarray(inputs[0], dtype=np.float32)
        self.model.setdefault("batch", 1)
        if x.shape[0] != self.model["batch"]:
            raise RuntimeError(f"input batch {x.shape[0]} differs from the model's {self.model['batch']}")
        w = np.asarray(self.model["weight"], dtype=np.float32)
        b = np.asarray(self.model["bias"], dtype=np.float32)
        return [x @ w + b]

    def release(self) -> None:
        CALLS.append(("release",))
        self.ready = False
