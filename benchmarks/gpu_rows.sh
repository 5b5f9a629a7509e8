#!/usr/bin/env bash
# The GPU checks and rows of issue 18, as one command for a lent CUDA machine (its image has
# Python 3.12 with PyTorch and no network; see benchmarks/gpu_wheels.sh for what travels).
#
# Here, once:  bash benchmarks/gpu_wheels.sh          (writes .whl/, about 22 MB, ignored by git)
# There:       the device tool's run with command "bash benchmarks/gpu_rows.sh", carry [".whl"],
#              timeout_s 560 (about 4-6 minutes of work).
#
# It installs the wheels, then writes to $OUT (a temporary folder when unset):
#   device.txt          the GPU and torch version;
#   tests.txt           pytest of tests/gpu (noise rows on the GPU against the CPU's, LSTM users
#                       batched on the GPU against sequential and the CPU, an in-process run);
#   throughput_gpu.json benchmarks/throughput.py --device cuda on W1 and the SO LSTM (the floor
#                       on the GPU, fedsim in-process with its LSTM users one by one and batched;
#                       SYSTEMS overrides the list, e.g. to add fedsim-inprocess, vectorize = auto);
#   throughput_gpu.log  its progress and any system's error (--keep-going);
#   streams.json        benchmarks/gpu_streams.py: 20 users' local steps with plain copies, queued
#                       copies, a CUDA stream per user, and replayed CUDA graphs (sim.cuda_graphs);
#   factorize_gpu.jsonl fedsim factorize --mechanism dense --device cuda at n = FACTORIZE_N
#                       (default 512 1024 2048), FACTORIZE_S seconds at most each (default 60).
# ROUNDS (default 6), SYSTEMS and BENCH_S (the benchmark's time limit, default 330 s) can be set.
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
export PYTHONPATH="$PYTHONPATH:$PWD/tests"  # tests/helpers.py
{ nvidia-smi -L; "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"; } \
    >"$OUT/device.txt" 2>&1
# importlib mode: fedsim runs from the source tree here (PYTHONPATH), and pytest's default mode
# would put tests/ first on sys.path, where tests/strategies hides the top-level strategies package
# (tests/ comes last on PYTHONPATH instead, for tests/helpers.py)
timeout 150 "$PY" -m pytest -q -p no:cacheprovider --import-mode=importlib tests/gpu >"$OUT/tests.txt" 2>&1
echo "tests/gpu exit $?" >>"$OUT/tests.txt"
timeout "${BENCH_S:-330}" "$PY" benchmarks/throughput.py --device cuda --workloads w1 so_lstm \
    --systems ${SYSTEMS:-floor fedsim-inprocess-seq fedsim-inprocess-batched} \
    --rounds "${ROUNDS:-6}" --reps 1 --keep-going --json >"$OUT/throughput_gpu.json" 2>"$OUT/throughput_gpu.log"
echo "throughput exit $?" >>"$OUT/throughput_gpu.log"
# the users' steps four ways in one process: plain copies, queued copies, a stream per user, CUDA graphs
timeout 120 "$PY" benchmarks/gpu_streams.py --rounds 4 --json >"$OUT/streams.json" 2>"$OUT/streams.log" ||
    echo "gpu_streams exit $?" >>"$OUT/streams.log"
# the dense optimiser's GPU path (fedsim factorize --device cuda) at three sizes, each timed by
# the command itself ("seconds"); on a fresh machine nothing is cached
for n in ${FACTORIZE_N:-512 1024 2048}; do
    timeout "${FACTORIZE_S:-60}" "$PY" -m fedsim.cli factorize --mechanism dense --rounds "$n" --device cuda --json \
        >>"$OUT/factorize_gpu.jsonl" 2>>"$OUT/factorize_gpu.log" || echo "factorize n=$n exit $?" >>"$OUT/factorize_gpu.log"
done
cat "$OUT/device.txt" "$OUT/tests.txt"
tail -c 3000 "$OUT/throughput_gpu.log"
cat "$OUT/throughput_gpu.json"
cat "$OUT/streams.json"
cat "$OUT/factorize_gpu.jsonl" "$OUT/factorize_gpu.log" 2>/dev/null
