#!/usr/bin/env bash
# Set-up for a fresh machine: install torch only when none is installed (NPU/GPU users must first install
# the torch their vendor stack requires), then npudist and its test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${NPUDIST_TORCH:-torch==2.13.0}
# PyTorch's own index of CPU-only wheels: PyPI's Linux x86_64 torch is the CUDA build, which pulls its nvidia-*
# wheels (several GB). Where it cannot be reached (a mirror of PyPI only) the default index is used and the
# build that came is named below.
CPU_INDEX=${NPUDIST_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

# Done before for this interpreter, with this pyproject.toml and this script, and npudist still imports from
# this checkout: nothing to do (`make demo` on a finished run used to reinstall every time).
STAMPS=${NPUDIST_SETUP_STAMPS:-build/setup-stamps}
interpreter=$("$PYTHON" -c 'import sys; print(sys.prefix, sys.executable)')
stamp="$STAMPS/$(printf '%s' "$interpreter" | sha256sum | cut -c1-16)"
inputs=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-64)
here=$(pwd -P)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ] && "$PYTHON" - "$here/src" >/dev/null 2>&1 <<'PY'
import importlib.util, sys
spec = importlib.util.find_spec("npudist")
sys.exit(0 if spec and spec.origin and spec.origin.startswith(sys.argv[1]) else 1)
PY
then
  echo "setup: already done for $PYTHON (pyproject.toml and scripts/setup.sh unchanged); remove $stamp to redo it"
  exit 0
fi

install_torch() {
  if "$PYTHON" - "$CPU_INDEX" >/dev/null 2>&1 <<'PY'
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)
PY
  then
    echo "setup: no torch installed; installing $TORCH_SPEC, the CPU build, from $CPU_INDEX (override with NPUDIST_TORCH=...)"
    "$PYTHON" -m pip install --quiet --timeout 30 --index-url "$CPU_INDEX" "$TORCH_SPEC"
  else
    echo "setup: no torch installed; $CPU_INDEX cannot be reached, so installing $TORCH_SPEC from the default index"
    echo "setup: (there, on Linux x86_64, torch is usually the CUDA build; override with NPUDIST_TORCH=... or NPUDIST_TORCH_INDEX=...)"
    "$PYTHON" -m pip install --quiet "$TORCH_SPEC"
  fi
  # What came: the build (CPU or CUDA) and its size on disk with the nvidia-*/triton wheels it pulled.
  "$PYTHON" - <<'PY'
import importlib.metadata as md
dists = [d for d in md.distributions() if (d.metadata["Name"] or "").lower().startswith(("torch", "nvidia-", "triton"))
         and (d.metadata["Name"] or "").lower() not in ("torchvision", "torchaudio")]
size = sum(f.size or 0 for d in dists for f in (d.files or ()))
version = md.version("torch")
cuda = [d.metadata["Name"] for d in dists if d.metadata["Name"].lower().startswith("nvidia-")]
build = f"the CUDA build, with {len(cuda)} nvidia-* wheels" if cuda or "+cu" in version else "the CPU build"
print(f"setup: installed torch {version}: {build}, {size / 1e9:.1f} GB on disk")
PY
}
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
    install_torch ;;
  ok) ;;
  *)
    echo "setup: torch is installed but does not import ($state); leaving it as it is."
    echo "setup: after set-up, \`npudist doctor\` names the cause and the fix (for torch_npu: source CANN's set_env.sh)." ;;
esac
# torch before 2.3 was built against numpy 1.x: with numpy 2 its numpy bridge fails ("Numpy is not
# available"; torch 2.3 release notes). An older torch (an Ascend user's pin) keeps numpy below 2.
numpy_pin=()
torch_version=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
case "$torch_version" in
  1.*|2.[0-2]|2.[0-2].*|2.[0-2]+*)
    numpy_pin=("numpy<2")
    echo "setup: torch $torch_version predates numpy 2 support (torch 2.3); installing with numpy<2" ;;
esac
"$PYTHON" -m pip install --quiet -e ".[test]" ${numpy_pin[@]+"${numpy_pin[@]}"}
mkdir -p "$STAMPS" && printf '%s\n' "$inputs" > "$stamp"
