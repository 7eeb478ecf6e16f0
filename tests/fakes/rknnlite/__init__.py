"""A fake of rknn-toolkit-lite2's ``rknnlite`` package, for tests on machines without an RK3588 NPU.

It mirrors the documented API only (airockchip/rknn-toolkit2, rknn-toolkit-lite2 user guide and
examples/resnet18/test.py): ``RKNNLite()``, ``load_rknn(path) -> 0|-1``,
``init_runtime(core_mask=...) -> 0|-1``, ``inference(inputs=[ndarray]) -> [ndarray, ...]``,
``release()``, and the ``NPU_CORE_*`` masks (0 auto, 1/2/4 one core, 3 cores 0-1, 7 all three).
The "model" file is JSON {"weight": [[...]], "bias": [...], "batch": B}: a linear layer, so tests can
write expected outputs by hand. It fails like the real runtime: -1 from load/init, an error for a
batch that differs from the converted one.
"""
