"""The rewrite: what it produces, that it keeps what it does not touch, and that it is a no-op on itself."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from npudist.migrate import analyse, apply
from tests.conftest import REPO, run_npudist

CORPUS = REPO / "tests" / "migrate" / "corpus"


def _fix(code: str) -> str:
    return apply(analyse(textwrap.dedent(code))).code


def test_rewrites_device_init_ddp_and_amp_keeping_comments() -> None:
    out = _fix('''
        import torch  # the framework
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main(local_rank):
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl", timeout=t)  # join
            # wrap it
            model = DDP(Net().cuda(), device_ids=[local_rank], find_unused_parameters=True)
            scaler = torch.cuda.amp.GradScaler(enabled=True)
            x = torch.ones(2, device="cuda:0")
    ''')
    assert "import torch  # the framework" in out
    assert "import npudist" in out
    assert out.count("npudist.init(") == 1  # set_device + init_process_group -> one init
    assert "    ctx = npudist.init(timeout=t)  # join" in out
    assert "# wrap it" in out
    assert "npudist.ddp(Net().to(ctx.device), find_unused_parameters=True)" in out
    assert "import torch.distributed" not in out and "DistributedDataParallel" not in out  # dead: F401
    assert "torch.amp.GradScaler(npudist.accelerator().device_type, enabled=True)" in out
    assert "device=npudist.accelerator().device(0)" in out
    assert "cuda" not in out.replace("torch.cuda.amp", "")


def test_leaves_what_needs_a_person_and_says_why() -> None:
    result = apply(analyse('import torch\nok = x.is_cuda\ntorch.cuda.memory_stats()\n'))
    assert result.code == 'import torch\nok = x.is_cuda\ntorch.cuda.memory_stats()\n'
    assert sorted(f.rule for f in result.left) == ["cuda-memory-api"]
    assert result.blocking == ()  # a warning: the script runs, reporting 0


@pytest.mark.subprocess
def test_fix_exits_non_zero_naming_the_lines_it_could_not_port(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nmajor, minor = torch.cuda.get_device_capability()\nx = torch.ones(1).cuda()\n")
    r = run_npudist(["migrate", "fix", "--write", str(script)])
    assert r.returncode == 1, r.stderr
    assert f"left for a person: {script}:2:16: cuda-api error: torch.cuda.get_device_capability()" in r.stderr
    assert "1 line(s) left (errors above) still stop the script off CUDA" in r.stderr
    assert "x = torch.ones(1).to(npudist.accelerator().device())" in script.read_text()  # the rest is written
    script.write_text("import torch\nprint(torch.cuda.get_device_name(0))\n")
    r = run_npudist(["migrate", "fix", "--write", str(script)])
    assert r.returncode == 0, r.stderr
    assert "print(npudist.accelerator().device_name(0))" in script.read_text()


@pytest.mark.parametrize("script", sorted(CORPUS.rglob("*.py")), ids=lambda p: str(p.relative_to(CORPUS)))
def test_fix_is_a_no_op_on_its_own_output(script: Path) -> None:
    once = apply(analyse(script.read_text())).code
    assert apply(analyse(once)).code == once
    assert not apply(analyse(once)).applied


@pytest.mark.subprocess
def test_check_exit_codes_and_json(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text('import torch\ntorch.backends.cudnn.benchmark = True\n')  # a warning only
    assert run_npudist(["migrate", "check", str(script)]).returncode == 0
    assert run_npudist(["migrate", "check", "--fail-on", "warning", str(script)]).returncode == 1
    doc = json.loads(run_npudist(["migrate", "check", "--json", "--fail-on", "never", str(script)]).stdout)
    assert [(f["line"], f["rule"], f["severity"]) for f in doc["findings"]] == [(2, "cuda-backend-flags", "warning")]
    bad = run_npudist(["migrate", "check", "--fail-on", "sometimes", str(script)])
    assert bad.returncode == 2 and "--fail-on" in bad.stderr


@pytest.mark.subprocess
def test_bad_files_are_reported_and_never_rewritten(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nx = torch.zeros(2).cuda(\n")
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\x00\x01torch.cuda.set_device(0)")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.py"
    outside.write_text("import torch\nm = model.cuda()\n")
    (tmp_path / "link.py").symlink_to(outside)
    good = tmp_path / "good.py"
    good.write_text("import torch\nm = model.cuda()\n")
    before = {p: p.read_bytes() for p in (broken, binary, outside)}
    r = run_npudist(["migrate", "fix", "--write", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    assert "broken.py: skipped: does not parse (line 2" in r.stderr
    assert "blob.py: skipped: binary" in r.stderr
    assert {p: p.read_bytes() for p in (broken, binary, outside)} == before  # the link's target is outside
    assert good.read_text().split() == ["import", "torch", "import", "npudist", "m", "=",
                                        "model.to(npudist.accelerator().device())"]
    check = json.loads(run_npudist(["migrate", "check", "--json", str(tmp_path)]).stdout)
    assert {Path(s["path"]).name for s in check["skipped"]} == {"broken.py", "blob.py", "link.py"}
