"""Stand-in for ``torch_npu`` under ``npudist launch --simulate npu``: the simulated NPU, not Ascend's.

Present only in a simulating process: the launcher puts this directory's parent on the ranks' PYTHONPATH, and
npudist's ``torch.backends`` entry point (npudist/sim/autoload.py) loads it at ``import torch`` when
NPUDIST_SIMULATE is set, as torch_npu's own entry point loads torch_npu. Importing it installs the simulation,
as importing the real package registers the device. ``torch_npu.npu`` is ``torch.npu`` (as in torch_npu),
with ``amp`` and ``utils``; ``torch_npu.contrib.transfer_to_npu`` ports CUDA scripts as Huawei's does. A
torch_npu name or submodule that is not simulated raises "not simulated: NAME" instead of a bare
AttributeError or ModuleNotFoundError (docs/guide/simulated-npu.md lists both kinds).
"""

from __future__ import annotations

import importlib.abc
import sys

import torch

from npudist.runtime.settings import Settings
from npudist.sim import install
from npudist.sim.names import NotSimulated

_settings = Settings.from_env()
install(_settings.simulate or "npu", chips=_settings.sim_chips)
del _settings

__version__ = f"{torch.__version__.split('+')[0]}+npudist.sim"
npu = torch.npu
# The submodules torch_npu scripts import by name (``from torch_npu.npu import amp``,
# ``import torch_npu.npu.utils``), registered as the objects torch.npu already holds.
for _name, _module in {"npu": npu, "npu.amp": npu.amp, "npu.utils": npu.utils}.items():
    sys.modules[f"{__name__}.{_name}"] = _module
sys.modules.setdefault("torch.npu.amp", npu.amp)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotSimulated(f"torch_npu.{name}")


class _NotSimulatedSubmodules(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: a ``torch_npu.X`` submodule no earlier finder found is one not simulated."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(f"{__name__}."):
            raise ModuleNotFoundError(str(NotSimulated(fullname)), name=fullname)
        return None


if not any(type(f).__name__ == _NotSimulatedSubmodules.__name__ for f in sys.meta_path):
    sys.meta_path.append(_NotSimulatedSubmodules())
