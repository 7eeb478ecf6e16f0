"""torch's functional collectives on simulated tensors, and the wait that a view of their output must reach.

A functional collective (``torch.ops._c10d_functional``, torch/csrc/distributed/c10d/Functional.cpp) registers its
output with its Work in the process's work registry, keyed by the output's storage, and ``wait_tensor`` finds the
Work by the storage of the tensor it is given: on a device, a view of the output shares that storage, so waiting the
view waits the collective (FSDP2 waits the views of an all-gather's output). A simulated tensor is a wrapper whose
storage is its own, not its host tensor's, so a view's wait would find nothing and the Work would keep the output
alive for the life of the process. Here each output is remembered by its host storage, and a wait on any simulated
tensor of that storage waits the output itself too, as the shared storage does on a chip.
"""

from __future__ import annotations

from typing import Any

import torch

from npudist.sim.state import SIM


def _host_storage(tensor: Any) -> int:
    """The address of a simulated tensor's host storage; 0 for anything else (and for an empty storage)."""
    elem = getattr(tensor, "elem", None)
    return elem.untyped_storage().data_ptr() if isinstance(elem, torch.Tensor) else 0


def run(func: torch._ops.OpOverload, keys: torch._C.DispatchKeySet, args: tuple, kwargs: dict) -> Any:
    """Run a functional collective (or a DTensor op of that family) at the device's kernels; a wait also waits the
    registered output its tensor is a view of."""
    out = func.redispatch(keys, *args, **kwargs)
    if func.namespace != "_c10d_functional":
        return out
    if func.__name__ == "wait_tensor.default":  # named, not imported: older torch has no such op at import
        base = SIM.funcol_outputs.pop(_host_storage(args[0]), None)
        if base is not None and base is not args[0]:
            func.redispatch(keys, base)
    elif not func.__name__.startswith("_wrap_tensor_autograd"):  # that one hands back a tensor it was given
        for tensor in out if isinstance(out, list | tuple) else (out,):
            key = _host_storage(tensor)
            if key:
                SIM.funcol_outputs[key] = tensor
    return out
