"""``from torch_npu.contrib import transfer_to_npu``: a CUDA script runs on the (simulated) NPU unchanged.

Importing it applies npudist.sim.transfer, which maps what Huawei's module maps (torch_npu/contrib/
transfer_to_npu.py in Ascend/pytorch): torch.cuda onto torch.npu, "cuda" device strings onto "npu", nccl onto
hccl.
"""

from npudist.sim.transfer import apply

apply()
