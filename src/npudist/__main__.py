"""The `npudist` command's entry point: torch must import (or the failure be explained) before the CLI loads.

The CLI's own modules import torch, so the check runs here, before them.
"""

from __future__ import annotations

import sys

# Commands that start ranks: with a vendor extension switched off they would run the user's job without its
# device, so they refuse instead (the others work: the doctor explains, the exporter needs no torch device).
_RANK_COMMANDS = ("launch", "bench", "test")


def _fail(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[bold red]npudist:[/] {escape(message)}")
    sys.exit(2)


def _import_torch(argv: list[str]) -> None:
    from npudist.accelerators import backend_guard

    try:
        backend_guard.import_torch_or_rerun(argv)
    except ImportError as exc:
        _fail(f"torch cannot be imported ({exc}). Install the torch your accelerator stack requires first "
              "(torch_npu, CUDA; on a CPU host `pip install torch==2.13.0`).")
    broken = backend_guard.from_env()
    if broken is None:
        return
    if argv and argv[0] in _RANK_COMMANDS:
        _fail(f"{argv[0]} refused: {backend_guard.explain(broken)}")
    if argv and argv[0] == "exporter":
        print(f"npudist exporter: {broken.extension} does not load ({broken.cause}); serving what the vendor tool "
              "and the host report. `npudist doctor` says how to fix it.", file=sys.stderr)


_HELP = ("--help", "-h", "--version")


def help_only(argv: list[str]) -> bool:
    """The command line only asks for help or the version (before any `--`): no torch needed to answer.
    After `launch`, words past the first belong to torchrun or the script (`launch train.py --help`)."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    if words[:1] == ["launch"]:
        return words[1:2] in (["--help"], ["-h"])
    return not words or any(w in _HELP for w in words)


def main() -> None:
    if not help_only(sys.argv[1:]):
        _import_torch(sys.argv[1:])
    from npudist.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
