"""The simulated NPU's batch-norm kernels (npudist/sim/batch_norm.py) on plain CPU tensors, against torch's
own batch norm: forward, running estimates and gradients, split over two "ranks" by counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from npudist.sim import batch_norm as bn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_shards_combined_equal_batch_norm_of_the_whole(dtype):
    g = torch.Generator().manual_seed(0)
    shards = [torch.randn(3, 5, 4, 4, generator=g).to(dtype) * 2 + 1, torch.randn(5, 5, 4, 4, generator=g).to(dtype)]
    whole = torch.cat(shards).float().requires_grad_(True)
    weight = (torch.rand(5, generator=g) + 0.5).requires_grad_(True)
    bias = torch.randn(5, generator=g).requires_grad_(True)
    rm_ref, rv_ref = torch.zeros(5), torch.ones(5)
    y_ref = F.batch_norm(whole, rm_ref, rv_ref, weight, bias, training=True, momentum=0.1, eps=1e-5)
    dy = torch.randn(y_ref.shape, generator=g)
    y_ref.backward(dy)

    stats = [bn.stats(s, 1e-5) for s in shards]
    counts = torch.tensor([float(s.numel() // s.size(1)) for s in shards])
    rm, rv = torch.zeros(5), torch.ones(5)
    weight_, bias_ = weight.detach(), bias.detach()
    mean, invstd = bn.gather_stats_with_counts(shards[0], torch.stack([m for m, _ in stats]),
                                               torch.stack([i for _, i in stats]), rm, rv, 0.1, 1e-5, counts)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    torch.testing.assert_close(rm, rm_ref, **tol)
    torch.testing.assert_close(rv, rv_ref, **tol)  # the unbiased variance over the whole batch
    out = torch.cat([bn.elemt(s, weight_, bias_, mean, invstd, 1e-5) for s in shards])
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), y_ref.detach(), **tol)

    dys = dy.split([3, 5])
    sums = [bn.backward_reduce(d.to(dtype), s, mean, invstd, weight_, True, True, True)
            for d, s in zip(dys, shards, strict=True)]
    sum_dy = sums[0][0] + sums[1][0]  # what the all_reduce of SyncBatchNorm's backward makes
    sum_dy_xmu = sums[0][1] + sums[1][1]
    torch.testing.assert_close(sums[0][2] + sums[1][2], weight.grad, **tol)  # DDP sums these over ranks
    torch.testing.assert_close(sums[0][3] + sums[1][3], bias.grad, **tol)
    grad_in = torch.cat([bn.backward_elemt(d.to(dtype), s, mean, invstd, weight_, sum_dy, sum_dy_xmu,
                                           counts.to(torch.int32)) for d, s in zip(dys, shards, strict=True)])
    assert grad_in.dtype == dtype
    torch.testing.assert_close(grad_in.float(), whole.grad, **tol)
