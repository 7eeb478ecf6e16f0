#!/usr/bin/env bash
# Every benchmark behind a README table, one after another, each output saved under OUT (default
# bench-results/). Run on a quiet machine: each table is a ratio against a baseline measured in the
# same run, but neighbours' load still widens the spread.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
run() {
  local name=$1; shift
  echo "== $name: $*" | tee "$OUT/$name.txt"
  timeout 1200 "$@" 2>&1 | tee -a "$OUT/$name.txt"
}
run allreduce python -m npudist bench collective --op all_reduce --nproc 2 --min-bytes 1M --max-bytes 64M \
  --dtype float32 --baseline
run strict python -m npudist bench collective --op all_reduce --nproc 2 --min-bytes 16M --max-bytes 16M \
  --dtype bfloat16 --profile hccl-strict --odd --baseline --baseline-dtype float32
run strict_bf16 python -m npudist launch --nproc-per-node 2 benchmarks/strict_bf16.py --iters 15
run bucketing python -m npudist launch --nproc-per-node 2 benchmarks/bucketing.py --blocks 3 --iters 30
run comm_overhead python -m npudist launch --nproc-per-node 2 benchmarks/comm_overhead.py --samples 60
run telemetry_overhead python benchmarks/telemetry_overhead.py --pairs 4 --steps 200
run loop_hook_cost python benchmarks/loop_hook_cost.py --steps 3000 --repeats 6
run phase_cost python benchmarks/phase_cost.py
run telemetry_ab python benchmarks/telemetry_ab.py --pairs 12 --block 300
run telemetry_ab_null python benchmarks/telemetry_ab.py --pairs 12 --block 300 --aa
run telemetry_ab_calibration python benchmarks/telemetry_ab.py --pairs 12 --block 300 --inject-ms 0.2
run scrape_latency python benchmarks/scrape_latency.py --seconds 5
run scrape_hostile_ab python benchmarks/scrape_latency.py --ab 6 --block 3
run ddp_ab python -m npudist launch --nproc-per-node 2 benchmarks/ddp_ab.py --pairs 10 --block 200
run ddp_ab_null python -m npudist launch --nproc-per-node 2 benchmarks/ddp_ab.py --pairs 10 --block 200 --aa
command -v valgrind >/dev/null && run cpu_cost python benchmarks/cpu_cost.py
run fault_tolerance python benchmarks/fault_tolerance.py --repeats 3
run ops_infer python benchmarks/bench_ops_infer.py
