"""torch module or ONNX file in, ``.rknn`` for a Rockchip NPU out, with its accuracy against the source.

The toolkit runs in its own environment (npudist.edge.toolkit); everything here imports it lazily, so the
module itself imports anywhere. The accuracy check runs the built model in the toolkit's simulator on
held-out samples and compares with torch (or onnxruntime for an ONNX input) in fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from npudist.edge.build import ConversionError, build
from npudist.edge.recipe import ONNX_OPSET, Recipe


@dataclass(frozen=True)
class ConvertResult:
    rknn: Path
    recipe: Recipe

    @property
    def max_abs_error(self) -> float:
        return float(self.recipe.accuracy["max_abs_error"])

    @property
    def top1_agreement(self) -> float | None:
        value = self.recipe.accuracy.get("top1_agreement")
        return None if value is None else float(value)


def export_onnx(model: Any, input_shape: Sequence[int], path: Path) -> Path:
    """The torch module as ONNX at the opset the toolkit reads (TorchScript-based exporter: the toolkit's
    loader expects the classic op set, and it needs no onnxscript)."""
    import torch

    example = torch.zeros(*input_shape)
    model = model.eval()
    try:
        torch.onnx.export(model, (example,), str(path), input_names=["input"], output_names=["output"],
                          opset_version=ONNX_OPSET, dynamo=False)
    except Exception as exc:
        raise ConversionError(f"torch.onnx.export failed before the toolkit saw the model: "
                              f"{type(exc).__name__}: {exc}") from exc
    return path


def load_samples(source: str | Path | Callable[[], Any]) -> np.ndarray:
    """Samples stacked on axis 0 from a directory of ``.npy`` files (each one sample or a batch of them),
    or from a callable returning an array, a tensor or a sequence of either."""
    if callable(source):
        data = source()
        items = data if isinstance(data, list | tuple) else [data]
        arrays = [np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float32)
                  for x in items]
        return np.concatenate([a if a.ndim > 1 else a[None] for a in arrays])
    folder = Path(source)
    files = sorted(folder.glob("*.npy")) if folder.is_dir() else []
    if not files:
        raise ValueError(f"{folder}: not a directory of .npy samples (none found)")
    return np.stack([np.load(f).astype(np.float32) for f in files])


def write_dataset(samples: np.ndarray, input_shape: Sequence[int], folder: Path) -> Path:
    """The toolkit's calibration dataset file: one ``.npy`` of the model's input shape per line.

    Samples are grouped into inputs of the model's batch; the last group is filled up from the first samples.
    """
    batch = int(input_shape[0])
    per_sample = tuple(int(d) for d in input_shape[1:])
    if samples.ndim == len(input_shape) and tuple(samples.shape[1:]) != per_sample:
        raise ValueError(f"calibration samples have shape {samples.shape[1:]}, the model takes {per_sample}")
    samples = samples.reshape(-1, *per_sample)
    if len(samples) == 0:
        raise ValueError("the calibration set is empty")
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, start in enumerate(range(0, len(samples), batch)):
        group = samples[start:start + batch]
        if len(group) < batch:
            group = np.concatenate([group, np.resize(samples, (batch - len(group), *per_sample))])
        path = folder / f"{i:05d}.npy"
        np.save(path, group.astype(np.float32))
        lines.append(str(path.resolve()))
    dataset = folder / "dataset.txt"
    dataset.write_text("\n".join(lines) + "\n")
    return dataset


def accuracy(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """max abs error over all outputs, and top-1 agreement where outputs are [samples, classes]."""
    reference, got = reference.reshape(len(reference), -1), got.reshape(len(got), -1)
    row: dict[str, float] = {"samples": float(len(reference)),
                             "max_abs_error": float(np.abs(reference - got).max())}
    if reference.shape[1] > 1:
        row["top1_agreement"] = float((reference.argmax(1) == got.argmax(1)).mean())
    return row


def _reference(model: Any, onnx_path: str, samples: np.ndarray) -> np.ndarray:
    if model is not None:
        import torch

        with torch.inference_mode():
            return model.eval()(torch.as_tensor(samples)).float().numpy()
    import onnxruntime

    session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    batch = session.get_inputs()[0].shape[0]
    batch = batch if isinstance(batch, int) and batch > 0 else len(samples)  # a fixed batch: chunks, last padded
    outs = []
    for start in range(0, len(samples), batch):
        chunk = samples[start:start + batch]
        padded = np.concatenate([chunk, np.zeros((batch - len(chunk), *chunk.shape[1:]), np.float32)])
        outs.append(np.asarray(session.run(None, {name: padded})[0], dtype=np.float32)[:len(chunk)])
    return np.concatenate(outs)


def convert(model: Any, out: str | Path, *, input_shape: Sequence[int] | None = None, target: str = "rk3588",
            dtype: str = "fp16", calibration: str | Path | Callable[[], Any] | None = None,
            held_out: str | Path | Callable[[], Any] | None = None, verbose: bool = False) -> ConvertResult:
    """Write ``out`` (``.rknn``), its ONNX and recipe next to it, and check it on ``held_out`` samples.

    ``model`` is a torch module (``input_shape`` required) or the path of an ONNX file (its own input shape
    unless ``input_shape`` is given). ``held_out`` defaults to 64 standard-normal samples, which checks the
    conversion, not the task: give real held-out data for a task accuracy.
    """
    from npudist.edge.rknn_runtime import RKNNSimulatorRunner

    out = Path(out)
    if out.suffix != ".rknn":
        raise ValueError(f"{out}: the output must end in .rknn")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch_model = None if isinstance(model, str | Path) else model
    if torch_model is None:
        onnx_path = Path(model)
        if not onnx_path.is_file():
            raise ValueError(f"{onnx_path}: no such ONNX file")
        dims = _onnx_input_dims(onnx_path)
        shape = tuple(input_shape) if input_shape else _static_shape(onnx_path, dims)
    else:
        if not input_shape:
            raise ValueError("a torch module needs input_shape (e.g. 1,8: batch first)")
        shape = tuple(int(d) for d in input_shape)
        onnx_path = export_onnx(torch_model, shape, out.with_suffix(".onnx"))
    dataset = None
    if dtype == "int8":
        if calibration is None:
            raise ValueError("int8 needs a calibration set (a directory of .npy samples or a dataset callable)")
        dataset = str(write_dataset(load_samples(calibration), shape, out.with_suffix(".calibration")))
    recipe = Recipe(onnx=str(onnx_path.resolve()), input_shape=shape, target=target, dtype=dtype,
                    dataset=dataset)
    rknn = build(recipe, verbose=verbose)
    if rknn.export_rknn(str(out)) != 0:
        rknn.release()
        raise ConversionError(f"rknn-toolkit2 export_rknn({out}) failed; see its log above")
    samples = (load_samples(held_out) if held_out is not None else
               np.random.default_rng(0).standard_normal((64, *shape[1:])).astype(np.float32))
    runner = RKNNSimulatorRunner(recipe, built=rknn)
    try:
        import torch

        got = runner(torch.as_tensor(samples.reshape(-1, *shape[1:]))).numpy()
    finally:
        runner.release()
    row = accuracy(_reference(torch_model, str(onnx_path), samples.reshape(-1, *shape[1:])), got)
    recipe = replace(recipe, accuracy=row)
    recipe.save(out)
    return ConvertResult(out, recipe)


def _onnx_input_dims(path: Path) -> Any:
    """The first graph input's dims; ValueError naming the file when it is not a readable ONNX model."""
    import onnx

    try:
        graph = onnx.load(str(path)).graph
    except Exception as exc:  # protobuf DecodeError; IndexError/UnicodeDecodeError/ValueError on cut bytes
        raise ValueError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc}); export it again "
                         "(torch.onnx.export) or give a torch module instead") from None
    if not graph.input:
        raise ValueError(f"{path}: the ONNX graph declares no input; export it again with its input named")
    return graph.input[0].type.tensor_type.shape.dim


def _static_shape(path: Path, dims: Any) -> tuple[int, ...]:
    shape = tuple(d.dim_value for d in dims)
    if not shape or any(d < 1 for d in shape):
        raise ValueError(f"{path}: its input has a dynamic shape {[d.dim_param or d.dim_value for d in dims]}; "
                         "give --input-shape")
    return shape
