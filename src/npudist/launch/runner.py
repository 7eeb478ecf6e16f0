"""`npudist launch` carried out: torchrun's agent with the plan's arguments (or this process replaced by the
MPI rank's script), inside what stands around it (scope.py), and the hint when ranks failed off CUDA."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from npudist.accelerators import Accelerator
from npudist.launch import scope
from npudist.launch.errors import LaunchError
from npudist.launch.planner import plan
from npudist.runtime.settings import PG_WATCH_VAR, SIMULATE_VAR


def _build_watch() -> None:
    """Build the process-group watch here, once, before the ranks start: each would otherwise wait on the
    build lock at init() (10-30 s the first time a torch is used on a host). Never stops the launch."""
    if os.environ.get(PG_WATCH_VAR, "native").lower() != "native":
        return
    from npudist.comm import pg_watch

    if pg_watch.unsupported() is None and pg_watch.library_path().exists():
        return
    if pg_watch.unsupported() is None:
        print("npudist launch: building the process-group watch for this torch (once per host and torch version)",
              file=sys.stderr, flush=True)
    try:
        pg_watch.build()
    except pg_watch.WatchUnavailable as exc:
        print(f"npudist launch: {exc}; hangs in collectives npudist did not issue are then named only by the "
              "collective timeout", file=sys.stderr, flush=True)
        os.environ[PG_WATCH_VAR] = "off"  # said once here: the ranks (which inherit it) neither retry nor repeat it


def run(argv: Sequence[str], acc: Accelerator, env: Mapping[str, str] | None = None) -> int:
    """Run a plan: hand torchrun its arguments, or replace this process with the MPI rank's script.

    Returns torchrun's outcome: 0, 1 when a rank failed (torchrun's summary on stderr), or 128 + the signal
    number when stopped by a signal (the ranks say where they stopped; see examples/train_ddp.py).
    """
    the_plan = plan(argv, acc, dict(os.environ if env is None else env))
    if the_plan.script is not None and not os.path.isfile(the_plan.script):
        raise LaunchError(f"{the_plan.script}: no such file (the training script; for a module use -m MODULE)")
    os.environ.update(the_plan.env_updates)  # torchrun's workers inherit this process's environment
    for note in the_plan.notes:
        print(f"npudist launch: {note}", file=sys.stderr, flush=True)
    if the_plan.mode == "mpi":
        # exec leaves nothing behind to clean up: under mpirun/srun the batch script's trap empties the file.
        if the_plan.targets_file:
            from npudist.telemetry.exposition.targets import write_targets

            write_targets(the_plan.targets_file, the_plan.targets)
        os.execvpe(the_plan.exec_argv[0], the_plan.exec_argv, the_plan.exec_env)
    _build_watch()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from npudist.comm.hang import local_ranks

    try:
        with scope.stop_signals_raise(), scope.quiet_stop(), scope.published(the_plan), scope.peer_holder(the_plan), \
                local_ranks.watching():
            torchrun_main(the_plan.torchrun_argv)
    except ChildFailedError as exc:
        print(exc.format_msg(), file=sys.stderr)
        from npudist.launch.hint import cuda_hint

        hint = cuda_hint(the_plan.script, "npu" if the_plan.env_updates.get(SIMULATE_VAR) else acc.device_type)
        if hint:
            print(f"npudist launch: {hint}", file=sys.stderr)
        return 1
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0
