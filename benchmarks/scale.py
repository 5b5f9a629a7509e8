"""How fedsim's server-side costs grow with the population, the rounds and the model (issue 46).

Three tables, each case in a fresh child process (its peak memory is its own ``ru_maxrss``), CPU
time from ``time.process_time`` (all the process's threads; the machine is shared, so wall time
is not compared), and growth exponents fitted by least squares on log CPU time:

- **population** ``N`` × scheme (``poisson`` with Gaussian noise, keyed ``epochs`` with MF
  identity noise, 256 keyed groups), a synthetic population and a 4-class logistic regression
  on 8 features: building the run; the server's work in a round besides training (sampling
  the cohort, the noise step, the ledger; CPU of the main thread); a checkpoint; and the peak
  memory. Before/after ratios from one run:
  a checkpoint hashing the population each time (before) against once per run (after); ε
  composed on the critical path (before) against prefetched while the round trains (after,
  with a stand-in for training of ``--train-seconds``).
- **factorization** at ``n`` rounds × mechanism: CPU time and peak memory (the disk cache is
  bypassed).
- **noise** ms a row at the last round ``t = n`` of an ``n``-round run, dimension ``d``:
  dense ``C⁻¹`` (as dense, DP-MF+, sqrt and tree noise) redrawing ``ξ_0 … ξ_t`` (before) or
  reading the noise table (after; the table's one-off build is reported, and amortised over the
  ``n`` rows; ``dense_memory`` where all of ``Z`` fits the budget and no table is made),
  against banded (8 bands) and BLT (4 buffers). The memory budget is scaled with
  ``d`` (1 GiB at d = 4,050,748, the Stack Overflow LSTM), so that the history fits for the same
  ~66 rounds at every ``d``.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/scale.py --quick [--json out.json]   # minutes
    OMP_NUM_THREADS=1 python benchmarks/scale.py [--json out.json]           # hours, ~40 GB of disk

``--quick``: N = 10³ … 10⁶, n = 64 … 256, d = 40,507 (a hundredth). Full: N = 10³ … 10⁷,
n = 256 … 4,096 (dense and DP-MF+ to 2,048), d = 4,050,748.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

D_FULL = 4_050_748
BUDGET_FULL = 1 << 30


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu(fn: Any, clock: Any = time.process_time) -> tuple[float, Any]:
    t0 = clock()
    out = fn()
    return clock() - t0, out


def population_case(n_users: int, scheme: str, train_seconds: float) -> dict[str, Any]:
    """Setup, per-round server work, checkpoint and ε costs for ``n_users`` users."""
    import torch

    from fedsim.config import DEFAULT_EXPERIMENT, load_config
    from fedsim.runner.build import build_run
    from fedsim.runner.callbacks import Checkpointer, LedgerFile, population_sha256

    sets = [
        "data.name='synthetic'",
        f"data.num_clients={n_users}",
        "data.samples_per_user=4",
        "data.num_features=8",
        "data.num_classes=4",
        "model.name='logreg'",
        "rounds=256",
        "privacy.noise_multiplier=1.0",
        "sim.engine='inprocess'",
        "sim.num_workers=1",
        "eval.every=0",
        "eval.max_users=1000",  # a seeded thousand, as a user of 10⁶+ users evaluates (not all of them)
    ]
    if scheme == "poisson":
        sets += ["sampling.scheme='poisson'", "sampling.cohort_size=167", "privacy.mechanism='gaussian'"]
    else:
        sets += ["sampling.scheme='epochs'", "sampling.min_sep=256", "privacy.mechanism='identity'"]
    cfg = load_config(DEFAULT_EXPERIMENT, sets)
    setup, run = _cpu(lambda: build_run(cfg))
    server, sampler = run.server, run.sampler
    dim = server.params.numel()

    def server_round(t: int) -> int:
        users = sampler.sample(t)
        server.step(torch.zeros(dim), len(users))
        return len(users)

    # the main thread's CPU (the accountant's and the noise's background threads excluded)
    rounds = [_cpu(lambda t=t: server_round(t), time.thread_time) for t in range(3)]
    with tempfile.TemporaryDirectory(prefix="fedsim-scale-") as tmp:
        ckpt = Checkpointer(LedgerFile())
        ckpt.ledger.on_start(run, Path(tmp), False)
        digest, _ = _cpu(lambda: population_sha256(run.data.names))
        ckpt.on_start(run, Path(tmp), False)
        saves = [_cpu(lambda r=r: ckpt.save(r))[0] for r in (1, 2, 3)]
    row: dict[str, Any] = {
        "table": "population",
        "population": n_users,
        "scheme": scheme,
        "cohort": rounds[-1][1],
        "setup_cpu_s": setup,
        "round_server_cpu_s": min(c for c, _ in rounds[1:]),
        "checkpoint_before_cpu_s": min(saves) + digest,
        "checkpoint_cpu_s": min(saves),
        "peak_mb": _peak_mb(),
    }
    if scheme == "poisson":  # ε on the critical path (before) and prefetched (after), at round 5
        ledger = server.ledger
        inline, _ = _cpu(lambda: ledger._curve._compute(5, 5))
        t0 = time.perf_counter()
        ledger._curve.prefetch(5)
        time.sleep(train_seconds)  # the round's training, which the accountant thread overlaps
        ledger._curve(5)
        waited = max(0.0, time.perf_counter() - t0 - train_seconds)
        row.update({"epsilon_inline_cpu_s": inline, "epsilon_critical_path_s": waited})
    return row


def factorization_case(mechanism: str, n: int) -> dict[str, Any]:
    """CPU time and peak memory of factorizing the prefix-sum workload for ``n`` rounds."""
    import numpy as np
    import torch  # noqa: F401 - fedsim imports it lazily; its import is not the factorization's cost

    from fedsim.privacy.mechanisms.banded import optimize_banded
    from fedsim.privacy.mechanisms.blt import optimize_blt
    from fedsim.privacy.mechanisms.dense import factorize_dense
    from fedsim.privacy.mechanisms.dpmf_plus import factorize_dpmf_plus
    from fedsim.privacy.mechanisms.tree import tree
    from fedsim.privacy.workloads import prefix_sum

    A = prefix_sum(n)
    base = _peak_mb()
    make = {
        "dense": lambda: factorize_dense(A, cache=False),
        "dpmf_plus": lambda: factorize_dpmf_plus(A, cache=False),
        "banded": lambda: optimize_banded(np.asarray(A), 8),
        "tree": lambda: tree(n, A=A),
        "blt": lambda: optimize_blt(n, 4),
    }[mechanism]
    seconds, _ = _cpu(make)
    return {"table": "factorization", "mechanism": mechanism, "n": n, "cpu_s": seconds, "peak_mb": _peak_mb() - base}


def noise_case(mechanism: str, n: int, d: int) -> dict[str, Any]:
    """CPU ms of the noise row of round ``n`` (the last) of an ``n``-round run at dimension ``d``."""
    import numpy as np
    import torch
    from scipy.linalg import solve_triangular, toeplitz

    from fedsim.privacy.mechanisms.banded import BandedStream
    from fedsim.privacy.mechanisms.blt import BLTStream
    from fedsim.privacy.mechanisms.sqrt import sqrt_toeplitz_coefficients
    from fedsim.privacy.noise import MatrixStream, NoiseMechanism

    torch.set_num_threads(1)
    t = n - 1
    budget = max(1, int(BUDGET_FULL * d / D_FULL))
    row: dict[str, Any] = {"table": "noise", "mechanism": mechanism, "n": n, "d": d}
    if mechanism in ("dense_redraw", "dense_table"):
        M = solve_triangular(np.tril(toeplitz(sqrt_toeplitz_coefficients(n))), np.eye(n), lower=True)
        stream = MatrixStream(M, 1.0, name="dense", memory_budget=budget)
        noise = NoiseMechanism(d, 0, "cpu", stream)
        if mechanism == "dense_table":  # the table in a private temporary folder, removed at exit
            folder = Path(tempfile.mkdtemp(prefix="fedsim-scale-table-"))
            atexit.register(shutil.rmtree, folder, True)
            noise.set_scratch(folder)
            if stream.history_fits():  # all of Z fits the budget: kept in memory, no table
                row["mechanism"] = "dense_memory"
            else:
                build, _ = _cpu(lambda: noise.row(0))
                row["table_build_cpu_s"] = build
                row["table_gb"] = n * d * 4 / 1e9
        else:
            stream.set_scratch(None)
    elif mechanism == "banded":
        rng = np.random.default_rng(0)
        C = np.tril(rng.uniform(-0.1, 0.1, (n, n)))
        C[np.tril_indices(n, -8)] = 0.0
        C[np.diag_indices(n)] = 1.0
        banded = BandedStream(C, 1.0)
        noise = NoiseMechanism(d, 0, "cpu", banded)
        banded.next_t = t
        banded._ring().normal_()  # the state of round t: b − 1 stored rows
    else:
        blt = BLTStream(np.array([0.99, 0.9, 0.6, 0.2]), np.array([0.05, 0.1, 0.1, 0.1]), 1.0)
        noise = NoiseMechanism(d, 0, "cpu", blt)
        blt.t = t
        blt.buffers = tuple(torch.empty(d).normal_() for _ in range(4))
    seconds, _ = _cpu(lambda: noise.row(t))
    row["row_ms"] = 1e3 * seconds
    if "table_build_cpu_s" in row:
        row["row_amortised_ms"] = row["row_ms"] + 1e3 * row["table_build_cpu_s"] / n
    noise.close()
    return row


def _child(kind: str, args: list[str], train_seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, *args, "--train-seconds", str(train_seconds)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        return {"table": kind, "case": args, "error": res.stderr.strip().splitlines()[-1:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x (None with fewer than two positive points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else None


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def report(rows: list[dict[str, Any]]) -> str:
    """The three markdown tables and the fitted exponents."""
    lines = []
    pop = [r for r in rows if r["table"] == "population" and "error" not in r]
    lines += (
        []
        if not pop
        else [
            "| N | scheme | setup CPU s | server CPU s a round | checkpoint CPU s (before → after) | "
            "ε on the critical path s (inline → prefetched) | peak MB |",
            "|---|---|---|---|---|---|---|",
        ]
    )
    for r in pop:
        eps = (
            f"{_fmt(r['epsilon_inline_cpu_s'])} → {_fmt(r['epsilon_critical_path_s'])}"
            if "epsilon_inline_cpu_s" in r
            else "–"
        )
        lines.append(
            f"| {r['population']:,} | {r['scheme']} | {_fmt(r['setup_cpu_s'])} | {_fmt(r['round_server_cpu_s'])} | "
            f"{_fmt(r['checkpoint_before_cpu_s'])} → {_fmt(r['checkpoint_cpu_s'])} "
            f"(×{_fmt(r['checkpoint_before_cpu_s'] / max(r['checkpoint_cpu_s'], 1e-9))}) | {eps} | "
            f"{r['peak_mb']:.0f} |"
        )
    for scheme in sorted({r["scheme"] for r in pop}):
        sub = [r for r in pop if r["scheme"] == scheme]
        ns = [float(r["population"]) for r in sub]
        fits = {k: exponent(ns, [r[k] for r in sub]) for k in ("setup_cpu_s", "round_server_cpu_s")}
        fits["checkpoint before"] = exponent(ns, [r["checkpoint_before_cpu_s"] for r in sub])
        fits["checkpoint after"] = exponent(ns, [r["checkpoint_cpu_s"] for r in sub])
        fits["peak memory"] = exponent(ns, [r["peak_mb"] for r in sub])
        lines.append(f"\n{scheme}: growth exponents in N: " + ", ".join(f"{k} {_fmt(v, 2)}" for k, v in fits.items()))
    fac = [r for r in rows if r["table"] == "factorization" and "error" not in r]
    lines += ["", "| mechanism | n | CPU s | peak MB |", "|---|---|---|---|"] if fac else []
    lines += [f"| {r['mechanism']} | {r['n']} | {_fmt(r['cpu_s'])} | {_fmt(r['peak_mb'])} |" for r in fac]
    for mech in sorted({r["mechanism"] for r in fac}):
        sub = [r for r in fac if r["mechanism"] == mech]
        slope = exponent([float(r["n"]) for r in sub], [r["cpu_s"] for r in sub])
        lines.append(f"\n{mech}: growth exponent of factorization CPU time in n: {_fmt(slope, 2)}")
    noi = [r for r in rows if r["table"] == "noise" and "error" not in r]
    lines += (
        [
            "",
            "| mechanism | n = t | d | row CPU ms | table build CPU s | row + amortised build ms |",
            "|---|---|---|---|---|---|",
        ]
        if noi
        else []
    )
    for r in noi:
        lines.append(
            f"| {r['mechanism']} | {r['n']} | {r['d']:,} | {_fmt(r['row_ms'])} | {_fmt(r.get('table_build_cpu_s'))} | "
            f"{_fmt(r.get('row_amortised_ms'))} |"
        )
    for mech in sorted({r["mechanism"] for r in noi}):
        sub = [r for r in noi if r["mechanism"] == mech]
        slope = exponent([float(r["n"]) for r in sub], [r["row_ms"] for r in sub])
        lines.append(f"\n{mech}: growth exponent of a row's CPU time in t: {_fmt(slope, 2)}")
    errors = [r for r in rows if "error" in r]
    lines += [f"\nfailed: {r}" for r in errors]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--child``, one case) and print the tables.

    Parameters
    ----------
    argv : the command line (default: `sys.argv[1:]`).
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (minutes)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--only", nargs="*", default=["population", "factorization", "noise"], help="which tables")
    ap.add_argument("--train-seconds", type=float, default=2.0, help="the training stand-in for ε prefetch (2 s)")
    ap.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "population":
            row = population_case(int(rest[0]), rest[1], args.train_seconds)
        elif kind == "factorization":
            row = factorization_case(rest[0], int(rest[1]))
        else:
            row = noise_case(rest[0], int(rest[1]), int(rest[2]))
        print(json.dumps(row), flush=True)
        return 0
    if args.quick:
        pops, ns, d = [10**3, 10**4, 10**5, 10**6], [64, 128, 256], D_FULL // 100
        dense_ns = ns
    else:
        pops, ns, d = [10**3, 10**4, 10**5, 10**6, 10**7], [256, 512, 1024, 2048, 4096], D_FULL
        dense_ns = ns[:-1]
    cases: list[tuple[str, list[str]]] = []
    if "population" in args.only:
        cases += [("population", [str(n), s]) for s in ("poisson", "epochs") for n in pops]
    if "factorization" in args.only:
        for mech in ("dense", "dpmf_plus", "banded", "tree", "blt"):
            cases += [("factorization", [mech, str(n)]) for n in (dense_ns if mech in ("dense", "dpmf_plus") else ns)]
    if "noise" in args.only:
        for mech in ("dense_redraw", "dense_table", "banded", "blt"):
            cases += [("noise", [mech, str(n), str(d)]) for n in ns]
    rows = []
    for kind, case in cases:
        row = _child(kind, case, args.train_seconds)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
