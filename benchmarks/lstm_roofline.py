"""How close a W1 training step is to this CPU core's arithmetic limit (one thread).

The W1 workload's step (LEAF's character LSTM: embedding 8, two LSTM layers of 256, batch 8 ×
80 characters) is almost all matrix products. Counting them, and timing both the step and the
core's single-precision matrix product rate, says how much faster any implementation of the
same computation could be on this core:

- ``step_gflop``: multiply-adds ×2 of one forward and backward pass: per layer the input and
  recurrent products ``2·B·T·4H·(I + H)`` forward, the same again for the weight gradients, and
  ``2·B·T·4H·(I + H)`` for the input and recurrent gradients (the first layer's input, the
  embedding, is trained, so its gradient is needed too); the output layer adds under 0.1 %.
- ``sgemm_gflops``: the best of ``torch.mm`` on a 2048² product and on the step's own large
  products (``B·T × (I + H) × 4H``).
- ``step_ms``: one step of fedsim's loop body (the model's ``nn.LSTM``, after
  :func:`fedsim.training.allocator.tune_allocator`, as fedsim's workers run it), median of 60 steps after
  60 warm-up steps, and ``step_gflops`` = ``step_gflop`` / ``step_ms``: the rate of the whole
  step, gates, activations and weight reorders included.
- With ``--floor-round S`` (the floor's seconds per W1 round from ``benchmarks/throughput.py``;
  160 steps: 20 users × 8 batches), ``needed_gflops_for_0_8``: the rate at which the products
  alone would have to run for a round at 0.8 × the floor's, with nothing else costing anything.
  Compare both with ``sgemm_gflops``.

Usage::

    python benchmarks/lstm_roofline.py [--floor-round 7.20] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

B, T, E, H, LAYERS, V = 8, 80, 8, 256, 2, 80

_STEP = r"""
import json, statistics, sys, time, torch
torch.set_num_threads(1)
from fedsim.training.allocator import tune_allocator
tune_allocator()
from fedsim.models import make_model
m = make_model("shakespeare_lstm", 80, seed=0)
x, y = torch.randint(0, 80, (8, 80)), torch.randint(0, 80, (8,))
params = list(m.parameters())
def step():
    for p in params:
        p.grad = None
    torch.nn.functional.cross_entropy(m(x), y).backward()
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-0.1)
for _ in range(60):  # the allocator's steady state (glibc raises its thresholds as blocks are freed)
    step()
times = []
for _ in range(60):
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
print(json.dumps(statistics.median(times)))
"""


def step_gflop() -> float:
    """Floating-point operations (10⁹) of one W1 training step's matrix products."""
    total = 0.0
    for layer in range(LAYERS):
        inputs = E if layer == 0 else H
        forward = 2 * B * T * 4 * H * (inputs + H)
        total += 3 * forward  # forward; weight gradients; input and recurrent gradients
    total += 3 * 2 * B * H * V  # the output layer on the last step
    return total / 1e9


def sgemm_gflops(reps: int = 20) -> float:
    """The best single-thread ``torch.mm`` rate (10⁹ flop/s) over a large square product and the
    step's own large products."""
    torch.set_num_threads(1)
    best = 0.0
    for m, k, n in ((2048, 2048, 2048), (B * T, H + H, 4 * H), (B * T, 4 * H, H)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        best = max(best, 2 * m * k * n / statistics.median(times) / 1e9)
    return best


def _step_ms() -> float:
    out = subprocess.run([sys.executable, "-c", _STEP, "tuned"], capture_output=True, text=True, check=True)
    return 1e3 * float(out.stdout.strip().splitlines()[-1])


#: W1 training steps per round: 20 users × 64 windows / batch 8.
STEPS_PER_ROUND = 20 * 64 // B


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--floor-round", type=float, default=None, help="the floor's seconds per W1 round")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    flop, step_ms, peak = step_gflop(), _step_ms(), sgemm_gflops()
    row = {"step_gflop": flop, "step_ms": step_ms, "step_gflops": flop / step_ms * 1e3, "sgemm_gflops": peak}
    if args.floor_round:
        row["floor_round_s"] = args.floor_round
        row["needed_gflops_for_0_8"] = flop * STEPS_PER_ROUND / (0.8 * args.floor_round)
    if args.json:
        print(json.dumps(row))
        return
    print(
        f"W1 step: {flop:.2f} GFLOP of matrix products in {step_ms:.1f} ms = {row['step_gflops']:.0f} GFLOP/s "
        f"(everything included); this core's sgemm: {peak:.0f} GFLOP/s"
        + (
            f"; a round at 0.8 × the floor's {args.floor_round:.2f} s needs {row['needed_gflops_for_0_8']:.0f} "
            f"GFLOP/s for the products alone"
            if args.floor_round
            else ""
        )
    )


if __name__ == "__main__":
    main()
