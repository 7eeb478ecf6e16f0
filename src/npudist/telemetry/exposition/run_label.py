"""The ``run`` label on every rank series and in the run log: which run of a job a series belongs to.

Without it two runs scraped by one Prometheus under the same job and targets overwrite each other's series
(dcgm-exporter labels pod/namespace, Slurm exporters the job id, for the same reason). First found wins:
NPUDIST_RUN_ID (set by the user, or by `npudist launch` for a single-node run), SLURM_JOB_ID, torchrun's
rendezvous id (TORCHELASTIC_RUN_ID, from --rdzv-id; torchrun's default "none" names nothing), then a hash of
the run directory (NPUDIST_RUN_DIR). Empty when none is known.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Mapping

from npudist.runtime.settings import RUN_DIR_VAR, RUN_ID_SOURCES

MAX_LEN = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@+-]")


def _clean(value: str) -> str:
    """Printable and short: a label value is shown in every legend and alert."""
    return _UNSAFE.sub("_", value.strip())[:MAX_LEN]


def run_id(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    for name in RUN_ID_SOURCES:
        value = _clean(env.get(name, ""))
        if value and value != "none":
            return value
    run_dir = env.get(RUN_DIR_VAR, "").strip()
    if run_dir:
        return "dir-" + hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:12]
    return ""


def new_run_id(now: float | None = None) -> str:
    """A fresh id for one launch: its UTC start time and 4 random bytes (unique on one Prometheus)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{os.urandom(4).hex()}"
