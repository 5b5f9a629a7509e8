# Sourced by the scripts that run on a lent CUDA machine (benchmarks/gpu_rows.sh,
# experiments/so_lstm_regime.sh), from the repository root: installs the wheels of
# benchmarks/gpu_wheels.sh (carried as .whl/) into /tmp/site, and sets PY (that machine's Python,
# or $PYTHON), OUT (a temporary folder when unset) and the environment fedsim's processes run
# with there (no telemetry, no hub, one OpenMP thread, fedsim from this source tree). Exits 3
# when the wheels are missing.
OUT=${OUT:-$(mktemp -d)}
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || {
    echo "$(basename "$0"): installing .whl/ failed: run benchmarks/gpu_wheels.sh here and carry .whl" >&2
    exit 3
}
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 FLWR_TELEMETRY_ENABLED=0 HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1 FLWR_HOME="$(mktemp -d)" RAY_TMPDIR="$(mktemp -d)"
