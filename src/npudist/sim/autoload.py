"""npudist's ``torch.backends`` entry point: the simulated NPU arrives with ``import torch``, as torch_npu does.

torch >= 2.5 calls every entry point of the group ``torch.backends`` while ``import torch`` runs
(torch/__init__.py ``_import_device_backends``); torch_npu registers ``torch_npu = torch_npu:_autoload`` there
(Ascend/pytorch setup.py), which is why Huawei's samples use ``torch.npu`` and ``"npu:0"`` without importing
torch_npu. npudist registers ``autoload`` here (pyproject.toml). Two rules follow from where it runs:

- it does nothing at all unless this process is simulating (NPUDIST_SIMULATE, which ``npudist launch
  --simulate`` sets for the ranks): every torch program in the environment calls it;
- it never raises: torch turns any exception from an entry point into a failed ``import torch`` for every
  program in the environment. A failure is kept in ``SIM.autoload_failure`` and shown once as a warning;
  ``npudist.init()`` (the ``npu-sim`` row) reports it again when it tries to install.

The module imports only the standard library at load time, so that loading the entry point cannot fail either.
"""

from __future__ import annotations

import os

SIMULATE_VAR = "NPUDIST_SIMULATE"
"""The variable that makes a process a simulating one (npudist.runtime.settings.SIMULATE_VAR)."""


def autoload() -> None:
    """Install the simulated NPU and its ``torch_npu`` stand-in when NPUDIST_SIMULATE is set; else nothing."""
    if not os.environ.get(SIMULATE_VAR, "").strip():
        return
    try:
        _load()
    except Exception as exc:  # the contract above: never let import torch fail
        _record(f"{type(exc).__name__}: {exc}")


def _load() -> None:
    import importlib.util
    import sys
    from pathlib import Path

    if "torch_npu" in sys.modules:
        return
    spec = importlib.util.find_spec("torch_npu")
    stand_in = Path(__file__).parent / "stand_in" / "torch_npu" / "__init__.py"
    if spec is not None and Path(spec.origin or "").resolve() != stand_in.resolve():
        # A real torch_npu is installed; its own entry point claims the device. The simulation is for hosts
        # without one (npudist.sim.install refuses a taken device slot with the reason).
        _record(f"a real torch_npu is installed ({spec.origin}); the simulated NPU is not loaded")
        return
    if spec is None:
        spec = importlib.util.spec_from_file_location("torch_npu", stand_in,
                                                      submodule_search_locations=[str(stand_in.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch_npu"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("torch_npu", None)
        raise


def _record(reason: str) -> None:
    try:
        import warnings

        from npudist.sim.state import SIM

        SIM.autoload_failure = reason
        warnings.warn(f"npudist: NPUDIST_SIMULATE is set but the simulated NPU did not load at import torch: "
                      f"{reason}", RuntimeWarning, stacklevel=2)
    except Exception:  # nothing may escape into import torch
        return
