"""Time the banded and BLT optimisers (docs/algorithms.md §3) on the prefix-sum workload.

Prints one JSON object per line:
``{"mechanism", "n", "bands" | "buffers", "seconds", "iterations", "loss", ...}``.

Usage::

    .venv/bin/python benchmarks/factorize_banded_blt.py            # banded n=256 b=16, blt n=2048 m=4
    .venv/bin/python benchmarks/factorize_banded_blt.py --full     # adds banded n=2048 b=64 (minutes)

``--threads`` sets torch's intra-op threads (default 1, the project default
``OMP_NUM_THREADS=1``; the banded optimiser issues many small BLAS calls, and on a
busy machine extra threads make it slower, not faster).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import numpy as np
import torch

from fedsim.privacy.mechanisms.banded import optimize_banded
from fedsim.privacy.mechanisms.blt import optimize_blt


def _row(mechanism: str, size_key: str, size: int, info: dict) -> dict:
    return {
        "mechanism": mechanism,
        "n": info["n"],
        size_key: size,
        "seconds": round(float(info["seconds"]), 3),
        "iterations": int(info["iterations"]),
        "loss": float(info["loss"]),
        "max_error": float(info["max_error"]),
        "converged": bool(info["converged"]),
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark cases and print one JSON line per case.

    Parameters
    ----------
    argv : list of str or None, default None
        Command-line arguments (``sys.argv[1:]`` when None): ``--full`` adds the
        banded ``n = 2048, b = 64`` case; ``--threads N`` (default 1).

    Returns
    -------
    int
        Exit status (0).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also run banded n=2048, b=64 (several minutes)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))

    cases: list[tuple[str, int, int]] = [("banded", 256, 16)]
    if args.full:
        cases.append(("banded", 2048, 64))
    cases.append(("blt", 2048, 4))

    print(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "python": sys.version.split()[0],
                "torch": torch.__version__,
            }
        ),
        flush=True,
    )
    for mechanism, n, size in cases:
        if mechanism == "banded":
            _, info = optimize_banded(np.tril(np.ones((n, n))), size)
            print(json.dumps(_row("banded", "bands", size, info)), flush=True)
        else:
            _, _, info = optimize_blt(n, size)
            print(json.dumps(_row("blt", "buffers", size, info)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
