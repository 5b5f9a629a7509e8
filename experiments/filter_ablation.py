"""Filter ablation on Shakespeare (issue 4, experiment 1), at a reduced scale.

Arms: {independent Gaussian with Poisson sampling, BLT MF noise with the epochs scheme} ×
{no filter, EMA, DOPPLER ``first_order_v1``, DOPPLER ``second_order``, DiSK ``two_point``,
DiSK ``lookahead``}. Within a mechanism every arm has the same ``z`` and the same sampling;
the server optimizer is SGD (a filter is the momentum), and the server step is picked per
arm from the grid ``--lrs`` on seed 0 (best final accuracy), then run on the other seeds.

Scale (to fit a 2-core machine): 280 users (seeded subset), cohort 20 (Poisson q = 1/14, or
14 epochs groups of 20), 70 rounds (each user about 5 times), ``shakespeare_lstm_small``,
z = 1.0 for both mechanisms, client SGD step 2.0 (as the default experiment); evaluation after the
last round on 100 users.

Run: ``python experiments/filter_ablation.py [--seeds 3] [--lrs 1.0 2.5] [--eval-every 10] [--out DIR]``.
Writes one run folder per (arm, lr, seed) under ``--out`` and ``ablation.json`` with every final
accuracy; ``fedsim report DIR/* --ablation FILE.png`` draws accuracy against round per arm and the
final accuracy with error bars. Runs use the in-process engine with the two workers' message split
(``sim.num_workers = 2``), which gives the same numbers as Ray with two workers; ``--eval-every``
evaluates during training for the curves (evaluation draws no training randomness).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fedsim.config import load_config

BASE = [
    "rounds=70",
    "model.name='shakespeare_lstm_small'",
    "data.max_users=280",
    "client.max_examples=32",
    "client.lr=2.0",
    "eval.every=0",
    "eval.max_users=100",
    "eval.max_examples_per_user=32",
    "server.optimizer='sgd'",
    "privacy.noise_multiplier=1.0",
    "sim.num_workers=2",
    "sim.engine='inprocess'",
]
MECHS = {
    "gaussian": ["sampling.scheme='poisson'", "sampling.cohort_size=20", "privacy.mechanism='gaussian'"],
    "blt": ["sampling.scheme='epochs'", "sampling.min_sep=14", "sampling.cohort_size=20", "privacy.mechanism='blt'"],
}
FILTERS = {
    "none": [],
    "ema": ["filter.name='ema'"],
    "doppler_v1": ["filter.name='doppler'", "filter.preset='first_order_v1'"],
    "doppler_2nd": ["filter.name='doppler'", "filter.preset='second_order'"],
    "disk_two_point": ["filter.name='disk'", "filter.mode='two_point'"],
    "disk_lookahead": ["filter.name='disk'", "filter.mode='lookahead'"],
}


def one(out: Path, mech: str, filt: str, lr: float, seed: int, eval_every: int = 0) -> float:
    from fedsim.run import run_experiment

    run_dir = out / f"{mech}-{filt}-lr{lr:g}-s{seed}"
    summ = run_dir / "summary.json"
    if summ.exists():
        return json.loads(summ.read_text())["final_eval_accuracy"]
    cfg = load_config(
        None,
        BASE
        + MECHS[mech]
        + FILTERS[filt]
        + [f"server.lr={lr}", f"seed={seed}", f"name='{run_dir.name}'", f"eval.every={eval_every}"],
    )
    return run_experiment(cfg, run_dir, progress=False)["final_eval_accuracy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--lrs", type=float, nargs="+", default=[1.0, 2.5])
    ap.add_argument("--out", type=Path, default=Path("runs/filter_ablation"))
    ap.add_argument("--mechs", nargs="+", default=list(MECHS))
    ap.add_argument("--eval-every", type=int, default=10, help="evaluate every this many rounds (0: only at the end)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for mech in args.mechs:
        for filt in FILTERS:
            tune = {lr: one(args.out, mech, filt, lr, 0, args.eval_every) for lr in args.lrs}
            best = max(tune, key=lambda lr: tune[lr])
            accs = [tune[best]] + [one(args.out, mech, filt, best, s, args.eval_every) for s in range(1, args.seeds)]
            results[f"{mech}/{filt}"] = {
                "lr_grid": tune,
                "lr": best,
                "accuracies": accs,
                "mean": statistics.mean(accs),
                "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            }
            (args.out / "ablation.json").write_text(json.dumps(results, indent=1))
            r = results[f"{mech}/{filt}"]
            print(
                f"{mech:9s} {filt:15s} lr {best:<4g} {100 * r['mean']:.2f} ± {100 * r['std']:.2f} %  "
                f"(grid {', '.join(f'{k:g}: {100 * v:.2f}' for k, v in tune.items())})",
                flush=True,
            )


if __name__ == "__main__":
    main()
