"""Fingerprints of what a run releases, to prove that a refactoring changed nothing.

Runs four experiments (the bundled default, a banded-MF run, a dense-MF run and an
adaptive-clipping run) and prints, for each, the SHA-256 of the final model, of the metrics
rows with the wall-clock field ``seconds`` removed, and of the ledger. Run it on the commit
before a refactoring and after it, on the same machine, and compare the two JSON files:

    python benchmarks/behaviour_hashes.py --out before.json      # on the old commit
    python benchmarks/behaviour_hashes.py --out after.json       # on the new one
    diff before.json after.json

``--quick`` shrinks the default experiment to 20 rounds (the other three are small already).
Bit-identity holds on one machine and torch build; float reductions may differ elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

RUNS: dict[str, list[str]] = {
    "default": [],
    "banded": [
        "rounds=24",
        "privacy.mechanism='banded'",
        "sampling.scheme='min_sep'",
        "sampling.min_sep=4",
        "data.max_users=120",
        "eval.every=12",
        "eval.max_users=20",
    ],
    "dense": [
        "rounds=16",
        "privacy.mechanism='dense'",
        "sampling.scheme='epochs'",
        "sampling.min_sep=4",
        "data.max_users=120",
        "eval.every=8",
        "eval.max_users=20",
    ],
    "adaptive_clip": [
        "rounds=20",
        "privacy.mechanism='gaussian'",
        "sampling.scheme='poisson'",
        "sampling.cohort_size=20",
        "data.max_users=200",
        "clipping.adaptive=true",
        "eval.every=10",
        "eval.max_users=20",
    ],
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(out: Path) -> dict[str, str]:
    """The hashes of one finished run folder."""
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("seconds", None)
    ledger = json.loads((out / "ledger.json").read_text())
    return {
        "model_sha256": summary["model_sha256"],
        "rows": str(len(rows)),
        "metrics_sha256": _sha(json.dumps(rows, sort_keys=True).encode()),
        "ledger_sha256": _sha(json.dumps(ledger, sort_keys=True).encode()),
        "epsilon": repr(summary["epsilon"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON file for the fingerprints")
    ap.add_argument("--only", nargs="*", default=list(RUNS), help="which runs (default: all four)")
    ap.add_argument("--quick", action="store_true", help="the default experiment for 20 rounds only")
    args = ap.parse_args()
    from fedsim.config import DEFAULT_EXPERIMENT, load_config
    from fedsim.runner import run_experiment

    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            sets = list(RUNS[name]) + (["rounds=20"] if args.quick and name == "default" else [])
            cfg = load_config(DEFAULT_EXPERIMENT, sets)
            run_experiment(cfg, Path(tmp) / name, progress=False)
            result[name] = fingerprint(Path(tmp) / name)
            print(name, result[name], flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
