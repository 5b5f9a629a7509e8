"""Endurance: 2,048 rounds, MF noise, a population of 342,477 users; RSS every 100 rounds.

The run goes through the real path (``run_experiment``: Flower's simulation engine on Ray,
the strategy, the sampler, the BLT noise stream, the server optimizer, the ledger, metrics
and checkpoints every ``--checkpoint-every`` rounds). The population is the Stack Overflow
size: a few real Shakespeare users plus simulated users (the strategy's ``synthetic`` hook,
the same one the privacy audit's canaries use) whose clipped update is a seeded random
direction of norm ``c`` — no dataset of that size is needed to test that the server's state
stays bounded. What is measured is the server process (the sampler, ledger, noise state and
model live there): its resident set size (``VmRSS`` from ``/proc/self/status``) whenever a
round ``t`` with ``t % 100 == 0`` is aggregated, and its peak (``VmHWM``).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/endurance.py [--rounds 2048] [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from fedsim.config import load_config
from fedsim.seeding import make_generator

POPULATION = 342_477


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


class RandomUsers:
    """Simulated users: user ``u`` in round ``t`` sends ``c·ξ/‖ξ‖`` with ``ξ`` seeded by (u, t)."""

    def __init__(self, count: int, every: int = 100) -> None:
        self.count = int(count)
        self.every = int(every)
        self.samples: list[dict] = []
        self.t0 = time.perf_counter()

    def bind(self, first_id: int, dim: int) -> None:
        self.first_id, self.dim = int(first_id), int(dim)

    def update_sum(self, user_ids: list[int], t: int, clip_norm: float, dim: int) -> torch.Tensor:
        if t % self.every == 0:
            self.samples.append(
                {"round": t, "rss_mib": _status_kib("VmRSS") / 1024, "seconds": time.perf_counter() - self.t0}
            )
        total = torch.zeros(dim)
        for u in user_ids:
            xi = torch.randn(dim, generator=make_generator(0, "endurance", int(u), int(t)))
            total.add_(xi, alpha=clip_norm / float(xi.norm()))
        return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2048)
    ap.add_argument("--mechanism", default="blt", choices=["blt", "banded"])
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from fedsim.runner import run_experiment

    real = 2
    b = args.rounds  # one participation each: b = n groups of ⌊N/b⌋ users
    cfg = load_config(
        None,
        [
            f"rounds={args.rounds}",
            "model.name='shakespeare_lstm_small'",
            f"data.max_users={real}",
            "sampling.scheme='epochs'",
            f"sampling.min_sep={b}",
            f"sampling.cohort_size={POPULATION // b}",
            f"privacy.mechanism='{args.mechanism}'",
            "privacy.noise_multiplier=1.0",
            "eval.every=0",
            "eval.max_users=1",
            "eval.max_examples_per_user=1",
            "sim.num_workers=1",
            "sim.engine='ray'",
            f"checkpoint.every={args.checkpoint_every}",
            "server.optimizer='sgd'",
            "client.max_examples=4",
        ],
    )
    users = RandomUsers(POPULATION - real)
    out = args.out or Path(tempfile.mkdtemp(prefix="fedsim-endurance-")) / "run"
    t0 = time.perf_counter()
    summary = run_experiment(cfg, out, progress=False, synthetic=users)
    result = {
        "rounds": summary["rounds_completed"],
        "population": summary["population"],
        "mechanism": args.mechanism,
        "cohort": cfg.sampling.cohort_size,
        "num_parameters": summary["num_parameters"],
        "wall_seconds": time.perf_counter() - t0,
        "rss_mib": users.samples,
        "peak_rss_mib": _status_kib("VmHWM") / 1024,
        "epsilon": summary["epsilon"],
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{result['rounds']} rounds, N = {result['population']:,}, {args.mechanism}, "
            f"{result['wall_seconds']:.0f} s, peak RSS {result['peak_rss_mib']:.0f} MiB"
        )
        for s in users.samples:
            print(f"  round {s['round']:5d}  RSS {s['rss_mib']:7.1f} MiB  at {s['seconds']:6.0f} s")


if __name__ == "__main__":
    main()
