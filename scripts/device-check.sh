#!/usr/bin/env bash
# The prepared device check: proves npudist's CUDA/NCCL and NVML paths on a host with NVIDIA GPUs, in at
# most DEVICE_CHECK_BUDGET_S seconds (default 470, under 8 minutes, set-up included).
#
#   make device-check                       # or: bash scripts/device-check.sh
#   OUT=/some/dir PYTHON=/path/to/python bash scripts/device-check.sh
#
# Steps, each under `timeout` and never past the budget: the environment (nvidia-smi, torch/CUDA/NCCL
# versions, devices, `npudist doctor --json` summary); on a GPU host only, the set-up described below;
# `pytest -m cuda tests/cuda` (each test has its own time limit too); `npudist bench collective --op
# all_reduce` with one rank per device; benchmarks/checkpoint_gpu.py (4 GiB async checkpoint, npudist vs DCP).
# Everything goes to $OUT (default runs/device-check/<UTC time>):
# summary.json, env.json, doctor.json, pytest-cuda.xml, bench-all_reduce.json and one NAME.log per step.
# The last line printed is `device-check: N passed, M failed, K skipped`, counting the cuda tests, the
# benchmark and, where nvidia-smi lists a GPU, whether torch can use it. Exit 1 if anything failed.
# Without a GPU every cuda test is skipped with its reason, the benchmark too, and the exit code is 0.
#
# Python: $PYTHON, else the project's virtual environment (.venv/bin/python), else python3; it imports
# this checkout's src through PYTHONPATH, so nothing has to be installed where that Python already has
# npudist's dependencies. Set-up, only where nvidia-smi lists a GPU: if the installed torch has no CUDA
# (or none is importable), `pip install` torch of the same version (NPUDIST_TORCH_CUDA overrides the
# requirement; PIP_INDEX_URL chooses the index; Linux wheels on the default index are CUDA builds), and
# any missing dependency (nvidia-ml-py for NVML among them). GPU hosts are often offline: there pip
# fails within its own timeouts, the step is logged, and the checks that needed it fail with the reason.
# Nothing is ever installed on a host without a GPU.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/runs/device-check/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=python3
fi
if [[ "$PY" == */* && "$PY" != /* ]]; then PY=$PWD/$PY; fi  # a relative path means the caller's directory
cd "$ROOT" || exit 2
if ! "$PY" -c 'import sys' >/dev/null 2>&1; then
  echo "cannot run Python '$PY'; set PYTHON=/path/to/python"
  echo "device-check: 0 passed, 1 failed, 0 skipped"
  exit 1
fi

for f in started.json steps.tsv summary.json env.json doctor.json pytest-cuda.xml bench-all_reduce.json \
  nvidia-smi.log env.log install-torch.log install-deps.log doctor.log pytest-cuda.log bench-all_reduce.log \
  bench-checkpoint.json bench-checkpoint.log; do
  rm -f "${OUT:?}/$f"  # a previous run's files in the same directory
done
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-470}
REPORT_RESERVE_S=15
printf '{"started_at": "%s", "epoch": %s}\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(date +%s)" >"$OUT/started.json"
echo "== device check: python $PY, results in $OUT, budget ${BUDGET_S} s"

# Seconds a step may take: what it asks for, within what is left of the budget (the report's share kept).
limit_for() {
  local left=$((BUDGET_S - REPORT_RESERVE_S - SECONDS))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

skip_step() {  # NAME REASON
  printf '%s\tskipped\t\t0\t\t%s\n' "$1" "$2" >>"$OUT/steps.tsv"
  echo "== $1: skipped: $2"
}

# step NAME SECONDS CMD...: CMD under `timeout` (its process group is killed at the limit), output to the
# screen and $OUT/NAME.log, one line in $OUT/steps.tsv; returns CMD's exit status (124/137: timed out).
step() {
  local name=$1 lim; lim=$(limit_for "$2"); shift 2
  if [ "$lim" -lt 5 ]; then
    skip_step "$name" "no time left in the ${BUDGET_S} s budget"
    return 124
  fi
  echo "== $name (limit ${lim} s)"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$lim" "$@" </dev/null 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  printf '%s\tran\t%s\t%s\t%s\t%s.log\n' "$name" "$rc" "$((SECONDS - t0))" "$lim" "$name" >>"$OUT/steps.tsv"
  return "$rc"
}

env_field() {  # one field of env.json ("" when absent)
  "$PY" -c 'import json, sys
v = json.load(open(sys.argv[1])).get(sys.argv[2])
print(" ".join(v) if isinstance(v, list) else ("" if v is None else v))' "$OUT/env.json" "$1" 2>/dev/null
}

# 1. Environment.
if command -v nvidia-smi >/dev/null 2>&1; then
  step nvidia-smi 30 bash -c 'nvidia-smi -L && nvidia-smi --format=csv \
    --query-gpu=index,name,memory.total,driver_version,compute_mode,power.draw,temperature.gpu,clocks.sm'
else
  skip_step nvidia-smi "nvidia-smi is not on PATH"
fi
gpus_listed=$(grep -c '^GPU [0-9]*:' "$OUT/nvidia-smi.log" 2>/dev/null)
gpus_listed=${gpus_listed:-0}
step env 60 "$PY" scripts/device_check.py env "$OUT"

# 2. Set-up, on a GPU host only.
if [ "$gpus_listed" -gt 0 ]; then
  if [ -z "$(env_field torch_cuda)" ]; then
    version=$(env_field torch)
    spec=${NPUDIST_TORCH_CUDA:-torch${version:+==${version%%+*}}}
    # --no-deps first: pip fetches the wheel before it removes the CPU build, so an offline host keeps it;
    # the second call adds the CUDA libraries the new wheel requires.
    step install-torch 300 bash -c '"$0" -m pip install --retries 1 --timeout 30 --force-reinstall --no-deps "$1" &&
      "$0" -m pip install --retries 1 --timeout 30 "$1"' "$PY" "$spec"
    step env 60 "$PY" scripts/device_check.py env "$OUT"
  fi
  missing=$(env_field missing)
  if [ -n "$missing" ]; then
    # shellcheck disable=SC2086  # one requirement per word
    step install-deps 120 "$PY" -m pip install --retries 1 --timeout 30 $missing
  fi
fi
step doctor 60 bash -c '"$0" -m npudist doctor --json >"$1"' "$PY" "$OUT/doctor.json"
"$PY" scripts/device_check.py doctor "$OUT"

# 3. The cuda tests.
step pytest-cuda 330 "$PY" -m pytest -m cuda tests/cuda -v -p no:cacheprovider --junitxml="$OUT/pytest-cuda.xml"

# 4. The collective benchmark, one rank per device.
devices=$(env_field cuda_device_count)
if [ "${devices:-0}" -ge 1 ] 2>/dev/null; then
  lim=$(limit_for 120)
  step bench-all_reduce "$lim" "$PY" -m npudist bench collective --op all_reduce --nproc "$devices" \
    --min-bytes 1K --max-bytes 256M --blocks 2 --iters 20 --timeout $((lim > 25 ? lim - 15 : 10)) \
    --out "$OUT/bench-all_reduce.json"
else
  skip_step bench-all_reduce "$(env_field cuda_reason)"
fi

# 5. Asynchronous checkpoint cost of 4 GiB of CUDA state, npudist against DCP (benchmarks/checkpoint_gpu.py);
# the example's checkpoint-and-resume on CUDA is a cuda test above (tests/cuda/test_train_cuda.py).
if [ "${devices:-0}" -ge 1 ] 2>/dev/null; then
  step bench-checkpoint 120 "$PY" benchmarks/checkpoint_gpu.py --size-gib 4 --saves 3 --out "$OUT/bench-checkpoint.json"
else
  skip_step bench-checkpoint "$(env_field cuda_reason)"
fi

# 6. The summary; its last line is the result.
"$PY" scripts/device_check.py report "$OUT"
