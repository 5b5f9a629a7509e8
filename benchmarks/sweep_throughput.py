"""A sweep on Ray Tune against the same runs one after another, side by side in one script.

The sweep: the W2 workload of ``benchmarks/throughput.py`` (logistic regression, 100 users, 50
per round, fixed cohorts, Gaussian noise) for ``--rounds`` rounds, over client lr × server lr ×
seeds (4 × 3 × 3 = 36 trials by default). Two ways to run it, timed in the same script:

- ``sequential``: one ``fedsim run`` command per trial, one after another, each with exactly the
  overrides the sweep gives that trial (``fedsim.runner.sweep.trials``, plus the sweep's own
  per-trial defaults: one worker, the in-process engine);
- ``sweep``: ``fedsim sweep SPEC`` (Ray Tune; every trial asks for ``sim.client_cpus`` = 1 CPU,
  so Tune runs as many at once as the machine has cores, and reuses its workers' imports).

Both write ordinary run folders; the script checks that every trial's ε and final model hash
are the same both ways (the same work was done: the hash tells trials with other learning rates
or seeds apart, which ε and a one-example accuracy do not), then prints the wall times and their
ratio. The
order alternates with ``--reps`` so that drifting machine load hits both alike.

Usage::

    python benchmarks/sweep_throughput.py [--rounds 20] [--reps 1] [--small] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import COMMON, WORKLOADS, bench_env

AXES = {"client.lr": [0.05, 0.1, 0.2, 0.5], "server.lr": [0.5, 1.0, 2.0]}
SEEDS = [0, 1, 2]


def _spec(rounds: int, axes: dict[str, list[float]], seeds: list[int]) -> str:
    sets = WORKLOADS["w2"] + COMMON + [f"rounds={rounds}"]
    lines = ["[sweep]", 'name = "w2_throughput"', f"set = {json.dumps(sets)}", f"seeds = {seeds}", "", "[sweep.axes]"]
    lines += [f'"{k}" = {v}' for k, v in axes.items()]
    return "\n".join(lines) + "\n"


def _env(tmp: Path) -> dict[str, str]:
    return bench_env(RAY_TMPDIR=str(tmp / "ray"), FLWR_HOME=str(tmp / "flwr"))


def _fedsim() -> list[str]:
    return [sys.executable, "-m", "fedsim.cli"]


def sequential(out: Path, items: list[dict], env: dict[str, str]) -> float:
    """Every trial as its own ``fedsim run`` command, one after another; wall seconds."""
    from fedsim.runner.sweep import TRIAL_DEFAULTS, TRIAL_ENGINE

    t0 = time.perf_counter()
    for t in items:
        sets = [a for s in TRIAL_DEFAULTS + t["sets"] + TRIAL_ENGINE for a in ("--set", s)]
        cmd = [*_fedsim(), "run", "--out", str(out / t["name"]), "--quiet", *sets]
        subprocess.run(cmd, check=True, env=env, capture_output=True)
    return time.perf_counter() - t0


def sweep(spec_path: Path, out: Path, env: dict[str, str]) -> float:
    """``fedsim sweep`` of the same trials; wall seconds."""
    t0 = time.perf_counter()
    subprocess.run([*_fedsim(), "sweep", str(spec_path), "--out", str(out)], check=True, env=env, capture_output=True)
    return time.perf_counter() - t0


def _summary(folder: Path) -> tuple[float, str]:
    """A trial's ε and model hash (the hash tells every trial apart; ε alone does not depend on
    the learning rates or the seed)."""
    s = json.loads((folder / "summary.json").read_text())
    return s["epsilon"], s["model_sha256"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--small", action="store_true", help="a 2 × 1 × 2 = 4-trial grid (a smoke test)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from fedsim.runner.sweep import load_spec, trials

    axes, seeds = ({"client.lr": [0.1, 0.2], "server.lr": [1.0]}, [0, 1]) if args.small else (AXES, SEEDS)
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        spec_path = tmp / "w2_sweep.toml"
        spec_path.write_text(_spec(args.rounds, axes, seeds))
        items = trials(load_spec(spec_path)[0])
        env = _env(tmp)
        for rep in range(args.reps):
            wall: dict[str, float] = {}
            for how in ["sequential", "sweep"] if rep % 2 == 0 else ["sweep", "sequential"]:
                out = tmp / f"{how}-{rep}"
                wall[how] = sequential(out, items, env) if how == "sequential" else sweep(spec_path, out, env)
            for t in items:  # the same work both ways: the same ε and final model per trial
                a = _summary(tmp / f"sequential-{rep}" / t["name"])
                b = _summary(tmp / f"sweep-{rep}" / "trials" / t["name"])
                if a != b:
                    raise SystemExit(f"trial {t['name']}: sequential {a} != sweep {b}")
            rows.append(
                {
                    "rep": rep,
                    "trials": len(items),
                    "rounds": args.rounds,
                    "sequential_s": wall["sequential"],
                    "sweep_s": wall["sweep"],
                    "ratio": wall["sweep"] / wall["sequential"],
                    "load_avg": os.getloadavg()[0],
                    "cpus": os.cpu_count(),
                }
            )
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(
                f"rep {r['rep']}: {r['trials']} trials × {r['rounds']} rounds: sequential {r['sequential_s']:.1f} s, "
                f"sweep {r['sweep_s']:.1f} s, ratio {r['ratio']:.3f} (load {r['load_avg']:.1f}, {r['cpus']} CPUs)"
            )


if __name__ == "__main__":
    main()
