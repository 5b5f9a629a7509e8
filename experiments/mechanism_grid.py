"""Experiment (c) of the MF issue: Shakespeare user-level DP at three ε values, amplified
Gaussian noise against the MF mechanisms under their natural schemes, several seeds — a thin
wrapper around the sweep spec ``experiments/sweeps/mechanism_grid.toml``.

Arms (the default experiment with the overrides of each ``shakespeare_<mechanism>.toml``, the
target ε, the seed and ``eval.every = 0``, which evaluates once, after the last round):

- ``gaussian``: independent Gaussian noise, Poisson sampling at q = 30/848, amplified accounting;
- ``blt``: BLT (4 buffers) optimised for the epochs scheme, 28 groups of 30, k = 6 (the default);
- ``banded``: banded MF with 28 bands under ``min_sep`` = 28.

All: 848 users, 150 rounds, δ = 1/N^1.1, FedAvgM, ``shakespeare_lstm_small``; every trial on the
in-process engine with one worker.

Run: ``python experiments/mechanism_grid.py [--out DIR] [--only TEXT]`` runs (or resumes) the sweep
and prints the table; ``--table`` only prints the table of the finished trials under ``--out`` (the
one in ``experiments/README.md``). The same sweep directly: ``fedsim sweep
experiments/sweeps/mechanism_grid.toml --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the arms, in the table's order (the spec's [[sweep.arms]]; other arms found under --out follow).
MECHS = ("gaussian", "blt", "banded")


def markdown_table(out: Path) -> str:
    """The results table of the sweep's finished trials under ``out`` that ran as planned (the
    check of every sweep table: each trial's ledger holds its arm's planned accounting spec; any
    other trial folder is left out and named under the table), checking that each run's ε (its
    ledger's last entry, copied into ``summary.json``) is the target."""
    from fedsim.runner.sweep import finished_as_planned

    finished, left_out = finished_as_planned(out, HERE / "sweeps" / "mechanism_grid.toml")
    rows: dict[tuple[str, float], dict[int, dict]] = {}
    for trial in sorted(r["trial"] for r in finished):
        mech, eps, seed = trial.split(",")
        summary = json.loads((out / "trials" / trial / "summary.json").read_text())
        rows.setdefault((mech, float(eps.split("=")[1])), {})[int(seed.split("=")[1])] = summary
    lines = [
        "| ε | mechanism | z | sens(C) | seed 0 / 1 / 2 | mean ± std | wall time per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in sorted({e for _, e in rows}):
        for m in [m for m in MECHS if (m, e) in rows] + sorted(m for m, x in rows if x == e and m not in MECHS):
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
    if left_out:
        lines.append(f"\nleft out (not as planned: another accounting spec, or not a trial of this sweep): {left_out}")
    return "\n".join(lines)


def is_started(out: Path) -> bool:
    """Whether ``out`` already holds this sweep, to be resumed: ``run_sweep`` refuses to start a new
    one where ``plan.json`` (written before Ray starts), ``tune/`` or ``trials/`` exists."""
    from fedsim.runner.sweep import PLAN_FILE

    return any((out / part).exists() for part in (PLAN_FILE, "tune", "trials"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/mechanism_grid"))
    ap.add_argument(
        "--only",
        help="run only the trials that have each comma-separated part of this text as a whole part of their "
        "name (e.g. 'blt' or 'privacy.target_epsilon=8.0,seed=0')",
    )
    ap.add_argument("--table", action="store_true", help="only print the markdown table of the finished runs")
    args = ap.parse_args()
    if not args.table:
        from fedsim.runner.sweep import run_sweep

        resume = is_started(args.out)
        run_sweep(HERE / "sweeps" / "mechanism_grid.toml", args.out, resume=resume, only=args.only)
    print(markdown_table(args.out))


if __name__ == "__main__":
    main()
