"""Experiment (c) of the MF issue: Shakespeare user-level DP at three ε values, amplified
Gaussian noise against the MF mechanisms under their natural schemes, several seeds.

Arms (each an experiment TOML in this folder, unchanged except ``privacy.target_epsilon``,
``seed`` and ``eval.every = 0``, which evaluates once, after the last round):

- ``gaussian``: independent Gaussian noise, Poisson sampling at q = 30/848, amplified accounting
  (``shakespeare_gaussian.toml``);
- ``blt``: BLT (4 buffers) optimised for the epochs scheme, 28 groups of 30, k = 6
  (``shakespeare_blt.toml`` = the default experiment);
- ``banded``: banded MF with 28 bands under ``min_sep`` = 28 (``shakespeare_banded.toml``);
- ``dense`` (not in the default sweep, ``--mechs ... dense`` adds it): the dense
  single-participation optimum under the same epochs scheme (``shakespeare_dense.toml``).

All: 848 users, 150 rounds, cohort 30, δ = 1/N^1.1, FedAvgM, ``shakespeare_lstm_small``.

Run: ``python experiments/mechanism_grid.py [--eps 2 4 8] [--seeds 3] [--mechs gaussian blt banded]
[--jobs 2] [--out DIR]``.
Each arm runs as its own ``fedsim run`` process (in-process engine, one thread), ``--jobs`` at a
time; an arm whose ``summary.json`` exists is skipped, so an interrupted sweep resumes.
Writes ``grid.json`` (this invocation's arms: accuracies, ε, z, wall times) and prints the markdown
table of every finished run; ``--table`` only prints the
markdown table of every finished run under ``--out`` (the one in ``experiments/README.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
MECHS = {
    "gaussian": "shakespeare_gaussian.toml",
    "blt": "shakespeare_blt.toml",
    "banded": "shakespeare_banded.toml",
    "dense": "shakespeare_dense.toml",
}


def one(out: Path, mech: str, eps: float, seed: int) -> dict:
    """Run one arm (or read its finished summary); return its summary dict."""
    run_dir = out / f"{mech}-eps{eps:g}-s{seed}"
    summ = run_dir / "summary.json"
    if not summ.exists():
        cmd = [
            sys.executable,
            "-m",
            "fedsim.cli",
            "run",
            str(HERE / MECHS[mech]),
            "--quiet",
            "--out",
            str(run_dir),
            "--set",
            f"privacy.target_epsilon={eps}",
            "--set",
            f"seed={seed}",
            "--set",
            "eval.every=0",
            "--set",
            "sim.engine='inprocess'",
            "--set",
            "sim.num_workers=1",
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        with open(out / f"{run_dir.name}.log", "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    return json.loads(summ.read_text())


def markdown_table(out: Path) -> str:
    """The results table of every finished arm under ``out`` (any mechanism, any seeds), checking
    that each run's ε (its ledger's last entry, copied into ``summary.json``) is the target."""
    rows: dict[tuple[str, float], dict[int, dict]] = {}
    for summ in sorted(out.glob("*-eps*-s*/summary.json")):
        mech, eps, seed = summ.parent.name.rsplit("-", 2)
        rows.setdefault((mech, float(eps[3:])), {})[int(seed[1:])] = json.loads(summ.read_text())
    lines = [
        "| ε | mechanism | z | sens(C) | seed 0 / 1 / 2 | mean ± std | wall time per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in sorted({e for _, e in rows}):
        for m in [m for m in MECHS if (m, e) in rows]:
            r = rows[(m, e)]
            for s in r.values():
                if abs(s["epsilon"] - e) > 1e-3:
                    raise SystemExit(f"{m} ε={e:g}: the run's ε is {s['epsilon']}, not the target")
            accs = [100 * r[k]["final_eval_accuracy"] for k in sorted(r)]
            first = r[min(r)]
            mean = (
                f"{statistics.mean(accs):.2f} ± {statistics.stdev(accs):.2f} %"
                if len(accs) > 1
                else f"{accs[0]:.2f} % (1 seed)"
            )
            walls = [r[k]["wall_seconds"] for k in r]
            lines.append(
                f"| {e:g} | {m} | {first['noise_multiplier']:.4f} | {first.get('sensitivity') or 1.0:.3f} | "
                f"{' / '.join(f'{a:.2f}' for a in accs)} | {mean} | {min(walls):.0f}–{max(walls):.0f} s |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eps", type=float, nargs="+", default=[8.0, 4.0, 2.0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--mechs", nargs="+", default=["gaussian", "blt", "banded"], choices=list(MECHS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/mechanism_grid"))
    ap.add_argument("--table", action="store_true", help="only print the markdown table of the finished runs")
    args = ap.parse_args()
    if args.table:
        print(markdown_table(args.out))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    arms = [(m, e, s) for s in range(args.seeds) for e in args.eps for m in args.mechs]
    with ThreadPoolExecutor(args.jobs) as pool:
        summaries = dict(zip(arms, pool.map(lambda a: one(args.out, *a), arms)))
    results = {f"{m}/eps{e:g}": [summaries[(m, e, s)] for s in range(args.seeds)] for e in args.eps for m in args.mechs}
    (args.out / "grid.json").write_text(
        json.dumps(
            {
                k: {
                    "accuracies": [r["final_eval_accuracy"] for r in rows],
                    "epsilon": [r["epsilon"] for r in rows],
                    "noise_multiplier": rows[0]["noise_multiplier"],
                    "wall_seconds": [r["wall_seconds"] for r in rows],
                }
                for k, rows in results.items()
            },
            indent=1,
        )
    )
    print(markdown_table(args.out))


if __name__ == "__main__":
    main()
