#!/usr/bin/env bash
# Set-up for a fresh machine: install torch only when none is installed (NPU/GPU users must first install
# the torch their vendor stack requires), then npudist and its test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${NPUDIST_TORCH:-torch==2.13.0}
# "missing", "ok", or the first line of the import error. find_spec looks without importing, so a torch that
# is installed but fails to import (torch_npu without CANN) is never replaced by another build.
state=$("$PYTHON" -c '
import importlib.util
if importlib.util.find_spec("torch") is None:
    print("missing")
else:
    try:
        import torch  # noqa: F401
        print("ok")
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}".splitlines()[0])
' 2>/dev/null)
case "$state" in
  missing)
    echo "setup: no torch installed; installing $TORCH_SPEC (override with NPUDIST_TORCH=...)"
    "$PYTHON" -m pip install --quiet "$TORCH_SPEC" ;;
  ok) ;;
  *)
    echo "setup: torch is installed but does not import ($state); leaving it as it is."
    echo "setup: after set-up, \`npudist doctor\` names the cause and the fix (for torch_npu: source CANN's set_env.sh)." ;;
esac
"$PYTHON" -m pip install --quiet -e ".[test]"
