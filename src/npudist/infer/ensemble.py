"""Cooperative inference: every rank runs its own member, one all-reduce combines the predictions.

Two ways to use it. SPMD: every rank calls ``ensemble_predict(model, batch)`` with the same batch.
Service: rank 0 takes requests (``EnsembleServer.request``, e.g. from the HTTP front) and the other
ranks sit in ``EnsembleServer.follow()``; rank 0 sends them each batch, so they need no network front.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from npudist.infer.collective import _all_reduce, world
from npudist.infer.combine import check_combine, contribution, finish
from npudist.infer.runners import Runner, select_runner
from npudist.telemetry.job.histogram import STEP_BUCKETS, Histogram

# Commands rank 0 sends to followers in the request header [command, batch, features].
_STOP, _PREDICT, _IDLE = 0, 1, 2


class EnsembleError(RuntimeError):
    """A member failed on some rank; every rank raises it for the same request, and keeps serving."""

    status = 500
    """The HTTP status the front answers with."""


@dataclass(frozen=True)
class EnsembleResult:
    labels: Tensor
    """[batch] int64: the combined prediction."""
    scores: Tensor
    """[batch, classes]: mean probability, mean logit, or share of votes per class."""
    world_size: int
    compute_seconds: float
    """This rank's member, input to logits, device synchronised."""
    compute_seconds_mean: float
    """Mean over all members of their compute time (sent along with the predictions, no extra call)."""
    aggregate_seconds: float
    """The all-reduce, including waiting for the slowest member."""
    distribute_seconds: float = 0.0
    """Service mode only: sending the request from rank 0 to the other ranks."""
    missing: tuple[str, ...] = ()
    """Fan-out front only: the members left out of this answer, each with why (``world_size`` counts
    those combined)."""

    @property
    def degraded(self) -> bool:
        """Fewer members than the ensemble has made this answer."""
        return bool(self.missing)

    @property
    def total_seconds(self) -> float:
        return self.distribute_seconds + self.compute_seconds + self.aggregate_seconds

    def latency(self) -> dict[str, float]:
        return {"distribute": self.distribute_seconds, "compute": self.compute_seconds,
                "compute_mean_over_ranks": self.compute_seconds_mean, "aggregate": self.aggregate_seconds,
                "total": self.total_seconds}


@dataclass
class EnsembleStats:
    """This rank's figures; npudist.telemetry.job.edge_metrics.EdgeCollector exports them."""

    requests: int = 0
    errors: int = 0
    """Requests where any member failed (every rank counts them)."""
    compute_seconds: float = 0.0
    aggregate_seconds: float = 0.0
    member_failures: int = 0
    """Requests where this rank's own member failed."""
    degraded: int = 0
    """Fan-out front only: answers combined from fewer members than the ensemble has."""
    members_expected: int = 0
    """Fan-out front only: the members the ensemble has (0 elsewhere)."""
    members_answering: int = 0
    """Fan-out front only: members combined into the latest answer (or that answered the latest probe)."""
    inference: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS))
    """This rank's member, input to logits, per request (failed ones too: a timeout is a latency)."""
    runtime: str = ""
    core_mask: str = ""


@dataclass
class EnsembleServer:
    """This rank's member plus the rules to combine it with the others'."""

    runner: Runner
    num_classes: int
    input_features: int | None = None
    """Service mode: the feature count every request must have; None for any 2-D batch."""
    combine: str = "mean_probs"
    max_batch: int = 4096
    stats: EnsembleStats = field(default_factory=EnsembleStats)

    def __post_init__(self) -> None:
        self.stats.runtime, self.stats.core_mask = self.runner.kind, self.runner.core_mask
        check_combine(self.combine)
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {self.num_classes}")

    @property
    def rank(self) -> int:
        return world()[0]

    def contribute(self, batch: Tensor) -> tuple[Tensor, str, float]:
        """This rank's member on ``batch``: its [batch, classes] share of the sum (zeros when it failed),
        the failure ("" when none) and the seconds it took. Never raises: a failure is data to pass on."""
        n = batch.shape[0]
        start = time.perf_counter()
        failure = ""
        try:
            part = contribution(self.runner(batch), self.combine)
            if part.shape != (n, self.num_classes):
                raise ValueError(f"member returned shape {tuple(part.shape)}, "
                                 f"expected ({n}, {self.num_classes})")
        except Exception as exc:  # any member failure must still reach the other ranks
            failure = f"{type(exc).__name__}: {exc}"
            part = torch.zeros(n, self.num_classes)
        compute = time.perf_counter() - start
        self.stats.inference.observe(compute)
        self.stats.member_failures += bool(failure)
        return part, failure, compute

    def predict(self, batch: Tensor) -> EnsembleResult:
        """Collective: every rank calls it with the same batch shape and gets the same result.

        A member that raises (or returns the wrong shape) does not leave the others waiting: its
        failure travels in the same all-reduce and every rank raises EnsembleError.
        """
        n = batch.shape[0]
        part, failure, compute = self.contribute(batch)
        tail = torch.tensor([1.0 if failure else 0.0, compute])
        payload = torch.cat([part.reshape(-1), tail])
        start = time.perf_counter()
        payload = _all_reduce(payload, "sum")
        aggregate = time.perf_counter() - start
        size = world()[1]
        self.stats.requests += 1
        failed = round(float(payload[-2]))
        if failed:
            self.stats.errors += 1
            mine = f"; here (rank {self.rank}): {failure}" if failure else ""
            raise EnsembleError(f"{failed} of {size} ensemble members failed on this request{mine}")
        labels, scores = finish(payload[:-2].reshape(n, self.num_classes), size, self.combine)
        self.stats.compute_seconds += compute
        self.stats.aggregate_seconds += aggregate
        return EnsembleResult(labels, scores, size, compute, float(payload[-1]) / size, aggregate)

    def _header(self, command: int, batch: int = 0, features: int = 0) -> Tensor:
        header = torch.tensor([command, batch, features], dtype=torch.int64) if self.rank == 0 else \
            torch.zeros(3, dtype=torch.int64)
        return _all_reduce(header, "sum")  # only rank 0 contributes: a broadcast through the one collective

    def request(self, batch: Tensor) -> EnsembleResult:
        """Rank 0 in service mode: send ``batch`` to the followers, then predict together."""
        if self.rank != 0:
            raise RuntimeError("EnsembleServer.request is for rank 0; other ranks call follow()")
        if batch.dim() != 2 or batch.shape[0] < 1:
            raise ValueError(f"a request is a [batch, features] tensor, got shape {tuple(batch.shape)}")
        start = time.perf_counter()
        self._header(_PREDICT, batch.shape[0], batch.shape[1])
        batch = _all_reduce(batch.float().contiguous().clone(), "sum")
        distribute = time.perf_counter() - start
        result = self.predict(batch)
        return EnsembleResult(result.labels, result.scores, result.world_size, result.compute_seconds,
                              result.compute_seconds_mean, result.aggregate_seconds, distribute)

    def idle(self) -> None:
        """Rank 0: tell followers nothing happened, so an idle service never hits the collective timeout."""
        self._header(_IDLE)

    def stop(self) -> None:
        """Rank 0: release the followers from follow()."""
        self._header(_STOP)

    def follow(self) -> int:
        """Ranks other than 0: serve rank 0's requests until it calls stop(); returns requests served."""
        served = 0
        while True:
            command, n, features = (int(v) for v in self._header(_STOP))
            if command == _STOP:
                return served
            if command == _IDLE:
                continue
            batch = _all_reduce(torch.zeros(n, features), "sum")
            with contextlib.suppress(EnsembleError):  # rank 0 tells the client; this rank keeps serving
                self.predict(batch)
            served += 1


def ensemble_predict(model: nn.Module | Runner, batch: Tensor, *,
                     combine: str = "mean_probs", num_classes: int | None = None) -> EnsembleResult:
    """Every rank calls this with its own member and the same batch; all get the combined prediction.

    With ``num_classes`` given, a member failure raises EnsembleError on every rank; without it the
    class count comes from this rank's output, so a failure there is raised on this rank only.
    """
    runner = select_runner(model) if isinstance(model, nn.Module) else model
    if num_classes is None:
        num_classes = int(runner(batch[:1]).shape[-1])
    return EnsembleServer(runner, num_classes, combine=combine).predict(batch)


def gather_floats(value: float) -> list[float]:
    """One number from every rank, in rank order (e.g. each member's accuracy for a report)."""
    rank, size = world()
    slots = torch.zeros(size, dtype=torch.float64)
    slots[rank] = value
    return [float(v) for v in _all_reduce(slots, "sum")]
