#!/usr/bin/env bash
# Issue 38's GPU row as one command for a lent CUDA machine (Python 3.12 with PyTorch, no network):
# experiments/so_lstm_regime.py's two stages on the GPU, trials side by side.
#
# Here, once:  bash benchmarks/gpu_wheels.sh      (.whl/, the packages that machine lacks)
#              python -c "import sys; sys.path.insert(0, 'experiments'); from pathlib import Path; \
#                  from so_lstm_regime import ensure_data; ensure_data(Path('.sodata/so'), 2000)"
#              (.sodata/, the generated users; ignored by git; generated there when absent)
# There:       the device tool's run with command "bash experiments/so_lstm_regime.sh",
#              carry [".whl", ".sodata"], timeout_s 560.
#
# Writes to $OUT: device.txt (GPU, torch, whether MPS ran), results.jsonl (one line a trial),
# driver.log, driver.json, dmon.txt (the GPU's utilisation every 5 s). PARALLEL (default 12) and
# DEADLINE (seconds for the trials, default 450) can be set; DRIVER_ARGS are passed on to the
# driver (e.g. "--chosen dpsgd=1 ... --eval-seeds 4 5 6" for more evaluation seeds). MPS=0 skips CUDA's multi-process
# service (it lets the trials' small kernels share the device at once rather than in turns).
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
{ nvidia-smi -L; "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"; nproc; } \
    >"$OUT/device.txt" 2>&1
if [ "${MPS:-1}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
    mkdir -p /tmp/mps_pipe /tmp/mps_log
    if nvidia-cuda-mps-control -d && timeout 40 "$PY" -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
        echo "mps: on" >>"$OUT/device.txt"
    else
        echo quit | timeout 10 nvidia-cuda-mps-control
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        echo "mps: failed to start, trials share the device in turns" >>"$OUT/device.txt"
    fi
else
    echo "mps: off" >>"$OUT/device.txt"
fi
(nvidia-smi dmon -s u -d 5 >"$OUT/dmon.txt" 2>&1 &)
mkdir -p .sodata
timeout $(( ${DEADLINE:-450} + 60 )) "$PY" experiments/so_lstm_regime.py run --out /tmp/regime --data .sodata/so \
    --device cuda --parallel "${PARALLEL:-12}" --deadline "${DEADLINE:-450}" ${DRIVER_ARGS:-} >"$OUT/driver.log" 2>&1
echo "driver exit $?" >>"$OUT/driver.log"
cp /tmp/regime/results.jsonl /tmp/regime/driver.json "$OUT/" 2>/dev/null
cat "$OUT/device.txt"
tail -n 60 "$OUT/driver.log"
