"""The simulated NPU's generator state: torch_npu's 16 bytes (seed, offset), and draws that depend on them only."""

from __future__ import annotations

import pytest
import torch

from npudist.sim.rng import DEFAULT_SEED, SimGenerator


def _draw(g: SimGenerator, n: int) -> torch.Tensor:
    return g.run(lambda: torch.randn(n), lambda out: out.numel())


def test_the_state_is_seed_then_offset_in_sixteen_bytes():
    g = SimGenerator()
    assert g.get_state().view(torch.int64).tolist() == [DEFAULT_SEED, 0]
    g.manual_seed(2**64 - 1)  # a uint64 seed survives the int64 packing
    g.offset = 12
    state = g.get_state()
    assert (state.dtype, state.numel()) == (torch.uint8, 16)
    other = SimGenerator()
    other.set_state(state)
    assert (other.seed, other.offset) == (2**64 - 1, 12)


def test_a_state_of_another_layout_is_refused_naming_it():
    with pytest.raises(RuntimeError, match=r"16 bytes \(seed, offset\).*got torch.uint8 with 5056"):
        SimGenerator().set_state(torch.get_rng_state())


def test_draws_depend_on_seed_and_offset_and_move_the_offset_by_whole_fours():
    g = SimGenerator()
    g.manual_seed(3)
    first = _draw(g, 5)
    assert g.offset == 8  # 5 rounded up to a multiple of 4 (DTensor's rule, from CUDAGeneratorImpl)
    second = _draw(g, 5)
    assert not torch.equal(first, second)
    g.set_state(torch.tensor([3, 0], dtype=torch.int64).view(torch.uint8))
    assert torch.equal(_draw(g, 5), first)


def test_the_host_generator_is_left_where_it_was():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    _draw(SimGenerator(), 7)
    assert torch.equal(torch.rand(3), expected)
