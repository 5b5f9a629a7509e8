"""Wall time of building each factorization (docs/algorithms.md §3).

Prints one JSON row per (mechanism, n): ``{mechanism, n, seconds, iterations, loss}``
(``loss`` at single-participation sensitivity, prefix-sum workload). The disk cache is
bypassed so that every row is a real computation. Timings are not asserted anywhere.

Usage::

    .venv/bin/python benchmarks/factorize_times.py                 # dense at n = 256 and more
    .venv/bin/python benchmarks/factorize_times.py --n 64 256 --mechanisms dense sqrt
    .venv/bin/python benchmarks/factorize_times.py --threads 1      # pin BLAS threads

BLAS threading matters a lot on a shared machine: on a loaded 2-core box a 256×256
``eigh`` took ~10× longer with 2 BLAS threads than with 1. ``--threads`` sets
``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` before numpy is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the process exit status.

    Parameters
    ----------
    argv : list of str or None, optional
        Command-line arguments (default ``None`` = ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[64, 128, 256], help="rounds")
    parser.add_argument(
        "--mechanisms",
        nargs="+",
        default=["identity", "sqrt", "tree", "dense", "dpmf_plus"],
        help="mechanisms to time (default: all)",
    )
    parser.add_argument("--tol", type=float, default=1e-10, help="dense tolerance (1e-10)")
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: library default)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
        if "numpy" in sys.modules:
            print("warning: numpy already imported; --threads may not apply", file=sys.stderr)

    from fedsim.privacy.mechanisms.dense import factorize_dense
    from fedsim.privacy.mechanisms.dpmf_plus import factorize_dpmf_plus
    from fedsim.privacy.mechanisms.identity import identity
    from fedsim.privacy.mechanisms.sqrt import sqrt_toeplitz
    from fedsim.privacy.mechanisms.tree import tree
    from fedsim.privacy.workloads import prefix_sum

    families = {
        "identity": lambda A: identity(A),
        "tree": lambda A: tree(A.shape[0], A=A),
        "sqrt": lambda A: sqrt_toeplitz(A),
        "dense": lambda A: factorize_dense(A, tol=args.tol, cache=False),
        "dpmf_plus": lambda A: factorize_dpmf_plus(A, tol=args.tol, cache=False),
    }

    for n in args.n:
        A = prefix_sum(n)
        for mech in args.mechanisms:
            if mech == "tree" and n & (n - 1):
                continue
            start = time.perf_counter()
            f = families[mech](A)
            seconds = time.perf_counter() - start
            row = {
                "mechanism": mech,
                "n": n,
                "seconds": round(seconds, 4),
                "iterations": f.info.get("iterations"),
                "loss": f.loss(),
                "threads": os.environ.get("OMP_NUM_THREADS", "default"),
            }
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
