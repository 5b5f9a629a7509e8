"""One-run audit goals table (issue 48): ε lower bounds from m = 1000 gradient canaries against
the ledger's ε, for independent Gaussian noise and for BLT and banded MF noise, and the wall-time
cost of an audit against a plain run.

Every arm is `fedsim.runner.audit.run_one_run_audit` on a small Shakespeare run that fits a
2-core machine: `shakespeare_lstm_small` (59,232 parameters), 30 real users, 10 rounds,
δ = 1e-5, the in-process engine. Arms:

- `gaussian`: independent Gaussian noise, Poisson sampling with K̄ = 265 (q ≈ 1/2 of the ≈ 530
  users the audit trains on), ε ∈ {1, 2, 4, 8};
- `identity`, `blt`, `banded`: matrix-factorization noise (identity = independent noise without
  amplification), fixed epochs: 5 keyed groups, round t trains group t mod 5, each user
  twice (min_sep = 5, max_participations = 2), ε ∈ {1, 2, 4, 8};
  MF arms report the decorrelated every-model statistic and the raw one.

Run (one arm at a time, about a minute each)::

    OMP_NUM_THREADS=1 .venv/bin/python experiments/one_run_audit.py --json experiments/one_run_audit.json

It prints a markdown table (also written next to the JSON as .md).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

BASE = [
    "model.name='shakespeare_lstm_small'",
    "data.max_users=30",
    "rounds=10",
    "client.max_examples=16",
    "client.batch_size=8",
    "eval.every=0",
    "eval.max_users=4",
    "eval.max_examples_per_user=4",
    "sim.engine='inprocess'",
    "sim.num_workers=1",
    "privacy.delta=1e-5",
]
POISSON = ["sampling.scheme='poisson'", "sampling.cohort_size=265"]
EPOCHS = ["sampling.scheme='epochs'", "sampling.min_sep=5", "sampling.max_participations=2"]
ARMS = {
    "gaussian": ["privacy.mechanism='gaussian'", *POISSON],
    "identity": ["privacy.mechanism='identity'", *EPOCHS],
    "blt": ["privacy.mechanism='blt'", *EPOCHS],
    "banded": ["privacy.mechanism='banded'", *EPOCHS],
}
EPSILONS = (1.0, 2.0, 4.0, 8.0)
#: Text canaries (`--text`): trained long enough for a non-private model to memorise a secret seen
#: 16 times; Poisson sampling, K̄ = 20, server momentum 0.9 with lr 1.0, 3 local epochs, δ = 1e-5.
TEXT_COMMON = [
    "rounds=100",
    "client.local_epochs=3",
    "sampling.scheme='poisson'",
    "sampling.cohort_size=20",
    "server.optimizer='momentum'",
    "server.lr=1.0",
    "server.momentum=0.9",
    "eval.every=0",
    "eval.max_users=4",
    "sim.engine='inprocess'",
    "sim.num_workers=1",
    "privacy.delta=1e-5",
]
#: dataset → (config file, overrides, canaries m, canary size, secret length)
TEXT = {
    "shakespeare": (None, ["data.max_users=300", "client.max_examples=64"], 200, 100, 8),
    "so_fixture": ("experiments/stackoverflow_nwp_fixture.toml", ["data.max_users=250"], 150, 10, 4),
}


def _env() -> None:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="flwr-"))
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="ray-"))


def arm(mechanism: str, eps: float, m: int, work: Path) -> dict[str, Any]:
    """One audited run; the report's bounds flattened to one row per (adversary, method)."""
    from fedsim.config import load_config
    from fedsim.runner.audit import run_one_run_audit

    cfg = load_config(None, BASE + ARMS[mechanism] + [f"privacy.target_epsilon={eps}"])
    t0 = time.perf_counter()
    rep = run_one_run_audit(cfg, work / f"{mechanism}-{eps:g}", m, progress=False)
    wall = time.perf_counter() - t0
    return {
        "mechanism": mechanism,
        "target_epsilon": eps,
        "ledger_epsilon": rep["ledger_epsilon"],
        "delta": rep["delta"],
        "num_canaries": rep["num_canaries"],
        "num_included": rep["num_included"],
        "ceiling": rep["ceiling"],
        "noise_multiplier": rep["noise_multiplier"],
        "wall_s": wall,
        "bounds": {
            f"{b['adversary']}/{b['method']}": {k: b[k] for k in ("epsilon", "guesses", "correct")}
            for b in rep["bounds"]
        },
    }


def text_arm(dataset: str, mechanism: str, eps: float | None, out: Path, so_root: str | None) -> dict[str, Any]:
    """One text-canary one-run audit (fedsim.runner.text_audit.run_text_one_run_audit); `eps`
    None with mechanism 'none'. The Stack Overflow fixture needs `so_root` (made by `fedsim data
    synth stackoverflow --users 250 --per-user 40 --vocab 150 --out DIR`)."""
    from fedsim.config import load_config
    from fedsim.runner.text_audit import run_text_one_run_audit

    path, extra, m, size, length = TEXT[dataset]
    over = [*TEXT_COMMON, *extra, f"privacy.mechanism='{mechanism}'"]
    if eps is not None:
        over.append(f"privacy.target_epsilon={eps}")
    if dataset == "so_fixture":
        over.append(f"data.root='{so_root}'")
    t0 = time.perf_counter()
    rep = run_text_one_run_audit(load_config(path, over), out, m, size=size, secret_length=length, progress=False)
    return {
        "dataset": dataset,
        "mechanism": mechanism,
        "ledger_epsilon": rep["ledger_epsilon"],
        "num_canaries": m,
        "num_included": rep["num_included"],
        "ceiling": rep["ceiling"],
        "accuracy": rep["final_eval_accuracy"],
        "wall_s": time.perf_counter() - t0,
        "bounds": {
            b["method"]: {k: b[k] for k in ("epsilon", "guesses", "correct", "confidence")} for b in rep["bounds"]
        },
    }


def timing(work: Path, m: int) -> dict[str, float]:
    """Wall time of a plain run and of the audited run of the same experiment (BLT, ε = 4; the
    Poisson arm's K̄ = 265 needs the canaries' population), measured back to back in this process
    after an untimed warm-up run."""
    from fedsim.config import load_config
    from fedsim.runner import run_experiment
    from fedsim.runner.audit import run_one_run_audit

    cfg = load_config(None, BASE + ARMS["blt"] + ["privacy.target_epsilon=4.0"])
    run_experiment(cfg, work / "warm-up", progress=False)  # imports, data and caches: not timed
    t0 = time.perf_counter()
    run_experiment(cfg, work / "plain", progress=False)
    plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_one_run_audit(cfg, work / "audited", m, progress=False)
    audited = time.perf_counter() - t0
    return {"plain_s": plain, "audit_s": audited, "ratio": audited / plain}


def idealised(eps: float, delta: float, m: int, trials: int = 20) -> tuple[float, float]:
    """Mean (snj, fdp) bound of one-run audits of the exact Gaussian mechanism that is (ε, δ)-DP
    (scores `μ·S_i + N(0, 1)`, no training; seeded): what the best attack on a run whose privacy
    curve is exactly the ledger's can certify with m canaries."""
    import numpy as np

    from fedsim.attacks.one_run import gdp_mu, one_run_bound

    rng = np.random.default_rng(0)
    mu = gdp_mu(eps, delta)
    out = {"snj": 0.0, "fdp": 0.0}
    for _ in range(trials):
        inc = rng.random(m) < 0.5
        s = mu * inc + rng.normal(size=m)
        for k in out:
            out[k] += one_run_bound(s, inc, delta, method=k).epsilon / trials
    return out["snj"], out["fdp"]


def table(rows: list[dict[str, Any]]) -> str:
    """The goals table (markdown): ε_LB per adversary and method, ½ε, the ceiling for m, and the
    idealised audit of the exact Gaussian mechanism with the ledger's (ε, δ)."""
    lines = [
        "| noise | ledger ε | ½ε | ceiling snj / fdp | exact Gaussian, ideal attack snj / fdp "
        "| final model snj / fdp | every model snj / fdp | every model, raw snj / fdp |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = r["bounds"]

        def pair(adv: str, b: dict[str, Any] = b) -> str:
            if f"{adv}/snj" not in b:
                return "—"
            return f"{b[adv + '/snj']['epsilon']:.2f} / {b[adv + '/fdp']['epsilon']:.2f}"

        led = r["ledger_epsilon"]
        ideal = idealised(led, r["delta"], r["num_canaries"])
        lines.append(
            f"| {r['mechanism']} | {led:.2f} | {led / 2:.2f} | {r['ceiling']['snj']:.2f} / {r['ceiling']['fdp']:.2f} "
            f"| {ideal[0]:.2f} / {ideal[1]:.2f} | {pair('final-model')} | {pair('every-model')} | {pair('every-model-raw')} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None, help="write the rows here (and the table next to it as .md)")
    p.add_argument("--canaries", type=int, default=1000, help="m, canaries with a coin (default 1000)")
    p.add_argument("--mechanisms", default=",".join(ARMS), help="comma-separated arms (default all)")
    p.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS), help="target ε values")
    p.add_argument("--no-timing", action="store_true", help="skip the plain-vs-audit timing pair")
    p.add_argument("--timing-only", action="store_true", help="only the plain-vs-audit timing pair")
    p.add_argument(
        "--text",
        nargs=3,
        metavar=("DATASET", "MECHANISM", "EPS"),
        help="instead: one text-canary arm, e.g. shakespeare none inf or so_fixture gaussian 8",
    )
    p.add_argument("--so-root", default="/tmp/so-fixture", help="the generated Stack Overflow fixture (--text)")
    args = p.parse_args()
    _env()
    if args.text is not None:
        ds, mech, eps = args.text
        with tempfile.TemporaryDirectory(prefix="one-run-text-") as tmp:
            row = text_arm(ds, mech, None if eps == "inf" else float(eps), Path(tmp) / "audit", args.so_root)
        print(json.dumps(row))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="one-run-audit-") as tmp:
        work = Path(tmp)
        for mech in [] if args.timing_only else args.mechanisms.split(","):
            for eps in (float(e) for e in args.epsilons.split(",")):
                rows.append(arm(mech, eps, args.canaries, work))
                print(json.dumps(rows[-1]), flush=True)
        cost = None if args.no_timing else timing(work, args.canaries)
    md = table(rows)
    print(md)
    if cost is not None:
        print(json.dumps({"timing": cost}))
        print(
            f"wall time: plain run {cost['plain_s']:.1f} s, audited run {cost['audit_s']:.1f} s (× {cost['ratio']:.2f})"
        )
    if args.json is not None and rows:
        args.json.write_text(json.dumps({"rows": rows, "timing": cost}, indent=1), encoding="utf-8")
        args.json.with_suffix(".md").write_text(md + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
