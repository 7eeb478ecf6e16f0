"""Import paths that moved keep working for one release: scripts outside this repository import them.

Each old module path must be the very module at its new place (so a monkeypatch or an isinstance check
through either path agrees), and each public name a script imported from it must still be there.
"""

from __future__ import annotations

import importlib

import pytest

# old path -> new path (docs/architecture.md's layout)
MOVED_MODULES = {
    "npudist.comm.rank_states": "npudist.diagnosis.rank_states",
    "npudist.comm.watchdog": "npudist.comm.hang.watchdog",
    "npudist.comm.hang_reader": "npudist.comm.hang.reader",
    "npudist.comm.progress_store": "npudist.comm.hang.store",
    "npudist.accelerators.place": "npudist.diagnosis.place",
    "npudist.telemetry.job.detector": "npudist.diagnosis.straggler.detector",
    "npudist.telemetry.job.student_t": "npudist.diagnosis.straggler.student_t",
    "npudist.telemetry.job.skew": "npudist.diagnosis.straggler.skew",
}

# (old module, name) -> where the name lives now
MOVED_NAMES = {
    ("npudist.comm.hang", "judge"): "npudist.diagnosis.hang",
    ("npudist.comm.hang", "suspects"): "npudist.diagnosis.hang",
    ("npudist.comm.hang", "ProgressTracker"): "npudist.diagnosis.hang",
    ("npudist.comm.progress_store", "Record"): "npudist.diagnosis.record",
    ("npudist.comm.progress_store", "parse_record"): "npudist.diagnosis.record",
    ("npudist.comm.progress_store", "GroupInfo"): "npudist.diagnosis.record",
    ("npudist.comm.watchdog", "CollectiveHangError"): "npudist.comm.hang.watchdog",
    ("npudist.telemetry", "StragglerDetector"): "npudist.diagnosis.straggler.detector",
    ("npudist.telemetry.job.skew", "SkewReport"): "npudist.diagnosis.straggler.skew",
    ("npudist.accelerators.place", "Place"): "npudist.diagnosis.place",
}


@pytest.mark.parametrize("old,new", sorted(MOVED_MODULES.items()))
def test_an_old_module_path_is_the_module_at_its_new_place(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


@pytest.mark.parametrize("old,name", sorted(MOVED_NAMES))
def test_a_name_imported_from_its_old_place_is_the_one_at_its_new_place(old, name):
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(MOVED_NAMES[old, name]),
                                                                   name)


def test_an_old_path_that_never_had_a_name_still_says_so():
    with pytest.raises(AttributeError, match="no_such_name"):
        importlib.import_module("npudist.comm.hang").no_such_name  # noqa: B018
