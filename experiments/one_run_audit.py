"""One-run audit goals tables (issue 48): ε lower bounds from gradient canaries against the
ledger's ε and against the ceiling (the ideal attack on the exact Gaussian mechanism at that m),
for independent Gaussian noise and for BLT and banded MF noise; text canaries; the wall-time
cost of an audit against a plain run.

Every gradient arm is `fedsim.runner.audit.run_one_run_audit`, δ = 1e-5, the in-process engine:

- `gaussian`, `identity`, `blt`, `banded` (default, m = 1000): a small Shakespeare run,
  `shakespeare_lstm_small` (59,232 parameters), 30 real users, 10 rounds. `gaussian`: Poisson
  with K̄ = 265 (q ≈ 1/2 of the ≈ 530 users the audit trains on); the others (identity =
  independent noise without amplification): fixed epochs, 5 keyed groups, each user twice
  (min_sep = 5, max_participations = 2); MF arms report the decorrelated every-model statistic
  and the raw one.
- `gaussian-full`: 30 generated users, logistic regression with d = 10·(features + 1), every
  user in every round (so each canary sees exactly the accounted Gaussian mechanism), any m;
  with `--directions orthogonal` m can reach d.

Runs (docs/howto/audit.md and experiments/README.md give every command)::

    OMP_NUM_THREADS=1 .venv/bin/python experiments/one_run_audit.py --seeds 0,1,2 --json experiments/one_run_audit.json
    OMP_NUM_THREADS=1 .venv/bin/python experiments/one_run_audit.py --ceiling 1000,10000,100000,1000000
    .venv/bin/python experiments/one_run_audit.py --table experiments/one_run_audit_large_m.json

It prints markdown tables (also written next to the JSON as .md).
"""

from __future__ import annotations

import argparse
import json
import math
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
#: The large-m Gaussian arm (`gaussian-full`): a generated population of 30 users and a logistic
#: regression with d = (features + 1)·10 parameters, every user in every round (Poisson q = 1: the
#: cohort size is set to the population the coins give), so each canary's view of the releases is
#: exactly the Gaussian mechanism with μ = √T/z the ledger accounts.
FULL_BASE = [
    "data.name='synthetic'",
    "data.num_clients=30",
    "data.num_classes=10",
    "model.name='logreg'",
    "eval.every=0",
    "sim.engine='inprocess'",
    "sim.num_workers=1",
    "privacy.delta=1e-5",
    "privacy.delta_reason='the one-run audit table keeps delta = 1e-5 at every m so that bounds compare across m'",
    "privacy.mechanism='gaussian'",
    "sampling.scheme='poisson'",
]
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


#: MF text arms: fixed epochs with b groups of about 20 users (as the Poisson arms' K̄ = 20; the
#: audit trains about 206 Shakespeare and 174 Stack Overflow users), each user ⌈100/b⌉ times.
TEXT_EPOCHS = {
    "shakespeare": ["sampling.scheme='epochs'", "sampling.min_sep=10", "sampling.max_participations=10"],
    "so_fixture": ["sampling.scheme='epochs'", "sampling.min_sep=9", "sampling.max_participations=12"],
}


def _env() -> None:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="flwr-"))
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="ray-"))


def full_config(eps: float, m: int, seed: int, features: int, rounds: int) -> Any:
    """The `gaussian-full` arm's config: FULL_BASE with `features` inputs, `rounds` rounds and the
    cohort size equal to the population (30 real users and the canaries the audit's coins include)."""
    from fedsim.config import load_config
    from fedsim.runner.audit import inclusion_bits
    from fedsim.seeding import derive_seed

    over = [*FULL_BASE, f"data.num_features={features}", f"rounds={rounds}", f"seed={seed}"]
    over.append(f"privacy.target_epsilon={eps}")
    cfg = load_config(None, over)
    population = 30 + int(inclusion_bits(derive_seed(cfg.seed, "audit"), m).sum())
    return load_config(None, [*over, f"sampling.cohort_size={population}"])


def arm(
    mechanism: str,
    eps: float,
    m: int,
    work: Path,
    seed: int = 0,
    features: int = 4999,
    rounds: int = 10,
    directions: str = "random",
) -> dict[str, Any]:
    """One audited run; the report's bounds flattened to one row per (adversary, method).
    `features` and `rounds` size the `gaussian-full` arm only; `directions` is the canaries'
    ("random" or "orthogonal", fedsim.runner.audit.OneRunCanaries)."""
    from fedsim.config import load_config
    from fedsim.runner.audit import run_one_run_audit

    if mechanism == "gaussian-full":
        cfg = full_config(eps, m, seed, features, rounds)
    else:
        cfg = load_config(None, BASE + ARMS[mechanism] + [f"privacy.target_epsilon={eps}", f"seed={seed}"])
    t0 = time.perf_counter()
    rep = run_one_run_audit(cfg, work / f"{mechanism}-{eps:g}-{m}-{seed}", m, progress=False, directions=directions)
    wall = time.perf_counter() - t0
    return {
        "mechanism": mechanism,
        "seed": seed,
        "directions": directions,
        "dimension": rep["dimension"],
        "rounds": rep["rounds"],
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


def text_arm(
    dataset: str, mechanism: str, eps: float | None, out: Path, so_root: str | None, seed: int = 0
) -> dict[str, Any]:
    """One text-canary one-run audit (fedsim.runner.text_audit.run_text_one_run_audit); `eps`
    None with mechanism 'none'. The Stack Overflow fixture needs `so_root` (made by `fedsim data
    synth stackoverflow --users 250 --per-user 40 --vocab 150 --out DIR`)."""
    from fedsim.config import load_config
    from fedsim.runner.text_audit import run_text_one_run_audit

    path, extra, m, size, length = TEXT[dataset]
    over = [*TEXT_COMMON, *extra, f"privacy.mechanism='{mechanism}'", f"seed={seed}"]
    if mechanism in ("blt", "banded"):  # MF noise needs bounded participation: K̄ ≈ 20 as in the Poisson arms
        over = [o for o in over if not o.startswith("sampling.")] + TEXT_EPOCHS[dataset]
    if eps is not None:
        over.append(f"privacy.target_epsilon={eps}")
    if dataset == "so_fixture":
        over.append(f"data.root='{so_root}'")
    t0 = time.perf_counter()
    rep = run_text_one_run_audit(load_config(path, over), out, m, size=size, secret_length=length, progress=False)
    return {
        "dataset": dataset,
        "mechanism": mechanism,
        "seed": seed,
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


def ceiling(
    eps: float, delta: float, m: int, trials: int = 20, sides: str = "one", methods: tuple[str, ...] = ("snj", "fdp")
) -> dict[str, tuple[float, float]]:
    """The ceiling of a one-run audit at ledger ε: mean and standard deviation, over `trials`
    seeded draws, of `one_run_bound` (95 %, the audit's guessing rules, `sides`) on the scores
    `s_i = μ·S_i + N(0, 1)` with `S_i ~ Bernoulli(1/2)` and `μ = gdp_mu(ε, δ)`. That is the
    Gaussian mechanism whose (ε, δ) is exactly the ledger's, observed without training or other
    users and scored by its likelihood ratio (`μ·s_i − μ²/2`, monotone in `s_i`, the most
    powerful score). Returns {method: (mean, sd)} for each of `methods`."""
    import numpy as np

    from fedsim.attacks.one_run import gdp_mu, one_run_bound

    rng = np.random.default_rng(0)
    mu = gdp_mu(eps, delta)
    got: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(trials):
        inc = rng.random(m) < 0.5
        s = mu * inc + rng.normal(size=m)
        for k in got:
            got[k].append(one_run_bound(s, inc, delta, method=k, sides=sides).epsilon)
    return {k: (float(np.mean(v)), float(np.std(v))) for k, v in got.items()}


def ceiling_table(ms: list[int], epsilons: list[float], delta: float = 1e-5) -> tuple[str, list[dict[str, Any]]]:
    """Markdown table (and rows) of `ceiling` for each m and ε: snj and fdp one-sided, fdp
    two-sided, and the perfect-separation cap for m; 20 draws (10 at m ≥ 10⁶)."""
    from fedsim.attacks.one_run import perfect_separation_bound

    lines = [
        "| m | ledger ε | ½ε | ceiling snj | ceiling fdp | ceiling fdp, two-sided | perfect separation snj / fdp |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = []
    for m in ms:
        cap = {k: perfect_separation_bound(m, delta, method=k) for k in ("snj", "fdp")}
        trials = 10 if m >= 10**6 else 20
        for eps in epsilons:
            one, two = ceiling(eps, delta, m, trials), ceiling(eps, delta, m, trials, sides="two", methods=("fdp",))
            rows.append({"m": m, "epsilon": eps, "trials": trials, "one": one, "two_fdp": two["fdp"], "cap": cap})
            cells = [f"{one['snj'][0]:.2f} ± {one['snj'][1]:.2f}", f"{one['fdp'][0]:.2f} ± {one['fdp'][1]:.2f}"]
            cells.append(f"{two['fdp'][0]:.2f} ± {two['fdp'][1]:.2f}")
            lines.append(
                f"| {m:,} | {eps:g} | {eps / 2:g} | {' | '.join(cells)} | {cap['snj']:.2f} / {cap['fdp']:.2f} |"
            )
            print(lines[-1], flush=True)
    return "\n".join(lines), rows


def _stat(values: list[float]) -> str:
    """`mean` for one value, `mean ± sd (min–max)` for several."""
    import numpy as np

    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{np.mean(values):.2f} ± {np.std(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def table(rows: list[dict[str, Any]]) -> str:
    """The goals table (markdown), one line per (arm, m, ε) with its seeds pooled: ε_LB per
    adversary and method (mean ± sd (min–max) over seeds), ½ε, the ceiling at that m (`ceiling`)
    and whether the every-model fdp bound reaches ½ε (in the mean, and in how many seeds)."""
    groups: dict[tuple[str, int, float], list[dict[str, Any]]] = {}
    for r in rows:
        key = (
            r["mechanism"] + ("" if r.get("directions", "random") == "random" else ", orthogonal"),
            r["num_canaries"],
        )
        groups.setdefault((*key, r["target_epsilon"]), []).append(r)
    lines = [
        "| noise | m | seeds | ledger ε | ½ε | ceiling snj / fdp | final model snj | final model fdp "
        "| every model snj | every model fdp | every model, raw snj / fdp | ½ε reached (every model fdp) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (mech, m, _), rs in groups.items():
        led = rs[0]["ledger_epsilon"]
        ideal = ceiling(led, rs[0]["delta"], m, 10 if m >= 10**6 else 20)

        def col(key: str, rs: list[dict[str, Any]] = rs) -> str:
            if key not in rs[0]["bounds"]:
                return "—"
            return _stat([r["bounds"][key]["epsilon"] for r in rs])

        raw = "—"
        if "every-model-raw/snj" in rs[0]["bounds"]:
            raw = f"{col('every-model-raw/snj')} / {col('every-model-raw/fdp')}"
        fdp = [r["bounds"]["every-model/fdp"]["epsilon"] for r in rs]
        hits = sum(e >= led / 2 for e in fdp)
        reached = f"{'yes' if sum(fdp) / len(fdp) >= led / 2 else 'no'} ({hits} of {len(rs)})"
        lines.append(
            f"| {mech} | {m:,} | {len(rs)} | {led:.2f} | {led / 2:.2f} | {ideal['snj'][0]:.2f} / {ideal['fdp'][0]:.2f} "
            f"| {col('final-model/snj')} | {col('final-model/fdp')} | {col('every-model/snj')} "
            f"| {col('every-model/fdp')} | {raw} | {reached} |"
        )
    return "\n".join(lines)


def goals_table(rows: list[dict[str, Any]]) -> str:
    """The ½ε goal (markdown), one line per (ε, m, directions): the ceiling at that m (`ceiling`,
    mean ± sd over its draws) and the measured every-model bounds (mean ± sd over seeds), `snj`
    and `fdp`, and whether the ceiling and the measured mean reach ½ε (`fdp`)."""
    import numpy as np

    groups: dict[tuple[str, float, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["mechanism"].startswith("gaussian"):  # the goal is about Gaussian noise
            key = (r["mechanism"], r["target_epsilon"], r["num_canaries"], r.get("directions", "random"))
            groups.setdefault(key, []).append(r)
    lines = [
        "| noise | ledger ε | ½ε | m | canaries | d | seeds | ceiling snj | measured snj | ceiling fdp | measured fdp "
        "| ½ε reached: ceiling / measured (seeds) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (mech, eps, m, directions), rs in sorted(groups.items()):
        led = rs[0]["ledger_epsilon"]
        ideal = ceiling(led, rs[0]["delta"], m, 10 if m >= 10**6 else 20)
        got = {k: [r["bounds"][f"every-model/{k}"]["epsilon"] for r in rs] for k in ("snj", "fdp")}
        hits = sum(e >= led / 2 for e in got["fdp"])
        yes = {True: "yes", False: "no"}
        lines.append(
            f"| {mech} | {eps:g} | {eps / 2:g} | {m:,} | {directions} | {rs[0]['dimension']:,} | {len(rs)} "
            f"| {ideal['snj'][0]:.2f} ± {ideal['snj'][1]:.2f} | {np.mean(got['snj']):.2f} ± {np.std(got['snj']):.2f} "
            f"| {ideal['fdp'][0]:.2f} ± {ideal['fdp'][1]:.2f} | {np.mean(got['fdp']):.2f} ± {np.std(got['fdp']):.2f} "
            f"| {yes[ideal['fdp'][0] >= led / 2]} / {yes[float(np.mean(got['fdp'])) >= led / 2]} ({hits} of {len(rs)}) |"
        )
    return "\n".join(lines)


def text_table(rows: list[dict[str, Any]]) -> str:
    """The text-canary table (markdown) from `--text` rows, one line per (dataset, noise, ε) with
    its seeds pooled (mean ± sd (min–max) over seeds)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        led = r["ledger_epsilon"]
        key = (r["dataset"], r["mechanism"], "∞" if isinstance(led, str) or led == math.inf else f"{led:.2f}")
        groups.setdefault(key, []).append(r)
    lines = [
        "| dataset | noise | ledger ε | seeds | m (included) | ceiling snj / fdp | ε_LB snj (95 %) | ε_LB fdp (95 %) "
        "| correct of guesses (fdp) | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (ds, mech, led), rs in groups.items():
        r0 = rs[0]
        inc = "/".join(str(r["num_included"]) for r in rs)
        hits = ", ".join(f"{r['bounds']['fdp']['correct']} of {r['bounds']['fdp']['guesses']}" for r in rs)
        lines.append(
            f"| {ds} | {mech} | {led} | {len(rs)} | {r0['num_canaries']} ({inc}) "
            f"| {r0['ceiling']['snj']:.2f} / {r0['ceiling']['fdp']:.2f} "
            f"| {_stat([r['bounds']['snj']['epsilon'] for r in rs])} | {_stat([r['bounds']['fdp']['epsilon'] for r in rs])} "
            f"| {hits} | {'/'.join(str(round(r['wall_s'])) for r in rs)} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None, help="write the rows here (and the table next to it as .md)")
    p.add_argument("--append", action="store_true", help="add to the rows already in --json instead of replacing them")
    p.add_argument("--canaries", type=int, default=1000, help="m, canaries with a coin (default 1000)")
    p.add_argument(
        "--mechanisms", default="gaussian,identity,blt,banded", help="comma-separated arms (also gaussian-full)"
    )
    p.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS), help="target ε values")
    p.add_argument("--seeds", default="0", help="comma-separated run seeds (coins, directions, noise); default 0")
    p.add_argument("--features", type=int, default=4999, help="gaussian-full: inputs (d = 10·(features + 1))")
    p.add_argument("--rounds", type=int, default=10, help="gaussian-full: rounds (default 10)")
    p.add_argument("--directions", default="random", help="canary directions: random (default) or orthogonal")
    p.add_argument("--no-timing", action="store_true", help="skip the plain-vs-audit timing pair")
    p.add_argument("--timing-only", action="store_true", help="only the plain-vs-audit timing pair")
    p.add_argument(
        "--ceiling",
        default=None,
        metavar="M,M,...",
        help="instead: the ceiling table (ideal attack on the exact Gaussian mechanism) for these m",
    )
    p.add_argument(
        "--text",
        nargs=3,
        metavar=("DATASET", "MECHANISM", "EPS"),
        help="instead: one text-canary arm, e.g. shakespeare none inf or so_fixture blt 8",
    )
    p.add_argument("--so-root", default="/tmp/so-fixture", help="the generated Stack Overflow fixture (--text)")
    p.add_argument(
        "--table",
        type=Path,
        default=None,
        metavar="JSON",
        help="instead: print the tables of saved rows (one_run_audit*.json; text rows get the text table)",
    )
    args = p.parse_args()
    _env()
    if args.table is not None:
        saved = json.loads(args.table.read_text())["rows"]
        print(text_table(saved) if "dataset" in saved[0] else table(saved) + "\n\n" + goals_table(saved))
        return
    epsilons = [float(e) for e in args.epsilons.split(",")]
    if args.ceiling is not None:
        md, crow = ceiling_table([int(m) for m in args.ceiling.split(",")], epsilons)
        print(md)
        if args.json is not None:
            args.json.write_text(json.dumps({"ceiling": crow}, indent=1), encoding="utf-8")
            args.json.with_suffix(".md").write_text(md + "\n", encoding="utf-8")
        return
    if args.text is not None:
        ds, mech, eps = args.text
        rows_t = []
        for seed in (int(x) for x in args.seeds.split(",")):
            with tempfile.TemporaryDirectory(prefix="one-run-text-") as tmp:
                e = None if eps == "inf" else float(eps)
                rows_t.append(text_arm(ds, mech, e, Path(tmp) / "audit", args.so_root, seed))
            print(json.dumps(rows_t[-1]), flush=True)
        if args.json is not None:
            old = json.loads(args.json.read_text())["rows"] if args.append and args.json.exists() else []
            args.json.write_text(json.dumps({"rows": old + rows_t}, indent=1), encoding="utf-8")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="one-run-audit-") as tmp:
        work = Path(tmp)
        for mech in [] if args.timing_only else args.mechanisms.split(","):
            for eps in epsilons:
                for seed in (int(x) for x in args.seeds.split(",")):
                    rows.append(arm(mech, eps, args.canaries, work, seed, args.features, args.rounds, args.directions))
                    print(json.dumps(rows[-1]), flush=True)
        cost = None if args.no_timing else timing(work, args.canaries)
    old_rows, old_cost = [], None
    if args.append and args.json is not None and args.json.exists():
        old = json.loads(args.json.read_text())
        old_rows, old_cost = old["rows"], old.get("timing")
    rows = old_rows + rows
    cost = cost or old_cost
    md = table(rows) + "\n\n" + goals_table(rows)
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
