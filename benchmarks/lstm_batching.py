"""Batched LSTM users against ``nn.LSTM`` user by user, on this machine's CPU (or a GPU).

W1's shape (LEAF's character LSTM: embedding 8, two LSTM layers of 256, 80 characters, batch 8)
and the SO LSTM shape (embedding 96, LSTM 670, 20 tokens, batch 16), for ``U`` users, each
with its own weights (as in a round: users diverge after their first local step). One forward
and backward pass of one batch per user, timed two ways in the same process:

- ``sequential``: the fused ``nn.LSTM`` user by user (what fedsim does by default on a CPU,
  and what the floor does);
- ``batched``: what ``sim.vectorize`` does for LSTM models: ``vmap`` over the users' stacked
  weights of the model's :class:`~fedsim.models.stepwise_lstm.StepwiseLSTM` twin.

The per-user losses and gradients are first checked equal (so the timing compares the same
computation). Usage::

    python benchmarks/lstm_batching.py [--users 20] [--reps 3] [--device cpu] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.func import functional_call, vmap

from fedsim.models import make_model
from fedsim.models.stepwise_lstm import stepwise_twin

#: name → (model, dims, sequence length, batch, loss over the model's output)
SHAPES = {
    "w1": ("shakespeare_lstm", 80, 80, 8, "last"),
    "so_lstm": ("so_nwp_lstm", {"num_classes": 10004}, 20, 16, "every"),
}


def _loss(out: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "last":
        return torch.nn.functional.cross_entropy(out, y)
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def measure(shape: str, users: int, reps: int, device: str) -> dict:
    """Median seconds of one fwd+bwd batch for ``users`` users, both ways, and their ratio."""
    name, dims, steps, batch, kind = SHAPES[shape]
    torch.manual_seed(0)
    model = make_model(name, dims, seed=0).to(device)
    twin = stepwise_twin(model)
    classes = model.head.out_features
    x = torch.randint(0, classes, (users, batch, steps), device=device)
    y = torch.randint(0, classes, (users, batch) if kind == "last" else (users, batch, steps), device=device)
    stacked = {n: p.detach() + 0.01 * torch.randn(users, *p.shape, device=device) for n, p in model.named_parameters()}

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def sequential() -> tuple[torch.Tensor, list[torch.Tensor]]:
        losses, grads = [], []
        for u in range(users):
            own = {n: v[u].clone().requires_grad_(True) for n, v in stacked.items()}
            lo = _loss(functional_call(model, own, (x[u],)), y[u], kind)
            grads.append(torch.autograd.grad(lo, list(own.values()))[0])
            losses.append(lo.detach())
        return torch.stack(losses), grads

    per_user = vmap(lambda p, xb, yb: _loss(functional_call(twin, p, (xb,)), yb, kind))

    def batched() -> tuple[torch.Tensor, list[torch.Tensor]]:
        leaves = {n: v.clone().requires_grad_(True) for n, v in stacked.items()}
        lo = per_user(leaves, x, y)
        first = torch.autograd.grad(lo.sum(), list(leaves.values()))[0]
        return lo.detach(), list(first)

    (la, ga), (lb, gb) = sequential(), batched()
    torch.testing.assert_close(lb, la, rtol=1e-4, atol=1e-5)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)
    times: dict[str, list[float]] = {"sequential": [], "batched": []}
    for _ in range(reps):
        for label, fn in (("sequential", sequential), ("batched", batched)):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[label].append(time.perf_counter() - t0)
    s, b = statistics.median(times["sequential"]), statistics.median(times["batched"])
    return {"shape": shape, "users": users, "device": device, "sequential_s": s, "batched_s": b, "ratio": b / s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--json", action="store_true", help="print one JSON row per shape")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for shape in args.shapes:
        r = measure(shape, args.users, args.reps, args.device)
        if args.json:
            print(json.dumps(r))
        else:
            print(
                f"{shape}: {r['users']} users on {r['device']}, one batch fwd+bwd: sequential nn.LSTM "
                f"{r['sequential_s']:.3f} s, batched StepwiseLSTM {r['batched_s']:.3f} s, ratio {r['ratio']:.2f}"
            )


if __name__ == "__main__":
    main()
