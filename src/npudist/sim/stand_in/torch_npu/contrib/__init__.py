"""``torch_npu.contrib`` of the simulated NPU: only ``transfer_to_npu`` is simulated."""
