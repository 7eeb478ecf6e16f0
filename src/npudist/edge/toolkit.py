"""Where rknn-toolkit2 lives: its own virtual environment, because its wheel pins ``torch<=2.4.0`` and
``numpy<=1.26.4`` while npudist's main environment runs a current torch."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

MAKE_ENV = "make rknn-env"
"""The one command (docs/guide/edge-and-inference.md) that builds the toolkit's environment (scripts/rknn-env.sh)."""
ENV_PYTHON = ".venv-rknn/bin/python"
"""Where that command puts the environment's interpreter, relative to the checkout."""


class ToolkitMissing(RuntimeError):
    """rknn-toolkit2 cannot be imported by this interpreter; the message says how to make its environment."""


def require_toolkit() -> Any:
    """The ``rknn.api`` module, or ToolkitMissing naming this Python and the command that makes the env."""
    here = f"{sys.executable} (Python {sys.version_info.major}.{sys.version_info.minor})"
    if importlib.util.find_spec("rknn") is None:
        raise ToolkitMissing(
            f"rknn-toolkit2 is not installed for {here}. It needs CPython 3.11 on x86_64 and its own "
            f"environment (it pins torch<=2.4 and numpy<=1.26.4): run `{MAKE_ENV}` in the npudist checkout, "
            f"then `{ENV_PYTHON} -m npudist edge convert ...`")
    try:
        return importlib.import_module("rknn.api")
    except Exception as exc:  # a half-installed toolkit fails on one of its runtime imports
        raise ToolkitMissing(f"rknn-toolkit2 is installed for {here} but does not import "
                             f"({type(exc).__name__}: {exc}); rebuild its environment with `{MAKE_ENV}`") from exc
