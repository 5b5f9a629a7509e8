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

.PHONY: install run lint test test-slow clean images

# Deployment images (docker/Dockerfile): the fedsim wheel, and torch's CPU wheel where pip finds
# one, go into docker/local/wheels/, then one image per role. BASE_IMAGE and TORCH_INDEX_URL are
# passed on when set (docker/base/build-base.sh builds a base without a registry).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
BASE_IMAGE ?=
TORCH_INDEX_URL ?=
BUILD_ARGS := $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) $(if $(TORCH_INDEX_URL),--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL))

install: $(STAMP)

$(STAMP): pyproject.toml requirements/lock.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -c requirements/lock.txt -c requirements/torch.txt -e ".[test,tracking,sweep,docs]"
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

images: install
	rm -f docker/local/wheels/fedsim-*.whl
	$(PIP) wheel --quiet --no-deps --no-build-isolation -w docker/local/wheels .
	-$(PIP) download --quiet --no-deps --only-binary=:all: --index-url $(or $(TORCH_INDEX_URL),https://download.pytorch.org/whl/cpu) -d docker/local/wheels $(TORCH)
	for role in superlink supernode superexec; do \
	  docker build -f docker/Dockerfile --target $$role $(BUILD_ARGS) -t fedsim-$$role:$(VERSION) . || exit 1; \
	done
