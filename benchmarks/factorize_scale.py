"""Factorization cost before and after issue 46's solvers, in one run (CPU time, peak memory, loss).

Each case runs in a fresh child process with ``OMP_NUM_THREADS=1`` (CPU time from
``time.process_time``, which counts every thread of the process; peak memory from ``ru_maxrss``),
once against an older checkout of fedsim (``--before``, e.g. a ``git worktree`` of the commit
before the change) and once against this one, alternating so both see the same machine load. The
disk cache is bypassed. Cases: ``dense`` and ``dpmf_plus`` (single participation, prefix sums) at
``n = 256 … 2048``, ``banded`` with 8 bands at ``n = 1024 … 4096``. Each row is printed as one JSON
line as soon as it is measured (and appended to ``--jsonl``); a table follows at the end.

Usage::

    git worktree add --detach /tmp/fedsim-before <old commit>
    python benchmarks/factorize_scale.py --before /tmp/fedsim-before --jsonl out.jsonl
    python benchmarks/factorize_scale.py --table out.jsonl        # the table of saved rows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES: list[tuple[str, int]] = [
    *[(m, n) for n in (256, 512, 1024, 2048) for m in ("dense", "dpmf_plus")],
    *[("banded", n) for n in (1024, 2048, 4096)],
]


def child(mechanism: str, n: int) -> dict[str, Any]:
    """Factorize the prefix-sum workload for ``n`` rounds with the fedsim on ``sys.path``."""
    import resource
    import time

    import numpy as np
    import torch  # noqa: F401 - imported before the clock starts (newer fedsim imports it lazily)

    from fedsim.privacy.mechanisms.banded import optimize_banded
    from fedsim.privacy.mechanisms.dense import factorize_dense
    from fedsim.privacy.mechanisms.dpmf_plus import factorize_dpmf_plus
    from fedsim.privacy.workloads import prefix_sum

    A = prefix_sum(n)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    if mechanism == "banded":
        _, info = optimize_banded(np.asarray(A), 8)
        loss, extra = float(info["loss"]), {"evaluator": info.get("evaluator", "dense")}
    else:
        make = factorize_dense if mechanism == "dense" else factorize_dpmf_plus
        f = make(A, cache=False)
        info = f.info
        loss, extra = f.loss(), {"rel_gap": info["rel_gap"]}
        if mechanism == "dpmf_plus":
            extra["objective"] = info["objective"]
    cpu = time.process_time() - t0
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {
        "mechanism": mechanism,
        "n": n,
        "cpu_s": cpu,
        "peak_mb": peak,
        "loss": loss,
        "iterations": info.get("iterations"),
        "converged": info.get("converged"),
        **extra,
    }


def run_case(code: Path, mechanism: str, n: int, label: str, timeout: float) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = str(code)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mechanism, str(n)]
    try:
        out = subprocess.run(cmd, env=env, cwd=code, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"mechanism": mechanism, "n": n, "code": label, "error": f"over {timeout:.0f} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"mechanism": mechanism, "n": n, "code": label, "error": out.stderr.strip()[-400:]}
    return {**json.loads(lines[-1]), "code": label}


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table: before and after side by side, with the CPU ratio and the loss change."""
    by = {(r["mechanism"], r["n"], r["code"]): r for r in rows}
    lines = [
        "| mechanism | n | CPU s before | CPU s after | ratio | peak MB before → after | loss before | loss after | rel. change |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mech, n in CASES:
        b, a = by.get((mech, n, "before")), by.get((mech, n, "after"))
        if a is None or "error" in a:
            continue
        if b is None or "error" in b:
            lines.append(
                f"| {mech} | {n:,} | {b.get('error', '—') if b else '—'} | {a['cpu_s']:.1f} | | | | {a['loss']!r} | |"
            )
            continue
        lines.append(
            f"| {mech} | {n:,} | {b['cpu_s']:.1f} | {a['cpu_s']:.1f} | {b['cpu_s'] / a['cpu_s']:.1f}× | "
            f"{b['peak_mb']:.0f} → {a['peak_mb']:.0f} | {b['loss']!r} | {a['loss']!r} | "
            f"{(a['loss'] - b['loss']) / b['loss']:+.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (or one ``--child`` case, or ``--table`` of saved rows).

    Parameters
    ----------
    argv : the command line (default: `sys.argv[1:]`).
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, help="checkout of the older fedsim (omit: after only)")
    ap.add_argument("--jsonl", type=Path, default=None, help="append each row to this file")
    ap.add_argument("--table", type=Path, default=None, help="print the table of a saved --jsonl and stop")
    ap.add_argument("--only", nargs="*", default=None, help="mechanism:n cases, e.g. dense:256 banded:4096")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a case may take (1800)")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))), flush=True)
        return 0
    if args.table:
        rows = [json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]
        print(table(rows))
        return 0
    cases = CASES if not args.only else [(c.split(":")[0], int(c.split(":")[1])) for c in args.only]
    codes = ([("before", args.before)] if args.before else []) + [("after", ROOT)]
    rows = []
    for mech, n in cases:
        for label, code in codes:
            row = run_case(code, mech, n, label, args.timeout)
            print(json.dumps(row), flush=True)
            rows.append(row)
            if args.jsonl is not None:
                with args.jsonl.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
