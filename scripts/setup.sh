#!/usr/bin/env bash
# Set-up for a fresh machine: install torch only when none is importable (NPU/GPU users must first
# install the torch their vendor stack requires), then npudist and its test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${NPUDIST_TORCH:-torch==2.13.0}
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
  echo "setup: no importable torch; installing $TORCH_SPEC (override with NPUDIST_TORCH=...)"
  "$PYTHON" -m pip install --quiet "$TORCH_SPEC"
fi
"$PYTHON" -m pip install --quiet -e ".[test]"
