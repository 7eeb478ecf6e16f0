"""The ctypes kernel path, against a real shared library compiled from C in the test."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest
import torch
from torch import Tensor

from npudist.ops import CtypesKernel, KernelConstraints, KernelError, aligned_empty, conform, define
from tests.conftest import run_py

# The kernel checks its own constraints and returns 3 when they are broken, so an uncopied
# misaligned pointer would fail the call instead of passing silently.
C_SOURCE = textwrap.dedent("""
    #include <math.h>
    #include <stdint.h>
    int swish_f32(const float *x, float *out, int64_t n, double beta) {
        if ((uintptr_t)x % 128 || (uintptr_t)out % 128) return 3;
        for (int64_t i = 0; i < n; i++) out[i] = x[i] / (1.0f + expf(-(float)beta * x[i]));
        return 0;
    }
    int always_fails(const float *x, float *out, int64_t n, double beta) { return 7; }
""")

# x = 0, 1, -1, 2 with beta 1: x * sigmoid(x) = 0, 0.7310586, -0.2689414, 1.7615942.
X = [0.0, 1.0, -1.0, 2.0]
EXPECTED = [0.0, 0.7310586, -0.2689414, 1.7615942]


@pytest.fixture(scope="module")
def libswish(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp("kernel")
    (d / "swish.c").write_text(C_SOURCE)
    lib = d / "libswish.so"
    subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(d / "swish.c"), "-lm"], check=True,
                   timeout=60, capture_output=True)
    return lib


@pytest.mark.subprocess
def test_aligned_kernel_gives_correct_results(libswish: Path) -> None:
    k = CtypesKernel(str(libswish), "swish_f32", n_scalars=1)
    x = aligned_empty((4,), torch.float32, "cpu", 128)
    x.copy_(torch.tensor(X))
    out = k(x, scalars=(1.0,))
    assert out.tolist() == pytest.approx(EXPECTED, abs=1e-6)
    assert out.data_ptr() % 128 == 0
    assert k.copies == 0


@pytest.mark.subprocess
def test_misaligned_input_is_copied_not_rejected(libswish: Path) -> None:
    k = CtypesKernel(str(libswish), "swish_f32", n_scalars=1)
    base = aligned_empty((5,), torch.float32, "cpu", 128)
    base[1:] = torch.tensor(X)
    x = base[1:]  # 4 bytes past a 128-byte boundary
    assert x.data_ptr() % 128 == 4
    assert k(x, scalars=(1.0,)).tolist() == pytest.approx(EXPECTED, abs=1e-6)
    assert k.copies == 1
    strided = torch.tensor([[v, 9.0] for v in X])[:, 0]  # a column: stride 2, non-contiguous
    assert not strided.is_contiguous()
    assert k(strided, scalars=(1.0,)).tolist() == pytest.approx(EXPECTED, abs=1e-6)
    assert k.copies == 2


def test_conform_keeps_a_good_tensor_and_copies_a_bad_one() -> None:
    c = KernelConstraints(alignment=128)
    good = aligned_empty((8,), torch.float32, "cpu", 128)
    same, copied = conform(good, c)
    assert same is good and not copied
    fixed, copied = conform(good[1:], c)
    assert copied and fixed.data_ptr() % 128 == 0 and fixed.is_contiguous()


@pytest.mark.subprocess
def test_missing_symbol_is_a_clear_error(libswish: Path) -> None:
    with pytest.raises(KernelError, match=r"exports no symbol 'swish_bf16'.*nm -D"):
        CtypesKernel(str(libswish), "swish_bf16", n_scalars=1)


def test_missing_library_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(KernelError, match=r"libnothere\.so' does not exist"):
        CtypesKernel(str(tmp_path / "libnothere.so"), "swish_f32")


def test_not_a_library_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "libbogus.so"
    bogus.write_text("not an ELF file")
    with pytest.raises(KernelError, match="cannot load kernel library"):
        CtypesKernel(str(bogus), "swish_f32")


@pytest.mark.subprocess
def test_kernel_error_code_is_raised(libswish: Path) -> None:
    k = CtypesKernel(str(libswish), "always_fails", n_scalars=1)
    with pytest.raises(KernelError, match="returned error code 7"):
        k(torch.ones(3), scalars=(1.0,))


def test_bad_constraints_are_rejected() -> None:
    with pytest.raises(ValueError, match="power of two"):
        KernelConstraints(alignment=100)


@pytest.mark.subprocess
def test_operator_with_ctypes_kernel_falls_back_for_other_dtypes(libswish: Path) -> None:
    k = CtypesKernel(str(libswish), "swish_f32", n_scalars=1)

    def reference(x: Tensor, beta: float) -> Tensor:
        return x * torch.sigmoid(beta * x) + 0  # same maths, through torch

    def fake(x: Tensor, beta: float) -> Tensor:
        return torch.empty_like(x)

    op = define(f"npudist_test::swish_c_{uuid.uuid4().hex[:8]}", reference, fake=fake,
                kernels={"cpu": lambda x, beta: k(x, scalars=(beta,))})
    assert op(torch.tensor(X), 1.0).tolist() == pytest.approx(EXPECTED, abs=1e-6)
    assert k.copies <= 1
    as64 = op(torch.tensor(X, dtype=torch.float64), 1.0)  # kernel declares float32 only -> reference
    assert as64.dtype == torch.float64
    assert as64.tolist() == pytest.approx(EXPECTED, abs=1e-6)


@pytest.mark.subprocess
def test_swish_module_uses_a_registered_kernel(libswish: Path) -> None:
    # In a child process: registering a CPU kernel for npudist::swish is process-wide.
    script = textwrap.dedent(f"""
        import torch
        from npudist.ops import CtypesKernel, Swish, register_swish_kernel
        k = CtypesKernel({str(libswish)!r}, "swish_f32", n_scalars=1)
        assert register_swish_kernel("cpu", k, "libswish")
        m = Swish(1.0)
        print(m.implementation())
        x = torch.tensor({X!r}, requires_grad=True)
        y = m(x)
        y.sum().backward()
        print(k.copies, [round(v, 6) for v in y.tolist()], [round(v, 6) for v in x.grad.tolist()])
    """)
    proc = run_py(["-c", script], timeout=120)
    assert proc.returncode == 0, proc.stderr
    impl, rest = proc.stdout.strip().splitlines()
    assert impl == "kernel: libswish"
    copies, values, grads = rest.split(" ", 1)[0], *rest.split(" ", 1)[1].split("] [")
    assert int(copies) in (0, 1)  # torch's allocator gives 64-byte alignment, so the input may be copied
    assert [float(v) for v in values.strip("[]").split(", ")] == pytest.approx(EXPECTED, abs=1e-5)
    # d/dx x*sigmoid(x) = s + x s (1-s): 0.5, 0.9276705, 0.0723295, 1.0907842
    assert [float(v) for v in grads.strip("[]").split(", ")] == pytest.approx(
        [0.5, 0.9276705, 0.0723295, 1.0907842], abs=1e-5)
