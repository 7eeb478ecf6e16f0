"""Test tiers: a test that starts a process says so with a marker, and the test run checks it.

The markers (registered in pyproject.toml) say what a test starts: ``subprocess`` (a CLI, a tool, a script),
``ranks`` (distributed ranks), ``cluster`` (network-namespace nodes), ``e2e`` (a whole job through ``npudist
launch`` or the example). ``make check`` runs the tests that carry none of them, in parallel; an unmarked test
that starts a process would land in that tier and make it slow, or flaky next to its neighbours. So while a
test sets up and runs, every way this interpreter starts a process is wrapped, and a start from a test that
carries none of the four fails it, naming the marker to add. A fixture seen starting a process is
remembered: a later unmarked test that uses it fails too, as it would when run alone.

``slow`` is derived: every test with one of the four is also ``slow``, so ``-m "not slow"`` (``make check``)
is the tier that starts no process. ``slow`` on its own marks an in-process test that is merely slow.

tests/conftest.py re-exports the hooks; tests/test_process_guard.py runs them under pytester.
"""

from __future__ import annotations

import multiprocessing.process
import os
import shlex
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import pytest

PROCESS_MARKERS = ("subprocess", "ranks", "cluster", "e2e")

# Every way a process starts in CPython, wrapped at the one place each path goes through:
# Popen._execute_child serves subprocess.run/check_output/call, os.popen and asyncio's subprocesses;
# os.fork serves multiprocessing's fork start method, os.spawn* and pty.fork (or os.forkpty); BaseProcess.start
# serves every multiprocessing and torch.multiprocessing start method (spawn and forkserver exec through
# _posixsubprocess, not os.fork); os.system and os.posix_spawn* call C directly.
STARTERS: list[tuple[object, str]] = [
    (subprocess.Popen, "_execute_child"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (multiprocessing.process.BaseProcess, "start"),
]

# Which marker a start most likely needs, by a word of its command line; the first row that matches wins.
# Any of the four satisfies the guard: the suggestion only saves the reader a look at the definitions.
_SUGGEST: list[tuple[tuple[str, ...], str]] = [
    (("netns", "unshare", "nsenter"), "cluster"),
    (("train_ddp.py", "edge_ensemble.py"), "e2e"),
    (("--nproc-per-node", "--nproc", "--nnodes", "torchrun", "torch.distributed.run", "mpirun"), "ranks"),
]

_TIER_TIME = pytest.StashKey[dict]()  # tier -> [seconds, tests]: the time summary at the end of a session
_FIXTURES = pytest.StashKey[dict]()  # id of each FixtureDef seen starting a process: (what, suggested marker)
_SETTING_UP = pytest.StashKey[list]()  # the FixtureDefs being set up, innermost last


def suggest_marker(argv: Sequence[str] | str, env: Mapping[str, str] | None = None) -> str:
    """The marker a test that runs ``argv`` (with ``env``) most likely needs."""
    words = argv.split() if isinstance(argv, str) else [str(a) for a in argv]
    for needles, marker in _SUGGEST:
        if any(n in w for w in words for n in needles):
            return marker
    if env and int(str(env.get("WORLD_SIZE", "1")) or 1) > 1:
        return "ranks"
    return "subprocess"


def process_marker(item: pytest.Item) -> str | None:
    """The first of the four markers ``item`` carries, or None."""
    return next((m for m in PROCESS_MARKERS if item.get_closest_marker(m)), None)


def _describe(owner: object, name: str, args: tuple) -> tuple[str, str]:
    """(what started, suggested marker) for one call of a wrapped starter."""
    if name == "_execute_child":
        argv, env = args[0], args[6] if len(args) > 6 else None
        text = argv if isinstance(argv, str | bytes) else shlex.join(map(str, argv))
        return f"subprocess {str(text)[:160]}", suggest_marker(argv, env)
    if name == "start":
        return f"multiprocessing {type(owner).__name__}.start()", "ranks"
    if name == "system":
        return f"os.system({str(args[0])[:160]!r})", suggest_marker(str(args[0]))
    if name.startswith("posix_spawn"):
        return f"os.{name} {shlex.join(map(str, args[1]))[:160]}", suggest_marker(args[1])
    return f"{getattr(owner, '__name__', type(owner).__name__)}.{name}()", "subprocess"


def _message(item: pytest.Item, what: str, marker: str, via: str = "") -> str:
    return (f"{item.nodeid} started a process{via} without a marker that says so: {what}\n"
            f"Add @pytest.mark.{marker} to the test (or pytestmark = pytest.mark.{marker} for the whole file); "
            f"one of {', '.join(PROCESS_MARKERS)} (pyproject.toml: what each means). Unmarked tests run in "
            "`make check`'s parallel tier that starts no process (tests/process_guard.py).")


@contextmanager
def _guarded(item: pytest.Item) -> Iterator[list[str]]:
    """Wrap every starter while the block runs; yields the violations seen (also raised where they happen,
    but a thread's exception does not fail the test, so the caller checks the list afterwards)."""
    allowed = process_marker(item) is not None
    fixtures, setting_up = item.config.stash[_FIXTURES], item.config.stash[_SETTING_UP]
    violations: list[str] = []

    def wrap(owner: object, name: str, original: Callable) -> Callable:
        def starter(*args, **kwargs):
            # a method of a class (Popen, BaseProcess) gets its instance first
            this, rest = (args[0], args[1:]) if isinstance(owner, type) else (owner, args)
            what, marker = _describe(this, name, rest)
            if setting_up:
                fixtures.setdefault(id(setting_up[-1]), (what, marker))
            if not allowed:
                violations.append(_message(item, what, marker))
                pytest.fail(violations[-1], pytrace=False)
            return original(*args, **kwargs)
        starter.__wrapped__ = original
        starter.process_guard = True
        return starter

    saved = [(owner, name, getattr(owner, name)) for owner, name in STARTERS if hasattr(owner, name)]
    for owner, name, current in saved:
        # Call through to the real starter, never to another guard's wrapper: an outer session's (pytester)
        # or one a test's monkeypatch captured and put back at teardown, with another test's markers.
        while getattr(current, "process_guard", False):
            current = current.__wrapped__
        setattr(owner, name, wrap(owner, name, current))
    try:
        yield violations
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _process_fixture(item: pytest.Item) -> tuple[str, str, str] | None:
    """(name, what it started, suggested marker) of a fixture of ``item`` already seen starting a process (set
    up for an earlier test, so this test would start it when run alone or on another xdist worker)."""
    seen = item.config.stash[_FIXTURES]
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the test's fixture closure
    for name, defs in (getattr(info, "name2fixturedefs", None) or {}).items():
        if defs and id(defs[-1]) in seen:
            return (name, *seen[id(defs[-1])])
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_FIXTURES] = {}
    config.stash[_SETTING_UP] = []
    config.stash[_TIER_TIME] = {}


def tier_of(keywords: Mapping[str, object]) -> str:
    """The tier a test ran in, from its report's keywords (they carry its markers, also across xdist)."""
    return next((m for m in PROCESS_MARKERS if m in keywords), "slow" if "slow" in keywords else "no process")


@pytest.hookimpl(wrapper=True)
def pytest_report_teststatus(report, config):
    """Add each phase's duration to its tier (the controller sees every worker's reports here)."""
    if isinstance(report, pytest.TestReport):
        entry = config.stash[_TIER_TIME].setdefault(tier_of(report.keywords), [0.0, 0])
        entry[0] += report.duration
        entry[1] += report.when == "call"
    return (yield)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """Seconds per tier, beside --durations: CI time is a budget, and this says which tier spends it."""
    times = config.stash[_TIER_TIME]
    if times:
        parts = [f"{tier} {seconds:.1f} s ({n} tests)" for tier, (seconds, n) in sorted(times.items())]
        terminalreporter.write_line("test time by tier (setup + call + teardown): " + ", ".join(parts))


@pytest.hookimpl(tryfirst=True)  # before the -m deselection of _pytest.mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if process_marker(item) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    stack = request.config.stash[_SETTING_UP]
    stack.append(fixturedef)
    try:
        return (yield)
    finally:
        stack.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    if process_marker(item) is None and (found := _process_fixture(item)):
        name, what, marker = found
        pytest.fail(_message(item, what, marker, via=f" through its fixture {name!r}"), pytrace=False)
    with _guarded(item) as violations:
        result = yield
    if violations:
        pytest.fail(violations[0], pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _guarded(item) as violations:
        try:
            result = yield
        except BaseException:
            # The refusal is the cause: code under test that caught it (a poller thread logs and goes on)
            # fails the test later with an assertion that would hide it.
            if violations:
                pytest.fail(violations[0], pytrace=False)
            raise
    if violations:
        pytest.fail(violations[0], pytrace=False)
    return result
