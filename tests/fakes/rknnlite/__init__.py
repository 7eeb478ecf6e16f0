"""A fake of rknn-toolkit-lite2's ``rknnlite`` package, for tests on machines without an RK3588 NPU.

It mirrors the real ``rknnlite/api/rknn_lite.py`` of rknn-toolkit-lite2 2.5.0 (an aarch64 wheel, read after
``pip download --no-deps --platform manylinux_2_17_aarch64 --python-version 3.11 --only-binary=:all:
rknn-toolkit-lite2==2.5.0``): the signatures of ``RKNNLite()``, ``load_rknn(path, key_path=None) -> 0|-1``,
``init_runtime(target=None, device_id=None, async_mode=False, core_mask=NPU_CORE_AUTO) -> 0|-1``,
``inference(inputs, ...) -> [ndarray, ...] | None`` (None on failure: the real one logs and never raises),
``release()``, and the ``NPU_CORE_*`` masks (0 auto, 1/2/4 one core, 3 cores 0-1, 7 all three,
0xffff all). The "model" file is JSON {"weight": [[...]], "bias": [...], "batch": B}: a linear layer, so
tests can write expected outputs by hand.
"""
