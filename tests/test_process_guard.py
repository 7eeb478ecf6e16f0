"""The test-tier guard (tests/process_guard.py): a test that starts a process without a marker that says so
fails, naming the marker; with the marker it passes. Inner test sessions run in this process (pytester's
in-process mode); where a marked inner test must start something, it starts a stand-in starter the guard
wraps like the real ones, so these tests start no process themselves and stay in `make check`'s tier."""

from __future__ import annotations

import re
import textwrap

import pytest

from tests.process_guard import suggest_marker

# The inner sessions load the guard as a plugin and add one stand-in starter to its table.
CONFTEST = """
import types

from tests import process_guard

STARTED = []
standin = types.SimpleNamespace(spawn=lambda *argv: STARTED.append(argv))
process_guard.STARTERS.append((standin, "spawn"))


def pytest_unconfigure(config):
    process_guard.STARTERS.remove((standin, "spawn"))
"""


@pytest.fixture(autouse=True)
def _only_the_guard(monkeypatch):
    """Inner sessions load no installed plugin: their start-up (hypothesis, xdist...) cost seconds each."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def _run(pytester: pytest.Pytester, tests: str, *args: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=textwrap.dedent(tests))
    pytester.makeini("[pytest]\nmarkers =\n    subprocess: x\n    ranks: x\n    cluster: x\n    e2e: x\n    slow: x\n")
    return pytester.runpytest_inprocess("-p", "tests.process_guard", "-p", "no:cacheprovider", *args)


def test_an_unmarked_test_that_starts_a_subprocess_fails_before_it_starts_naming_the_marker(pytester):
    result = _run(pytester, """
        import subprocess, sys

        def test_runs_a_tool(tmp_path):
            subprocess.run([sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"], timeout=30)
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_runs_a_tool started a process without a marker that says so: subprocess*",
                                 "Add @pytest.mark.subprocess to the test*"])
    assert not list(pytester.path.rglob("ran"))  # refused before the child ran


def test_every_way_to_start_a_process_is_refused_without_a_marker(pytester):
    result = _run(pytester, """
        import multiprocessing, os, sys

        def test_fork():
            os.fork()

        def test_system():
            os.system("true")

        def test_posix_spawn():
            os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], os.environ)

        def test_multiprocessing_spawn():
            multiprocessing.get_context("spawn").Process(target=print).start()

        def test_torchrun_like_argv():
            import subprocess
            subprocess.Popen(["torchrun", "--nproc-per-node", "2", "t.py"])
    """)
    result.assert_outcomes(failed=5)
    result.stdout.fnmatch_lines_random([
        "*test_fork started a process*: os.fork()", "*test_system started a process*: os.system('true')",
        "*test_posix_spawn started a process*: os.posix_spawn *",
        "*started a process*: multiprocessing SpawnProcess.start()",
        "*test_torchrun_like_argv started a process*: subprocess torchrun --nproc-per-node 2 t.py",
        "Add @pytest.mark.ranks to the test*"])


def test_a_marked_test_may_start_one_and_an_unmarked_one_may_not(pytester):
    result = _run(pytester, """
        import pytest
        from conftest import STARTED, standin

        @pytest.mark.subprocess
        def test_marked():
            standin.spawn("tool")
            assert STARTED == [("tool",)]

        class TestWholeFile:
            pytestmark = pytest.mark.e2e

            def test_class_marked(self):
                standin.spawn("job")

        def test_unmarked():
            standin.spawn("tool")
    """)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked started a process without a marker*: SimpleNamespace.spawn()*"])


def test_a_fixture_that_started_a_process_fails_the_unmarked_tests_that_use_it_later(pytester):
    result = _run(pytester, """
        import pytest
        from conftest import standin

        @pytest.fixture(scope="module")
        def job():
            standin.spawn("launch")
            return "done"

        @pytest.mark.e2e
        def test_first_starts_it(job):
            assert job == "done"

        def test_later_reuses_it(job):
            assert job == "done"
    """)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_later_reuses_it started a process through its fixture 'job' without*"])


def test_a_start_in_a_thread_still_fails_the_test(pytester):
    result = _run(pytester, """
        import threading
        from conftest import standin

        def test_starts_from_a_thread():
            worker = threading.Thread(target=standin.spawn, args=("tool",))
            worker.start()
            worker.join()
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_starts_from_a_thread started a process without a marker*"])


def test_the_process_markers_imply_slow_so_not_slow_is_the_tier_that_starts_none(pytester):
    result = _run(pytester, """
        import pytest
        from conftest import standin

        @pytest.mark.ranks
        def test_ranks():
            standin.spawn("x")

        @pytest.mark.slow
        def test_slow_in_process():
            pass

        def test_quick():
            pass
    """, "-m", "not slow", "-v")
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*test_quick PASSED*"])


def test_an_inner_session_leaves_the_starters_as_it_found_them(pytester):
    import os
    import subprocess

    before = (os.fork, subprocess.Popen._execute_child)  # this test's own guard, one level deep
    _run(pytester, "def test_nothing():\n    pass\n").assert_outcomes(passed=1)
    assert (os.fork, subprocess.Popen._execute_child) == before
    assert not hasattr(os.fork.__wrapped__, "__wrapped__")


def test_the_summary_adds_up_the_time_of_each_tier(pytester):
    result = _run(pytester, """
        import time
        import pytest

        @pytest.mark.ranks
        def test_ranks():
            time.sleep(0.3)

        @pytest.mark.subprocess
        @pytest.mark.parametrize("n", [1, 2])
        def test_tool(n):
            time.sleep(0.2)

        def test_quick():
            pass
    """)
    result.assert_outcomes(passed=4)
    line = [x for x in result.outlines if x.startswith("test time by tier")]
    assert len(line) == 1, result.outlines
    tiers = {tier: (float(s), int(n)) for tier, s, n in re.findall(r"([a-z ]+) ([\d.]+) s \((\d+) tests\)", line[0])}
    assert {tier.strip(", ") for tier in tiers} == {"no process", "ranks", "subprocess"}, line[0]
    seconds = {tier.strip(", "): value for tier, value in tiers.items()}
    assert seconds["ranks"][1] == 1 and 0.3 <= seconds["ranks"][0] < 5
    assert seconds["subprocess"][1] == 2 and 0.4 <= seconds["subprocess"][0] < 5  # both parameters, summed
    assert seconds["no process"][1] == 1 and seconds["no process"][0] < 0.3


def test_a_wrapper_left_behind_by_a_monkeypatch_never_judges_a_later_test(pytester):
    result = _run(pytester, """
        import pytest
        from conftest import standin

        def test_patches_a_starter(monkeypatch):
            monkeypatch.setattr(standin, "spawn", standin.spawn)  # undone at teardown: puts this test's wrapper back

        @pytest.mark.subprocess
        def test_marked_later():
            standin.spawn("tool")

        def test_unmarked_later():
            standin.spawn("tool")
    """)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked_later started a process without a marker*"])


@pytest.mark.parametrize(("argv", "env", "want"), [
    (["ip", "netns", "exec", "n1", "python"], None, "cluster"),
    (["python", "-m", "npudist", "launch", "--nproc-per-node", "2", "examples/train_ddp.py"], None, "e2e"),
    (["torchrun", "--nproc-per-node", "2", "t.py"], None, "ranks"),
    (["python", "probe.py"], {"WORLD_SIZE": "2", "RANK": "1"}, "ranks"),
    (["python", "-m", "npudist", "launch", "--help"], None, "subprocess"),
    ("promtool check rules r.yml", None, "subprocess"),
])
def test_the_suggested_marker_follows_what_was_started(argv, env, want):
    assert suggest_marker(argv, env) == want
