"""Elastic restarts through torchrun's agent: a killed worker, and nodes that leave, lose no work."""

import random
import re
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO, child_env, free_port, run_npudist

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
FINAL = re.compile(r"^final step=(\d+) loss=([\d.]+) params_sha256=([0-9a-f]{64})$", re.MULTILINE)
STEP = re.compile(r"^step=(\d+) ", re.MULTILINE)
RESUMED = re.compile(r"^resumed from step=(\d+)", re.MULTILINE)


def _train_args(run_dir, steps, every):
    return ["examples/train_ddp.py", "--steps", str(steps), "--run-dir", str(run_dir), "--checkpoint-every",
            str(every), "--log-every", "1", "--every-rank-done"]


def _workers(parent: psutil.Process) -> list[psutil.Process]:
    return [p for p in parent.children(recursive=True) if "train_ddp.py" in " ".join(p.cmdline())]


def _run_until(proc: subprocess.Popen, pattern: re.Pattern, deadline: float) -> tuple[str, re.Match]:
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        if m := pattern.search(line):
            return seen, m
    raise AssertionError(f"never saw {pattern.pattern!r}; output so far:\n{seen[-3000:]}")


def _rank0_worker(parent: psutil.Process) -> psutil.Process:
    return next(p for p in _workers(parent) if p.environ().get("RANK") == "0")


def _wait_for_write_in_progress(run_dir, deadline: float):
    """The .tmp-step-N directory of a background checkpoint write, once one exists."""
    while time.monotonic() < deadline:
        found = sorted(run_dir.glob(".tmp-step-*"))
        if found:
            return found[0]
        time.sleep(0.01)
    raise AssertionError(f"no background checkpoint write seen in {run_dir}")


def test_sigkilled_writer_mid_background_write_resumes_from_the_previous_checkpoint_bitwise(tmp_path):
    steps, every = 60, 10
    reference = run_npudist(["launch", "--nproc-per-node", "2", *_train_args(tmp_path / "ref", steps, every)],
                            timeout=240)
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = FINAL.search(reference.stdout).groups()

    kill_at = random.Random(20261202).randint(12, 45)
    run_dir = tmp_path / "run"
    # Every background write sleeps 1 s between its files and its manifest: a slow disk to be killed on.
    env = child_env({"NPUDIST_TEST_CHECKPOINT_DELAY_S": "1.0"})
    proc = subprocess.Popen([sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "--max-restarts",
                             "2", *_train_args(run_dir, steps, every)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen, _ = _run_until(proc, re.compile(rf"^step={kill_at} "), time.monotonic() + 120)
        writing = _wait_for_write_in_progress(run_dir, time.monotonic() + 60)
        _rank0_worker(psutil.Process(proc.pid)).send_signal(signal.SIGKILL)  # rank 0 is the writer
        rest, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    output = seen + rest
    assert proc.returncode == 0, output[-3000:]
    unfinished = int(writing.name.rsplit("-", 1)[1])
    resumed = int(RESUMED.search(rest).group(1))
    assert resumed == unfinished - every  # the half-written checkpoint never became the newest good one
    reached = max(int(s) for s in STEP.findall(seen))
    assert reached - resumed <= 2 * every  # the write of one checkpoint overlaps the next interval
    assert "took over the lock of a job that is no longer running" in rest  # the dead rank 0's run dir lock
    assert FINAL.search(output).groups() == expected  # bitwise: same loss text and same parameter hash
    assert not list(run_dir.glob(".tmp-*"))


def test_a_second_job_on_a_live_run_directory_exits_at_once_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from npudist import checkpoint; "
                               "checkpoint.lock_run_dir(sys.argv[1]); print('held', flush=True); time.sleep(300)",
                               str(run_dir)], env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        second = run_npudist(["launch", "--nproc-per-node", "2", *_train_args(run_dir, 5, 5)], timeout=120)
        text = second.stdout + second.stderr
        assert second.returncode != 0
        assert f"is in use by another job (host {socket.gethostname()}, pid {holder.pid}, started " in text
        assert text.count("train_ddp.py: run directory") == 2  # both ranks stopped, each saying why
        assert "step=" not in second.stdout and not list(run_dir.glob("step-*"))
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # A stale lock (its holder dead) is taken over: tests/checkpoint/test_lock.py, and under torchrun in
    # the SIGKILL test above, where the restarted rank 0 takes over its killed predecessor's lock.


def _agent(port: int, nnodes: str, run_dir, steps: int, extra_conf: str = "", log=None,
           extra_args: tuple[str, ...] | list[str] = ()) -> subprocess.Popen:
    conf = "join_timeout=60,last_call_timeout=2,close_timeout=5" + extra_conf
    out = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115 - the child owns it
    return subprocess.Popen(
        [sys.executable, "-m", "npudist", "launch", "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend",
         "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "npudist-test", "--rdzv-conf", conf,
         "--max-restarts", "3", "--monitor-interval", "0.5", *_train_args(run_dir, steps, 5), *extra_args],
        cwd=REPO, env=child_env(), stdout=out, stderr=subprocess.STDOUT, text=True)


def test_two_agents_rendezvous_over_c10d_and_train_together(tmp_path):
    port = free_port()
    agents = [_agent(port, "2", tmp_path / "run", 20) for _ in range(2)]
    outputs = [a.communicate(timeout=240)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    joined = "\n".join(outputs)
    assert "world=2" in joined and FINAL.search(joined)
    assert joined.count("done steps=20") == 2  # one worker per agent, both finished


def _store_host(agents: list[subprocess.Popen], port: int) -> int:
    """Index of the agent that serves the c10d rendezvous store (the first to bind the endpoint)."""
    for i, agent in enumerate(agents):
        for proc in [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]:
            if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in proc.net_connections("tcp")):
                return i
    raise AssertionError(f"no agent listens on the rendezvous port {port}")


def _wait_for(pattern: str, logs: list, offsets: list[int], what: str, timeout: float = 120) -> None:
    """Until a line matching pattern appears in any log after its offset."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(re.search(pattern, log.read_text()[off:], re.MULTILINE) for log, off in zip(logs, offsets, strict=True)):
            return
        time.sleep(0.2)
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[off:][-2500:]}"
                      for log, off in zip(logs, offsets, strict=True))
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def test_elastic_job_survives_a_node_leaving_and_takes_it_back(tmp_path):
    port = free_port()
    steps = 600
    # A dead node is noticed after 2 s x 5 missed heartbeats. At 1 s x 2 a newcomer once found no live
    # participant on this busy 2-core machine (a starved heartbeat, most likely) and started its own job.
    conf = ",keep_alive_interval=2,keep_alive_max_attempt=5"
    slow = ["--slow-rank", "0", "--slow-ms", "20"]  # keeps the job running while nodes come and go
    logs = [tmp_path / f"agent{i}.log" for i in range(3)]
    agents = [_agent(port, "1:2", tmp_path / "run", steps, conf, log=log, extra_args=slow) for log in logs[:2]]
    try:
        _wait_for(r"^step=(1[5-9]|[2-9]\d) .*world=2", logs[:2], [0, 0], "two nodes training together")
        # The node that serves the rendezvous store must stay (torchrun's c10d rendezvous lives in it);
        # the other node leaves.
        survivor = _store_host(agents, port)
        victim = agents[1 - survivor]
        for p in [*psutil.Process(victim.pid).children(recursive=True), psutil.Process(victim.pid)]:
            p.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        left_at = len(logs[survivor].read_text())
        _wait_for(r"^step=\d+ .*world=1 ", [logs[survivor]], [left_at], "the survivor training alone")
        # A node comes back: the running agent sees it waiting and re-forms the world with it.
        agents.append(_agent(port, "1:2", tmp_path / "run", steps, conf, log=logs[2], extra_args=slow))
        back_at = [len(logs[survivor].read_text()), 0]
        _wait_for(r"^step=\d+ .*world=2 ", [logs[survivor], logs[2]], back_at, "the world growing back to 2")
        for a in (agents[survivor], agents[2]):
            a.wait(timeout=300)
    finally:
        for a in agents:
            a.kill()
    both = [logs[survivor].read_text(), logs[2].read_text()]
    assert [agents[survivor].returncode, agents[2].returncode] == [0, 0], "\n".join(o[-3000:] for o in both)
    assert both[1].count("done steps=") == 1  # the newcomer's worker trained to the end
    # Only rank 0 logs steps and it can be either node now; one final line, after the world was 2 again.
    finals = [FINAL.search(o) for o in both]
    assert sum(f is not None for f in finals) == 1 and f"final step={steps} " in "".join(both)
    assert "world=1" not in both[1], "the newcomer ran a job of its own instead of joining"


def test_a_rank_that_skips_a_collective_is_named_and_nothing_is_left_running(tmp_path):
    start = time.monotonic()
    done = run_npudist(["launch", "--nproc-per-node", "3", str(REPO / "tests/fault/skip_probe.py"), str(tmp_path)],
                       env=child_env({"NPUDIST_TIMEOUT": "4"}), timeout=300)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert elapsed < 200  # the 4 s collective timeout ended it, not rank 2's 600 s sleep (start-up may be slow)
    text = done.stdout + done.stderr
    assert "CollectiveHangError" in text and "all_reduce #5" in text
    assert "rank(s) 2 never reached it" in text and "rank 2: last all_reduce #4 (done" in text
    reports = sorted(tmp_path.glob("hang-rank*.json"))
    assert reports, text[-3000:]
    import json

    report = json.loads(reports[0].read_text())
    assert (report["op"], report["seq"], report["not_reached"]) == ("all_reduce", 5, [2])
    assert report["reached"] == [0, 1] and report["ranks"]["2"]["seq"] == 4
    time.sleep(1)
    leftover = [p for p in psutil.process_iter(["cmdline"]) if "skip_probe.py" in " ".join(p.info["cmdline"] or [])]
    assert leftover == []
