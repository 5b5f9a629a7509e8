"""The Stack Overflow output layer and loss, fused (``sim.fused_softmax = "auto"``) against unfused.

Two measurements on one thread, in one process, alternating the two ways so that machine load
hits both alike:

- ``layer_ms``: one forward and backward of the output layer and its loss alone, on the shape of
  a Stack Overflow step (16 sequences × 20 positions = 320 rows, embedding 96, 10,004 classes):
  ``cross_entropy(linear(f), t, ignore_index=0)`` against
  :func:`fedsim.models.softmax_head.linear_cross_entropy`; median of ``--reps`` calls. A quarter
  of the rows are padding (ignored), about the share in the generated sentences below.
- ``user_ms``: one user's whole local update (``fedsim.training.local.train_one_user``: 64 sentences,
  batch 16, the full ``so_nwp_lstm`` model) on generated tokens (``fedsim data synth
  stackoverflow``: 100 users, written to a temporary folder), with ``fused_softmax`` off and on;
  median over ``--users`` users, each trained both ways. ``ignored_fraction``: the share of
  those users' target positions that are padding (the rows the fused layer leaves out).

Usage::

    python benchmarks/softmax_head.py [--users 60] [--reps 40] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedsim.data import data_spec, load_federated
from fedsim.data.stackoverflow.synthetic import generate
from fedsim.models import make_model
from fedsim.models.softmax_head import linear_cross_entropy
from fedsim.training.allocator import tune_allocator
from fedsim.training.local import LocalTraining, train_one_user

ROWS, EMBED, CLASSES = 320, 96, 10_004


def layer_ms(reps: int) -> dict[str, float]:
    """Median ms of one forward and backward of the output layer and loss, each way."""
    g = torch.Generator().manual_seed(0)
    f = torch.randn(ROWS, EMBED, generator=g, requires_grad=True)
    w = (torch.randn(CLASSES, EMBED, generator=g) * 0.1).requires_grad_()
    b = torch.zeros(CLASSES, requires_grad=True)
    t = torch.randint(1, CLASSES, (ROWS,), generator=g)
    t[::4] = 0  # padding positions, about as many as in the generated sentences
    ways = {
        "off": lambda: F.cross_entropy(F.linear(f, w, b), t, ignore_index=0),
        "fused": lambda: linear_cross_entropy(f, w, b, t, 0),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for i in range(reps + 5):
        for k in sorted(ways, reverse=bool(i % 2)):
            t0 = time.perf_counter()
            ways[k]().backward()
            if i >= 5:
                times[k].append(time.perf_counter() - t0)
            f.grad = w.grad = b.grad = None
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def user_ms(users: int) -> tuple[dict[str, float], float]:
    """Median ms of one user's local update, each way, and the share of padding targets."""
    with tempfile.TemporaryDirectory() as tmp:
        root = generate(Path(tmp) / "so", users=100, per_user=64.0, vocab=12_000, tags=50, seed=0)
        data = load_federated(data_spec("stackoverflow_nwp", root=str(root), vocab_size=10_000, seq_len=20))
        model = make_model("so_nwp_lstm", data.model_dims(), seed=0)
        x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
        off = LocalTraining(epochs=1, batch_size=16, lr=0.5, max_examples=64, clip_norm=1.0)
        specs = {"off": off, "fused": dataclasses.replace(off, fused_softmax=True)}
        for u in range(3):  # warm-up: the allocator's steady state, oneDNN's primitive cache
            for spec in specs.values():
                train_one_user(model, x0, data, u, 0, 0, spec)
        times: dict[str, list[float]] = {k: [] for k in specs}
        pad = total = 0
        padding: int = data.softmax_ignore_index  # type: ignore[attr-defined]  # the SO data's padding target
        for u in range(3, 3 + users):
            _, y = data.train_samples(u % data.population, np.arange(min(64, data.num_train(u % data.population))))
            pad, total = pad + int(torch.eq(y, padding).sum()), total + y.numel()
            for k in sorted(specs, reverse=bool(u % 2)):
                t0 = time.perf_counter()
                train_one_user(model, x0, data, u % data.population, 0, 0, specs[k])
                times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}, pad / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=60, help="users timed each way (default 60)")
    ap.add_argument("--reps", type=int, default=40, help="layer calls timed each way (default 40)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tune_allocator()
    layer, (user, ignored) = layer_ms(args.reps), user_ms(args.users)
    row = {
        "layer_ms": layer,
        "layer_ratio": layer["fused"] / layer["off"],
        "user_ms": user,
        "user_ratio": user["fused"] / user["off"],
        "ignored_fraction": ignored,
    }
    if args.json:
        print(json.dumps(row, indent=1))
        return
    print(
        f"output layer + loss, forward and backward: {layer['off']:.2f} ms unfused, {layer['fused']:.2f} ms fused "
        f"({row['layer_ratio']:.3f}x); one SO user's local update: {user['off']:.1f} ms unfused, "
        f"{user['fused']:.1f} ms fused ({row['user_ratio']:.3f}x); {ignored:.1%} of the targets are padding"
    )


if __name__ == "__main__":
    main()
