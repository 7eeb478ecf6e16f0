"""npudist.edge without the toolkit: its refusal and how-to, the recipe, error naming, datasets, the CLI's specs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npudist.edge import Recipe
from npudist.edge.build import name_op, toolkit_message
from npudist.edge.cli import SpecError, default_out, load_callable, parse_kwargs
from npudist.edge.conversion import accuracy, load_samples, write_dataset
from tests.conftest import REPO, child_env, run_npudist

# The toolkit's own words for a Unique node (rknn-toolkit2 2.5.0, load_onnx then build on a 1x8 input).
UNIQUE_TRACEBACK = """Traceback (most recent call last):
  File "rknn/api/graph_optimizer.py", line 368, in rknn.api.graph_optimizer._dynamic_check
  File "rknn/api/rknn_log.py", line 95, in rknn.api.rknn_log.RKNNLog.e
ValueError: The input 0 of Unique('y') need to be constant! It will cause the graph to be a dynamic graph!
                  Remove Unique('y') manually and try again!
"""


def test_toolkit_message_is_the_last_error_and_the_op_is_named() -> None:
    message = toolkit_message(ValueError(UNIQUE_TRACEBACK))
    assert message.startswith("ValueError: The input 0 of Unique('y') need to be constant!")
    assert "Remove Unique('y') manually" in message
    nodes = [("Gemm", "/0/Gemm"), ("Unique", "y")]
    assert name_op(message, nodes) == "Unique('y')"
    # onnxruntime's shape inference inside the toolkit names only the op type
    assert name_op("[ONNXRuntimeError] : 1 : FAIL : Node () Op (Det) [ShapeInferenceError]",
                   [("Det", "")]) == "Det"
    assert name_op("Unsupport onnx opset 20, need <= 19!", nodes) is None


@pytest.mark.subprocess
def test_the_cli_says_how_to_make_the_toolkit_env(tmp_path: Path) -> None:
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(b"")
    proc = run_npudist(["edge", "convert", str(onnx_file), "-o", str(tmp_path / "m.rknn")],
                       env=child_env({"COLUMNS": "300"}))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())
    assert "rknn-toolkit2 is not installed" in text and "make rknn-env" in text, text
    assert ".venv-rknn/bin/python -m npudist edge convert" in text
    assert "Traceback" not in proc.stderr


def test_recipe_refuses_bad_settings_and_round_trips(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="target 'rk9999': choose one of rk3588, rk3576, rk3566"):
        Recipe(onnx="m.onnx", input_shape=(1, 8), target="rk9999")
    with pytest.raises(ValueError, match="dtype 'int4': choose one of fp16, int8"):
        Recipe(onnx="m.onnx", input_shape=(1, 8), dtype="int4")
    with pytest.raises(ValueError, match="int8 needs a calibration set"):
        Recipe(onnx="m.onnx", input_shape=(1, 8), dtype="int8")
    recipe = Recipe(onnx="m.onnx", input_shape=(4, 8), dtype="int8", dataset="d.txt", accuracy={"samples": 3.0})
    written = recipe.save(tmp_path / "m.rknn")
    assert written.name == "m.rknn.json" and json.loads(written.read_text())["target"] == "rk3588"
    assert Recipe.load(tmp_path / "m.rknn") == recipe and recipe.batch == 4
    with pytest.raises(ValueError, match=r"cannot read the conversion recipe .*nope\.rknn\.json"):
        Recipe.load(tmp_path / "nope.rknn")


def test_calibration_set_is_grouped_into_model_batches(tmp_path: Path) -> None:
    for i in range(5):
        np.save(tmp_path / f"s{i}.npy", np.full(3, i, dtype=np.float32))
    samples = load_samples(tmp_path)
    assert samples.shape == (5, 3)
    dataset = write_dataset(samples, (2, 3), tmp_path / "cal")
    files = dataset.read_text().split()
    assert len(files) == 3  # 5 samples in batches of 2, the last filled up from the first sample
    assert np.load(files[2]).tolist() == [[4, 4, 4], [0, 0, 0]]
    with pytest.raises(ValueError, match="calibration samples have shape \\(3,\\), the model takes \\(4,\\)"):
        write_dataset(samples, (1, 4), tmp_path / "bad")
    with pytest.raises(ValueError, match=r"not a directory of \.npy samples"):
        load_samples(tmp_path / "cal" / "none")
    assert load_samples(lambda: [np.zeros(3), np.ones(3)]).shape == (2, 3)


def test_accuracy_row() -> None:
    ref = np.array([[1.0, 0.0], [0.0, 1.0]])
    row = accuracy(ref, np.array([[0.9, 0.2], [0.6, 0.5]]))
    assert row["max_abs_error"] == pytest.approx(0.6) and row["top1_agreement"] == 0.5 and row["samples"] == 2
    assert "top1_agreement" not in accuracy(np.zeros((3, 1)), np.zeros((3, 1)))


def test_model_and_dataset_specs() -> None:
    factory = load_callable(f"{REPO / 'examples' / 'edge_ensemble.py'}:member_model")
    assert callable(factory)
    assert load_callable("npudist.edge.conversion:accuracy") is accuracy
    with pytest.raises(SpecError, match=r"expected FILE\.py:FUNCTION"):
        load_callable("model.pt")
    with pytest.raises(SpecError, match="has no callable 'nope'"):
        load_callable("npudist.edge.conversion:nope")
    assert parse_kwargs(["rank=2", "name=a b"]) == {"rank": 2, "name": "a b"}
    with pytest.raises(SpecError, match="expected KEY=VALUE"):
        parse_kwargs(["rank"])


def test_the_default_output_sits_beside_the_model() -> None:
    assert default_out("models/m.onnx") == Path("models/m.rknn")
    assert default_out("examples/edge_ensemble.py:member_model") == Path("examples/edge_ensemble.member_model.rknn")
    assert default_out("pkg.mod:build") == Path("build.rknn")


def test_edge_stands_below_infer():
    # The ensemble (infer) runs .rknn members through edge's runtimes; edge must not import infer back.
    import ast

    edge = Path(__file__).resolve().parents[2] / "src" / "npudist" / "edge"
    imports = []
    for path in sorted(edge.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imports.append((path.name, node.module))
            elif isinstance(node, ast.Import):
                imports += [(path.name, a.name) for a in node.names]
    assert ("conversion.py", "npudist.edge.rknn_runtime") in imports  # the walk sees function-level imports
    assert [i for i in imports if i[1].startswith("npudist.infer")] == []
