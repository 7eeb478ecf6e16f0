"""The simulated NPU's random generator: torch_npu's (seed, offset) state, drawn from host generators.

torch_npu's generator is a Philox counter generator like CUDA's: its state is 16 bytes, a uint64 seed and an
int64 offset (torch_npu/csrc/aten/NPUGeneratorImpl.cpp, get_state/set_state), and every random op advances the
offset. DTensor's RNG tracker relies on that layout (torch/distributed/tensor/_random.py, ``_PhiloxState``): it
sets each rank's offset to where its shard starts, so ranks holding the same shard draw the same numbers, and
moves every rank to the same offset afterwards. The host's mt19937 state (5056 bytes) has no offset, so the
tracker failed on it (``_PhiloxState.offset``: AssertionError).

Here the state is the same 16 bytes, and a random op on a simulated tensor draws from a host generator seeded
from (seed, offset); the offset then advances by the op's element count rounded up to 4 (the rule DTensor
applies, from CUDAGeneratorImpl). Draws are a function of (seed, offset, op) as on a real chip, so save and
restore, ``fork_rng`` and the DTensor tracker behave; the numbers are not a real chip's, nor the CPU's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch

DEFAULT_SEED = 67280421310721
"""The seed a fresh generator has (c10::default_rng_seed_val, which CUDA's and torch_npu's generators use)."""

_MASK = (1 << 64) - 1


class SimGenerator:
    """One process's simulated NPU generator: a seed and an offset."""

    def __init__(self) -> None:
        self.seed = DEFAULT_SEED
        self.offset = 0

    def manual_seed(self, seed: int) -> None:
        self.seed = int(seed) & _MASK
        self.offset = 0

    def get_state(self) -> torch.Tensor:
        """16 bytes as torch_npu packs them: the seed (uint64), then the offset (int64), native byte order."""
        packed = torch.tensor([self.seed - (1 << 64) if self.seed >= 1 << 63 else self.seed, self.offset],
                              dtype=torch.int64)
        return packed.view(torch.uint8).clone()

    def set_state(self, state: torch.Tensor) -> None:
        if state.dtype != torch.uint8 or state.numel() != 16:
            raise RuntimeError(f"RNG state must be a torch.ByteTensor of 16 bytes (seed, offset), as torch_npu's "
                               f"generator takes; got {state.dtype} with {state.numel()} elements")
        seed, offset = state.contiguous().view(torch.int64).tolist()
        self.seed, self.offset = seed & _MASK, offset

    def _host_seed(self) -> int:
        digest = hashlib.blake2b(f"{self.seed}:{self.offset}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def run(self, op: Callable[[], Any], numel: Callable[[Any], int]) -> Any:
        """Run a random op with the host's default generator seeded from this state (then restored), and move
        the offset past what it drew. Ops with and without a ``generator`` argument (dropout) both draw from
        the default generator when none is passed."""
        host = torch.default_generator
        saved = host.get_state()
        host.manual_seed(self._host_seed())
        try:
            out = op()
        finally:
            host.set_state(saved)
        self.offset += (numel(out) + 3) // 4 * 4
        return out


def seeded(func: torch._ops.OpOverload) -> bool:
    """Whether an op draws random numbers (torch tags them ``nondeterministic_seeded``, as DTensor reads)."""
    return torch.Tag.nondeterministic_seeded in func.tags
