#!/usr/bin/env bash
# rknn-toolkit2's own environment: `npudist edge convert` and the RKNN simulator run in it.
# Usage: scripts/rknn-env.sh [VENV]   (default .venv-rknn; RKNN_PYTHON picks the CPython 3.11 to build it from)
# torch first (NPUDIST_TORCH, default torch==2.13.0, the CPU build), then the exact working set with --no-deps
# (requirements/rknn-toolkit.txt says which of the toolkit's pins it overrides and why), then this checkout's src on its path.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-rknn}
RKNN_PYTHON=${RKNN_PYTHON:-python3.11}
if ! "$RKNN_PYTHON" -c 'import sys, platform; sys.exit(sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64")' 2>/dev/null; then
  echo "rknn-env: $RKNN_PYTHON is not CPython 3.11 on x86_64; rknn-toolkit2 2.5.0 ships a cp311 x86_64 wheel" \
       "for this use. Set RKNN_PYTHON=/path/to/python3.11" >&2
  exit 2
fi
rm -rf "$VENV"
"$RKNN_PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "${NPUDIST_TORCH:-torch==2.13.0}"
"$VENV/bin/python" -m pip install --quiet --no-deps -r requirements/rknn-toolkit.txt
# This checkout's source on the venv's path: no build, so it cannot race another venv's build of the checkout
# (.ci/run makes this one while the demo installs npudist), and edits show at once, as with `pip install -e`.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/src" > "$site/npudist-checkout.pth"
"$VENV/bin/python" -c 'from rknn.api import RKNN; import npudist.edge' \
  || { echo "rknn-env: the toolkit does not import in $VENV" >&2; exit 1; }
echo "rknn-env: $VENV ready; run $VENV/bin/python -m npudist edge convert --help"
