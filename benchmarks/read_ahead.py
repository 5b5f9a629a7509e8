"""Reading the next user's rows while the device trains: SO LSTM rounds with and without it.

Stack Overflow users' rows are read from the SQLite file and decoded when a worker first needs
them (a few milliseconds a user on the host; a small per-process cache keeps the last few). On a
GPU, a user's local steps are replayed from CUDA graphs and queued, so the host is free while
the device trains; :func:`fedsim.training.local.train_users` uses that time to read and decode the
next user's rows (``prepare_train``). Without it, the device waits for every user's decoding.

This script runs the SO LSTM workload of ``benchmarks/throughput.py`` (100 generated users,
cohort 10, batch 16 × 20 tokens, 4 steps a user) in-process, ``--reps`` times each way,
alternating in one process: ``ahead`` (fedsim as it is) and ``plain`` (reading ahead switched
off by replacing :func:`fedsim.training.local.prepare_next` with one that returns None). Each run's
time is the median of its rounds' seconds, without the first (set-up and captures) and the last
(final accounting); the ratio is ``ahead / plain`` of the medians over repetitions. The runs'
results are the same either way (reading ahead changes when rows are read, not which).

Usage::

    python benchmarks/read_ahead.py [--device cuda] [--rounds 12] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure(device: str, rounds: int, reps: int) -> dict:
    """Per-round seconds of the SO LSTM workload with and without reading ahead, alternating."""
    from throughput import COMMON, GPU_OVERRIDES, WORKLOADS

    import fedsim.training.local as training
    from fedsim.config import load_config
    from fedsim.data.stackoverflow.synthetic import generate
    from fedsim.runner import run_experiment

    real = training.prepare_next
    per: dict[str, list[float]] = {"ahead": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp) / "so"
        so.mkdir()
        generate(so, users=100, per_user=64.0, vocab=12_000, tags=50, seed=0)
        overrides = [o.format(so_root=so) for o in WORKLOADS["so_lstm"]] + COMMON + [f"rounds={rounds}"]
        overrides += (GPU_OVERRIDES if device == "cuda" else []) + [
            "sim.engine='inprocess'",
            "sim.num_workers=1",
            "sim.vectorize='off'",
        ]
        try:
            for n in range(2 * reps):
                label = "ahead" if n % 2 == 0 else "plain"
                training.prepare_next = real if label == "ahead" else (lambda data, user: None)  # type: ignore[assignment]
                out = f"{tmp}/{label}{n}"
                run_experiment(load_config(None, overrides), out, progress=False)
                seconds = [json.loads(line)["seconds"] for line in open(out + "/metrics.jsonl")]
                per[label].append(statistics.median(seconds[1:-1]))
        finally:
            training.prepare_next = real
    ahead, plain = statistics.median(per["ahead"]), statistics.median(per["plain"])
    return {
        "workload": "so_lstm",
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "rounds": rounds,
        "per_round_s": {"ahead": ahead, "plain": plain},
        "per_rep_s": per,
        "ratio_ahead_to_plain": ahead / plain,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda", help="where users train (default cuda)")
    ap.add_argument("--rounds", type=int, default=12, help="rounds a run (default 12)")
    ap.add_argument("--reps", type=int, default=3, help="runs each way, alternating (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("read_ahead.py --device cuda needs a CUDA device")
    torch.set_num_threads(1)
    row = measure(args.device, args.rounds, args.reps)
    if args.json:
        print(json.dumps(row, indent=1))
    else:
        print({k: round(v, 4) for k, v in row["per_round_s"].items()}, "ratio", round(row["ratio_ahead_to_plain"], 3))


if __name__ == "__main__":
    main()
