"""Which torch and CANN each torch_npu release is built for, as data.

From Ascend/pytorch ``COMPATIBILITY.en.md`` ("TorchNPU version mapping table", the active releases), at
commit 9e73e708ab9350d203475609f36f8a43f6a0c2ab (2026-08-21). A torch_npu wheel loads only against the
torch it was built for (else `undefined symbol`), and its operators call the CANN release it was built
with (a mismatch shows up as EH9999 / "aclnn... not found" at the first kernel).
"""

from __future__ import annotations

from types import MappingProxyType

TORCH_NPU_RELEASES = MappingProxyType({
    # torch_npu wheel version: (torch version, CANN version)
    "2.12.0": ("2.12.0", "9.1.0"),
    "2.11.0": ("2.11.0", "9.1.0"),
    "2.10.0.post4": ("2.10.0", "9.1.0"),
    "2.9.0.post6": ("2.9.0", "9.1.0"),
    "2.7.1.post8": ("2.7.1", "9.1.0"),
    "2.9.0.post2": ("2.9.0", "9.0.0"),
    "2.8.0.post4": ("2.8.0", "9.0.0"),
    "2.7.1.post4": ("2.7.1", "9.0.0"),
    "2.9.0": ("2.9.0", "8.5.0"),
    "2.8.0.post2": ("2.8.0", "8.5.0"),
    "2.7.1.post2": ("2.7.1", "8.5.0"),
    "2.6.0.post5": ("2.6.0", "8.5.0"),
    "2.8.0": ("2.8.0", "8.3.RC1"),
    "2.7.1": ("2.7.1", "8.3.RC1"),
    "2.6.0.post3": ("2.6.0", "8.3.RC1"),
    "2.1.0.post17": ("2.1.0", "8.3.RC1"),
    "2.6.0": ("2.6.0", "8.2.RC1"),
    "2.5.1.post1": ("2.5.1", "8.2.RC1"),
    "2.1.0.post13": ("2.1.0", "8.2.RC1"),
    "2.5.1": ("2.5.1", "8.1.RC1"),
    "2.4.0.post4": ("2.4.0", "8.1.RC1"),
    "2.3.1.post6": ("2.3.1", "8.1.RC1"),
    "2.1.0.post12": ("2.1.0", "8.1.RC1"),
    "2.4.0.post2": ("2.4.0", "8.0.0"),
    "2.3.1.post4": ("2.3.1", "8.0.0"),
    "2.1.0.post10": ("2.1.0", "8.0.0"),
    "2.4.0": ("2.4.0", "8.0.RC3"),
    "2.3.1.post2": ("2.3.1", "8.0.RC3"),
    "2.1.0.post8": ("2.1.0", "8.0.RC3"),
    "2.3.1": ("2.3.1", "8.0.RC2"),
    "2.2.0.post2": ("2.2.0", "8.0.RC2"),
    "2.1.0.post6": ("2.1.0", "8.0.RC2"),
    "2.2.0": ("2.2.0", "8.0.RC1"),
    "2.1.0.post4": ("2.1.0", "8.0.RC1"),
    "2.1.0": ("2.1.0", "7.0.0"),
})
