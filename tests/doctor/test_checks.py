"""Each doctor check against a fabricated host: variables, fake binaries on PATH, temporary file trees."""

import json
import os
import re
import socket
import stat
import sys
from pathlib import Path

import pytest

from npudist.doctor import (
    FAIL,
    OK,
    SKIP,
    WARN,
    CheckResult,
    Host,
    as_document,
    ascend,
    checks,
    exit_code,
    host_limits,
    network,
    processes,
    run_checks,
)
from tests.conftest import FAKES, child_env, fakes_path, run_npudist


def _host(**kw) -> Host:
    kw.setdefault("env", {"PATH": ""})
    return Host(**kw)


def _by_name(results):
    return {r.name: r for r in (results if isinstance(results, list) else [results])}


def _script(folder: Path, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_shm_below_one_gib_warns_with_the_container_fix(tmp_path):
    (tmp_path / "dev/shm").mkdir(parents=True)
    small = host_limits.shm(_host(root=tmp_path, fs_size=lambda p: 64 << 20))
    assert small.status == WARN and "0.06 GiB" in small.finding and "--shm-size" in small.fix
    big = host_limits.shm(_host(root=tmp_path, fs_size=lambda p: 8 << 30))
    assert big.status == OK
    assert host_limits.shm(_host(root=tmp_path / "nothing")).status == SKIP


def test_open_files_limit():
    low = host_limits.open_files(_host(nofile=lambda: (1024, 4096)))
    assert low.status == WARN and "1024" in low.finding and low.fix.startswith("ulimit -n 4096")
    assert "hard limit is 4096" in low.fix  # 4096 is not enough either: say how to raise the hard limit
    assert host_limits.open_files(_host(nofile=lambda: (1048576, 1048576))).status == OK
    roomy = host_limits.open_files(_host(nofile=lambda: (1024, 1048576)))
    assert roomy.fix.startswith("ulimit -n 65536")


def test_open_files_at_the_hard_limit_names_the_hard_limit_not_a_useless_ulimit():
    stuck = host_limits.open_files(_host(nofile=lambda: (20000, 20000)))
    assert stuck.status == WARN and not stuck.fix.startswith("ulimit -n 20000")
    assert "hard limit is 20000" in stuck.fix and "limits.conf" in stuck.fix and "--ulimit nofile=" in stuck.fix


@pytest.mark.subprocess
def test_doctor_in_a_pipe_prints_compact_lines_and_a_summary():
    res = run_npudist(["doctor"], timeout=180)
    lines = res.stdout.splitlines()
    lines = lines[:lines.index("# environment (paste into a shell to reproduce):")]  # the block follows the checks
    assert lines[0].startswith("npudist doctor (")
    assert re.fullmatch(r"\d+ ok, \d+ warn, \d+ fail, \d+ skip", lines[-1])
    assert not any(ch in res.stdout for ch in "┃│┏")  # no table borders to break on an 80-column pipe
    checked = [line for line in lines[1:-1] if not line.startswith(" ")]
    assert all(line.split()[0] in ("ok", "warn", "fail", "skip") for line in checked)


def test_master_addr_unresolvable_fails_and_busy_port_warns():
    def no_dns(name):
        raise socket.gaierror(-2, "Name or service not known")

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        got = _by_name(network.master_addr(_host(env={"MASTER_ADDR": "node-zero", "MASTER_PORT": str(port)},
                                                resolve=no_dns)))
    assert got["master-addr"].status == FAIL and "node-zero does not resolve" in got["master-addr"].finding
    assert got["master-port"].status == WARN and f"MASTER_PORT={port} is in use" in got["master-port"].finding
    ok = _by_name(network.master_addr(_host(env={"MASTER_ADDR": "h", "MASTER_PORT": "http"},
                                           resolve=lambda n: ["10.0.0.7"])))
    assert ok["master-addr"].status == OK and "10.0.0.7" in ok["master-addr"].finding
    assert ok["master-port"].status == FAIL


IFACES = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.5"], "eth1": ["10.0.1.5"], "ib0": ["192.168.9.9"]}


@pytest.mark.parametrize(
    ("var", "value", "status", "text"),
    [
        ("HCCL_IF_IP", "10.0.0.5", OK, "is on eth0"),
        ("HCCL_IF_IP", "10.0.0.99", FAIL, "not an address of this host"),
        ("NCCL_SOCKET_IFNAME", "eth", OK, "selects eth0, eth1"),  # NCCL matches prefixes
        ("NCCL_SOCKET_IFNAME", "=eth", FAIL, "matches no interface"),  # '=' asks for the exact name
        ("NCCL_SOCKET_IFNAME", "^lo,eth", OK, "selects ib0"),  # '^' excludes
        ("GLOO_SOCKET_IFNAME", "ib0", OK, "selects ib0"),
        ("GLOO_SOCKET_IFNAME", "eth", FAIL, "matches no interface"),  # gloo takes exact names
    ],
)
def test_network_interface_variables(var, value, status, text):
    got = _by_name(network.network_interfaces(_host(env={var: value}, interfaces=lambda: IFACES)))[var]
    assert got.status == status and text in got.finding


@pytest.mark.parametrize(
    ("value", "status", "text"),
    [(None, OK, "default 120 s"), ("600", OK, "=600 s"), ("60", FAIL, "outside [120, 7200]"),
     ("2m", FAIL, "not an integer")],
)
def test_hccl_connect_timeout(value, status, text):
    env = {"ASCEND_HOME_PATH": "/usr/local/Ascend/ascend-toolkit/latest"}
    env |= {} if value is None else {"HCCL_CONNECT_TIMEOUT": value}
    got = _by_name(ascend.hccl_timeouts(_host(env=env)))["HCCL_CONNECT_TIMEOUT"]
    assert got.status == status and text in got.finding


def test_hccl_settings_are_not_applicable_without_an_npu():
    got = _by_name(ascend.hccl_timeouts(_host(env={"PATH": ""})))
    assert {r.status for r in got.values()} == {SKIP} and "n/a: no NPU" in got["HCCL_EXEC_TIMEOUT"].finding
    set_anyway = _by_name(ascend.hccl_timeouts(_host(env={"HCCL_CONNECT_TIMEOUT": "60"})))["HCCL_CONNECT_TIMEOUT"]
    assert set_anyway.status == FAIL  # a value that is set is still checked


def _cann_tree(tmp_path: Path, with_lib: bool) -> dict[str, str]:
    home = tmp_path / "Ascend/ascend-toolkit/latest"
    (home / "x86_64-linux").mkdir(parents=True)
    (home / "x86_64-linux/ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.0.RC1\ninnerversion=V100R001C17B214\narch=x86_64\n")
    lib = home / "lib64"
    lib.mkdir()
    if with_lib:
        (lib / "libascendcl.so").write_bytes(b"")
    return {"ASCEND_HOME_PATH": str(home), "LD_LIBRARY_PATH": f"/usr/lib:{lib}"}


def test_ascend_env_reads_the_toolkit_version(tmp_path):
    got = ascend.ascend_env(_host(env=_cann_tree(tmp_path, with_lib=True)))
    assert got.status == OK and "CANN 8.0.RC1" in got.finding


def test_ascend_env_without_runtime_libraries_fails(tmp_path):
    got = ascend.ascend_env(_host(env=_cann_tree(tmp_path, with_lib=False)))
    assert got.status == FAIL and "libascendcl.so" in got.finding and "set_env.sh" in got.fix


def test_ascend_env_pointing_nowhere_fails(tmp_path):
    got = ascend.ascend_env(_host(env={"ASCEND_TOOLKIT_HOME": str(tmp_path / "gone")}))
    assert got.status == FAIL and "does not exist" in got.finding


def test_toolkit_version_formats():
    assert ascend.parse_toolkit_version("Version=7.0.0.5.242\n") == "7.0.0.5.242"
    assert ascend.parse_toolkit_version("runtime_running_version=[7.0.0:7.0]\nversion=[6.3.RC2:6.3]") == "6.3.RC2"
    assert ascend.parse_toolkit_version("nothing here") is None


@pytest.mark.subprocess
def test_vendor_tools_and_processes_from_a_fake_nvidia_smi(tmp_path):
    # The query format nvidia-smi documents for --query-compute-apps with csv,noheader.
    _script(tmp_path / "bin", "nvidia-smi", "print('4242, python3\\n777, /usr/bin/vllm')")
    host = _host(env={"PATH": str(tmp_path / "bin")})
    tools = _by_name(checks.vendor_tools(host))
    assert tools["tool:nvidia-smi"].status == OK and str(tmp_path / "bin") in tools["tool:nvidia-smi"].finding
    assert tools["tool:npu-smi"].status == SKIP
    procs = _by_name(processes.device_processes(host))["processes:nvidia-smi"]
    assert procs.status == WARN and "4242 (python3)" in procs.finding and "777 (/usr/bin/vllm)" in procs.finding


@pytest.mark.subprocess
def test_a_vendor_tool_that_fails_is_a_warning_not_a_crash(tmp_path):
    _script(tmp_path / "bin", "nvidia-smi", "import sys; print('NVIDIA-SMI has failed', file=sys.stderr); sys.exit(9)")
    procs = _by_name(processes.device_processes(_host(env={"PATH": str(tmp_path / "bin")})))["processes:nvidia-smi"]
    assert procs.status == WARN and "exited 9" in procs.finding


def test_a_crashing_check_becomes_a_failed_result(monkeypatch):
    def boom(host):
        raise KeyError("surprise")

    monkeypatch.setattr(checks, "CHECKS", [("boom", boom)])
    import npudist.doctor as doc

    monkeypatch.setattr(doc, "CHECKS", [("boom", boom)])
    results = run_checks(_host())
    assert [(r.name, r.status) for r in results] == [("boom", FAIL)] and "KeyError" in results[0].finding
    assert exit_code(results) == 1 and as_document(results)["summary"]["fail"] == 1


ISSUE_CHECKS = {"settings", "python", "torch",
                "accelerator:npu", "accelerator:cuda", "accelerator:mlu", "accelerator:rknpu",
                "accelerator:cpu", "tool:npu-smi", "tool:nvidia-smi", "tool:cnmon", "ascend-env", "backends",
                "shm", "open-files", "master-addr", "master-port", "torch-npu-version", "network-interfaces",
                "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "processes:npu-smi", "processes:nvidia-smi",
                "comm-constraints", "flight-recorder:nccl", "flight-recorder:hccl"}


@pytest.mark.subprocess
def test_doctor_json_document_names_every_check():
    done = run_npudist(["doctor", "--json"])
    doc = json.loads(done.stdout)
    assert set(doc) == {"npudist", "checks", "summary", "exit_code"}
    names = {c["name"] for c in doc["checks"]}
    assert names >= ISSUE_CHECKS, ISSUE_CHECKS - names
    for c in doc["checks"]:
        assert set(c) == {"name", "status", "finding", "fix"} and c["status"] in ("ok", "warn", "fail", "skip")
        assert c["finding"]
    assert sum(doc["summary"].values()) == len(doc["checks"])
    assert done.returncode == doc["exit_code"] == (1 if doc["summary"]["fail"] else 0)


@pytest.mark.subprocess
def test_doctor_fails_on_a_broken_torch_npu():
    env = child_env(pythonpath=[FAKES / "vendors_broken"])
    done = run_npudist(["doctor", "--json"], env=env)
    doc = json.loads(done.stdout)
    npu = next(c for c in doc["checks"] if c["name"] == "accelerator:npu")
    assert npu["status"] == "fail" and "libhccl.so" in npu["finding"]
    assert done.returncode == 1


@pytest.mark.subprocess
def test_doctor_flags_torch_npu_built_for_another_torch():
    env = child_env({"PATH": os.environ.get("PATH", "")}, pythonpath=[FAKES / "vendors"])
    doc = json.loads(run_npudist(["doctor", "--json"], env=env).stdout)
    by = {c["name"]: c for c in doc["checks"]}
    assert by["accelerator:npu"]["status"] == "ok"
    # the fake reports torch_npu 2.1.0.post3, the torch here is 2.13: the 'undefined symbol' trap
    assert by["torch-npu-version"]["status"] == "fail" and "2.1.0.post3" in by["torch-npu-version"]["finding"]
    assert by["ascend-env"]["status"] == "fail"  # torch_npu present, CANN environment not sourced
    assert by["tool:npu-smi"]["status"] == "warn"  # device available, its tool missing


@pytest.fixture
def fakes_first(monkeypatch):
    """The fake npu-smi inherits this process's PATH: its `python3` must be the tests' interpreter."""
    monkeypatch.setenv("PATH", fakes_path())


def _fake_npu_smi_host(recording: str, **env) -> Host:
    return _host(env={"PATH": str(FAKES / "bin"), "NPUDIST_FAKE_NPU_SMI_FILE": str(FAKES / "npu-smi" / recording),
                      **env})


@pytest.mark.subprocess
def test_processes_holding_npus_are_named_from_the_npu_smi_table(monkeypatch, fakes_first):
    # The fake npu-smi reads its mode from the process environment it inherits.
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_FILE", str(FAKES / "npu-smi/910b2c-23.0.2.1-with-processes.txt"))
    got = _by_name(processes.device_processes(_fake_npu_smi_host("910b2c-23.0.2.1-with-processes.txt")))
    assert got["processes:npu-smi"].status == WARN
    assert "124528 (python3.8)" in got["processes:npu-smi"].finding  # row "| 0  0 | 124528 | python3.8 |"


@pytest.mark.subprocess
def test_no_process_on_the_npus_is_ok(monkeypatch, fakes_first):
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_FILE", str(FAKES / "npu-smi/310-23.0.0-no-processes.txt"))
    got = _by_name(processes.device_processes(_fake_npu_smi_host("310-23.0.0-no-processes.txt")))
    assert got["processes:npu-smi"].status == OK


@pytest.mark.subprocess
def test_npu_smi_printing_garbage_is_a_warning(monkeypatch, fakes_first):
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_MODE", "garbage")
    got = _by_name(processes.device_processes(_fake_npu_smi_host("310-23.0.0-no-processes.txt")))
    assert got["processes:npu-smi"].status == WARN and "could not read npu-smi" in got["processes:npu-smi"].finding


@pytest.mark.subprocess
def test_flight_recorder_on_an_npu_host_without_tracing_warns_with_the_variables():
    env = child_env(pythonpath=[FAKES / "vendors"])
    by = {c["name"]: c for c in json.loads(run_npudist(["doctor", "--json"], env=env).stdout)["checks"]}
    assert by["flight-recorder:hccl"]["status"] == "warn"
    assert "TORCH_HCCL_TRACE_BUFFER_SIZE=2000" in by["flight-recorder:hccl"]["fix"]
    assert by["flight-recorder:nccl"]["status"] == "skip"  # no CUDA device on this machine
    env["TORCH_HCCL_TRACE_BUFFER_SIZE"] = "4000"
    by = {c["name"]: c for c in json.loads(run_npudist(["doctor", "--json"], env=env).stdout)["checks"]}
    assert by["flight-recorder:hccl"]["status"] == "ok" and "TORCH_HCCL_DUMP_ON_TIMEOUT" in by[
        "flight-recorder:hccl"]["finding"]


def test_comm_constraints_show_the_active_profile():
    strict = checks.comm_constraints(_host(env={"NPUDIST_COMM_PROFILE": "hccl-strict"}))
    assert strict.status == OK and "name: hccl-strict" in strict.finding
    assert "element_multiple: 128" in strict.finding and "alignment_bytes: 128" in strict.finding
    assert "forced by NPUDIST_COMM_PROFILE" in strict.finding
    plain = checks.comm_constraints(_host(env={}))
    assert "name: gloo" in plain.finding  # the CPU accelerator's backend
    bad = checks.comm_constraints(_host(env={"NPUDIST_COMM_PROFILE": "nccl-fast"}))
    assert bad.status == FAIL and "hccl-strict" in bad.fix


@pytest.mark.subprocess
def test_a_malformed_npudist_variable_is_named_once_not_reported_as_a_bug():
    done = run_npudist(["doctor", "--json"], env=child_env({"NPUDIST_TIMEOUT": "soon"}))
    by = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert by["settings"]["status"] == "fail" and "NPUDIST_TIMEOUT='soon'" in by["settings"]["finding"]
    assert not [c for c in by.values() if "bug" in c["fix"]]
    assert done.returncode == 1


@pytest.mark.subprocess
def test_environment_block_recreates_the_job_variables_in_a_shell():
    """The block is for pasting: run through bash it must give back every value exactly, quotes and spaces
    included, and list nothing npudist does not read."""
    import subprocess

    from npudist.doctor.result import environment_block

    env = {"NPUDIST_TIMEOUT": "30", "HCCL_IF_IP": "10.0.0.1", "MASTER_ADDR": "node 1; rm -rf /",
           "NCCL_DEBUG": "it's", "CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/root", "AWS_SECRET": "x"}
    block = environment_block(env)
    assert block[0].startswith("# environment")
    assert [line.split("=", 1)[0] for line in block[1:]] == [
        "export CUDA_VISIBLE_DEVICES", "export HCCL_IF_IP", "export MASTER_ADDR", "export NCCL_DEBUG",
        "export NPUDIST_TIMEOUT"]
    script = "\n".join(block) + '\nprintf "%s\\n%s\\n" "$MASTER_ADDR" "$NCCL_DEBUG"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10, env={}).stdout
    assert out.splitlines() == ["node 1; rm -rf /", "it's"]
    assert environment_block({"HOME": "/root"})[1].startswith("# (none")


@pytest.mark.subprocess
@pytest.mark.parametrize("name", ["NPUDIST_$(touch {p})", "NCCL_`touch {p}`", "HCCL_X\ntouch {p}",
                                  "NPUDIST_A;touch {p}"])
def test_a_variable_name_that_is_not_a_shell_name_is_counted_not_printed(tmp_path, name):
    """Third audit: the names were printed bare, so pasting the block ran `$(...)` from a planted name."""
    import subprocess

    from npudist.doctor.result import environment_block

    witness = tmp_path / "ran"
    name = name.format(p=witness)
    block = environment_block({name: "1", "NPUDIST_TIMEOUT": "30"})
    assert block[1] == "export NPUDIST_TIMEOUT=30"
    assert block[2].startswith("# 1 variable(s) left out") and "touch" not in "\n".join(block)
    subprocess.run(["bash", "-c", "\n".join(block)], capture_output=True, timeout=10, env={}, check=True)
    assert not witness.exists()


@pytest.mark.subprocess
def test_doctor_in_a_pipe_ends_with_the_environment_block():
    r = run_npudist(["doctor", "--compact"], env=child_env({"NPUDIST_TIMEOUT": "45", "HCCL_EXEC_TIMEOUT": "900"}))
    lines = r.stdout.splitlines()
    start = lines.index("# environment (paste into a shell to reproduce):")
    assert "export NPUDIST_TIMEOUT=45" in lines[start:] and "export HCCL_EXEC_TIMEOUT=900" in lines[start:]
    assert any(" ok, " in line for line in lines[:start])  # the summary line comes before it


def test_the_lines_fold_the_skips_and_cut_long_findings_that_all_and_json_keep():
    from npudist.doctor.result import FINDING_CHARS, compact

    results = [CheckResult("torch", OK, "torch 2.13"), CheckResult("tool:npu-smi", SKIP, "npu-smi not on PATH"),
               CheckResult("comm-constraints", OK, "name: gloo; " + "reduce sum: bf16, " * 40),
               CheckResult("ascend-nics", SKIP, "not an Ascend host")]
    lines = compact(results, "t")
    assert lines[1].startswith("ok    torch") and not any("npu-smi not on PATH" in line for line in lines)
    assert "skip  2 not applicable here: tool:npu-smi, ascend-nics (--all says why)" in lines
    (row,) = [line for line in lines if "comm-constraints" in line]
    assert row.endswith("... (--json: all of it)") and len(row) < FINDING_CHARS + 30
    every = compact(results, "t", show_all=True)
    assert any("npu-smi not on PATH" in line for line in every) and any(results[2].finding in line for line in every)
    assert lines[-1] == every[-1] == "2 ok, 0 warn, 0 fail, 2 skip"
