"""The papers' server-side claims at the Stack Overflow LSTM's shape (issue 38's GPU row).

Regime: ``experiments/stackoverflow_lstm_regime.toml`` (TFF's next-word LSTM, 4,053,428
parameters, on 2,000 users of generated Stack Overflow text; BLT noise at ε = 8, K̄ = 50 users a
round, 80 rounds). Each arm replaces the server step:

- ``dpsgd``: server SGD (DP-FedAvg with MF noise);
- ``momentum``: heavy-ball momentum 0.9 (FedAvgM), the check on DOPPLER found at the default scale;
- ``lp_dpsgd``: DOPPLER ``first_order_v1`` before server SGD (paper 001);
- ``disk``: DiSK look-ahead, κ = 0.7, before server SGD (paper 000);
- ``adam``: DP-Adam, β = (0.9, 0.999), ε_Adam = 1e-8;
- ``adambc``: DP-AdamBC (paper 002), floor γ′ = 0.01·Φ_t.

Two stages, as in the default-scale sweeps: stage 1 runs each arm's server-lr grid (four
values, factor 3, placed by 12-round trials on the CPU: server SGD diverged at 10, DP-Adam was
fastest at 0.03) on seed 0, the tuning seed; stage 2 runs each arm at the lr seed 0 chose on the evaluation seeds
(default 1–3). A seed fixes the initial model, the keyed groups, the local batches and the noise
draws, so the arms of one seed differ only in the server step; every arm has the same ε. The
trials run as separate ``fedsim run`` processes, ``--parallel`` at a time (on a GPU they share the
device). Every finished trial appends one line to ``<out>/results.jsonl`` at once, so what ran
before a deadline is kept.

Usage::

    python experiments/so_lstm_regime.py run --out DIR --data SO_ROOT [--device cuda] [--parallel 8]
        [--deadline 420] [--eval-seeds 1 2 3] [--set KEY=VALUE ...]
    python experiments/so_lstm_regime.py run ... --chosen dpsgd=1 adam=0.03 ... --eval-seeds 4 5
    python experiments/so_lstm_regime.py table DIR [--json FILE]

The second form adds evaluation seeds at the lrs an earlier stage 1 chose (its results go to the
same ``results.jsonl`` when ``--out`` is the same folder, or are concatenated into it).

``run`` generates the data into ``SO_ROOT`` when it holds none (``fedsim data synth
stackoverflow``'s generator: 2,000 users, about 24 sentences each, 12,000 words, seed 0).
``table`` prints each paper's paired comparison (treatment − baseline on the evaluation seeds, 95 %
t-interval) with :mod:`paper_tables`' functions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import paper_tables  # noqa: E402 (the shared statistics and the lr choice, beside this script)

CONFIG = HERE / "stackoverflow_lstm_regime.toml"
ADAM = ["server.beta1=0.9", "server.beta2=0.999"]

#: arm → (its overrides, its server-lr grid)
FAMILIES: dict[str, tuple[list[str], list[float]]] = {
    "dpsgd": (["server.optimizer='sgd'"], [0.1, 0.3, 1.0, 3.0]),
    "momentum": (["server.optimizer='momentum'", "server.momentum=0.9"], [0.01, 0.03, 0.1, 0.3]),
    "lp_dpsgd": (
        ["server.optimizer='sgd'", "filter.name='doppler'", "filter.preset='first_order_v1'"],
        [0.1, 0.3, 1.0, 3.0],
    ),
    "disk": (["server.optimizer='sgd'", "filter.name='disk'", "filter.mode='lookahead'"], [0.1, 0.3, 1.0, 3.0]),
    "adam": (["server.optimizer='adam'", *ADAM, "server.eps=1e-8"], [0.003, 0.01, 0.03, 0.1]),
    "adambc": (["server.optimizer='adambc'", *ADAM], [0.001, 0.003, 0.01, 0.03]),
}

#: (paper, claim, baseline, treatment) compared by ``table``
COMPARISONS = [
    ("DOPPLER (001)", "the low-pass filter beats DP-SGD", "dpsgd", "lp_dpsgd"),
    ("DOPPLER (001), check", "tuned momentum (FedAvgM) beats DP-SGD", "dpsgd", "momentum"),
    ("DOPPLER (001), check", "the filter beats tuned momentum (FedAvgM)", "momentum", "lp_dpsgd"),
    ("DiSK (000)", "the simplified Kalman filter beats DP-SGD", "dpsgd", "disk"),
    ("DP-AdamBC (002)", "removing the noise variance from Adam's second moment beats DP-Adam", "adam", "adambc"),
]


def trial_name(fam: str, lr: float, seed: int) -> str:
    return f"{fam}+lr={lr:g},seed={seed}"


def ensure_data(root: Path, users: int) -> None:
    """Generate the Stack Overflow folder into ``root`` unless it holds one."""
    from fedsim.data.stackoverflow.files import SQLITE

    if (root / SQLITE).exists():
        return
    from fedsim.data.stackoverflow.synthetic import generate

    start = time.perf_counter()
    generate(root, users=users, per_user=24.0, vocab=12_000, tags=50, seed=0)
    print(f"generated {users} users into {root} in {time.perf_counter() - start:.1f} s", flush=True)


def _result(folder: Path, fam: str, lr: float, seed: int, stage: int, rc: int | None, wall: float) -> dict[str, Any]:
    row: dict[str, Any] = {"trial": folder.name, "family": fam, "lr": lr, "seed": seed, "stage": stage}
    row.update(rc=rc, process_wall=round(wall, 2))
    summary = folder / "summary.json"
    if rc == 0 and summary.exists():
        s = json.loads(summary.read_text(encoding="utf-8"))
        row.update(
            loss=float(s["final_eval_metrics"]["eval_loss"]),
            acc=float(s["final_eval_accuracy"]),
            epsilon=s.get("epsilon"),
            delta=s.get("delta"),
            relation=s.get("neighboring_relation"),
            noise_multiplier=s.get("noise_multiplier"),
            cohort_size=s.get("cohort_size"),
            rounds=s.get("rounds_completed"),
            run_wall=s.get("wall_seconds"),
            device=s.get("device"),
            num_parameters=s.get("num_parameters"),
        )
    else:
        log = folder.with_suffix(".log")
        row["error"] = log.read_text(encoding="utf-8", errors="replace")[-1500:] if log.exists() else "no log"
    return row


def run_stage(
    trials: list[tuple[str, float, int]],
    stage: int,
    out: Path,
    base_set: list[str],
    parallel: int,
    deadline: float,
) -> list[dict[str, Any]]:
    """Run ``trials`` (family, lr, seed), ``parallel`` at a time, killing any still running at
    ``deadline`` (a ``time.monotonic()`` value); append each result to ``out/results.jsonl``."""
    pending = list(trials)
    running: dict[subprocess.Popen[bytes], tuple[str, float, int, Path, float]] = {}
    done: list[dict[str, Any]] = []
    (out / "trials").mkdir(parents=True, exist_ok=True)
    with (out / "results.jsonl").open("a", encoding="utf-8") as results:
        while pending or running:
            while pending and len(running) < parallel and time.monotonic() < deadline:
                fam, lr, seed = pending.pop(0)
                folder = out / "trials" / trial_name(fam, lr, seed)
                sets = [*base_set, *FAMILIES[fam][0], f"server.lr={lr}", f"seed={seed}"]
                cmd = [sys.executable, "-m", "fedsim.cli", "run", str(CONFIG), "--quiet", "--out", str(folder)]
                for s in sets:
                    cmd += ["--set", s]
                log = folder.with_suffix(".log").open("wb")
                running[subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)] = (
                    fam,
                    lr,
                    seed,
                    folder,
                    time.monotonic(),
                )
            if not running:
                break  # the deadline passed with trials not started
            time.sleep(0.5)
            for proc in list(running):
                fam, lr, seed, folder, t0 = running[proc]
                if proc.poll() is None and time.monotonic() >= deadline:
                    proc.kill()
                    proc.wait()
                if proc.poll() is not None:
                    del running[proc]
                    row = _result(folder, fam, lr, seed, stage, proc.returncode, time.monotonic() - t0)
                    done.append(row)
                    results.write(json.dumps(row) + "\n")
                    results.flush()
                    print(
                        f"stage {stage} {folder.name}: rc {proc.returncode}, loss {row.get('loss')}, "
                        f"acc {row.get('acc')}, {row['process_wall']} s",
                        flush=True,
                    )
    for fam, lr, seed in pending:
        print(f"stage {stage} {trial_name(fam, lr, seed)}: not started (deadline)", flush=True)
    return done


def chosen_lrs(rows: list[dict[str, Any]], tune_seeds: Sequence[int] = (0,)) -> dict[str, float]:
    """Each family's lr with the lowest mean final loss over ``tune_seeds``, by
    :func:`paper_tables.choose_lr` (a non-finite loss counts as +∞; a failed trial leaves its lr
    out). A family none of whose lrs has a finite mean gets none."""
    finished = [r for r in rows if "loss" in r]
    best: dict[str, float] = {}
    for fam in FAMILIES:
        try:
            pick = paper_tables.choose_lr(paper_tables.grid(finished, fam), tune_seeds)
        except ValueError:  # no lr has every tuning seed
            continue
        if math.isfinite(pick["means"][pick["lr"]]):
            best[fam] = pick["lr"]
    return best


def cmd_run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = start + args.deadline
    root = Path(args.data)
    ensure_data(root, args.users)
    base = [f"data.root='{root}'", f"sim.device='{args.device}'", *args.set]
    if args.device == "cuda":
        base.append("sim.client_gpus=1")
    fams = args.families or list(FAMILIES)
    if args.chosen:  # stage 1 ran before: more evaluation seeds at the lrs it chose
        lrs = {f: float(v) for f, v in (c.split("=", 1) for c in args.chosen)}
        fams = [f for f in fams if f in lrs]
    else:
        stage1 = [(f, lr, 0) for f in fams for lr in FAMILIES[f][1]]
        rows = run_stage(stage1, 1, out, base, args.parallel, deadline)
        lrs = chosen_lrs(rows)
        print(f"stage 1 done at {time.monotonic() - start:.0f} s; chosen lrs: {lrs}", flush=True)
    stage2 = [(f, lrs[f], s) for s in args.eval_seeds for f in fams if f in lrs]
    run_stage(stage2, 2, out, base, args.parallel, deadline)
    total = time.monotonic() - start
    (out / "driver.json").write_text(
        json.dumps(
            {"wall_seconds": total, "parallel": args.parallel, "device": args.device, "set": base, "chosen_lr": lrs}
        ),
        encoding="utf-8",
    )
    print(f"all done in {total:.0f} s", flush=True)


def read_rows(out: Path) -> list[dict[str, Any]]:
    """The finished trials of ``out/results.jsonl`` as :mod:`paper_tables` rows."""
    rows = []
    for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r.get("rc") == 0 and "loss" in r:
            rows.append(r)
    return rows


def cmd_table(args: argparse.Namespace) -> None:
    out = Path(args.out)
    rows = read_rows(out)
    spec = {"tune_seeds": [0], "effect_loss": 0.01}
    report: dict[str, Any] = {"trials": len(rows), "comparisons": []}
    eps = {round(r["epsilon"], 4) for r in rows if r.get("epsilon") is not None}
    print(f"{len(rows)} finished trials; ε per trial: {sorted(eps)} at δ = {rows[0].get('delta') if rows else None}")
    for fam in FAMILIES:
        g = paper_tables.grid(rows, fam)
        line = ", ".join(
            f"{lr:g}: " + " ".join(f"s{s}={v['loss']:.4f}" for s, v in sorted(by.items())) for lr, by in g.items()
        )
        print(f"{fam}: {line}")
    print()
    print(
        "| paper: claim | Δ eval loss (treatment − baseline) [95 % CI] | Δ accuracy pp [95 % CI] | lrs (baseline, treatment) | seeds | verdict |"
    )
    print("|---|---|---|---|---|---|")
    for paper, claim, base, treat in COMPARISONS:
        try:
            c = paper_tables.compare(rows, spec, base, treat)
        except (KeyError, ValueError) as e:
            print(f"| {paper}: {claim} | not enough trials ({e}) | | | | |")
            continue
        loss, acc = c["loss"], c["acc"]
        print(
            f"| {paper}: {claim} | {loss['mean']:+.4f} [{loss['low']:+.4f}, {loss['high']:+.4f}] "
            f"(baseline {c['baseline_loss']:.4f}) | {100 * acc['mean']:+.2f} [{100 * acc['low']:+.2f}, "
            f"{100 * acc['high']:+.2f}] (baseline {100 * c['baseline_acc']:.2f} %) | {c['lr'][base]:g}, "
            f"{c['lr'][treat]:g}{' (edge)' if any(c['edge_tune'].values()) else ''} | {len(c['eval_seeds'])} | {c['verdict']} |"
        )
        report["comparisons"].append({"paper": paper, "claim": claim, **c})
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the two stages")
    r.add_argument("--out", required=True, help="results folder")
    r.add_argument("--data", required=True, help="generated Stack Overflow folder (made when empty)")
    r.add_argument("--users", type=int, default=2000, help="users to generate (default 2000)")
    r.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    r.add_argument("--parallel", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="trials at a time")
    r.add_argument("--deadline", type=float, default=420.0, help="seconds after which running trials are killed")
    r.add_argument("--eval-seeds", type=int, nargs="+", default=[1, 2, 3])
    r.add_argument("--families", nargs="+", choices=list(FAMILIES), help="arms (default all)")
    r.add_argument("--set", action="append", default=[], help="extra config override (repeatable)")
    r.add_argument(
        "--chosen",
        nargs="+",
        metavar="FAMILY=LR",
        help="skip stage 1 and run stage 2 at these lrs (what an earlier stage 1 chose)",
    )
    t = sub.add_parser("table", help="the paired comparisons of a results folder")
    t.add_argument("out")
    t.add_argument("--json")
    args = p.parse_args(argv)
    cmd_run(args) if args.cmd == "run" else cmd_table(args)


if __name__ == "__main__":
    main()
