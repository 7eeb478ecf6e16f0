"""HTTP front: request parsing (pure) and a served 2-rank ensemble with bad inputs and a failing member, behind
one collective per request and behind the fan-out front (a frozen member leaves degraded answers, then comes back)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from npudist.infer.http import BadRequest, parse_batch
from tests.conftest import REPO, child_env
from tests.httpserve.clients import Crowd


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "body is not JSON"),
    (b"[1, 2]", 'JSON object with an "inputs" list'),
    (b'{"inputs": []}', "non-empty list of rows"),
    (b'{"inputs": [[1, 2], [3]]}', "rows of 2 numbers; row 1 has 1 values"),
    (b'{"inputs": [[1, "a"]]}', "\"inputs\"[0][1] is 'a'"),
    (b'{"inputs": [[1, NaN]]}', "finite number"),
    (b'{"inputs": [[1, true]]}', "finite number"),
    (b'{"inputs": [1, 2]}', "row 0 has int"),
])
def test_parse_batch_rejects_with_the_reason(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=None) as info:
        parse_batch(body, 2, 16)
    assert message in str(info.value)


def test_parse_batch_limits_and_accepts() -> None:
    assert parse_batch(b'{"inputs": [[1, 2.5]]}', 2, 16).tolist() == [[1.0, 2.5]]
    assert parse_batch(b'{"inputs": [[1, 2, 3]]}', None, 16).shape == (1, 3)
    with pytest.raises(BadRequest, match="at most 2 a request"):
        parse_batch(b'{"inputs": [[1], [2], [3]]}', 1, 2)


SERVE_SCRIPT = textwrap.dedent("""
    import os
    import sys
    import torch
    from torch import nn
    import npudist
    from npudist.infer import EnsembleServer, TorchRunner
    from npudist.infer.http import serve

    class Member(nn.Module):
        def __init__(self, rank):
            super().__init__()
            self.rank = rank
        def forward(self, x):
            if self.rank == 1 and (x == 999).any():
                raise ValueError("rank 1 refuses 999")
            if self.rank == 0:
                return x.clone()                                    # logits = [x0, x1]
            return torch.stack([x[:, 0] + x[:, 1], torch.zeros(len(x))], dim=1)  # [x0 + x1, 0]

    ctx = npudist.init()
    try:
        open(f"{sys.argv[1]}.rank{ctx.rank}", "w").write(str(os.getpid()))
        server = EnsembleServer(TorchRunner(Member(ctx.rank), torch.device("cpu")), 2, input_features=2,
                                combine="mean_logits", max_batch=8)
        serve(server, "127.0.0.1", 0, allow_shutdown=True, idle_seconds=1.0,
              on_ready=lambda port: open(sys.argv[1], "w").write(str(port)),
              member_host=sys.argv[2] if len(sys.argv) > 2 else None, deadline_s=1.0)
        s = server.stats
        print(f"rank={ctx.rank} stopped requests={s.requests} errors={s.errors}", flush=True)
    finally:
        npudist.shutdown()
""")


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _start(tmp_path: Path, *script_args: str) -> tuple[subprocess.Popen, Path, str]:
    script = tmp_path / "serve.py"
    script.write_text(SERVE_SCRIPT)
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", str(script),
                             str(port_file), *script_args], env=child_env(), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (port_file.exists() and port_file.read_text()) and proc.poll() is None:
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("the service did not start")
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()
    return proc, port_file, f"http://127.0.0.1:{port_file.read_text()}"


def _stats(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/stats", timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.ranks
@pytest.mark.slow
def test_two_rank_service_answers_and_survives_bad_input(tmp_path: Path) -> None:
    proc, port_file, base = _start(tmp_path)
    try:
        # Hand-computed mean of rank 0 [x0, x1] and rank 1 [x0 + x1, 0]:
        # [1, 2] -> [2, 1] -> 0;  [0, 3] -> [1.5, 1.5] -> tie -> 0;  [-1, 1] -> [-0.5, 0.5] -> 1
        status, doc = _post(f"{base}/predict", b'{"inputs": [[1, 2], [0, 3], [-1, 1]]}')
        assert status == 200, doc
        assert doc["labels"] == [0, 0, 1]
        assert doc["scores"] == [[2.0, 1.0], [1.5, 1.5], [-0.5, 0.5]]
        assert doc["ranks"] == 2
        assert set(doc["latency_seconds"]) == {"distribute", "compute", "compute_mean_over_ranks",
                                               "aggregate", "total"}
        crowd = Crowd(int(port_file.read_text()), 6, how="body", pace=0.3)  # trickling clients hold nothing
        try:
            time.sleep(1.2)  # idle past idle_seconds: rank 0 pings the follower, which must keep waiting
            status, doc = _post(f"{base}/predict", b'{"inputs": [[1, 2]]}')
            assert (status, doc["labels"]) == (200, [0])
        finally:
            crowd.close()
        for body, code, text in [(b"{oops", 400, "not JSON"), (b'{"inputs": [[1, 2, 3]]}', 400, "rows of 2"),
                                 (b'{"inputs": [[1, 2]]', 400, "not JSON"),  # cut off
                                 (json.dumps({"inputs": [[0, 0]] * 9}).encode(), 400, "at most 8")]:
            status, doc = _post(f"{base}/predict", body)
            assert (status, text in doc["error"]) == (code, True), doc
        status, doc = _post(f"{base}/predict", b'{"inputs": [[999, 1]]}')
        assert status == 500 and "1 of 2 ensemble members failed" in doc["error"]
        status, doc = _post(f"{base}/nowhere", b"{}")
        assert status == 404
        status, doc = _post(f"{base}/predict", b'{"inputs": [[-1, 1]]}')
        assert (status, doc["labels"]) == (200, [1])
        stats = _stats(base)
        assert (stats["requests"], stats["errors"], stats["bad_requests"]) == (4, 1, 4)
        assert _post(f"{base}/shutdown", b"")[0] == 200
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "rank=1 stopped requests=4 errors=1" in out  # the follower served every request, then left
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the ranks it started, nothing else
            proc.communicate(timeout=30)


@pytest.mark.ranks
@pytest.mark.slow
def test_fanout_front_answers_without_a_frozen_member_and_takes_it_back(tmp_path: Path) -> None:
    proc, _, base = _start(tmp_path, "127.0.0.1")
    try:
        status, doc = _post(f"{base}/predict", b'{"inputs": [[1, 2], [0, 3], [-1, 1]]}')
        assert status == 200, doc
        # The same hand-computed mean as behind the collective: both members answered.
        assert (doc["labels"], doc["scores"], doc["ranks"], doc["degraded"]) == \
            ([0, 0, 1], [[2.0, 1.0], [1.5, 1.5], [-0.5, 0.5]], 2, False)
        status, doc = _post(f"{base}/predict", b'{"inputs": [[999, 1]]}')  # rank 1 fails: rank 0's logits alone
        assert (status, doc["scores"], doc["ranks"], doc["degraded"]) == (200, [[999.0, 1.0]], 1, True), doc
        assert "rank 1 on" in doc["missing"][0] and "rank 1 refuses 999" in doc["missing"][0]
        member = int((tmp_path / "port.rank1").read_text())
        os.kill(member, signal.SIGSTOP)  # a frozen board: its port accepts, nothing answers
        try:
            status, doc = _post(f"{base}/predict", b'{"inputs": [[1, 2]]}')
            assert (status, doc["scores"], doc["ranks"]) == (200, [[1.0, 2.0]], 1), doc
            assert doc["missing"][0].endswith("no answer within 1 s")
            assert _stats(base)["members_answering"] == 1
        finally:
            os.kill(member, signal.SIGCONT)
        deadline = time.monotonic() + 30  # skipped 2 s, then the idle probe (every 0.5 s) takes it back
        while _stats(base)["members_answering"] != 2:
            assert time.monotonic() < deadline, _stats(base)
            time.sleep(0.2)
        status, doc = _post(f"{base}/predict", b'{"inputs": [[1, 2]]}')
        assert (status, doc["scores"], doc["degraded"]) == (200, [[2.0, 1.0]], False), doc
        stats = _stats(base)
        assert (stats["requests"], stats["errors"], stats["degraded"], stats["members_expected"]) == (4, 0, 2, 2)
        assert _post(f"{base}/shutdown", b"")[0] == 200
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "rank=1 stopped requests=4 errors=0" in out  # it answered the late request once thawed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
