"""Many users' local training at once (``sim.vectorize``): ``torch.func`` over stacked
per-user parameters.

For small models and small users, a worker's time goes into per-step Python and kernel
launch overhead, not arithmetic; training ``U`` users as one batched computation
(``vmap`` of the loss over a leading user dimension, one backward pass for all users) removes most of it. The result equals
sequential training (:func:`fedsim.training.local_delta` user by user) up to float rounding:
every user takes the same steps on the same batches in the same order, drawn from its own
generator ``(seed, "client", round, user)``; users are grouped by sample count so that their
step structures coincide. ``tests/test_vectorized.py`` checks the equivalence.

Models with recurrent layers (``nn.LSTM``, Opacus's ``DPLSTM``) are not vectorized (their
fused kernels do not batch under ``vmap``); neither are DiSK's two-point evaluation, error
feedback or example-level DP, which keep their sequential paths.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from fedsim.seeding import make_generator

#: Above this many parameters a model is trained user by user (arithmetic dominates anyway).
MAX_PARAMS = 2_000_000
#: Users trained together at most (bounds memory: CHUNK copies of the parameters).
CHUNK = 64


def vectorizable(model: nn.Module) -> bool:
    """Whether ``model`` can be trained under ``vmap`` (no recurrent layers) and is small
    enough for it to pay off (at most :data:`MAX_PARAMS` parameters)."""
    if any(isinstance(m, nn.RNNBase) or type(m).__name__.startswith("DPLSTM") or type(m).__name__ == "DPRNNBase"
           for m in model.modules()):
        return False
    return sum(p.numel() for p in model.parameters()) <= MAX_PARAMS


def _plans(data, users: list[int], round_index: int, seed: int, spec) -> dict[int, list[np.ndarray]]:
    """Each user's per-epoch sample order, exactly as :func:`fedsim.training.local_delta` draws it."""
    out = {}
    for u in users:
        g = make_generator(seed, "client", int(round_index), int(u))
        n = data.num_train(u)
        out[u] = [torch.randperm(n, generator=g)[: spec.max_examples].numpy() for _ in range(spec.epochs)]
    return out


def train_users_vectorized(model: nn.Module, x0: torch.Tensor, data, users: list[int], round_index: int,
                           seed: int, spec) -> tuple[torch.Tensor, list]:
    """Like :func:`fedsim.training.train_users` (sum of clipped deltas, per-user results), with
    users trained in groups under ``vmap``. ``spec`` is a :class:`~fedsim.training.LocalTraining`."""
    from fedsim.training import UserResult

    params = dict(model.named_parameters())
    names = list(params)
    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]
    dev = next(iter(params.values())).device
    x0 = x0.to(dev)
    base = dict(zip(names, (t.view(s) for t, s in zip(torch.split(x0, sizes), shapes))))
    buffers = dict(model.named_buffers())
    model.train()

    def loss_of(p, xb, yb):
        out = functional_call(model, (p, buffers), (xb,))
        return data.loss(out, yb)

    batched_loss = getattr(data, "batched_loss", None)
    if batched_loss is not None:  # vmap the model only; the dataset batches its own loss
        outputs = vmap(lambda p, xb: functional_call(model, (p, buffers), (xb,)))

        def forward(p, xb, yb):
            return batched_loss(outputs(p, xb), yb)
    else:
        forward = vmap(loss_of)

    def step(p, xb, yb):
        # Per-user gradients from one backward pass of Σ_u loss_u: user u's loss depends only on
        # its own slice of the stacked parameters, so ∂(Σ loss)/∂p[u] = ∂loss_u/∂p[u]. (The same
        # numbers as vmap(grad(loss)); plain autograd avoids torch.func.grad's one-off import of
        # torch._dynamo, about a second of start-up.)
        leaves = {k: v.detach().requires_grad_(True) for k, v in p.items()}
        lo = forward(leaves, xb, yb)
        grads = torch.autograd.grad(lo.sum(), list(leaves.values()))
        return dict(zip(leaves, grads)), lo.detach()

    from fedsim.training import failed_result, isolated_clip, train_one_user

    def _train_chunk(chunk: list[int], n: int) -> None:
        """Train ``chunk`` (users with ``n`` samples each) together under ``vmap``; each user's
        delta is clipped on its own, and a non-finite one becomes zero (isolation)."""
        samples = []
        for u in list(chunk):
            try:  # a user whose samples cannot be read contributes zero; the others stay batched
                samples.append(data.train_samples(u, np.arange(n)))
            except Exception:
                clipped_of[u], results[u] = torch.zeros(x0.numel(), dtype=torch.float32), failed_result(u)
                chunk = [v for v in chunk if v != u]
        if not chunk:
            return
        U = len(chunk)
        p = {k: v.unsqueeze(0).expand(U, *v.shape).clone() for k, v in base.items()}
        xs = torch.stack([s[0] for s in samples]).to(dev)
        ys = torch.stack([s[1] for s in samples]).to(dev)
        rows = torch.arange(U, device=dev).unsqueeze(1)
        loss_sum = torch.zeros(U, device=dev, dtype=torch.float64)
        steps = seen = 0
        for e in range(spec.epochs):
            perms = np.stack([plans[u][e] for u in chunk])  # same length for a group
            for s in range(0, perms.shape[1], spec.batch_size):
                idx = torch.from_numpy(np.sort(perms[:, s: s + spec.batch_size], axis=1)).to(dev)
                g, lo = step(p, xs[rows, idx], ys[rows, idx])
                with torch.no_grad():
                    for k in p:
                        p[k].sub_(g[k], alpha=spec.lr)
                loss_sum += lo.detach().double()
                steps += 1
                seen += idx.shape[1]
        with torch.no_grad():
            flat = torch.cat([p[k].reshape(U, -1) for k in names], dim=1) - x0
        for i, u in enumerate(chunk):
            clipped_of[u], norm, finite = isolated_clip(flat[i], spec.clip_norm)
            results[u] = (UserResult(u, float(loss_sum[i]) / max(steps, 1), seen, norm, norm > spec.clip_norm)
                          if finite else UserResult(u, float("nan"), seen, float("inf"), False, nonfinite=True))

    clipped_of: dict[int, torch.Tensor] = {}
    results: dict[int, UserResult] = {}
    plans: dict[int, list[np.ndarray]] = {}
    groups: dict[int, list[int]] = defaultdict(list)
    for u in users:
        try:  # isolation: a user whose data cannot even be sized or shuffled contributes zero
            plans.update(_plans(data, [u], round_index, seed, spec))
            groups[data.num_train(u)].append(u)
        except Exception:
            clipped_of[u], results[u] = torch.zeros(x0.numel(), dtype=torch.float32), failed_result(u)

    def chunk_sequentially(chunk: list[int]) -> None:
        """A chunk whose batched pass raised: its users one by one, each isolated."""
        for u in chunk:
            clipped_of[u], results[u] = train_one_user(model, x0, data, u, round_index, seed, spec)

    for n in sorted(groups):
        members = groups[n]
        for c in range(0, len(members), CHUNK):
            chunk = members[c: c + CHUNK]
            try:
                _train_chunk(chunk, n)
            except Exception:
                chunk_sequentially(chunk)
    total = torch.zeros(x0.numel(), dtype=torch.float32)
    for u in users:  # the sequential path's summation order
        total.add_(clipped_of[u])
    return total, [results[u] for u in users]

