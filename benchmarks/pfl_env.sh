#!/usr/bin/env bash
# Build pfl-research's own environment for benchmarks/throughput.py's pfl rows, once.
# pfl 0.6.0 pins dp-accounting 0.5.1, so it can never share fedsim's .venv. Torch is installed first
# and pinned (an unpinned torch pulls a multi-GB CUDA build); pydantic lets the worker import
# fedsim.models (PYTHONPATH=the repository), so pfl trains the very same model.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-pfl
[ -x "$VENV/bin/python" ] || python3.11 -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q "pfl[pytorch]==0.6.0" "$(grep -i '^pydantic==' requirements/lock.txt)"
"$VENV/bin/python" -c "import pfl, torch; print('pfl', pfl.__version__, 'torch', torch.__version__)"
