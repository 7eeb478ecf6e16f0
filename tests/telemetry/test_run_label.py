"""The `run` label: which variable names the run (first found wins), and one value per launch."""

from __future__ import annotations

import pytest

from npudist.telemetry.exposition.run_label import new_run_id, run_id


@pytest.mark.parametrize(("env", "want"), [
    ({"NPUDIST_RUN_ID": "exp-7", "SLURM_JOB_ID": "123", "TORCHELASTIC_RUN_ID": "r9"}, "exp-7"),
    ({"SLURM_JOB_ID": "123", "TORCHELASTIC_RUN_ID": "r9"}, "123"),
    ({"TORCHELASTIC_RUN_ID": "r9"}, "r9"),
    ({"TORCHELASTIC_RUN_ID": "none"}, ""),  # torchrun's default rdzv id names no run
    ({"NPUDIST_RUN_ID": 'a"b{c} d' + "x" * 100}, "a_b_c__d" + "x" * 56),  # printable, 64 characters at most
])
def test_the_first_variable_that_names_a_run_wins(env, want):
    assert run_id(env) == want


def test_a_run_directory_alone_gives_a_stable_hash_per_directory(tmp_path):
    a, b = run_id({"NPUDIST_RUN_DIR": str(tmp_path / "a")}), run_id({"NPUDIST_RUN_DIR": str(tmp_path / "b")})
    assert a.startswith("dir-") and a != b and a == run_id({"NPUDIST_RUN_DIR": str(tmp_path / "a")})


def test_two_launches_in_the_same_second_get_different_ids():
    assert new_run_id(0.0) != new_run_id(0.0) and new_run_id(0.0).startswith("19700101T000000Z-")


def test_a_single_node_launch_gives_its_ranks_one_run_id_unless_one_is_named():
    from npudist.accelerators import get
    from npudist.launch import plan

    argv = ["--nproc-per-node", "2", "examples/train_ddp.py"]
    assert plan(argv, get("cpu"), {}).env_updates["NPUDIST_RUN_ID"]
    assert "NPUDIST_RUN_ID" not in plan(argv, get("cpu"), {"SLURM_JOB_ID": "77"}).env_updates
    assert "NPUDIST_RUN_ID" not in plan(["--rdzv-id", "j1", *argv], get("cpu"), {}).env_updates
