#!/usr/bin/env bash
# torchtitan's own environment: tests/sim/test_torchtitan.py trains its llama3 debug model on the simulated NPU in it.
# Usage: scripts/torchtitan-env.sh [--no-checkout] [VENV]   (default .venv-torchtitan)
#   --no-checkout   leave out this checkout (.ci/run installs it after its demo: one build of the checkout at a time)
# torch is 2.15.0 (NPUDIST_TORCHTITAN_TORCH), not 2.13: torchtitan 0.3.0 calls torch.distributed.set_timeout after the
# first step (torchtitan/distributed/utils.py set_pg_timeouts), which torch has from 2.14. PyPI's Linux torch is the
# CUDA build (about 5 GB with its nvidia-* wheels); the wheels the 2.15.0 compatibility leg keeps (.ci/compat,
# COMPAT_WHEELS) are used when they are there, so a machine downloads them once.
# TORCHTITAN_BASE_PYTHON picks the CPython (>= 3.11, torchtitan's Requires-Python) to build it from.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=1
if [ "${1:-}" = "--no-checkout" ]; then checkout=0; shift; fi
VENV=${1:-.venv-torchtitan}
BASE=${TORCHTITAN_BASE_PYTHON:-python3}
TORCH=${NPUDIST_TORCHTITAN_TORCH:-torch==2.15.0}
WHEELS=${COMPAT_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/npudist-compat/torch-2.15.0}
if ! "$BASE" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' 2>/dev/null; then
  echo "torchtitan-env: $BASE is not CPython >= 3.11 (torchtitan 0.3.0 requires it)." \
       "Set TORCHTITAN_BASE_PYTHON=/path/to/python3.11" >&2
  exit 2
fi
rm -rf "$VENV"
"$BASE" -m venv "$VENV"
# A machine-wide pip constraint capping torch (this CI host caps it at the versions it keeps on disk) would refuse
# the version asked for, as in .ci/compat.
export PIP_CONSTRAINT=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
find=()
[ -f "$WHEELS/complete" ] && find=(--find-links "$WHEELS")
"$VENV/bin/python" -m pip install --quiet "${find[@]}" "$TORCH"
# torch named again so that pip keeps it while resolving torchtitan's dependencies (datasets, tokenizers, tyro,
# torchdata, wandb, ...); triton because torchtitan imports it at load (distributed/minimal_async_ep/kernels.py),
# which a CPU torch does not bring.
"$VENV/bin/python" -m pip install --quiet "${find[@]}" "$TORCH" torchtitan==0.3.0 triton
if [ "$checkout" = 1 ]; then
  # Installed, not put on the path: the simulated NPU arrives at `import torch` through npudist's torch.backends
  # entry point (npudist/sim/autoload.py), and torchtitan picks its device at import (torchtitan/tools/utils.py).
  "$VENV/bin/python" -m pip install --quiet -e .
fi
"$VENV/bin/python" -c 'import torchtitan.train, tokenizers, torch; print("torch", torch.__version__)' \
  || { echo "torchtitan-env: torchtitan does not import in $VENV" >&2; exit 1; }
echo "torchtitan-env: $VENV ready; NPUDIST_TORCHTITAN_PYTHON=$VENV/bin/python runs tests/sim/test_torchtitan.py"
