"""Hostile and malformed manifests: the checkpoint is skipped with a warning, nothing outside its
directory is opened, nothing blocks, nothing raises (issue 12, item 8)."""

import hashlib
import json
import logging
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npudist import checkpoint
from npudist.checkpoint.layout import check_manifest, name_problem, verify

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # cannot be removed; it records only while a test collects (_OPENED set)


class _Recording:
    def __enter__(self) -> list[str]:
        global _OPENED
        _OPENED = []
        return _OPENED

    def __exit__(self, *exc) -> None:
        global _OPENED
        _OPENED = None


def _assert_inside(opened: list[str], root: Path) -> None:
    """Absolute paths lie under root; relative ones (opened against a directory fd) never climb."""
    for path in opened:
        if os.path.isabs(path):
            assert Path(os.path.normpath(path)).is_relative_to(root), f"opened {path} outside {root}"
        else:
            assert ".." not in Path(path).parts, f"opened {path!r}, which climbs out of its directory"


def _digest(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


@pytest.fixture
def run(tmp_path):
    """A run directory with a good step 1 and a good step 2 to be damaged, plus a secret outside it."""
    root = tmp_path / "run"
    checkpoint.save({"w": torch.full((4,), 1.0)}, root, 1)
    checkpoint.save({"w": torch.full((4,), 2.0)}, root, 2)
    outside = tmp_path / "secret.pt"
    outside.write_bytes((root / "step-00000002" / "state.pt").read_bytes())  # a valid state, outside
    return root, outside


def _rewrite(root: Path, manifest) -> None:
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (root / "step-00000002" / "manifest.json").write_text(text)


def _manifest(root: Path) -> dict:
    return json.loads((root / "step-00000002" / "manifest.json").read_text())


def _falls_back(root: Path, caplog, why: str) -> None:
    with _Recording() as opened, caplog.at_level(logging.WARNING, logger="npudist.checkpoint"):
        state, step = checkpoint.load_latest(root)
    assert step == 1 and torch.equal(state["w"], torch.full((4,), 1.0))
    assert "skipping checkpoint" in caplog.text and "step-00000002" in caplog.text and why in caplog.text
    _assert_inside(opened, root)


def _point_at(root: Path, name: str, target: Path) -> None:
    m = _manifest(root)
    m["files"] = {"state.pt": m["files"]["state.pt"], name: _digest(target.read_bytes())}
    _rewrite(root, m)


@pytest.mark.parametrize("name", ["../../secret.pt", "../step-00000001/state.pt", "sub/../../../secret.pt",
                                  "./state.pt", "a//b", "", "manifest.json", "x\\..\\secret.pt", "nul\x00l"])
def test_names_that_leave_the_directory_are_refused_unread(run, caplog, name):
    root, outside = run
    _point_at(root, name, outside)
    _falls_back(root, caplog, "")


def test_an_absolute_name_is_refused_unread(run, caplog):
    root, outside = run
    _point_at(root, str(outside), outside)
    _falls_back(root, caplog, "not a plain relative path")


def test_a_symlink_to_a_valid_file_outside_is_refused(run, caplog):
    root, outside = run
    state = root / "step-00000002" / "state.pt"
    state.unlink()
    state.symlink_to(outside)  # same bytes, so only the refusal to follow it protects us
    _falls_back(root, caplog, "not a regular file inside the checkpoint")


def test_a_symlinked_subdirectory_is_not_followed(run, caplog, tmp_path):
    root, outside = run
    (root / "step-00000002" / "sub").symlink_to(tmp_path)
    _point_at(root, "sub/secret.pt", outside)
    _falls_back(root, caplog, "not a regular file inside the checkpoint")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_special_files_never_block_or_get_read(run, caplog, kind):
    root, _ = run
    state = root / "step-00000002" / "state.pt"
    state.unlink()
    if kind == "fifo":
        os.mkfifo(state)  # opening it for reading without O_NONBLOCK waits for a writer forever
    else:
        state.symlink_to("/dev/zero")  # hashing it would never end
    _falls_back(root, caplog, "state.pt")


@pytest.mark.timeout(30)
def test_a_manifest_that_is_a_fifo_or_a_device_is_skipped(run, caplog):
    root, _ = run
    manifest = root / "step-00000002" / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    _falls_back(root, caplog, "manifest.json unreadable")


def test_a_step_directory_that_is_a_symlink_is_not_a_checkpoint(run, caplog, tmp_path):
    root, _ = run
    elsewhere = tmp_path / "elsewhere"
    checkpoint.save({"w": torch.full((4,), 9.0)}, elsewhere, 5)
    (root / "step-00000005").symlink_to(elsewhere / "step-00000005")
    assert checkpoint.list_checkpoints(root) == [2, 1]
    assert verify(root / "step-00000005")[1].startswith("not a real directory")


DEEP = "[" * 200_000 + "]" * 200_000


@pytest.mark.parametrize(("manifest", "why"), [
    (5, "not an npudist checkpoint manifest"),
    ([1, 2], "not an npudist checkpoint manifest"),
    ({"format": True, "step": 2, "kind": "plain", "files": {}}, "not an npudist checkpoint manifest"),
    ({"format": 1, "step": "2", "kind": "plain", "files": {}}, "does not match the directory name"),
    ({"format": 1, "step": 2, "kind": "pickle", "files": {}}, "kind"),
    ({"format": 1, "step": 2, "kind": "plain", "files": 5}, "'files' is not an object"),
    ({"format": 1, "step": 2, "kind": "plain", "files": {"state.pt": 7}}, "needs a sha256"),
    ({"format": 1, "step": 2, "kind": "plain", "files": {"state.pt": {"sha256": "zz", "bytes": 1}}},
     "needs a sha256"),
    ({"format": 1, "step": 2, "kind": "plain", "files": {"state.pt": {"sha256": "0" * 64, "bytes": True}}},
     "needs a sha256"),
    ({"format": 1, "step": 2, "kind": "plain", "files": {}}, "does not list state.pt"),
    ({"format": 1, "step": 2, "kind": "sharded", "files": {"state.pt": {"sha256": "0" * 64, "bytes": 1}}},
     "does not list .metadata"),
    (DEEP, "nested too deeply"),
    ('{"format": 1, "step": 2' + "0" * 5000 + "}", "manifest.json unreadable"),
    ("\xff\xfe not text", "manifest.json unreadable"),
])
def test_malformed_manifests_fall_back_with_a_warning(run, caplog, manifest, why):
    root, _ = run
    _rewrite(root, manifest)
    _falls_back(root, caplog, why)


def test_an_oversized_manifest_is_not_read(run, caplog, monkeypatch):
    from npudist.checkpoint import layout

    root, _ = run
    _rewrite(root, json.dumps(_manifest(root)) + " " * 4000)  # still valid JSON, just large
    monkeypatch.setattr(layout, "MAX_MANIFEST_BYTES", 2000)
    _falls_back(root, caplog, "more than 2000")


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                     max_leaves=20)
_NAMES = st.sampled_from(["state.pt", "../secret.pt", "/etc/passwd", "sub/x", "..", ".", "", "a/../b",
                          "manifest.json"]) | st.text(max_size=12)
_ENTRY = st.fixed_dictionaries({"sha256": st.text(max_size=64) | st.just("0" * 64), "bytes": _JSON}) | _JSON
_MANIFESTS = st.fixed_dictionaries({
    "format": st.sampled_from([1, 1.0, True, "1", 2]) | _JSON,
    "step": st.sampled_from([2, "2", 2.0, None]),
    "kind": st.sampled_from(["plain", "sharded", "other"]),
    "files": st.dictionaries(_NAMES, _ENTRY, max_size=4) | _JSON,
}) | _JSON


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(manifest=_MANIFESTS)
def test_any_manifest_is_either_good_or_skipped_and_nothing_outside_is_opened(run, manifest):
    root, _ = run
    _rewrite(root, manifest)
    with _Recording() as opened:
        got, why = verify(root / "step-00000002")
    _assert_inside(opened, root)
    assert (got is None) != (why is None)
    if got is not None:  # only possible for a manifest that names real, matching files inside
        assert all(name_problem(n) is None for n in got["files"])


@given(manifest=_JSON, step=st.integers(0, 3))
def test_check_manifest_is_total(manifest, step):
    assert check_manifest(manifest, step) is None or isinstance(check_manifest(manifest, step), str)
