"""What this torch can do: every torch API npudist uses that an older supported torch lacks, in one table.

Ascend users run the torch their torch_npu release pairs with (torch_npu exists from torch 2.1.0), so
npudist supports torch from 2.1 and must not assume a newer API anywhere else. Each row names the torch
version the API or behaviour starts at; code asks ``has(name)`` or ``require(name, what)`` here instead
of testing versions or attributes itself. The versions were measured with PyPI's torch wheels in fresh
venvs (docs/reference/support.md) or read from torch's release notes where noted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist

MIN_TORCH = (2, 1)
"""The oldest torch npudist supports: the oldest torch a released torch_npu pairs with (torch_npu 2.1.0)."""


def parse_version(text: str) -> tuple[int, int, int]:
    """``"2.5.1+cu121"`` -> (2, 5, 1); a pre-release (``2.16.0a0``) counts as its release."""
    numbers = [int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3]]
    return tuple([*numbers, 0, 0, 0][:3])  # type: ignore[return-value]


TORCH = parse_version(torch.__version__)


@dataclass(frozen=True)
class Feature:
    since: tuple[int, int]
    """The first torch minor version with it."""
    what: str
    """The API or behaviour, as an error message names it."""


FEATURES: Mapping[str, Feature] = MappingProxyType({
    "dist_error": Feature((2, 2), "torch.distributed.DistError"),
    "dcp_checkpoint_id": Feature((2, 2), "torch.distributed.checkpoint.save/load(checkpoint_id=)"),
    # Measured on 2.1.2: "no support for _allgather_base in Gloo process group", and gloo refuses bfloat16
    # ("Invalid scalar type"; DDP's start-up broadcast of bf16 parameters fails); both work on 2.5.1. 2.2-2.4
    # were not measured, so they count as without.
    "gloo_allgather_base": Feature((2, 5), "gloo all_gather_into_tensor"),
    "gloo_bf16": Feature((2, 5), "gloo collectives on bfloat16"),
    # Measured: "Cannot use ReduceOp.AVG with Gloo" on 2.1.2; native on 2.13 (the CI torch). Versions between
    # were not measured, so they count as without (npudist then sums and divides).
    "gloo_avg": Feature((2, 13), "gloo ReduceOp.AVG"),
    "dcp_async_save": Feature((2, 3), "torch.distributed.checkpoint.async_save"),
    "custom_op": Feature((2, 4), "torch.library.custom_op and register_fake"),
    "accelerator": Feature((2, 6), "torch.accelerator"),
    # Measured: torch.accelerator.memory_allocated ... empty_cache present on 2.13 and 2.15, absent on 2.1.2;
    # 2.6-2.12 were not measured, so they count as without (npudist then asks the vendor's device module).
    "accelerator_memory": Feature((2, 13), "torch.accelerator.memory_allocated / memory_reserved / empty_cache"),
    "ddp_init_sync": Feature((2, 7), "DistributedDataParallel(init_sync=)"),
    # The process-group watch's C++ kernel (comm/native/pg_watch.cpp) against this torch's c10d headers and
    # op set: built and run on 2.13 (the CI torch) only; older and newer torches go without it until measured.
    "pg_watch": Feature((2, 13), "the process-group watch (a C++ kernel on torch's c10d ops)"),
    # Measured: async_save of CPU tensors returned before copying them on 2.5.1 (the checkpoint held
    # values changed after save() returned); correct on 2.8.0.
    "dcp_async_copies_cpu": Feature((2, 8), "torch.distributed.checkpoint.async_save copying CPU state"),
    "default_stager": Feature((2, 9), "torch.distributed.checkpoint.staging.DefaultStager"),
    "python_privateuse1": Feature((2, 10), "torch.utils.backend_registration."
                                           "_setup_privateuseone_for_python_backend"),
    # Measured: torch 2.1.2's gloo has no reduce_scatter_tensor, 2.5.1's has one; 2.2-2.4 were not measured,
    # so they count as without it (emulated: right values, more traffic).
    "gloo_reduce_scatter": Feature((2, 5), "gloo reduce_scatter_tensor"),
    # Measured: gloo reduce_scatter_tensor MIN/MAX/PRODUCT gave wrong values on 2.5.1 and 2.8.0 (absent on
    # 2.1), right from 2.11.
    "gloo_reduce_scatter_minmax": Feature((2, 11), "gloo reduce_scatter_tensor with MIN/MAX/PRODUCT"),
})


class TorchTooOld(RuntimeError):
    """This torch lacks an API a feature needs; the message names the version it needs."""


def has(name: str, version: tuple[int, ...] | None = None) -> bool:
    """Whether this torch (or ``version``) has feature ``name`` (a FEATURES key)."""
    return tuple((version or TORCH)[:2]) >= FEATURES[name].since


def require(name: str, purpose: str) -> None:
    """TorchTooOld naming ``purpose``, the API and the torch it needs, unless this torch has it."""
    if not has(name):
        feature = FEATURES[name]
        need = ".".join(map(str, feature.since))
        raise TorchTooOld(f"{purpose} needs torch >= {need} ({feature.what}); this is torch {torch.__version__}. "
                          f"Upgrade torch to {need} or newer (with the torch_npu/torch_mlu release that pairs "
                          "with it), or run without this feature.")


DIST_ERRORS: tuple[type[BaseException], ...] = (
    (RuntimeError, dist.DistError) if hasattr(dist, "DistError") else (RuntimeError,))
"""What a failed collective raises: torch's DistError (from 2.2; a RuntimeError subclass) or RuntimeError."""


def is_dist_error(exc: BaseException) -> bool:
    """A DistError where torch has one (a plain RuntimeError is judged by the caller)."""
    return len(DIST_ERRORS) > 1 and isinstance(exc, DIST_ERRORS[1])


def simulation_available() -> bool:
    """Whether this torch can run the simulated NPU (it registers its device from Python: torch >= 2.10)."""
    return has("python_privateuse1")


_ABSENT = "\x00npudist: no such key\x00"


def store_has_all(store: Any, keys: list[str]) -> bool:
    """Whether every one of ``keys`` is set (one request where torch has Store.check)."""
    check = getattr(store, "check", None)
    return bool(check(keys)) if check is not None else all(store_has(store, k) for k in keys)


def store_has(store: Any, key: str) -> bool:
    """Whether ``key`` is set in a c10d store, without waiting for it: Store.check where torch has it (torch
    2.1.2's TCPStore and PrefixStore have none, measured), else compare_set with a value nobody writes (it
    sets nothing and answers that value when the key is absent)."""
    check = getattr(store, "check", None)
    if check is not None:
        return bool(check([key]))
    got = store.compare_set(key, _ABSENT, _ABSENT)
    return (got.decode(errors="replace") if isinstance(got, bytes) else str(got)) != _ABSENT
