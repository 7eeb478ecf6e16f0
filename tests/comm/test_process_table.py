"""A pid is looked up only in the process table it came from: same kernel (boot id) and pid namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from npudist.comm.hang import process_table
from npudist.diagnosis.place import Place


@pytest.mark.parametrize(("status", "evidence"), [
    ("running", "alive"), ("sleeping", "alive"), ("disk-sleep", "alive"), ("idle", "alive"),
    ("stopped", "stopped"), ("tracing-stop", "stopped"), ("zombie", "gone"), ("dead", "gone"), (None, "gone"),
])
def test_a_process_status_is_evidence_of_one_kind(status, evidence):
    assert process_table.classify_status(status) == evidence


def test_the_identity_is_the_boot_id_and_the_pid_namespace(tmp_path):
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("6f2766fe-bec5\n")
    (tmp_path / "self/ns").mkdir(parents=True)
    (tmp_path / "self/ns/pid").write_text("")
    inode = os.stat(tmp_path / "self/ns/pid").st_ino
    assert process_table.identity(str(tmp_path)) == f"6f2766fe-bec5:{inode}"
    (tmp_path / "sys/kernel/random/boot_id").unlink()
    assert process_table.identity(str(tmp_path)) is None  # unknown: nothing is ever looked up


@pytest.mark.subprocess
def test_only_ranks_of_this_process_table_are_looked_up():
    here = process_table.identity()
    assert here is not None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        places = {0: Place(host="same-name", pid=child.pid, process_table=here),
                  1: Place(host="same-name", pid=child.pid, process_table="other-boot:123"),  # another container
                  2: Place(host="same-name", pid=2 ** 22 + 7, process_table=here),  # no such process here
                  3: Place(host="same-name", pid=child.pid)}  # said nothing of its table: not looked up
        assert process_table.local_processes(places, here) == {0: "alive", 2: "gone"}
        assert process_table.local_processes(places, None) == {}
    finally:
        child.kill()
        child.wait()


@pytest.mark.subprocess
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a pid namespace (CI runs as root)")
def test_a_rank_in_another_pid_namespace_with_the_same_host_name_is_never_called_gone():
    """`unshare --pid --uts`: the same kernel and host name as this process, but its own process table. Its pid
    (1 or 2 there) means nothing here; looked up by host name it would be 'gone' (or another process)."""
    code = ("import json, os, socket; from npudist.comm.hang.process_table import identity; "
            "print(json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), 'table': identity()}), flush=True); "
            "import time; time.sleep(20)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([p for p in sys.path if p])}
    child = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--uts", sys.executable, "-c", code],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        doc = json.loads(child.stdout.readline())
        here = process_table.identity()
        assert doc["table"] != here and doc["table"].split(":")[0] == here.split(":")[0]  # same kernel, own table
        assert doc["host"] == os.uname().nodename
        place = Place(host=doc["host"], pid=doc["pid"], process_table=doc["table"])
        assert process_table.local_processes({1: place}, here) == {}  # not looked up: never "gone"
    finally:
        child.kill()
        child.wait(timeout=10)
