"""Import paths that moved keep working for one release: scripts outside this repository import them.

Each old module path must be the very module at its new place (so a monkeypatch or an isinstance check
through either path agrees), and each public name a script imported from it must still be there.
"""

from __future__ import annotations

import importlib
from pathlib import Path

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
    "npudist.backend_guard": "npudist.accelerators.backend_guard",
    "npudist.toolrun": "npudist.runtime.toolrun",
    "npudist.runlog_schema": "npudist.telemetry.runlog_schema",
    "npudist.sentinel": "npudist.training.sentinel",
    "npudist.dry_run": "npudist.training.dry_run",
    "npudist.launch_options": "npudist.launch.options",
    "npudist.launch_multinode": "npudist.launch.multinode",
    "npudist.launch_scope": "npudist.launch.scope",
    "npudist.launch_hint": "npudist.launch.hint",
    "npudist.torchrun_parser": "npudist.launch.torchrun_parser",
    "npudist.comm.bench_rank": "npudist.bench.rank",
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
    ("npudist.backend_guard", "from_env"): "npudist.accelerators.backend_guard",
    ("npudist.runlog_schema", "check"): "npudist.telemetry.runlog_schema",
    ("npudist.sentinel", "NonFiniteError"): "npudist.training.sentinel",
    # launch.py became the package npudist.launch (split by concept); its names stay importable from it
    ("npudist.launch", "plan"): "npudist.launch.planner",
    ("npudist.launch", "LaunchPlan"): "npudist.launch.planner",
    ("npudist.launch", "LaunchError"): "npudist.launch.errors",
    ("npudist.launch", "run"): "npudist.launch.runner",
    ("npudist.launch", "accelerator_for"): "npudist.launch.planner",
    ("npudist.launch", "dry_run_steps"): "npudist.launch.planner",
    ("npudist.launch", "resolve_nproc"): "npudist.launch.devices",
    ("npudist.launch", "visible_devices"): "npudist.launch.devices",
    ("npudist.launch", "free_port"): "npudist.launch.ports",
    ("npudist.launch", "port_in_use"): "npudist.launch.ports",
    ("npudist.launch", "parser"): "npudist.launch.options",
    ("npudist.launch", "USAGE"): "npudist.launch.options",
    ("npudist.launch_options", "parser"): "npudist.launch.options",
    ("npudist.launch_scope", "QUIET_S"): "npudist.launch.scope",
    ("npudist.launch_hint", "cuda_hint"): "npudist.launch.hint",
    # bench.py became the package npudist.bench (cli.py, rank.py)
    ("npudist.bench", "app"): "npudist.bench.cli",
    ("npudist.bench", "summarise"): "npudist.bench.cli",
    ("npudist.bench", "bus_factor"): "npudist.bench.cli",
    ("npudist.comm.bench_rank", "PROGRESS"): "npudist.bench.rank",
}


@pytest.mark.parametrize("old,new", sorted(MOVED_MODULES.items()))
def test_an_old_module_path_is_the_module_at_its_new_place(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


@pytest.mark.parametrize("old,name", sorted(MOVED_NAMES))
def test_a_name_imported_from_its_old_place_is_the_one_at_its_new_place(old, name):
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(MOVED_NAMES[old, name]),
                                                                   name)


def test_a_moved_module_keeps_its_own_name_and_spec_and_leaves_no_file_behind():
    src = importlib.import_module("npudist").__path__[0]
    for old, new in MOVED_MODULES.items():
        module = importlib.import_module(old)
        assert module.__name__ == new and module.__spec__.name == new  # pickles and reloads see the new place
        assert not (Path(src).parent / (old.replace(".", "/") + ".py")).exists(), old


def test_a_path_that_exists_is_never_served_by_the_alias_table():
    import npudist.comm.hang as hang

    assert hang.__spec__.origin.endswith("comm/hang/__init__.py")  # the package, not the old verdict module
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("npudist.no_such_module")


def test_an_old_path_that_never_had_a_name_still_says_so():
    with pytest.raises(AttributeError, match="no_such_name"):
        importlib.import_module("npudist.comm.hang").no_such_name  # noqa: B018
