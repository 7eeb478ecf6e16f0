"""Fake ``rknnlite.api.RKNNLite``; see the package docstring for the API it mirrors."""

from __future__ import annotations

import json
import os

import numpy as np

CALLS: list[tuple] = []
"""Every call made on any instance, for tests to assert on."""


class RKNNLite:
    # Values as in rknn-toolkit-lite2 2.5.0 rknnlite/api/rknn_lite.py.
    NPU_CORE_AUTO = 0
    NPU_CORE_0 = 1
    NPU_CORE_1 = 2
    NPU_CORE_2 = 4
    NPU_CORE_0_1 = 3
    NPU_CORE_0_1_2 = 7
    NPU_CORE_ALL = 0xFFFF

    def __init__(self, verbose: bool = False, verbose_file: str | None = None) -> None:
        self.model: dict | None = None
        self.ready = False

    def load_rknn(self, path: str, key_path: str | None = None) -> int:
        CALLS.append(("load_rknn", path))
        if not os.path.exists(path):
            return -1
        with open(path) as f:
            self.model = json.load(f)
        return 0

    def init_runtime(self, target: str | None = None, device_id: str | None = None, async_mode: bool = False,
                     core_mask: int = NPU_CORE_AUTO) -> int:
        CALLS.append(("init_runtime", core_mask))
        if self.model is None or core_mask not in (0, 1, 2, 3, 4, 7, 0xFFFF):
            return -1
        self.ready = True
        return 0

    def inference(self, inputs: list, data_type: str | None = None, data_format: str | None = None,
                  inputs_pass_through: list | None = None, get_frame_id: bool = False,
                  reuse_outputs: bool = False) -> list | None:
        """Outputs, or None on any failure: the real one logs the error and returns None, it never raises."""
        CALLS.append(("inference", tuple(inputs[0].shape)))
        if not self.ready:
            return None
        x = np.asarray(inputs[0], dtype=np.float32)
        if x.shape[0] != self.model.get("batch", 1):
            return None  # the real runtime fails in set_inputs for a shape the model was not converted for
        w = np.asarray(self.model["weight"], dtype=np.float32)
        b = np.asarray(self.model["bias"], dtype=np.float32)
        return [x @ w + b]

    def release(self) -> None:
        CALLS.append(("release",))
        self.ready = False
