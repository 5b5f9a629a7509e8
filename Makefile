# fedsim — the two commands a new user needs are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.fedsim-installed
TORCH  := torch==2.13.0

# Environment for Flower and Ray: no telemetry, no hub access, one thread per op.
export FLWR_TELEMETRY_ENABLED := 0
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export OMP_NUM_THREADS ?= 1
export RAY_DEDUP_LOGS := 0

.PHONY: install run lint test test-slow clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements/lock.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -c requirements/lock.txt -c requirements/torch.txt -e ".[test,tracking,sweep]"
	touch $(STAMP)

run: install
	$(VENV)/bin/fedsim run

# ruff (lint, complexity ≤ 15, format) and mypy (strict for fedsim/privacy), then the tests
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -q

test-slow: install
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs .pytest_cache
