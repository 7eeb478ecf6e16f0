"""Multi-node jobs on a cluster of network namespaces (npudist.testing.cluster): the harness itself, a start
with no interface variable, the loopback refusal, node faults named as nodes (one while the others wait at
a checkpoint), and an elastic job that goes on alone through a partition and takes the node back when it
heals, without split brain; with in-memory peer snapshots a killed node costs at most one step.

Needs root and iproute2 (CI runs as root); elsewhere every test skips with the harness's reason.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from npudist.runtime.network import IFNAME_VARS
from npudist.testing.cluster import Cluster, ClusterUnavailable, unavailable
from npudist.testing.mttr import run_trial
from tests.conftest import REPO, child_env

REASON = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.cluster,
              pytest.mark.skipif(REASON is not None, reason=f"cluster harness: {REASON}")]
TRAIN = str(REPO / "examples" / "train_ddp.py")
PY = sys.executable


def _env() -> dict[str, str]:
    """This checkout's npudist, with no interface variable: launch has to find the network itself."""
    return {k: v for k, v in child_env().items() if k not in IFNAME_VARS}


def _wait(procs, timeout: float) -> list[int | None]:
    end = time.monotonic() + timeout
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):  # the caller asserts on the None
            p.wait(max(0.1, end - time.monotonic()))
    return [p.poll() for p in procs]


def _connect(c: Cluster, node, host: str, port: int) -> bool:
    code = f"import socket; socket.create_connection(({host!r}, {port}), timeout=2).close()"
    return c.run(node, [PY, "-c", code]).returncode == 0


def _eventually_connects(c: Cluster, node, host: str, port: int, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while not _connect(c, node, host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def test_nodes_have_their_own_hostname_and_address_faults_bite_and_nothing_is_left_behind(tmp_path):
    c = Cluster(2)
    with c:
        n0, n1 = c.nodes
        log = tmp_path / "hostname.log"
        assert c.spawn(n1, ["hostname"], log=log).wait(10) == 0
        assert log.read_text().strip() == "node1"
        server = c.spawn(n0, [PY, "-c", f"import socket,time; s=socket.create_server(({n0.address!r}, 29431)); "
                                        "time.sleep(60)"])
        assert _eventually_connects(c, n1, n0.address, 29431)
        assert not _connect(c, n0, n1.address, 29431)  # nothing listens there: a different host
        c.partition(n1)
        assert not _connect(c, n1, n0.address, 29431)
        c.heal(n1)  # the bridge port takes a moment to forward again
        assert _eventually_connects(c, n1, n0.address, 29431)
        c.slow(n1, "1mbit")
        assert "tbf" in c.run(n1, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        spawned = [server.pid, *c.pids(n0)]
    assert c.leftovers() == []
    assert not [p for p in spawned if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_failure_inside_the_cluster_still_removes_it():
    c = Cluster(1)
    with pytest.raises(RuntimeError, match="boom"), c:
        c.spawn(c.nodes[0], ["sleep", "60"])
        raise RuntimeError("boom")
    assert c.leftovers() == []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_cluster_a_killed_run_left_is_removed_and_a_used_subnet_is_not_taken(tmp_path):
    """A run SIGKILLed inside its cluster never closes it: its bridge kept its /24 and its node's processes ran
    on, so the next cluster on the same subnet shared a wire with them. The next cluster removes it first;
    and a /24 that an interface here already has is refused, a free one taken instead."""
    script = ("import sys, time\n"
              "from npudist.testing.cluster import Cluster\n"
              "c = Cluster(1).__enter__()\n"
              "c.spawn(c.nodes[0], ['sleep', '120'])\n"
              "print(c.tag, c.subnet, flush=True)\n"
              "time.sleep(120)\n")
    owner = subprocess.Popen([PY, "-c", script], env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        tag, _ = owner.stdout.readline().split()
    finally:
        owner.kill()
        owner.wait(10)
    left = Cluster(1)
    left.tag, left.bridge = tag, f"npdbr{tag}"
    left.nodes[0].netns, left.nodes[0].port = f"npd{tag}-n0", f"npd{tag}p0"
    stranded = left.pids(left.nodes[0])
    assert left.leftovers() and stranded  # what the killed run left: its bridge, veth, namespace and sleep
    with Cluster(1) as c:
        assert left.leftovers() == [] and not [p for p in stranded if _alive(p)]
        with pytest.raises(ClusterUnavailable, match=rf"subnet {c.subnet}\.0/24 is in use here \(npdbr"):
            Cluster(1, subnet=c.subnet).__enter__()
        with Cluster(1) as beside:
            assert beside.subnet != c.subnet
    assert c.leftovers() == [] and beside.leftovers() == []


def test_two_nodes_train_with_no_interface_variable_set(tmp_path):
    with Cluster(2) as c:
        procs = [c.launch(n, [TRAIN, "--steps", "4", "--log-every", "1"], env=_env(),
                          log=tmp_path / f"{n.hostname}.log") for n in c.nodes]
        codes = _wait(procs, 180)
    logs = {n.hostname: (tmp_path / f"{n.hostname}.log").read_text() for n in c.nodes}
    assert codes == [0, 0], logs["node0"][-3000:] + logs["node1"][-3000:]
    n0, n1 = (n.address for n in c.nodes)  # a free /24, taken when the cluster was made
    assert f"multi-node: eth0 ({n1}) routes to the master {n0}" in logs["node1"]
    assert "step=4 " in logs["node0"] and "world=4" in logs["node0"]


def test_two_nodes_with_one_host_name_and_their_own_pid_tables_never_call_a_live_rank_gone(tmp_path):
    """Boards flashed from one image, containers on one kernel: both nodes are "board" and each has its own
    pid namespace. Rank 1 (node 1) holds the GIL for 15 s inside a C call, so its watchdog thread cannot
    answer rank 0's probe; its pid means nothing in rank 0's process table, so the verdict must say it is not
    looked at (silent: aborted only after 60 s), never gone (aborted at once). The job runs to the end."""
    script = str(REPO / "tests" / "fault" / "any_caller.py")
    env = {**_env(), "NPUDIST_HANG_TIMEOUT": "4"}
    with Cluster(2, hostnames=("board", "board"), own_pids=True) as c:
        procs = [c.launch(n, [script, "raw", "--steps", "60", "--fault", "gil", "--fault-rank", "1",
                              "--fault-step", "20", "--fault-seconds", "15"], nproc=1, env=env,
                          launch_args=["--run-dir", str(tmp_path)], log=tmp_path / f"node{n.index}.log")
                 for n in c.nodes]
        codes = _wait(procs, 180)
    logs = [(tmp_path / f"node{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert all("DONE step=60" in log for log in logs)
    verdicts = [json.loads(p.read_text()) for p in tmp_path.glob("hang-attempt*.json")]
    assert verdicts and verdicts[0]["states"] == {"1": "silent"}, logs[0][-3000:]
    assert verdicts[0]["culprit_ranks"]["1"]["host"] == "board"
    assert "gone" not in logs[0] and "aborting" not in logs[0]


def test_a_rank_that_would_advertise_loopback_is_refused_before_the_collective(tmp_path):
    # Plain torchrun, as a user without npudist launch runs it: the node's hostname does not resolve, so
    # gloo would fall back to 127.0.0.1 and the peers would connect to themselves.
    with Cluster(2) as c:
        argv = lambda n: [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(n.index),  # noqa: E731
                          "--master-addr", c.nodes[0].address, "--master-port", "29512", "--nproc-per-node", "1",
                          TRAIN, "--steps", "3"]
        procs = [c.spawn(n, argv(n), env=_env(), log=tmp_path / f"{n.hostname}.log") for n in c.nodes]
        codes = _wait(procs, 120)
    text = (tmp_path / "node1.log").read_text()
    assert all(code not in (0, None) for code in codes), text[-3000:]
    assert "rank 1 of 2 (node 1) would advertise 127.0.0.1" in text
    assert "export GLOO_SOCKET_IFNAME=eth0" in text and f"eth0 ({c.nodes[1].address})" in text


def _node0_reports(run: Path) -> list[Path]:
    """node0's verdicts: a partitioned node1 writes its own into the shared directory too."""
    return sorted(r for r in run.glob("hang-*.json") if r.name not in ("hang-rank2.json", "hang-rank3.json"))


def _fault_named(tmp_path: Path, fault: str, at_checkpoint: bool) -> tuple[float, dict, str]:
    """Train 2 nodes x 2 ranks, apply ``fault`` to node1 after step 5, or with ``at_checkpoint`` while the
    other ranks wait for rank 0 in the checkpoint's control collective (a slow disk holds rank 0 there);
    seconds until a verdict, the verdict, and the node it names."""
    env, every = _env(), "100000"
    if at_checkpoint:
        env["NPUDIST_TEST_SYNC_CHECKPOINT_DELAY_S"], every = "8", "6"
    with Cluster(2) as c:
        procs = [c.launch(n, [TRAIN, "--steps", "100000", "--log-every", "1", "--no-telemetry",
                              "--run-dir", str(tmp_path), "--checkpoint-every", every, "--sync-checkpoints"],
                          env=env, log=tmp_path / f"{n.hostname}.log") for n in c.nodes]
        deadline = time.monotonic() + 180
        ready = (lambda: list(tmp_path.glob(".tmp-step-*"))) if at_checkpoint else \
            (lambda: "step=5 " in (tmp_path / "node0.log").read_text())
        while not ready() and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), (tmp_path / "node0.log").read_text()[-3000:]
            time.sleep(0.3)
        start = time.monotonic()
        getattr(c, fault)(c.nodes[1])
        while not _node0_reports(tmp_path) and time.monotonic() - start < 90:
            time.sleep(0.2)
        elapsed = time.monotonic() - start
        reports = _node0_reports(tmp_path)
        assert reports, (tmp_path / "node0.log").read_text()[-3000:]
        verdict = json.loads(reports[0].read_text())
        named = c.describe(verdict.get("culprits") or verdict["not_reached"], nproc=2)
    return elapsed, verdict, named


# A killed node while the others wait at a checkpoint (npudist's own control message, not a training
# collective); a partitioned one in the middle of training.
@pytest.mark.parametrize(("fault", "at_checkpoint"), [("kill_node", True), ("partition", False)])
def test_a_lost_node_is_named_within_30_s(tmp_path, fault, at_checkpoint):
    elapsed, verdict, named = _fault_named(tmp_path, fault, at_checkpoint)
    # Blamed: both ranks of node1, whether they died before or inside the call the others wait in.
    assert sorted(verdict.get("culprits") or verdict["not_reached"]) == [2, 3], verdict
    assert re.fullmatch(r"node1 \(10\.213\.\d+\.2, ranks 2-3\)", named), named
    assert elapsed < 30, f"{fault}: named after {elapsed:.1f} s"
    if at_checkpoint:
        assert verdict["op"].startswith("control "), verdict


_STEP = re.compile(r"^step=(\d+) .*\bworld=(\d+)", re.M)


def _until(what, within: float, every: float = 0.3):
    deadline = time.monotonic() + within
    while not (found := what()) and time.monotonic() < deadline:
        time.sleep(every)
    return found


def test_a_partitioned_node_heals_into_the_one_job_and_the_checkpoints_stay_whole(tmp_path):
    """--nnodes 1:2: node0 goes on alone from its last checkpoint while node1's cable is out; once it is
    back, node1 rejoins that job or stops, never trains as a second job, and every checkpoint verifies."""
    from npudist.checkpoint.layout import verify

    with Cluster(2) as c:
        logs = [tmp_path / f"{n.hostname}.log" for n in c.nodes]
        text = lambda i: logs[i].read_text() if logs[i].exists() else ""  # noqa: E731
        for n in c.nodes:
            c.launch(n, [TRAIN, "--steps", "100000", "--log-every", "1", "--no-telemetry", "--run-dir", str(tmp_path),
                         "--checkpoint-every", "5", "--sync-checkpoints"], elastic=True, env=_env(), log=logs[n.index])
        assert _until(lambda: any(int(m[1]) >= 8 for m in _STEP.finditer(text(0))), 180), text(0)[-3000:]
        cut = [len(text(0)), len(text(1))]
        c.partition(c.nodes[1])
        alone = _until(lambda: re.search(r"^resumed from step=(\d+)[\s\S]*?^step=\d+ .*\bworld=2\b",
                                         text(0)[cut[0]:], re.M), 150)
        assert alone, text(0)[-3000:]
        # The last step node0 finished before it resumed: steps go on between the harness's look and the cut.
        before = max(int(m[1]) for m in _STEP.finditer(text(0)[:cut[0] + alone.start()]))
        assert 0 <= before - int(alone[1]) <= 5, (before, alone[1])  # a checkpoint every 5 steps
        c.heal(c.nodes[1])
        healed = len(text(0))
        rejoined = _until(lambda: re.search(r"^step=\d+ .*\bworld=4\b", text(0)[healed:] + text(1)[cut[1]:], re.M)
                          or all(p.poll() is not None for p in c.nodes[1].procs[:1]), 90)
        after_partition = [text(0)[cut[0]:], text(1)[cut[1]:]]
    # One job: node1's ranks trained only inside the job of 4 (a step line there at world 2 would be a
    # second job's rank 0); node0 trained alone at world 2 or with node1 at world 4.
    assert {int(m[2]) for m in _STEP.finditer(after_partition[1])} <= {4}, after_partition[1][-3000:]
    assert {int(m[2]) for m in _STEP.finditer(after_partition[0])} <= {2, 4}, after_partition[0][-3000:]
    assert rejoined, "node1 neither rejoined nor stopped within 90 s of the heal:\n" + after_partition[1][-3000:]
    steps = sorted(tmp_path.glob("step-*"))
    assert steps, list(tmp_path.iterdir())
    for d in steps:
        _, problem = verify(d)
        assert problem is None, (d, problem)


def test_a_killed_node_costs_at_most_one_step_with_in_memory_snapshots(tmp_path):
    """--peer-snapshots 1 on 2 nodes x 2 ranks, checkpoints every 25 steps, node1 killed after step 30 (disk
    then holds step 25 until step 50: the kill lands a few steps after the harness sees step 30, more when steps
    are fast): node0 goes on alone at world 2 from its own node's copy of rank 0's state (what a disk resume
    would load on every rank), at most one step back, instead of from the older checkpoint."""
    t = run_trial("kill_node", TRAIN, env=_env(), prometheus=False, keep=str(tmp_path), warm_steps=30,
                  checkpoint_every=25, peer_snapshots=1, observe_s=150)
    log = (tmp_path / "node0.log").read_text()
    assert t.source == "local-memory", (t, log[-3000:])
    assert t.world_after == 2 and t.steps_lost is not None and 0 <= t.steps_lost <= 1, t
    said = re.search(r"^resume: source=local-memory step=(\d+) .*rank 0's copy at world 4, now 2; sha256 verified; "
                     r"newest disk checkpoint: (\d+)\)", log, re.M)
    assert said and int(said[1]) > int(said[2]), log[-3000:]


_FINAL = re.compile(r"^final step=(\d+) loss=([\d.]+) params_sha256=([0-9a-f]{64})$", re.M)
_SOURCE = re.compile(r"^resume: source=(\S+) step=(\d+) ", re.M)


def test_a_rank_killed_on_another_node_resumes_from_memory_exactly_as_from_disk(tmp_path):
    """2 nodes x 2 ranks: rank 3 (node1) is killed at step 9; torchrun restarts the job at world 4. With
    --peer-snapshots 4 every rank resumes from its copy of step 8 in its partner's node (rank 3's in node0's
    holder); a second job resumes from its disk checkpoint of step 8. Both end bitwise equal, and at the loss
    of a job never killed. Not bitwise that job's parameters: at world 4 DDP's first iteration after any
    restart reduces in its initial bucket layout, the unbroken job in the rebuilt one, and a sum of four
    floats rounds by its order (at world 2 it does not: tests/checkpoint/test_peer_restart.py)."""
    job = [TRAIN, "--steps", "14", "--log-every", "1", "--no-telemetry", "--d-model", "32", "--layers", "1",
           "--global-batch-size", "8", "--fault", "sigkill", "--fault-rank", "3"]
    # --fault adds a loss average to every step, so every job has it; the reference's never fires.
    runs = {"ref": (["--fault-step", "1000", "--checkpoint-every", "100"], []),
            "memory": (["--fault-step", "9", "--checkpoint-every", "100"], ["--peer-snapshots", "4"]),
            "disk": (["--fault-step", "9", "--checkpoint-every", "4", "--sync-checkpoints"], [])}
    # Only --peer-snapshots and the job's secret (the same on both nodes, as a scheduler sets it): each
    # node's holder binds the address that routes to the master by itself (issue 46).
    env = {**_env(), "NPUDIST_PEER_SECRET": secrets.token_hex(32)}
    with Cluster(2) as c:
        procs = []
        for port, (name, (args, launch)) in enumerate(runs.items(), 29611):  # at once, each its own rendezvous
            for n in c.nodes:
                procs.append(c.launch(n, [*job, *args, "--run-dir", str(tmp_path / name)], port=port, elastic=True,
                                      env=env, launch_args=launch, log=tmp_path / f"{name}-{n.hostname}.log"))
        codes = _wait(procs, 300)
    logs = {name: (tmp_path / f"{name}-node0.log").read_text() for name in runs}
    assert codes == [0] * 6, {k: v[-2000:] for k, v in logs.items()}
    assert f"holder serves {c.nodes[0].address}:" in logs["memory"] and "unreachable" not in logs["memory"]
    for name, source in (("memory", "peer-memory"), ("disk", "disk")):
        assert "FAULT sigkill rank=3 step=9 " in (tmp_path / f"{name}-node1.log").read_text()
        assert _SOURCE.search(logs[name]).groups() == (source, "8"), logs[name][-3000:]  # 1 step lost
        assert re.search(r"^step=\d+ .*\bworld=4\b", logs[name].split("resume: source=")[-1], re.M)
    final = {name: _FINAL.search(text).groups() for name, text in logs.items()}
    assert final["memory"] == final["disk"], final  # step, loss and params_sha256
    assert final["memory"][:2] == final["ref"][:2], final


EDGE = str(REPO / "examples" / "edge_ensemble.py")


def _predict(url: str, body: bytes, timeout: float = 15.0) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_edge_front_keeps_answering_from_three_boards_when_one_is_lost(tmp_path):
    """The seed's edge cluster: 4 boards (one namespace each, 1 rank, gloo over their own addresses) serve the
    cooperative ensemble through rank 0's fan-out front. A client streams one request after another. Board 2's
    cable is pulled mid-stream, then plugged in again; later board 3 dies. Every request is still answered:
    degraded while a board is out, from the other three, naming it; the healed board is taken back."""
    x = json.dumps({"inputs": [[0.3, -1.2, 0.5, 2.0, -0.7, 1.1, 0.0, -2.2]]}).encode()
    port_file = tmp_path / "port"
    with Cluster(4) as c:
        n0 = c.nodes[0]
        for n in c.nodes:
            c.launch(n, [EDGE, "--steps", "40", "--test-samples", "200", "--serve", "--host", n0.address,
                         "--port", "0", "--port-file", str(port_file), "--member-host", "auto", "--deadline", "2"],
                     nproc=1, env=_env(), launch_args=["--metrics-port", "9471"], log=tmp_path / f"{n.hostname}.log")
        started = _until(lambda: port_file.exists() and port_file.read_text(), 240, every=0.5)
        assert started, (tmp_path / "node0.log").read_text()[-3000:]
        url = f"http://{n0.address}:{port_file.read_text()}/predict"
        answers: list[tuple[float, int, dict]] = []

        def stream(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                answers.append((time.monotonic(), *_predict(url, x)))
                time.sleep(0.1)

        def metrics() -> str:
            return c.run(n0, [PY, "-c", "import urllib.request; print(urllib.request.urlopen("
                                        "'http://127.0.0.1:9471/metrics', timeout=10).read().decode())"]).stdout

        stream(3)
        marks = {"partition": time.monotonic()}
        c.partition(c.nodes[2])
        stream(8)
        cut_off = metrics()
        c.heal(c.nodes[2])
        healed = _until(lambda: _predict(url, x)[1].get("ranks") == 4, 60, every=0.5)
        marks["healed"] = time.monotonic()
        stream(2)
        marks["kill_node"] = time.monotonic()
        c.kill_node(c.nodes[3])
        stream(6)
        killed = metrics()
    assert healed, "board 2 was not taken back within 60 s of the heal"
    assert [s for _, s, _ in answers] == [200] * len(answers), [d for _, s, d in answers if s != 200][:3]
    # past one deadline after each fault every answer knows; the window after the heal has all four again
    for start, end, ranks, lost in [(0, marks["partition"], 4, None),
                                    (marks["partition"] + 2.5, marks["healed"], 3, c.nodes[2]),
                                    (marks["healed"], marks["kill_node"], 4, None),
                                    (marks["kill_node"] + 2.5, math.inf, 3, c.nodes[3])]:
        window = [d for t, _, d in answers if start < t < end]
        assert window and all((d["ranks"], d["degraded"]) == (ranks, lost is not None) for d in window), window[:2]
        if lost is not None:
            name = f"rank {lost.index} on {lost.hostname} ({lost.address}:"
            assert all(m.startswith(name) for d in window for m in d["missing"]), window[-1]
    # A degraded answer is the mean of the other three: 4 x (all four) - 3 x (the three) is board 3's own
    # probabilities, a distribution over the classes.
    full = [d for t, _, d in answers if marks["healed"] < t < marks["kill_node"]][-1]["scores"][0]
    board3 = [4 * a - 3 * b for a, b in zip(full, answers[-1][2]["scores"][0], strict=True)]
    assert min(board3) > -1e-4 and abs(sum(board3) - 1) < 1e-4, board3
    for text in (cut_off, killed):
        assert re.search(r"^npudist_edge_members_answering\{[^}]*\} 3\.0$", text, re.M), text[-2000:]
    degraded = re.search(r"^npudist_edge_degraded_answers_total\{[^}]*\} (\d+)\.0$", killed, re.M)
    assert degraded and int(degraded[1]) >= sum(1 for _, _, d in answers if d["degraded"]), killed[-2000:]
