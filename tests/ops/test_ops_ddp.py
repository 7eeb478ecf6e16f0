"""The custom Swish under DDP: 2 real gloo ranks give the gradients of one process over the same batch."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import REPO, run_npudist

ARGS = ["--global-batch-size", "8", "--seq-len", "8", "--d-model", "32", "--layers", "1", "--vocab", "16"]

RANK_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, sys.argv[1])
    import train_ddp
    import npudist

    out_dir, activation, argv = sys.argv[2], sys.argv[3], sys.argv[4:]
    args = train_ddp.parse_args([*argv, "--activation", activation])
    ctx = npudist.init()
    try:
        per_rank = args.global_batch_size // ctx.world_size
        torch.manual_seed(args.seed)
        model = train_ddp.TinyLM(args.vocab, args.d_model, args.layers, args.seq_len, args.activation)
        ddp = DDP(model)
        batch = train_ddp.global_batch(args.seed, 1, args.global_batch_size, args.seq_len, args.vocab)
        mine = batch[ctx.rank * per_rank:(ctx.rank + 1) * per_rank]
        logits = ddp(mine[:, :-1])
        F.cross_entropy(logits.reshape(-1, args.vocab), mine[:, 1:].reshape(-1)).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        torch.save(grads, f"{out_dir}/grads_rank{ctx.rank}.pt")
    finally:
        npudist.shutdown()
""")


def _train_ddp_module():
    spec = importlib.util.spec_from_file_location("train_ddp_under_test", REPO / "examples" / "train_ddp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _single_process_grads(activation: str) -> dict[str, torch.Tensor]:
    td = _train_ddp_module()
    args = td.parse_args([*ARGS, "--activation", activation])
    torch.manual_seed(args.seed)
    model = td.TinyLM(args.vocab, args.d_model, args.layers, args.seq_len, args.activation)
    batch = td.global_batch(args.seed, 1, args.global_batch_size, args.seq_len, args.vocab)
    logits = model(batch[:, :-1])
    F.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1)).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_activation_flag_rejects_unknown_names() -> None:
    with pytest.raises(SystemExit):
        _train_ddp_module().parse_args(["--activation", "swish"])


@pytest.mark.ranks
@pytest.mark.slow
def test_two_rank_swish_gradients_equal_single_process_and_silu(tmp_path: Path) -> None:
    script = tmp_path / "ddp_grads.py"
    script.write_text(RANK_SCRIPT)
    proc = run_npudist(["launch", "--nproc-per-node", "2", str(script), str(REPO / "examples"), str(tmp_path),
                        "swish-op", *ARGS], timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rank0 = torch.load(tmp_path / "grads_rank0.pt")
    rank1 = torch.load(tmp_path / "grads_rank1.pt")
    single_swish = _single_process_grads("swish-op")
    single_silu = _single_process_grads("silu")
    assert set(rank0) == set(single_swish) == set(single_silu)
    assert len(rank0) > 10  # embeddings, attention, feed-forward, norms, head
    for name in rank0:
        torch.testing.assert_close(rank0[name], rank1[name], rtol=0, atol=0)  # after all-reduce: identical
        torch.testing.assert_close(rank0[name], single_swish[name], rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(single_swish[name], single_silu[name], rtol=1e-4, atol=1e-6, msg=name)
    # the feed-forward weights before the activation are where a wrong Swish gradient would show first
    ff = next(n for n in rank0 if n.endswith("linear1.weight"))
    assert rank0[ff].abs().sum() > 0
