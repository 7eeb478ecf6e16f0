"""A causal-LM fine-tune loop written for CUDA the way such scripts commonly are (ours, for `npudist migrate`).

The idioms: the device as ``f"cuda:{local_rank}"``, a hardware report from ``torch.cuda.get_device_name``,
``get_device_properties(...).total_memory`` and ``mem_get_info`` (what fine-tune scripts print to size their
batch), mixed precision switched on by a test of the device string (``device.startswith("cuda")``),
``torch.autocast(device_type="cuda", dtype=torch.bfloat16)``, and the logged loss averaged over ranks in bf16
with ``ReduceOp.AVG``. Each rank prints ``rank R step S loss L logits DTYPE``.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, SEQ = 32, 16


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.block = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1), device=x.device)
        return self.head(self.block(self.embed(x), src_mask=mask, is_causal=True))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = f"cuda:{local_rank}"

    props = torch.cuda.get_device_properties(local_rank)
    free, total = torch.cuda.mem_get_info()
    print(f"rank {rank} on {torch.cuda.get_device_name(local_rank)}: {props.total_memory / 2**30:.1f} GiB, "
          f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f}")
    use_amp = device.startswith("cuda")

    torch.manual_seed(0)
    model = DDP(TinyLM().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.arange(SEQ + 1).repeat(8, 1) % VOCAB  # a sequence to learn: the next token is +1
    for step in range(12):
        x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=use_amp):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), y.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logged = loss.detach().to(torch.bfloat16)
        dist.all_reduce(logged, op=dist.ReduceOp.AVG)
        print(f"rank {rank} step {step} loss {logged.item():.4f} logits {logits.dtype}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
