"""Stand-in for ``torch_npu`` under ``npudist launch --simulate npu``: the simulated NPU, not Ascend's.

The launcher puts this directory's parent on PYTHONPATH only when simulating, so a script written for
torch_npu (``import torch_npu``, ``torch.npu.set_device``, ``.npu()``, ``backend="hccl"``) runs
unchanged. Importing it installs the simulation, as importing the real package registers the device.
"""

from __future__ import annotations

import torch

from npudist.runtime.settings import Settings
from npudist.sim import install

_settings = Settings.from_env()
install(_settings.simulate or "npu", chips=_settings.sim_chips)
del _settings

__version__ = f"{torch.__version__.split('+')[0]}+npudist.sim"
npu = torch.npu
