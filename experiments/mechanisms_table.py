"""Experiment (a): factorization quality against n (single participation, prefix-sum workload).

For each n and family, runs ``fedsim factorize`` in-process (cache disabled where the
family caches, so wall times are honest) and prints a JSON list and a markdown table of
``loss`` = sens²·‖B‖_F² and ``max_error`` = sens²·max_t‖B[t,:]‖² (units of (c·z)²) and
the wall time.

Usage: ``OMP_NUM_THREADS=1 python experiments/mechanisms_table.py [--n 16 64 256 1024]``
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("FEDSIM_CACHE", tempfile.mkdtemp(prefix="fedsim-exp-a-"))  # fresh cache: honest times

from fedsim.privacy.mechanisms import factorization_quality, plan_mf, workload_matrix
from fedsim.privacy.participation import make_scheme

FAMILIES = [
    ("identity (DP-SGD)", "identity", {}),
    ("tree online", "tree", {"tree_estimator": "online"}),
    ("tree full", "tree", {"tree_estimator": "full"}),
    ("sqrt", "sqrt", {}),
    ("dense", "dense", {}),
    ("banded b=16", "banded", {"bands": 16}),
    ("blt m=4", "blt", {"buffers": 4}),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[16, 64, 256, 1024])
    args = ap.parse_args()
    rows = []
    for n in args.n:
        scheme = make_scheme("single", n, 1, rounds=n)
        A = workload_matrix("prefix", n)
        for label, mech, kw in FAMILIES:
            if mech == "banded" and kw["bands"] > n:
                continue
            t0 = time.perf_counter()
            plan = plan_mf(mech, scheme, n, **kw)
            sec = time.perf_counter() - t0
            q = factorization_quality(plan, A)
            rows.append(
                {
                    "family": label,
                    "n": n,
                    **q,
                    "sensitivity": plan.sens,
                    "seconds": sec,
                    "iterations": plan.info.get("iterations"),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print("\n| n | " + " | ".join(f for f, _, _ in FAMILIES) + " |")
    print("|---|" + "---|" * len(FAMILIES))
    for n in args.n:
        cells = []
        for label, _, _ in FAMILIES:
            r = next((r for r in rows if r["n"] == n and r["family"] == label), None)
            cells.append("–" if r is None else f"{r['loss']:.4g} / {r['max_error']:.4g} ({r['seconds']:.2g} s)")
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
