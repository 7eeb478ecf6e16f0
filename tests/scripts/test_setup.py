"""scripts/setup.sh's choices, with pip recorded instead of run: the CPU index when it answers (else the
default index, said so), the build that came named, and numpy kept below 2 beside a torch older than 2.3."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import REPO, child_env

pytestmark = pytest.mark.subprocess

SHIM = """#!{python}
import json, os, sys
args = sys.argv[1:]
if args[:2] in (["-m", "pip"], ["-m", "npudist"]):
    with open(os.environ["SHIM_PIP_LOG"], "a") as f:
        f.write(json.dumps(args[2:]) + "\\n")
    sys.exit(0)
if args[:1] == ["-c"] and "find_spec" in args[1] and os.environ.get("SHIM_NO_TORCH"):
    print("missing")
    sys.exit(0)
os.execv(sys.executable, [sys.executable, *args])
"""


def _shim(tmp_path: Path) -> tuple[Path, Path]:
    """A python that records `-m pip` and `-m npudist` calls instead of running them, and runs the rest."""
    shim, log = tmp_path / "python", tmp_path / "calls.jsonl"
    if not shim.exists():
        shim.write_text(SHIM.format(python=sys.executable))
        shim.chmod(0o755)
    return shim, log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _setup(tmp_path: Path, *, torch_version: str | None = None, no_torch: bool = False,
           index: str = "http://127.0.0.1:9/none") -> tuple[str, list[list[str]]]:
    shim, log = _shim(tmp_path)
    log.unlink(missing_ok=True)
    paths = []
    if torch_version:  # an installed torch of that version, as its metadata says (the import is this torch)
        meta = tmp_path / "meta" / f"torch-{torch_version}.dist-info"
        meta.mkdir(parents=True, exist_ok=True)
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
        paths.append(meta.parent)
    env = child_env({"PYTHON": str(shim), "SHIM_PIP_LOG": str(log), "NPUDIST_TORCH_INDEX": index,
                     "NPUDIST_SETUP_STAMPS": str(tmp_path / "stamps"),
                     **({"SHIM_NO_TORCH": "1"} if no_torch else {})}, pythonpath=paths)
    done = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, _calls(log)


@pytest.mark.parametrize(("version", "pinned"), [("2.1.2", True), ("2.2.0+cpu", True), ("2.13.0", False),
                                                 ("2.10.0", False)])
def test_an_installed_torch_older_than_2_3_keeps_numpy_below_2(tmp_path, version, pinned):
    out, calls = _setup(tmp_path, torch_version=version)
    assert len(calls) == 1 and calls[0][:3] == ["install", "--quiet", "-e"]  # torch left as it is
    assert ("numpy<2" in calls[0]) is pinned, calls
    assert ("predates numpy 2 support" in out) is pinned


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html></html>")

    def log_message(self, *args):
        pass


def test_a_missing_torch_comes_from_the_cpu_index_when_it_answers(tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    try:
        out, calls = _setup(tmp_path, no_torch=True, index=index)
    finally:
        server.shutdown()
        server.server_close()
    assert calls[0][-3:] == ["--index-url", index, "torch==2.13.0"], calls
    assert f"the CPU build, from {index}" in out
    assert "setup: installed torch " in out  # what came, named (here: this interpreter's torch)


def test_an_unreachable_cpu_index_falls_back_to_the_default_and_says_so(tmp_path):
    out, calls = _setup(tmp_path, no_torch=True)
    assert calls[0] == ["install", "--quiet", "torch==2.13.0"], calls
    assert "cannot be reached" in out and "CUDA build" in out
    assert "setup: installed torch " in out


def test_a_second_set_up_with_nothing_changed_installs_nothing(tmp_path):
    _, calls = _setup(tmp_path, torch_version="2.13.0")
    assert len(calls) == 1
    out, calls = _setup(tmp_path, torch_version="2.13.0")
    assert calls == [] and "setup: already done for" in out
    (tmp_path / "stamps").joinpath(next((tmp_path / "stamps").iterdir()).name).write_text("other inputs\n")
    _, calls = _setup(tmp_path, torch_version="2.13.0")  # pyproject.toml or setup.sh changed: set up again
    assert len(calls) == 1


@pytest.mark.parametrize(("steps", "launched"), [(20, False), (40, True)])
def test_make_demo_on_a_finished_run_starts_no_ranks(tmp_path, steps, launched):
    shim, log = _shim(tmp_path)
    run = tmp_path / "run"
    (run / "step-00000020").mkdir(parents=True)
    (run / "step-00000020" / "manifest.json").write_text("{}")
    env = child_env({"SHIM_PIP_LOG": str(log), "NPUDIST_SETUP_STAMPS": str(tmp_path / "stamps")})
    done = subprocess.run(["make", "-s", "-C", str(REPO), "demo", f"PYTHON={shim}", f"STEPS={steps}",
                           f"RUN_DIR={run}"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    npudist = [c[0] for c in _calls(log) if c[0] in ("launch", "report")]
    assert npudist == (["launch", "report"] if launched else ["report"]), _calls(log)
    assert ("already finished step 20" in done.stdout) is not launched
