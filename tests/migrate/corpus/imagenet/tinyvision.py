"""The three torchvision names imagenet/main.py uses, small enough to train in seconds (not torchvision's code).

``models.resnet18`` is a two-layer CNN under that name; ``datasets.FakeData`` draws a fixed random image
per class, so the task can be learnt; ``transforms.ToTensor`` is the identity on tensors.
"""
from types import SimpleNamespace

import torch
import torch.nn as nn


class _TinyNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(4))
        self.fc = nn.Linear(8 * 16, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


def resnet18(pretrained=False, num_classes=10):
    return _TinyNet(num_classes)


class FakeData(torch.utils.data.Dataset):
    def __init__(self, size, image_size, num_classes, transform=None):
        g = torch.Generator().manual_seed(0)
        self.prototypes = torch.randn(num_classes, *image_size, generator=g)
        self.labels = torch.randint(0, num_classes, (size,), generator=g)
        self.noise = 0.3 * torch.randn(size, *image_size, generator=g)
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        image = self.prototypes[self.labels[i]] + self.noise[i]
        return (self.transform(image) if self.transform else image), int(self.labels[i])


def _to_tensor():
    return lambda x: x


models = SimpleNamespace(resnet18=resnet18)
datasets = SimpleNamespace(FakeData=FakeData)
transforms = SimpleNamespace(ToTensor=_to_tensor)
