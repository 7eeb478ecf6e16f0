"""``npudist edge convert``: the typer group cli.py registers. Runs in the toolkit's environment."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, help="Rockchip NPU models: convert to .rknn and check their accuracy.")
err = Console(stderr=True, soft_wrap=True)  # a path or command in a message stays whole, to copy


class SpecError(ValueError):
    """A MODEL / dataset argument that names nothing loadable."""


def load_callable(spec: str) -> Callable[..., Any]:
    """``path/to/file.py:name`` or ``package.module:name`` -> the callable it names."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise SpecError(f"{spec!r}: expected FILE.py:FUNCTION or package.module:FUNCTION")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise SpecError(f"{spec!r}: no such file {path}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise SpecError(f"{spec!r}: cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise SpecError(f"{spec!r}: cannot import {where}: {exc}") from exc
    target = getattr(module, name, None)
    if not callable(target):
        raise SpecError(f"{spec!r}: {where} has no callable {name!r}")
    return target


def parse_kwargs(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; values read as Python literals where they parse (2, 0.5, 'a'), else as strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise SpecError(f"--arg {pair!r}: expected KEY=VALUE")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def _dataset(spec: str | None, kwargs: dict[str, Any]) -> str | Callable[[], Any] | None:
    if spec is None or Path(spec).is_dir():
        return spec
    fn = load_callable(spec)
    return lambda: fn(**kwargs)


def default_out(model: str) -> Path:
    """MODEL.rknn beside the model: ``m.onnx`` -> ``m.rknn``; ``dir/f.py:build`` -> ``dir/f.build.rknn``;
    ``pkg.mod:build`` -> ``./build.rknn``."""
    if model.endswith(".onnx"):
        return Path(model).with_suffix(".rknn")
    file, _, func = model.rpartition(":")
    if file.endswith(".py"):
        return Path(file).with_suffix(f".{func}.rknn")
    return Path(f"{func or model}.rknn")


def _shape(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(d) for d in text.replace("x", ",").split(","))
    except ValueError:
        raise SpecError(f"--input-shape {text!r}: expected comma-separated sizes, batch first (1,8)") from None


@app.command(help="Convert MODEL (an .onnx file, or FILE.py:FUNCTION / package.module:FUNCTION returning a torch "
             "module) to .rknn, and print its accuracy against the source on held-out samples. Examples: "
             "`npudist edge convert model.onnx --target rk3588`; `npudist edge convert model.py:build "
             "--input-shape 1,8`.")
def convert(
    model: Annotated[str, typer.Argument(help="model.onnx, or a callable returning a torch nn.Module")],
    out: Annotated[Path | None, typer.Option("-o", "--out", help="The .rknn to write (with several --dtype: "
                                             "NAME.fp16.rknn, NAME.int8.rknn); default MODEL.rknn beside "
                                             "the model.")] = None,
    input_shape: Annotated[str | None, typer.Option(help="Input shape, batch first, e.g. 1,8 (required for "
                                                    "a torch module).")] = None,
    target: Annotated[str, typer.Option(help="rk3588, rk3576 or rk3566.")] = "rk3588",
    dtype: Annotated[list[str] | None, typer.Option(help="fp16 or int8; repeat for both.")] = None,
    calibration: Annotated[str | None, typer.Option(help="int8: a directory of .npy samples, or FILE.py:FUNCTION "
                                                    "returning samples.")] = None,
    held_out: Annotated[str | None, typer.Option(help="Samples the accuracy is measured on (as --calibration); "
                                                 "default 64 standard-normal inputs.")] = None,
    arg: Annotated[list[str] | None, typer.Option(help="KEY=VALUE passed to the model and dataset functions; "
                                                  "repeatable.")] = None,
) -> None:
    from npudist.edge import ConversionError, ToolkitMissing, require_toolkit
    from npudist.edge import convert as run

    dtypes = dtype or ["fp16"]
    out = out or default_out(model)
    try:
        require_toolkit()
        kwargs = parse_kwargs(arg or [])
        source: Any = model if model.endswith(".onnx") else load_callable(model)(**kwargs)
        shape = _shape(input_shape)
        rows = []
        for d in dtypes:
            path = out if len(dtypes) == 1 else out.with_suffix(f".{d}.rknn")
            rows.append(run(source, path, input_shape=shape, target=target, dtype=d,
                            calibration=_dataset(calibration, kwargs), held_out=_dataset(held_out, kwargs)))
    except (ToolkitMissing, ConversionError, SpecError, ValueError) as exc:
        err.print(f"[bold red]npudist edge convert:[/] {exc}")
        raise typer.Exit(2) from None
    reference = "torch fp32" if not model.endswith(".onnx") else "onnxruntime fp32"
    table = Table(title=f"{model} on {target}: simulator vs {reference}")
    for col in ("dtype", "samples", "max abs error", "top-1 agreement", "file"):
        table.add_column(col, overflow="fold")
    for r in rows:
        top1 = "n/a (one output)" if r.top1_agreement is None else f"{r.top1_agreement:.4f}"
        table.add_row(r.recipe.dtype, str(int(r.recipe.accuracy["samples"])), f"{r.max_abs_error:.3g}", top1,
                      str(r.rknn))
    Console(width=200).print(table)
