"""A vendor backend that breaks `import torch`, caught once so the CLI can still explain it.

torch >= 2.5 loads every installed device extension (its ``torch.backends`` entry points, e.g.
``torch_npu``) while ``import torch`` runs, and turns any failure into ``RuntimeError: Failed to load
the backend extension: NAME`` (torch/__init__.py ``_import_device_backends``). A torch_npu installed
on a host whose CANN environment is not sourced therefore breaks every torch program, the doctor
included. torch cannot be imported a second time in the same process after that, so the CLI re-runs
itself once with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` and carries the failure in ``NPUDIST_BROKEN_BACKEND``;
commands that start ranks then refuse, so the user's job never runs with the NPU silently off.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from typing import NoReturn

AUTOLOAD_VAR = "TORCH_DEVICE_BACKEND_AUTOLOAD"
"""torch reads it in ``_is_device_backend_autoload_enabled``; "0" skips the entry points."""
MARKER_VAR = "NPUDIST_BROKEN_BACKEND"
"""Set by the CLI for its own re-run only: the failure, as JSON."""

_FAILED = re.compile(r"Failed to load the backend extension: ([\w.\-]*[\w\-])")


@dataclass(frozen=True)
class BrokenBackend:
    extension: str
    """The entry point's name, which is the vendor package (``torch_npu``)."""
    cause: str
    """What the extension raised, e.g. ``ImportError: libhccl.so: cannot open shared object file``."""

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    def explain(self, fix: str | None = None) -> str:
        """One paragraph: what failed, why every torch program fails with it, and the two ways out."""
        setup = fix or f"install or configure the runtime that {self.extension} needs"
        return (f"torch cannot be imported on this host: its device extension {self.extension} failed to "
                f"load ({self.cause}). torch loads installed device extensions while `import torch` runs, "
                f"so every torch program here fails the same way. Fix: {setup}, then run `npudist doctor`; "
                f"or set {AUTOLOAD_VAR}=0 to run without {self.extension} (its device is then not used).")


def parse_failure(exc: BaseException) -> BrokenBackend | None:
    """The extension that broke ``import torch`` and its cause, or None for any other failure."""
    found = _FAILED.search(str(exc))
    if found is None:
        return None
    inner = exc.__cause__ or exc.__context__
    cause = f"{type(inner).__name__}: {inner}" if inner is not None else "no cause recorded"
    return BrokenBackend(found.group(1), cause)


def from_env(env: dict[str, str] | os._Environ[str] | None = None) -> BrokenBackend | None:
    """The failure the CLI recorded before re-running itself, or None (also for a garbled value)."""
    raw = (os.environ if env is None else env).get(MARKER_VAR)
    if not raw:
        return None
    try:
        fields = json.loads(raw)
        return BrokenBackend(str(fields["extension"]), str(fields["cause"]))
    except (ValueError, KeyError, TypeError):
        return None


def vendor_fix(broken: BrokenBackend) -> str | None:
    """The vendor row's set-up advice for the package that failed (torch imports fine by now)."""
    from npudist.accelerators.vendors import VENDORS

    return next((v.runtime_setup for v in VENDORS if v.module == broken.extension), None)


def explain(broken: BrokenBackend) -> str:
    return broken.explain(vendor_fix(broken))


def import_torch_or_rerun(argv: list[str]) -> None:
    """Import torch; if a device extension breaks it, re-run ``python -m npudist ARGV`` without autoload.

    Returns only when torch imported. Other import errors (torch missing) propagate to the caller.
    """
    if from_env() is not None:
        return  # this is the re-run: torch was imported with autoload off
    # Read before the import: torch sets the variable to "0" itself while it loads the extensions.
    autoload_off = os.environ.get(AUTOLOAD_VAR) == "0"
    try:
        import torch  # noqa: F401
    except RuntimeError as exc:
        broken = parse_failure(exc)
        if broken is None or autoload_off:
            raise
        _rerun(argv, broken)


def _rerun(argv: list[str], broken: BrokenBackend) -> NoReturn:
    env = {**os.environ, AUTOLOAD_VAR: "0", MARKER_VAR: broken.to_env()}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "npudist", *argv], env)
