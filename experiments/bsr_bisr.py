"""BSR and BISR against sqrt, banded and BLT: factorization loss and sensitivity.

For n = 256 and n = 2048 and three participation schemes — single participation (k = 1) and
``min_sep`` with b = 16 and b = 32 (k = n/b, the multi-epoch setting of both papers) — plans
every mechanism with :func:`fedsim.privacy.mechanisms.plan_mf` and reports
:func:`factorization_quality` (``loss = sens²·‖B‖_F²``, ``max_error = sens²·max_t ‖B[t,:]‖²``, in
units of (c·z)²), ``sens`` and whether it is exact, and the seconds the plan took.

Bands follow the papers: ``b = min_sep`` for banded, BSR and BISR under ``min_sep``, and
``b = n`` under single participation (where banded's b = n is the ``dense`` optimum). BLT has
its default 4 buffers. ``bisr b=n`` is BISR with the full inverse square root, i.e. the
``sqrt`` mechanism's C with BISR's exact Toeplitz sensitivity (``sqrt`` itself gets the generic
upper bound under ``min_sep``). Then a sweep of BISR's bands at n = 2048, ``min_sep`` b = 32.
With ``--momentum`` the n = 256 settings are repeated for the momentum workload (β = 0.9; BLT
supports only the prefix sum).

Each plan runs in its own process with a wall-clock limit (``--timeout``, default 600 s); an
arm over the limit is reported as skipped. Prints JSON lines while it runs, then markdown
tables, and writes all rows to ``--out``.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python experiments/bsr_bisr.py [--n 256 2048] [--momentum] \
        [--timeout 600] [--out experiments/bsr_bisr.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("FEDSIM_CACHE", tempfile.mkdtemp(prefix="fedsim-bsr-bisr-"))  # cold cache: honest times

MECHANISMS = ("bsr", "bisr", "sqrt", "banded", "blt")
SWEEP_BANDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 2048)


def plan_one(arm: dict[str, Any]) -> dict[str, Any]:
    """Plan one arm and measure it (runs in a child process)."""
    import torch

    from fedsim.privacy.mechanisms import factorization_quality, plan_mf, workload_matrix
    from fedsim.privacy.participation import make_scheme

    torch.set_num_threads(1)
    n, b, k = arm["n"], arm["min_sep"], arm["k"]
    if b is None:
        scheme = make_scheme("single", 10 * n, 10, rounds=n)
    else:
        scheme = make_scheme("min_sep", 10 * n, None, min_sep=b, max_participations=k, rounds=n)
    opts = {"bands": arm["bands"]} if arm["bands"] is not None else {}
    t0 = time.perf_counter()
    plan = plan_mf(arm["mechanism"], scheme, n, workload=arm["workload"], momentum=0.9, **opts)
    seconds = time.perf_counter() - t0
    q = factorization_quality(plan, workload_matrix(arm["workload"], n, 0.9))
    return {
        **arm,
        **q,
        "sensitivity": plan.sens,
        "sensitivity_exact": plan.sens_exact,
        "seconds": seconds,
        "iterations": plan.info.get("iterations"),
    }


def _child(arm: dict[str, Any], queue: Any) -> None:
    try:
        queue.put(plan_one(arm))
    except Exception as exc:  # reported in the table, not raised
        queue.put({**arm, "error": f"{type(exc).__name__}: {exc}"})


def run_arm(arm: dict[str, Any], timeout: float) -> dict[str, Any]:
    """:func:`plan_one` in a child process, stopped after ``timeout`` seconds."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(arm, queue))
    t0 = time.perf_counter()
    proc.start()
    try:
        row: dict[str, Any] = queue.get(timeout=timeout)
    except Exception:
        proc.terminate()  # the child this function started
        row = {**arm, "skipped": f"over {timeout:.0f} s"}
    proc.join()
    row["wall_seconds"] = time.perf_counter() - t0
    return row


def arms(ns: list[int], momentum: bool) -> list[dict[str, Any]]:
    """The comparison arms, then the BISR bands sweep."""
    out: list[dict[str, Any]] = []
    settings = [("prefix", n, b) for n in ns for b in (None, 16, 32)]
    if momentum:
        settings += [("momentum", 256, b) for b in (None, 16, 32)]
    for workload, n, b in settings:
        k = 1 if b is None else n // b
        for mech in MECHANISMS:
            if mech == "blt" and workload != "prefix":
                continue
            # bands None: the default, min_sep (or n under single participation)
            out.append(
                {"part": "main", "workload": workload, "n": n, "min_sep": b, "k": k, "mechanism": mech, "bands": None}
            )
        if b is not None:
            out.append(
                {"part": "main", "workload": workload, "n": n, "min_sep": b, "k": k, "mechanism": "bisr", "bands": n}
            )
    if 2048 in ns:
        for bands in SWEEP_BANDS:
            out.append(
                {
                    "part": "sweep",
                    "workload": "prefix",
                    "n": 2048,
                    "min_sep": 32,
                    "k": 64,
                    "mechanism": "bisr",
                    "bands": bands,
                }
            )
    return out


def label(row: dict[str, Any]) -> str:
    mech, bands, n = row["mechanism"], row["bands"], row["n"]
    if mech in ("bsr", "bisr", "banded"):
        b = bands if bands is not None else (row["min_sep"] or n)
        return f"{mech} b={'n' if b == n else b}"
    return "blt m=4" if mech == "blt" else mech


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of the rows."""
    head = "| workload | n | scheme | mechanism | sens | exact | loss | max_error | seconds |\n"
    head += "|---|---:|---|---|---:|:---:|---:|---:|---:|\n"
    lines = []
    for r in rows:
        scheme = "single (k=1)" if r["min_sep"] is None else f"min_sep b={r['min_sep']}, k={r['k']}"
        start = f"| {r['workload']} | {r['n']} | {scheme} | {label(r)} |"
        if "skipped" in r or "error" in r:
            lines.append(f"{start} — | — | {r.get('skipped') or r.get('error')} | — | {r['wall_seconds']:.0f} |")
            continue
        exact = "yes" if r["sensitivity_exact"] else "bound"
        lines.append(
            f"{start} {r['sensitivity']:.4g} | {exact} | {r['loss']:.5g} | {r['max_error']:.4g} | {r['seconds']:.2f} |"
        )
    return head + "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[256, 2048])
    ap.add_argument("--momentum", action="store_true", help="also the momentum workload (β = 0.9) at n = 256")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per arm before it is skipped")
    ap.add_argument("--out", default="experiments/bsr_bisr.json")
    args = ap.parse_args()
    rows = []
    for arm in arms(args.n, args.momentum):
        rows.append(run_arm(arm, args.timeout))
        print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    print("\n## Comparison\n")
    print(table([r for r in rows if r["part"] == "main"]))
    print("\n## BISR bands sweep (n = 2048, min_sep b = 32, k = 64)\n")
    print(table([r for r in rows if r["part"] == "sweep"]))


if __name__ == "__main__":
    main()
