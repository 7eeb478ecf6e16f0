"""The real rknn-toolkit2 2.5.0: `npudist edge convert` and the 4-rank ensemble in the toolkit's simulator.

`.ci/run` builds the toolkit's environment (scripts/rknn-env.sh) and names its Python in NPUDIST_RKNN_PYTHON;
these tests run npudist in that Python, in subprocesses. Without it they skip (CI refuses that skip).
The thresholds come from the first measured run (toolkit 2.5.0, torch 2.13.0 CPU, the example's default
members: logits of magnitude up to about 30), with head-room for other CPUs' float rounding; each assert says
what was measured.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, child_env

RKNN_PYTHON = os.environ.get("NPUDIST_RKNN_PYTHON")
pytestmark = [pytest.mark.rknn, pytest.mark.subprocess,
              pytest.mark.skipif(not RKNN_PYTHON, reason="NPUDIST_RKNN_PYTHON unset: no venv with rknn-toolkit2 "
                                 "(make rknn-env; .ci/run makes one)")]
EXAMPLE = REPO / "examples" / "edge_ensemble.py"


def _npudist(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RKNN_PYTHON, "-m", "npudist", *args], env=child_env({"COLUMNS": "300"}), cwd=cwd,
                          text=True, capture_output=True, timeout=timeout, check=False)


def test_member_converts_in_fp16_and_int8_and_keeps_its_accuracy(tmp_path: Path) -> None:
    proc = _npudist(["edge", "convert", f"{EXAMPLE}:member_model", "--arg", "rank=1", "--input-shape", "50,8",
                     "--dtype", "fp16", "--dtype", "int8", "--calibration", f"{EXAMPLE}:calibration_set",
                     "--held-out", f"{EXAMPLE}:held_out_set", "-o", str(tmp_path / "member1.rknn")], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"fp16\s.*2000\s.*member1\.fp16\.rknn", proc.stdout), proc.stdout[-2000:]
    rows = {}
    for dtype in ("fp16", "int8"):
        rknn = tmp_path / f"member1.{dtype}.rknn"
        assert rknn.read_bytes()[:4] == b"RKNN"  # the toolkit's model file, what RKNNLite.load_rknn reads
        recipe = json.loads(Path(f"{rknn}.json").read_text())
        assert recipe["target"] == "rk3588" and recipe["input_shape"] == [50, 8]
        rows[dtype] = recipe["accuracy"]
    assert rows["fp16"]["samples"] == 2000
    # measured: fp16 max abs error 0.026, top-1 agreement 1.0000
    assert rows["fp16"]["max_abs_error"] < 0.1
    assert rows["fp16"]["top1_agreement"] >= 0.998
    # measured: int8 (w8a8, calibrated on the member's 200 training inputs) max abs error 8.8, top-1 0.9945
    assert rows["int8"]["max_abs_error"] < 15
    assert rows["int8"]["top1_agreement"] >= 0.98


def test_onnx_input_for_the_other_targets(tmp_path: Path) -> None:
    onnx_file = tmp_path / "mlp.onnx"
    export = subprocess.run(
        [RKNN_PYTHON, "-c", "import sys, torch; from npudist.edge.conversion import export_onnx; torch.manual_seed(0); "
         "export_onnx(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)), "
         "(4, 8), __import__('pathlib').Path(sys.argv[1]))", str(onnx_file)],
        env=child_env(), text=True, capture_output=True, timeout=120, check=False)
    assert export.returncode == 0, export.stderr[-2000:]
    for target in ("rk3576", "rk3566"):
        out = tmp_path / f"mlp-{target}.rknn"
        proc = _npudist(["edge", "convert", str(onnx_file), "--target", target, "-o", str(out)], tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"on {target}: simulator vs onnxruntime fp32" in proc.stdout
        recipe = json.loads(Path(f"{out}.json").read_text())
        assert recipe["target"] == target and recipe["input_shape"] == [4, 8]  # the ONNX file's own shape
        assert recipe["accuracy"]["max_abs_error"] < 5e-3  # measured 4.1e-4 on 64 standard-normal inputs (fp16)
        assert recipe["accuracy"]["top1_agreement"] == 1.0


@pytest.mark.parametrize("content", [b"\x08\x07\x12\xff\xff\xff\xff\x0f", b"\x0a\x80\x80\x80", b"not onnx at all\n"],
                         ids=["bad-varint", "cut-length", "text"])
@pytest.mark.parametrize("shape", [[], ["--input-shape", "1,8"]], ids=["own-shape", "given-shape"])
def test_a_malformed_onnx_file_exits_2_naming_it(tmp_path: Path, content: bytes, shape: list[str]) -> None:
    """Third audit: protobuf's DecodeError (or IndexError on cut bytes) must not surface as a traceback."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    proc = _npudist(["edge", "convert", str(bad), *shape], tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = " ".join(proc.stderr.split())
    assert f"npudist edge convert: {bad}: not a readable ONNX model" in text and "Traceback" not in text, text
    assert not (tmp_path / "bad.rknn").exists()


def test_the_rknn_lands_beside_the_onnx_without_out(tmp_path: Path) -> None:
    onnx_file = tmp_path / "mlp.onnx"
    export = subprocess.run(
        [RKNN_PYTHON, "-c", "import sys, torch; from npudist.edge.conversion import export_onnx; "
         "export_onnx(torch.nn.Sequential(torch.nn.Linear(8, 3)), (2, 8), __import__('pathlib').Path(sys.argv[1]))",
         str(onnx_file)], env=child_env(), text=True, capture_output=True, timeout=120, check=False)
    assert export.returncode == 0, export.stderr[-2000:]
    proc = _npudist(["edge", "convert", str(onnx_file)], REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "mlp.rknn").is_file()


def test_an_unconvertible_op_is_named_with_the_toolkits_message(tmp_path: Path) -> None:
    proc = _npudist(["edge", "convert", f"{REPO / 'tests' / 'edge' / 'rknn_models.py'}:with_unique",
                     "--input-shape", "1,8", "-o", str(tmp_path / "u.rknn")], tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = " ".join(proc.stderr.split())
    assert "npudist edge convert: rknn-toolkit2 build for rk3588 (fp16): operator Unique('/Unique') cannot be " \
           "converted" in text, text
    assert "Toolkit: ValueError: The input 0 of Unique('/Unique') need to be constant!" in text
    assert not (tmp_path / "u.rknn").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_four_rank_ensemble_through_the_simulator(tmp_path: Path) -> None:
    proc = subprocess.run(
        [RKNN_PYTHON, "-m", "npudist", "launch", "--nproc-per-node", "4", str(EXAMPLE), "--rknn-sim", "fp16",
         "--rknn-sim", "int8", "--rknn-dir", str(tmp_path / "rknn"), "--dump", str(tmp_path / "dump")],
        env=child_env(), cwd=tmp_path, text=True, capture_output=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    dump = tmp_path / "dump"
    labels = torch.load(dump / "member0.pt")["labels"]
    accuracy = {}
    for dtype in ("", "fp16", "int8"):
        members = [torch.load(dump / f"{dtype}member{r}.pt")["logits"] for r in range(4)]
        ensemble = torch.load(dump / f"{dtype}ensemble.pt")
        # every rank's member ran in the simulator; rank 0 holds the mean of their probabilities
        mean = torch.stack([torch.softmax(m, dim=-1) for m in members]).mean(dim=0)
        torch.testing.assert_close(ensemble["scores"], mean, rtol=1e-5, atol=1e-6)
        accuracy[dtype or "fp32"] = ([float((m.argmax(-1) == labels).float().mean()) for m in members],
                                     float((ensemble["labels"] == labels).float().mean()))
    for r in range(4):
        torch_logits = torch.load(dump / f"member{r}.pt")["logits"]
        # measured max abs error vs torch: fp16 0.03, int8 9 (logits up to about 30)
        assert (torch.load(dump / f"fp16member{r}.pt")["logits"] - torch_logits).abs().max() < 0.1
    for dtype, (members, ensemble) in accuracy.items():
        assert f"runner={'torch' if dtype == 'fp32' else 'rknn-sim:' + dtype}" in proc.stdout
        # measured: fp32 and fp16 ensemble 0.8590 vs best member 0.8495; int8 0.8595 vs 0.8510
        assert ensemble > max(members), (dtype, members, ensemble)
    assert accuracy["fp16"] == accuracy["fp32"]  # measured: fp16 changes no test prediction's accuracy
    assert abs(accuracy["int8"][1] - accuracy["fp32"][1]) <= 0.01  # measured +0.0005
    assert "core_mask=simulator" in proc.stdout
    assert "| RKNN int8 (rk3588 simulator) |" in proc.stdout
