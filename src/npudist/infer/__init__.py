"""Cooperative inference: one member model per rank (RK3588 board, NPU, GPU or CPU), predictions combined."""

from npudist.infer.combine import COMBINES, contribution, finish
from npudist.infer.ensemble import (
    EnsembleError,
    EnsembleResult,
    EnsembleServer,
    EnsembleStats,
    ensemble_predict,
    gather_floats,
)
from npudist.infer.runners import (
    RKNNLiteRunner,
    RKNNSimulatorRunner,
    Runner,
    RunnerError,
    TorchRunner,
    select_runner,
)

__all__ = [
    "COMBINES",
    "EnsembleError",
    "EnsembleResult",
    "EnsembleServer",
    "EnsembleStats",
    "RKNNLiteRunner",
    "RKNNSimulatorRunner",
    "Runner",
    "RunnerError",
    "TorchRunner",
    "contribution",
    "ensemble_predict",
    "finish",
    "gather_floats",
    "select_runner",
]
