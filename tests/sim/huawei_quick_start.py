"""Huawei's torch_npu quick start, in its shape: a small CNN trained with torch_npu's AMP after the automatic
migration line, with no npudist in it.

The shape is the Ascend PyTorch quick start's ("Quick Start" of the Ascend Extension for PyTorch training
guide, hiascend.com): ``import torch_npu``, ``from torch_npu.npu import amp``, ``from torch_npu.contrib import
transfer_to_npu``, a device written as ``torch.device('cuda:0')`` that the migration maps to the NPU, then
``amp.GradScaler()`` and ``with amp.autocast():`` around the forward pass. Its MNIST download is replaced by a
learnable synthetic set so the test needs no network. Prints one ``RESULT`` line.
"""

import json
import sys

import torch
import torch.nn as nn
import torch_npu
from torch.utils.data import DataLoader, TensorDataset
from torch_npu.contrib import transfer_to_npu  # noqa: F401 - the quick start's automatic migration
from torch_npu.npu import amp


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(8 * 4 * 4, 10),
        )

    def forward(self, x):
        return self.net(x)


device = torch.device("cuda:0")  # the quick start's device line, mapped to npu:0 by transfer_to_npu
torch.manual_seed(0)
images = torch.randn(256, 1, 8, 8)
labels = images[:, 0, :4, :4].flatten(1).argmax(dim=1) % 10  # a rule the CNN can learn
loader = DataLoader(TensorDataset(images, labels), batch_size=64, shuffle=True, pin_memory=True)

model = CNN().to(device)
loss_func = nn.CrossEntropyLoss().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = amp.GradScaler()

losses, dtypes = [], set()
for _epoch in range(8):
    for imgs, targets in loader:
        imgs, targets = imgs.to(device), targets.to(device)
        with amp.autocast():
            outputs = model(imgs)
            loss = loss_func(outputs, targets)
        dtypes.add(str(outputs.dtype))
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())

with torch.no_grad():
    accuracy = (model(images.to(device)).argmax(dim=1).cpu() == labels).float().mean().item()
sys.stdout.write("RESULT " + json.dumps({
    "device": str(next(model.parameters()).device), "autocast_dtypes": sorted(dtypes),
    "first": sum(losses[:4]) / 4, "last": sum(losses[-4:]) / 4, "accuracy": accuracy,
    "scale": scaler.get_scale(), "torch_npu": torch_npu.__version__,
    "cuda_available": torch.cuda.is_available(), "cuda_device_name": torch.cuda.get_device_name(0),
}) + "\n")
