"""Experiment: what trained text models leak about users, across mechanisms and ε.

For each dataset (Shakespeare with the default model; the Stack Overflow next-word fixture) ×
ε ∈ {1, 2, 4, 8, ∞} × {Gaussian noise with Poisson sampling, BLT with epochs} × seeds, it runs

    fedsim audit CONFIG --attack canary --attack user-inference --out DIR --set …

(one training run per arm: canary users and held-out users at once; ε = ∞ is
``privacy.mechanism = "none"`` with the arm's sampling) and then prints one table per attack
(mean ± std over seeds) and draws one figure per attack. Arms whose ``audit.json`` exists are
skipped, so a killed sweep is resumed by running the command again.

    OMP_NUM_THREADS=1 python experiments/text_privacy.py --out runs/text_privacy --mechanisms gaussian blt
    OMP_NUM_THREADS=1 python experiments/text_privacy.py --out runs/text_privacy \
        --mechanisms gaussian-slr0.05 blt-slr0.05 --epsilons 1 8
    python experiments/text_privacy.py --out runs/text_privacy --table                      # tables only

(the two commands behind ``experiments/README.md``; without ``--mechanisms``/``--epsilons`` every
mechanism runs at every ε).

The Stack Overflow arms train on a generated folder in TFF's layout (``fedsim data synth``,
made once under ``--out``), not on real Stack Overflow text.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EPSILONS = ("1", "2", "4", "8", "inf")
#: the two mechanisms, each with its natural scheme: amplified Gaussian noise with Poisson sampling
#: (K̄ = 6, about N/28) and BLT with 28 fixed groups (k = 10 participations in 280 rounds).
#: The ``-slr0.05`` variants step the server with lr 0.05 instead of the dataset's 1.0: at lr 1.0
#: (momentum 0.9) the noisy DP updates make the model diverge (accuracy at uniform guessing); 0.05
#: was the better of {0.05, 0.005} for Gaussian noise at ε = 8, seed 0, on Shakespeare.
MECHANISMS = {
    "gaussian": ["privacy.mechanism='gaussian'", "sampling.scheme='poisson'", "sampling.cohort_size=6"],
    "blt": ["privacy.mechanism='blt'", "sampling.scheme='epochs'", "sampling.min_sep=28"],
    "gaussian-slr0.05": [
        "privacy.mechanism='gaussian'",
        "sampling.scheme='poisson'",
        "sampling.cohort_size=6",
        "server.lr=0.05",
    ],
    "blt-slr0.05": ["privacy.mechanism='blt'", "sampling.scheme='epochs'", "sampling.min_sep=28", "server.lr=0.05"],
}
#: A population small enough (200 users before the audit moves 30 to held-out and swaps 12 donors for
#: canaries: 170 trained) and training long enough (280 rounds) that the non-private arm memorises.
COMMON = ["data.max_users=200", "rounds=280", "sim.num_workers=1", "eval.every=140"]
AUDIT = ["--canaries", "12", "--repetitions", "1,4,16", "--held-out", "30", "--references", "2000"]
DATASETS: dict[str, dict[str, Any]] = {
    "shakespeare": {
        "config": "experiments/shakespeare_default.toml",
        "sets": [*COMMON, "client.local_epochs=3", "server.lr=1.0"],
        "audit": [*AUDIT, "--canary-size", "100"],
    },
    "so_nwp": {
        "config": "experiments/stackoverflow_nwp_fixture.toml",
        "sets": [*COMMON, "eval.max_users=40"],
        "audit": [*AUDIT, "--canary-size", "10", "--secret-length", "4"],
    },
}


def arm_sets(dataset: str, mech: str, eps: str, seed: int, root: Path) -> list[str]:
    """The ``--set`` overrides of one arm."""
    sets = list(DATASETS[dataset]["sets"]) + [f"seed={seed}"]
    if dataset == "so_nwp":
        sets.append(f"data.root='{root / 'so_fixture'}'")
    scheme = [s for s in MECHANISMS[mech] if not s.startswith("privacy.mechanism")]
    if eps == "inf":
        return sets + scheme + ["privacy.mechanism='none'"]
    return sets + MECHANISMS[mech][:1] + scheme + [f"privacy.target_epsilon={eps}"]


def run_arm(dataset: str, mech: str, eps: str, seed: int, root: Path) -> Path:
    """Run one arm's audit (skipped when its audit.json exists); returns its folder."""
    out = root / dataset / f"{mech}-eps{eps}-s{seed}"
    if (out / "audit.json").exists():
        return out
    cmd = [sys.executable, "-m", "fedsim.cli", "audit", str(ROOT / DATASETS[dataset]["config"]), "--out", str(out)]
    cmd += ["--attack", "canary", "--attack", "user-inference", "--json", *DATASETS[dataset]["audit"]]
    for s in arm_sets(dataset, mech, eps, seed, root):
        cmd += ["--set", s]
    if out.exists():  # a killed arm: start it again from scratch
        import shutil

        shutil.rmtree(out)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ.copy())
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nfailed ({r.returncode}):\n{r.stderr[-3000:]}")
    print(f"{dataset} {mech} ε={eps} seed={seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def make_fixture(root: Path) -> None:
    """The Stack Overflow fixture folder (generated text in TFF's layout), made once."""
    folder = root / "so_fixture"
    if (folder / "stackoverflow.sqlite").exists() or (folder / "stackoverflow.sqlite.lzma").exists():
        return
    cmd = [sys.executable, "-m", "fedsim.cli", "data", "synth", "stackoverflow", "--out", str(folder)]
    cmd += ["--users", "250", "--per-user", "40", "--vocab", "150", "--seed", "0"]
    subprocess.run(cmd, cwd=ROOT, check=True)


def _num(x: Any) -> float:
    return math.inf if x in ("inf", None) else float(x)


def _ms(values: list[float]) -> str:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return "–"
    m = sum(vals) / len(vals)
    sd = (sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
    return f"{m:.2f} ± {sd:.2f}"


def collect(root: Path, seeds: list[int]) -> list[dict[str, Any]]:
    """One row per (dataset, mechanism, ε): the seeds' audits summarised."""
    rows = []
    for dataset in DATASETS:
        for mech in MECHANISMS:
            for eps in EPSILONS:
                reps = [root / dataset / f"{mech}-eps{eps}-s{s}" / "audit.json" for s in seeds]
                reps = [json.loads(p.read_text()) for p in reps if p.exists()]
                if not reps:
                    continue
                rows.append(_row(dataset, mech, eps, reps))
    return rows


def _row(dataset: str, mech: str, eps: str, reps: list[dict[str, Any]]) -> dict[str, Any]:
    levels = [lv["repetitions"] for lv in reps[0]["canary"]["by_level"]]
    row: dict[str, Any] = {"dataset": dataset, "mechanism": mech, "target ε": eps, "seeds": len(reps)}
    row["ledger ε"] = _ms([_num(r["ledger_epsilon"]) for r in reps]) if eps != "inf" else "∞"
    row["accuracy %"] = _ms([100 * r["final_eval_accuracy"] for r in reps if r.get("final_eval_accuracy") is not None])
    for i, lv in enumerate(levels):
        row[f"exposure r={lv}"] = _ms([r["canary"]["by_level"][i]["mean_exposure"] for r in reps])
        row[f"chance r={lv}"] = _ms([r["canary"]["initial_model"][i]["mean_exposure"] for r in reps])
    ui = [r["user_inference"] for r in reps]
    row["UI AUC"] = _ms([u["auc"]["estimate"] for u in ui])
    row["UI TPR@1%"] = _ms([u["tpr_at_1pct_fpr"]["estimate"] for u in ui])
    row["ε_LB"] = _ms([_num(u["epsilon_lower_bound"]["epsilon_lb"]) for u in ui])
    return row


def markdown(rows: list[dict[str, Any]], keys: list[str]) -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "–")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def _mean_sd(cell: Any) -> tuple[float, float]:
    """A table cell ``"m ± s"`` as numbers (nan for a missing cell)."""
    if cell in ("–", None, "∞"):
        return float("nan"), float("nan")
    m, s = cell.split(" ± ")
    return float(m), float(s)


def figures(rows: list[dict[str, Any]], root: Path, out_dir: Path) -> None:
    """One figure per attack against ε (mean ± std over seeds), one line per dataset × mechanism.

    ``text_privacy_exposure.png``: a panel per repetition level r, with each dataset's chance
    level (the same secrets under the initial model) dotted. ``text_privacy_user_inference.png``:
    ROC AUC (0.5 dotted) and TPR at 1 % FPR.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(EPSILONS)))

    def series(key: str, dataset: str, mech: str) -> tuple[list[float], list[float]]:
        cells = [
            next((r[key] for r in rows if (r["dataset"], r["mechanism"], r["target ε"]) == (dataset, mech, e)), None)
            for e in EPSILONS
        ]
        pairs = [_mean_sd(c) for c in cells]
        return [m for m, _ in pairs], [s for _, s in pairs]

    def draw(ax: Any, key: str, ylabel: str) -> None:
        for di, dataset in enumerate(DATASETS):
            for mi, mech in enumerate(MECHANISMS):
                m, s = series(key, dataset, mech)
                keep = [i for i, v in enumerate(m) if v == v]  # arms that ran (not nan)
                if not keep:
                    continue
                style = "--" if "slr" in mech else "-"
                ax.errorbar(
                    [xs[i] for i in keep],
                    [m[i] for i in keep],
                    yerr=[s[i] for i in keep],
                    marker="o",
                    ls=style,
                    capsize=2,
                    color=f"C{di * len(MECHANISMS) + mi}",
                    label=f"{dataset}, {mech}",
                )
        ax.set_xticks(xs, ["1", "2", "4", "8", "∞"])
        ax.set_xlabel("ε (target; ∞ = no noise)")
        ax.set_ylabel(ylabel)

    levels = [k.split("=")[1] for k in rows[0] if k.startswith("exposure r=")]
    fig, axes = plt.subplots(1, len(levels), figsize=(4.2 * len(levels), 3.8), sharey=True)
    for ax, lv in zip(axes, levels, strict=True):
        draw(ax, f"exposure r={lv}", "canary exposure (bits)")
        for i, dataset in enumerate(DATASETS):
            chance = [m for mech in MECHANISMS for m in series(f"chance r={lv}", dataset, mech)[0] if m == m]
            if chance:
                ax.axhline(sum(chance) / len(chance), color=f"C{i * len(MECHANISMS)}", ls=":", lw=1)
        ax.set_title(f"secret inserted r = {lv} times")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "text_privacy_exposure.png", dpi=120, bbox_inches="tight")
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    draw(axes[0], "UI AUC", "user-inference ROC AUC")
    axes[0].axhline(0.5, color="grey", ls=":", lw=1)
    draw(axes[1], "UI TPR@1%", "TPR at 1 % FPR")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "text_privacy_user_inference.png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "text_privacy")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS))
    ap.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=list(MECHANISMS))
    ap.add_argument("--epsilons", nargs="+", default=list(EPSILONS), choices=list(EPSILONS))
    ap.add_argument("--table", action="store_true", help="only print the tables and draw the figures")
    ap.add_argument("--jobs", type=int, default=2, help="arms run at once (each one process, one thread)")
    args = ap.parse_args()
    root = args.out.resolve()
    if not args.table:
        from concurrent.futures import ThreadPoolExecutor

        if "so_nwp" in args.datasets:
            make_fixture(root)
        arms = [(d, m, e, s) for s in args.seeds for d in args.datasets for m in args.mechanisms for e in args.epsilons]
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda a: run_arm(*a, root), arms))
    rows = collect(root, args.seeds)
    common = ["dataset", "mechanism", "target ε", "seeds", "ledger ε", "accuracy %"]
    print(markdown(rows, common + [k for k in rows[0] if k.startswith(("exposure", "chance"))]))
    print()
    print(markdown(rows, common + ["UI AUC", "UI TPR@1%", "ε_LB"]))
    figures(rows, root, ROOT / "experiments" / "figures")
    (root / "table.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
