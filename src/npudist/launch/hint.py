"""After ranks failed on an accelerator other than CUDA: does the script hold CUDA-only code, and which command
ports it? A CUDA script run with `--simulate npu` (or on an NPU) failed with torch's own error only
(`Torch not compiled with CUDA enabled`), and nothing pointed at `npudist migrate`.
"""

from __future__ import annotations

from pathlib import Path

MAX_SCRIPT_BYTES = 4 << 20
"""A training script larger than this is not scanned (a hint is not worth a long parse)."""


def cuda_hint(script: str | None, device_type: str) -> str | None:
    """One line naming the script's first CUDA-only error finding and the migrate commands, or None (a CUDA
    device, no script file, nothing found, or the scanner unavailable: the hint is never worth a crash)."""
    if script is None or device_type == "cuda":
        return None
    try:
        path = Path(script)
        if not path.is_file() or path.stat().st_size > MAX_SCRIPT_BYTES:
            return None
        from npudist.migrate import analyse

        errors = [f for f in analyse(path.read_text(errors="replace")).findings if f.severity == "error"]
    except Exception:  # libcst missing, a syntax error, a scanner bug: the ranks' own error stands alone
        return None
    if not errors:
        return None
    first = errors[0]
    more = f" and {len(errors) - 1} more" if len(errors) > 1 else ""
    return (f"{script} has CUDA-only code that fails on {device_type} (line {first.line}: `{first.code.strip()}`"
            f"{more}): `npudist migrate check {script}` lists it, `npudist migrate fix {script}` ports it")
