"""`npudist launch --dry-run[=N]`: the user's own script for N optimizer steps, then a checkpoint of what the
optimizer trains saved and loaded back, then a clean exit: a minute's proof that a long job's loop, device,
collectives and checkpoint path work before it is queued for hours.

The end of a step is the optimizer's ``step`` (torch's global post-step hook, as the watched loop uses), so
any script is covered without a change. The checkpoint holds the optimizer's parameters and state_dict and
goes through npudist.checkpoint (rank 0 writes, every rank waits), into RUN_DIR/dry-run-checkpoint or a
folder under the temporary directory. Every rank that sees the folder loads it back and compares it
bit-exact, and loads the state_dict into its optimizer (the call a resume makes). Then SystemExit ends the
script from inside that ``step`` call; the Runtime's exit hook closes what npudist started.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from npudist.runtime.env import launcher_env

FOLDER = "dry-run-checkpoint"
PREFIX = "npudist dry run:"


class DryRunFailed(RuntimeError):
    """The checkpoint did not come back as saved; the message says how."""


@dataclass(frozen=True, kw_only=True)
class RoundTrip:
    tensors: int
    nbytes: int
    save_s: float
    load_s: float
    loaded: bool
    """False where this rank cannot see the folder rank 0 wrote (another node without shared storage)."""


def _state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    params = [p.detach().to("cpu", copy=True) for g in optimizer.param_groups for p in g["params"]]
    return {"params": params, "optimizer": optimizer.state_dict()}


def _tensors(value: Any, path: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested state, by where it sits (``optimizer.state.0.exp_avg``)."""
    if isinstance(value, torch.Tensor):
        return {path: value}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) \
        else ()
    out: dict[str, torch.Tensor] = {}
    for key, inner in items:
        out.update(_tensors(inner, f"{path}.{key}" if path else str(key)))
    return out


def round_trip(optimizer: torch.optim.Optimizer, directory: Path, step: int) -> RoundTrip:
    """Save what ``optimizer`` trains as checkpoint ``step`` in ``directory``, load it back and compare;
    DryRunFailed names the first difference. Every rank calls it (the save waits for every rank)."""
    from npudist import checkpoint

    state = _state(optimizer)
    began = time.perf_counter()
    checkpoint.save(state, directory, step, keep=1, overwrite=True)
    saved_s = time.perf_counter() - began
    want = _tensors(state)
    nbytes = sum(t.numel() * t.element_size() for t in want.values())
    if not directory.is_dir():
        return RoundTrip(tensors=len(want), nbytes=nbytes, save_s=saved_s, load_s=0.0, loaded=False)
    began = time.perf_counter()
    found = checkpoint.load_latest(directory)
    if found is None:
        raise DryRunFailed(f"checkpoint {step} was saved in {directory}, but no good checkpoint loads from there "
                           "(the warnings above say why)")
    loaded, got_step = found
    got = _tensors(loaded)
    for name, tensor in want.items():
        if name not in got:
            raise DryRunFailed(f"{name} is missing from the loaded checkpoint")
        if got[name].dtype != tensor.dtype or got[name].shape != tensor.shape or \
                not torch.equal(got[name].cpu(), tensor.cpu()):
            raise DryRunFailed(f"{name} came back different from what was saved (dtype {got[name].dtype} vs "
                               f"{tensor.dtype}, shape {tuple(got[name].shape)} vs {tuple(tensor.shape)})")
    if got_step != step:
        raise DryRunFailed(f"the newest checkpoint loaded is step {got_step}, not the {step} just saved")
    try:
        optimizer.load_state_dict(loaded["optimizer"])  # what a resume does with it
    except Exception as exc:
        raise DryRunFailed(f"the optimizer's state_dict does not load back: {type(exc).__name__}: {exc}") from exc
    return RoundTrip(tensors=len(want), nbytes=nbytes, save_s=saved_s, load_s=time.perf_counter() - began,
                     loaded=True)


def checkpoint_dir(run_dir: str | None, env: Mapping[str, str]) -> Path:
    """RUN_DIR/dry-run-checkpoint, else one folder every rank of this launch names alike: torchrun's run id
    ("none" under its static rendezvous) or the rendezvous address."""
    if run_dir:
        return Path(run_dir) / FOLDER
    launcher = launcher_env(env)
    job = launcher.run_id or f"{launcher.master_addr or 'local'}-{launcher.master_port or '0'}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job)
    return Path(tempfile.gettempdir()) / f"npudist-{FOLDER}-{safe}"


def install(steps: int, directory: Path, rank: int, say: Callable[[str], None] | None = None) -> Callable[[], None]:
    """Count the first optimizer's steps; at ``steps`` run the round trip, say the verdict (rank 0) and end the
    script (exit 0, or 1 when the checkpoint did not come back). Returns the function that removes the hook."""
    import torch.optim.optimizer as optimizer_module

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    seen: dict[str, Any] = {"lead": None, "count": 0}

    def after_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if seen["lead"] is None:
            seen["lead"] = id(optimizer)
        if id(optimizer) != seen["lead"]:
            return
        seen["count"] += 1
        if seen["count"] < steps:
            return
        handle.remove()
        try:
            done = round_trip(optimizer, directory, seen["count"])
        except DryRunFailed as exc:
            say(f"{PREFIX} rank {rank}: FAILED after {seen['count']} steps: {exc}")
            raise SystemExit(1) from None
        if rank == 0:
            where = "loaded back bit-exact" if done.loaded else "not loaded here (folder not visible)"
            say(f"{PREFIX} {seen['count']} optimizer steps ran; a checkpoint of {done.tensors} tensors "
                f"({done.nbytes / 2**20:.1f} MiB) saved in {done.save_s:.2f} s and {where} in "
                f"{done.load_s:.2f} s ({directory}); the optimizer's state_dict loads; stopping the script")
        raise SystemExit(0)

    handle = optimizer_module.register_optimizer_step_post_hook(after_step)
    return handle.remove
