# The two commands at the top of README.md. Both do their own set-up on a fresh machine.
PYTHON ?= python3
STEPS ?= 100

.PHONY: setup demo test lint

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

demo: setup
	$(PYTHON) -m npudist launch --nproc-per-node 2 examples/train_ddp.py --steps $(STEPS)

test: setup
	$(PYTHON) -m ruff check src tests examples
	$(PYTHON) -m pytest -q

lint:
	$(PYTHON) -m ruff check src tests examples
