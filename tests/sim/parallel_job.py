"""One rank of a parallel training job, on the simulated NPU or on CPU/gloo: OUT_DIR/rank{R}.json.

Written the way the public scripts are, so the simulated NPU is checked against what users run:

- ``fsdp2``: pytorch/examples distributed/FSDP2/example.py (``fully_shard`` per block, then the model; Adam,
  ``clip_grad_norm_``, ``model(x).sum()`` as the loss), with the example's Transformer
  (tests/migrate/corpus/pytorch_fsdp2/model.py), small. ``--ascend`` ports it the way torch_npu's documents
  do: ``import torch_npu``, ``torch.npu.set_device``, ``backend="hccl"``, ``device_id=torch.device("npu", i)``.
- ``hsdp``: the same model with ``fully_shard(mesh=...)`` over a 2-D mesh named ("replicate", "shard"), as
  torch's FSDP2 tests build HSDP (test/distributed/_composable/fsdp/test_fully_shard_training.py,
  TestFullyShardHSDPTraining).
- ``tp``: pytorch/examples distributed/tensor_parallelism/tensor_parallel_example.py (ToyModel, in_proj
  ColwiseParallel, out_proj RowwiseParallel over a 1-D "tp" mesh).

The weights are made on the host before they are sharded and the data come from a host generator, so the
device and the CPU job start from the same numbers; gloo reduces in the same order under both, so the losses
and final weights must match bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "migrate" / "corpus" / "pytorch_fsdp2"))

from model import ModelArgs, Transformer  # the example's own model

VOCAB, BATCH, SEQ = 32, 4, 8


def _start(device_type: str, ascend: bool) -> tuple[torch.device, int, int]:
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if device_type == "cpu":
        dist.init_process_group("gloo")
        return torch.device("cpu"), rank, dist.get_world_size()
    if ascend:
        import torch_npu  # noqa: F401  (the stand-in under --simulate; the real one on an Ascend host)

        torch.npu.set_device(local)
        device = torch.device("npu", local)
        dist.init_process_group(backend="hccl", device_id=device)
    else:  # the example as written: whatever accelerator torch finds, and its default backend
        device = torch.device(f"{torch.accelerator.current_accelerator()}:{local}")
        dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
    return device, rank, dist.get_world_size()


def _digest(params) -> str:
    h = hashlib.sha256()
    for p in params:
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _transformer(device: torch.device, mesh=None) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Transformer(ModelArgs(n_layers=2, n_heads=2, vocab_size=VOCAB, max_seq_len=SEQ, dim=16,
                                  dropout_p=0.0)).to(device)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class ToyModel(nn.Module):
    """tensor_parallel_example.py's model."""

    def __init__(self) -> None:
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.relu(self.in_proj(x)))


def _tp(device: torch.device, world: int) -> nn.Module:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = ToyModel().to(device)
    return parallelize_module(model, mesh["tp"], {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["fsdp2", "hsdp", "tp"])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--device", default="npu")
    ap.add_argument("--ascend", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    device, rank, world = _start(args.device, args.ascend)
    r: dict = {"device": str(device), "world": world}
    if args.mode == "tp":
        model = _tp(device, world)
        shape = (BATCH, 10)
    else:
        mesh = None
        if args.mode == "hsdp":
            mesh = init_device_mesh(device.type, (2, world // 2), mesh_dim_names=("replicate", "shard"))
            r["mesh"] = {"names": list(mesh.mesh_dim_names), "shard_group": dist.get_process_group_ranks(
                mesh.get_group("shard")), "replicate_group": dist.get_process_group_ranks(
                mesh.get_group("replicate"))}
        model = _transformer(device, mesh)
        shape = (BATCH, SEQ)
    r["placements"] = sorted({str(getattr(p, "placements", None)) for p in model.parameters()})
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1)  # the same batches on every rank and device (the CPU draws them)
    losses = []
    for _ in range(args.steps):
        if args.mode == "tp":
            x = torch.randn(*shape, generator=data).to(device)
        else:
            x = torch.randint(0, VOCAB, shape, generator=data).to(device)
        loss = model(x).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    r["losses"] = losses
    r["params_sha256"] = _digest(model.parameters())
    r["loss_device"] = str(loss.device)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"rank{rank}.json").write_text(json.dumps(r))
    dist.destroy_process_group()
    # The mesh and FSDP state still hold gloo groups, whose threads joined during interpreter finalization
    # aborted a CPU rank now and then ("terminate called without an active exception"): leave without it.
    os._exit(0)


if __name__ == "__main__":
    main()
