"""How a rank aborts a hung job: the line that says who the culprit is and what happens next, torchrun's error
file, the exit."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time

from npudist.runtime.env import launcher_env

log = logging.getLogger("npudist.comm")


def restart_note() -> str:
    """What happens after an abort, from what torchrun tells its workers (TORCHELASTIC_* variables)."""
    told = launcher_env(os.environ)
    if told.max_restarts is not None and told.max_restarts > told.restart_count:
        return (f"the launcher restarts the job (restart {told.restart_count + 1} of --max-restarts "
                f"{told.max_restarts})")
    return (f"nothing restarts it (--max-restarts {told.max_restarts or 0}): fix or replace the culprit, then run "
            "the same command again; it resumes from the last checkpoint")


def write_error_file(message: str, when: float | None) -> None:
    """torchrun's per-worker error file, if it gave one; best effort (the exit goes on regardless). ``when``:
    the verdict's time (torchrun names the earliest failure as the root cause), else now."""
    path = launcher_env(os.environ).error_file
    if not path:
        return
    stamp = int(when) if when is not None and math.isfinite(when) else int(time.time())
    body = {"message": {"message": f"npudist hang verdict: {message}",
                        "extraInfo": {"py_callstack": f"npudist: {message}", "timestamp": str(stamp)}}}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as fp:
            json.dump(body, fp)
    except OSError as exc:
        log.debug("torchrun error file not written: %s", exc)


def abort(message: str, *, verdict_line: str | None, verdict_time: float | None, code: int) -> None:
    """Exit with ``code``, saying who the culprit is and what happens next.

    The verdict also goes to torchrun's error file (TORCHELASTIC_ERROR_FILE, the format of
    torch.distributed.elastic's ErrorHandler.record_exception), so that its closing "Root Cause" block
    names the culprit instead of the rank that aborted; its time is the verdict's, before the culprit's
    own exit is seen, so torchrun picks it as the first failure.
    """
    message += "; " + restart_note()
    if verdict_line is not None:
        message += f". The verdict: {verdict_line}"
    print(f"npudist: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    write_error_file(message, verdict_time)
    os._exit(code)
