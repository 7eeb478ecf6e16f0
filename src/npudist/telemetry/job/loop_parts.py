"""The parts a started TrainingLoop (loop.py) drives: this rank's metrics, its StepTimer, rank 0's end summary,
straggler diagnosis and TensorBoard writer. ``TrainingLoop(make_parts=...)`` takes another factory in tests."""

from __future__ import annotations

from typing import Any


def make_parts(loop: Any) -> None:
    """The real parts: this rank's metrics (served when NPUDIST_METRICS_PORT is set), a StepTimer feeding
    them and, on rank 0, the end summary and straggler diagnosis; the run log opens at the first line."""
    settings = loop.settings
    if settings.tensorboard and loop.ctx.is_main:
        from npudist.telemetry.job.tensorboard import TensorBoardScalars

        loop.tensorboard = TensorBoardScalars(settings.tensorboard)
    if not settings.telemetry:
        return
    from npudist.telemetry.exposition.rank_exporter import serve_rank_metrics
    from npudist.telemetry.job.run_summary import RunSummary

    loop.telemetry = serve_rank_metrics(loop.ctx)
    loop.timer = loop.telemetry.step_timer(exchange_every=settings.exchange_every, op_every=settings.op_every,
                                           op_ranks=settings.op_ranks, start_step=loop.step)
    loop.telemetry.timer_made = loop.adopt  # a script that times its own steps takes over (after ours)
    if loop.ctx.is_main:
        loop.summary = RunSummary()
        loop.timer.on_exchange.append(loop.summary)
        if settings.straggler_diagnosis and settings.run_dir:
            from npudist.telemetry.job.straggler import StragglerDiagnosis

            loop.timer.on_exchange.append(StragglerDiagnosis(settings.run_dir, windows=settings.straggler_diagnosis))
