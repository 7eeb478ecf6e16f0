"""npudist.ops.swish: opcheck (schema, fake, autograd, AOT), float64 gradcheck, SiLU equality, compile."""

from __future__ import annotations

import math

import pytest
import torch

from npudist.ops import Swish, swish, swish_backward


def _sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def test_values_written_by_hand() -> None:
    # swish(x, b) = x * sigmoid(b x): sigmoid(1) = 0.7310585786, sigmoid(-1) = 0.2689414214.
    x = torch.tensor([0.0, 1.0, -1.0, 2.0], dtype=torch.float64)
    got = swish(x, torch.tensor(1.0, dtype=torch.float64))
    assert got.tolist() == pytest.approx([0.0, 0.7310585786, -0.2689414214, 1.7615941560])
    got = swish(torch.tensor([2.0], dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64))
    assert got.item() == pytest.approx(1.4621171573)  # 2 * sigmoid(1)


def test_gradient_written_by_hand() -> None:
    # At x=2, b=0.5: s=sigmoid(1); d/dx = s + b x s(1-s) = 0.7310585786 + 0.1966119332;
    # d/db = x^2 s(1-s) = 4 * 0.1966119332.
    x = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    swish(x, b).sum().backward()
    assert x.grad.item() == pytest.approx(0.9276705118)
    assert b.grad.item() == pytest.approx(0.7864477329)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 0, 4)])
def test_opcheck_forward(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, requires_grad=True)
    beta = torch.tensor(1.3, requires_grad=True)
    torch.library.opcheck(swish.op, (x, beta))  # schema, fake tensor, autograd registration, AOT dispatch
    torch.library.opcheck(swish.op, (x.detach(), beta.detach()))


def test_opcheck_backward_op() -> None:
    torch.library.opcheck(swish_backward.op, (torch.randn(4, 3), torch.randn(4, 3), torch.tensor(0.7)))


def test_gradcheck_float64() -> None:
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(swish, (x, beta))


def test_equals_silu_forward_and_backward() -> None:
    x = torch.randn(64, 16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y = Swish(1.0)(x)
    y_ref = torch.nn.SiLU()(x_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_module_fixed_and_learnable_beta() -> None:
    fixed = Swish(1.0)
    assert list(fixed.parameters()) == []
    assert float(fixed.beta) == 1.0
    learnable = Swish(0.5, learnable=True)
    (beta,) = list(learnable.parameters())
    learnable(torch.tensor([2.0])).sum().backward()
    assert beta.grad.item() == pytest.approx(0.7864477, rel=1e-5)  # as in the hand-written gradient test
    assert "implementation='reference'" in repr(fixed)


def test_beta_must_be_a_scalar() -> None:
    with pytest.raises(RuntimeError, match=r"beta must be a 0-dim tensor, got shape \(2,\)"):
        swish(torch.ones(2), torch.ones(2))


def test_compile_fullgraph_no_graph_break() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), Swish(1.5, learnable=True), torch.nn.Linear(8, 2))
        x = torch.randn(4, 8)
        eager_out = model(x)
        eager_out.sum().backward()
        eager_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        explained = torch._dynamo.explain(model)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
        assert "torch.ops.npudist.swish.default" in explained.graphs[0].code  # one opaque node, not inlined
        torch._dynamo.reset()
        # fullgraph=True makes any graph break an error; aot_eager traces forward and backward through
        # the fake implementations without paying for Inductor's C++ build on a 2-core machine.
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        out = compiled(x)
        out.sum().backward()
        torch.testing.assert_close(out, eager_out)
        for p, g in zip(model.parameters(), eager_grads, strict=True):
            torch.testing.assert_close(p.grad, g)
    finally:
        torch._dynamo.reset()
