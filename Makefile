# The two commands at the top of README.md. Both do their own set-up on a fresh machine.
PYTHON ?= python3
STEPS ?= 100
METRICS_PORT ?= 9500
RUN_DIR ?= runs/demo

PROM_PORT ?= 10190
EXPORTER_PORT ?= 9400
OBSERVE_STEPS ?= 20000

.PHONY: setup demo test check lint observe

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

# Telemetry on: each rank serves Prometheus metrics on 127.0.0.1:$(METRICS_PORT)+local_rank while it
# trains, the targets file lists them, and the run directory gets checkpoints and the run log.
# A run directory that already holds the checkpoint of step STEPS is finished: no ranks are started for it.
demo: setup
	@if [ -f "$(RUN_DIR)/$$(printf 'step-%08d' $(STEPS))/manifest.json" ]; then \
		echo "demo: $(RUN_DIR) already finished step $(STEPS), so no ranks were started; train on with" \
			"make demo STEPS=$$(( $(STEPS) * 2 )), or start over with rm -rf $(RUN_DIR)"; \
	else \
		echo $(PYTHON) -m npudist launch --nproc-per-node 2 --metrics-port $(METRICS_PORT) \
			--targets-file $(RUN_DIR)/targets.json examples/train_ddp.py --steps $(STEPS) --run-dir $(RUN_DIR); \
		$(PYTHON) -m npudist launch --nproc-per-node 2 --metrics-port $(METRICS_PORT) \
			--targets-file $(RUN_DIR)/targets.json examples/train_ddp.py --steps $(STEPS) --run-dir $(RUN_DIR); \
	fi
	$(PYTHON) -m npudist report $(RUN_DIR) -o $(RUN_DIR)/report.html

# The demo, long enough to watch (OBSERVE_STEPS, about 10 minutes on a laptop CPU), under a real Prometheus
# on 127.0.0.1:$(PROM_PORT) that scrapes its ranks and `npudist exporter` for this host's devices (on
# 127.0.0.1:$(EXPORTER_PORT)) and evaluates npudist's alert rules; prints the URL. Prometheus keeps
# answering after the job ends, until Ctrl-C.
observe: setup
	$(PYTHON) -m npudist observe --targets-file $(RUN_DIR)/targets.json --port $(PROM_PORT) \
		--exporter-port $(EXPORTER_PORT) -- \
		$(PYTHON) -m npudist launch --nproc-per-node 2 --metrics-port $(METRICS_PORT) \
		--targets-file $(RUN_DIR)/targets.json examples/train_ddp.py --steps $(OBSERVE_STEPS) --run-dir $(RUN_DIR)

# The test tiers (tests/process_guard.py): `slow` marks every test that starts a process (marked subprocess,
# ranks, cluster or e2e; a test that starts one unmarked fails), so `-m "not slow"` starts none and runs on
# PYTEST_WORKERS pytest-xdist workers. The tests that start one process each (only `subprocess`: a CLI, a tool,
# a script) run there too; the rest of the slow tier runs serially: its multi-rank tests bind ports and time
# their ranks, and must not share the cores with each other.
PYTEST_WORKERS ?= 2
ONE_PROCESS = subprocess and not ranks and not cluster and not e2e

# The development loop: ruff and the tier that starts no process, in parallel (a few minutes on 2 cores).
check: setup
	$(PYTHON) -m ruff check src tests examples benchmarks
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow"

# Everything (what CI and the README run): the check tier and the one-process tests in parallel, then the rest
# of the slow tier serially; both run whatever the first gave, so one CI log shows every failure.
test: setup
	$(PYTHON) -m ruff check src tests examples benchmarks
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow or ($(ONE_PROCESS))"; fast=$$?; \
		$(PYTHON) -m pytest -q -m "slow and not ($(ONE_PROCESS))"; slow=$$?; \
		[ $$fast -eq 0 ] && [ $$slow -eq 0 ]

lint:
	$(PYTHON) -m ruff check src tests examples benchmarks

# The prepared GPU check (scripts/device-check.sh): cuda tests, NVML, the NCCL benchmark, in under 8 minutes;
# results in $(OUT) when set, else runs/device-check/<time>. Skips everything, with reasons, without a GPU.
.PHONY: device-check
device-check:
	PYTHON=$(PYTHON) bash scripts/device-check.sh

# rknn-toolkit2's own environment (CPython 3.11, x86_64): `npudist edge convert` and the RKNN simulator.
RKNN_VENV ?= .venv-rknn
.PHONY: rknn-env
rknn-env:
	bash scripts/rknn-env.sh $(RKNN_VENV)

# torchtitan 0.3.0's own environment (torch 2.15.0): tests/sim/test_torchtitan.py trains its llama3 debug model on the
# simulated NPU there (NPUDIST_TORCHTITAN_PYTHON=$(TORCHTITAN_VENV)/bin/python).
TORCHTITAN_VENV ?= .venv-torchtitan
.PHONY: torchtitan-env
torchtitan-env:
	bash scripts/torchtitan-env.sh $(TORCHTITAN_VENV)
