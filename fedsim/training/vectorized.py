"""Many users' local training at once (``sim.vectorize``): ``torch.func`` over stacked
per-user parameters.

For small models and small users, a worker's time goes into per-step Python and kernel
launch overhead, not arithmetic; training ``U`` users as one batched computation
(``vmap`` of the loss over a leading user dimension, one backward pass for all users) removes most of it. The result equals
sequential training (:func:`fedsim.training.local.local_delta` user by user) up to float rounding:
every user takes the same steps on the same batches in the same order, drawn from its own
generator ``(seed, "client", round, user)``; users are grouped by the samples an epoch takes
(``min(n, max_examples)``) so that their step structures coincide, and each user's samples that
its plan takes are loaded, not all of them. ``tests/training/test_vectorized.py`` checks the equivalence.

A model that batches its own forward pass (``batched_forward(stacked_params, x)``: the linear
models, :func:`fedsim.models.batched_linear`; only where the class defining it also defines the
model's ``forward``) is called directly instead of through ``vmap`` and ``functional_call``, whose
per-call cost was a third of a W2 step; the users' deltas are clipped
as one batch (:func:`fedsim.training.local.isolated_clip_rows`, each row exactly what
:func:`~fedsim.training.local.isolated_clip` gives it alone).

Models with ``nn.LSTM`` layers are trained through their
:func:`~fedsim.models.stepwise_lstm.stepwise_twin` (the same function written from matrix
products and gates, which ``vmap`` batches; the fused kernel does not batch). That was
measured slower than the fused kernel user by user, on the CPU and on an H200 GPU (where the
step-by-step LSTM's hundreds of small kernels per sequence cost more than each user's fused step
replayed from a CUDA graph: W1 0.395× the GPU floor batched, 0.301× user by user), so ``sim.vectorize = 'auto'`` trains recurrent models user by user and ``'on'``
batches them (:func:`fedsim.runner.resolve_vectorize`). Other recurrent layers (Opacus's ``DPLSTM``, GRUs) are
not vectorized; neither are DiSK's two-point evaluation, error feedback or example-level DP,
which keep their sequential paths.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from fedsim.models import recurrent as recurrent  # re-exported: where models are sorted
from fedsim.models.stepwise_lstm import stepwise_twin, supported
from fedsim.seeding import make_generator, reseed
from fedsim.training.isolation import reset_for_user

#: Above this many parameters ``sim.vectorize = 'auto'`` trains a non-recurrent model user by user
#: (arithmetic dominates anyway); ``on`` batches any size.
MAX_PARAMS = 2_000_000
#: Users trained together at most.
CHUNK = 64
#: Stacked parameters held at once, in floats (bounds memory: a chunk holds at most this many,
#: so CHUNK users of a MAX_PARAMS model, fewer of a larger one).
STACKED_FLOATS = CHUNK * MAX_PARAMS


def vectorizable(model: nn.Module) -> bool:
    """Whether ``model`` can be trained under ``vmap``: its only recurrent layers are
    ``nn.LSTM`` s that :class:`~fedsim.models.stepwise_lstm.StepwiseLSTM` covers. (Whether it
    pays off is :func:`fedsim.runner.resolve_vectorize`'s question.)"""
    for m in model.modules():
        if isinstance(m, nn.LSTM) and supported(m):
            continue
        if isinstance(m, nn.RNNBase) or type(m).__name__.startswith("DPLSTM") or type(m).__name__ == "DPRNNBase":
            return False
    return True


def _plan(data, u: int, round_index: int, seed: int, spec, g: torch.Generator | None = None) -> list[np.ndarray]:
    """User ``u``'s per-epoch sample order, exactly as :func:`fedsim.training.local.local_delta` draws it
    (``g``, when given, is reseeded for the user instead of building a generator)."""
    g = (
        make_generator(seed, "client", int(round_index), int(u))
        if g is None
        else reseed(g, seed, "client", int(round_index), int(u))
    )
    n = data.num_train(u)
    return [torch.randperm(n, generator=g)[: spec.max_examples].numpy() for _ in range(spec.epochs)]


def _own_batched_forward(model: nn.Module) -> Callable[..., Any] | None:
    """``model.batched_forward`` when the class that defines it also defines the ``forward`` the
    model runs; None otherwise. (A subclass of a linear model that changes ``forward`` inherits a
    ``batched_forward`` that no longer computes it: such a model goes through ``vmap``.)"""
    if getattr(model, "batched_forward", None) is None:
        return None
    mro = type(model).__mro__
    owner = next(c for c in mro if "batched_forward" in vars(c))
    forward_owner = next((c for c in mro if "forward" in vars(c)), None)
    return getattr(model, "batched_forward") if owner is forward_owner else None  # noqa: B009


def _make_step(model: nn.Module, buffers: dict[str, torch.Tensor], data: Any) -> Callable[..., Any]:
    """``step(p, xb, yb) -> (per-user gradients, per-user losses)`` for stacked parameters ``p``."""
    batched_loss = getattr(data, "batched_loss", None)
    batched_forward = _own_batched_forward(model)
    if batched_loss is not None and batched_forward is not None and not buffers:
        # the model batches its own forward pass (a linear model: one batched matrix product,
        # the same arithmetic as vmap's, without vmap's and functional_call's per-call cost)

        def forward(p: Any, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            return batched_loss(batched_forward(p, xb), yb)
    elif batched_loss is not None:  # vmap the model only; the dataset batches its own loss
        outputs = vmap(lambda p, xb: functional_call(model, (p, buffers), (xb,)))

        def forward(p: Any, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            return batched_loss(outputs(p, xb), yb)
    else:

        def loss_of(p: Any, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            return data.loss(functional_call(model, (p, buffers), (xb,)), yb)

        forward = vmap(loss_of)

    def step(
        p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        # Per-user gradients from one backward pass of Σ_u loss_u: user u's loss depends only on
        # its own slice of the stacked parameters, so ∂(Σ loss)/∂p[u] = ∂loss_u/∂p[u]. (The same
        # numbers as vmap(grad(loss)); plain autograd avoids torch.func.grad's one-off import of
        # torch._dynamo, about a second of start-up.)
        leaves = {k: v.detach().requires_grad_(True) for k, v in p.items()}
        lo = forward(leaves, xb, yb)
        grads = torch.autograd.grad(lo.sum(), list(leaves.values()))
        return dict(zip(leaves, grads)), lo.detach()

    return step


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with zero rows appended up to ``rows`` rows (filler that no step indexes)."""
    if len(t) >= rows:
        return t
    return torch.cat([t, t.new_zeros((rows - len(t), *t.shape[1:]))])


class _VectorizedPass:
    """One worker's pass over its users, trained in groups of one step structure under ``vmap``.

    Results accumulate in ``clipped_of`` (user → clipped delta) and ``results`` (user →
    :class:`~fedsim.training.local.UserResult`); a user whose data fails contributes zero (isolation).
    """

    def __init__(self, model: nn.Module, x0: torch.Tensor, data: Any, round_index: int, seed: int, spec: Any) -> None:
        params = dict(model.named_parameters())
        self.names = list(params)
        shapes = [params[n].shape for n in self.names]
        sizes = [params[n].numel() for n in self.names]
        self.dev = next(iter(params.values())).device
        self.x0 = x0.to(self.dev)
        self.base = dict(zip(self.names, (t.view(s) for t, s in zip(torch.split(self.x0, sizes), shapes))))
        reset_for_user(model, self.x0)  # gradients, buffers and mode as no user left them
        # recurrent layers run as their vmap-able twin (same parameter names, same function)
        batched_model = stepwise_twin(model) if recurrent(model) else model
        self.step = _make_step(batched_model, dict(batched_model.named_buffers()), data)
        self.model, self.data, self.round_index, self.seed, self.spec = model, data, round_index, seed, spec
        self.clipped_of: dict[int, torch.Tensor] = {}
        self.results: dict[int, Any] = {}
        self.plans: dict[int, list[np.ndarray]] = {}
        self.positions: dict[int, list[np.ndarray]] = {}  # plans as rows of the loaded samples

    def fail(self, u: int) -> None:
        from fedsim.training.local import failed_result

        self.clipped_of[u] = torch.zeros(self.x0.numel(), dtype=torch.float32, device=self.dev)
        self.results[u] = failed_result(u)

    def group(self, users: list[int]) -> dict[tuple[int, ...], list[int]]:
        """Sample orders for ``users``, grouped by their step structure: the number of samples
        each epoch takes (``min(n, max_examples)``), not the user's whole sample count, so users
        with more samples than ``max_examples`` train together however many they have."""
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        g = torch.Generator()
        for u in users:
            try:  # isolation: a user whose data cannot even be sized or shuffled contributes zero
                self.plans[u] = _plan(self.data, u, self.round_index, self.seed, self.spec, g)
                groups[tuple(len(p) for p in self.plans[u])].append(u)
            except Exception:
                self.fail(u)
        return groups

    def _load(self, chunk: list[int]) -> tuple[list[int], list[Any]]:
        """Each user's samples that its plan takes (in index order; its plan rewritten to
        positions among them), zero rows appended up to the chunk's longest, never indexed.
        A user whose data returns another number of samples than asked for is trained on its
        own, as the sequential path trains it (padding must not stand in for its samples)."""
        samples = []
        for u in list(chunk):
            try:  # a user whose samples cannot be read contributes zero; the others stay batched
                used = np.unique(np.concatenate(self.plans[u]))
                got = self.data.train_samples(u, used)
                if len(got[0]) != len(used) or len(got[1]) != len(used):
                    self.train_sequentially([u])
                    chunk = [v for v in chunk if v != u]
                    continue
                samples.append(got)
                self.positions[u] = [np.searchsorted(used, p) for p in self.plans[u]]
            except Exception:
                self.fail(u)
                chunk = [v for v in chunk if v != u]
        longest = max((len(s[0]) for s in samples), default=0)
        padded = [tuple(_pad_rows(t, longest) for t in s[:2]) for s in samples]
        return chunk, padded

    def _descend(self, chunk: list[int], samples: list[Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor, int, int]:
        """Local SGD for ``chunk`` together: (stacked parameters, summed losses, steps, samples seen)."""
        spec, dev, U = self.spec, self.dev, len(chunk)
        p = {k: v.unsqueeze(0).expand(U, *v.shape).clone() for k, v in self.base.items()}
        xs = torch.stack([s[0] for s in samples]).to(dev)
        ys = torch.stack([s[1] for s in samples]).to(dev)
        rows = torch.arange(U, device=dev).unsqueeze(1)
        loss_sum = torch.zeros(U, device=dev, dtype=torch.float64)
        steps = seen = 0
        for e in range(spec.epochs):
            perms = np.stack([self.positions[u][e] for u in chunk])  # same length for a group
            for s in range(0, perms.shape[1], spec.batch_size):
                idx = torch.from_numpy(np.sort(perms[:, s : s + spec.batch_size], axis=1)).to(dev)
                g, lo = self.step(p, xs[rows, idx], ys[rows, idx])
                with torch.no_grad():
                    for k in p:
                        p[k].sub_(g[k], alpha=spec.lr)
                loss_sum += lo.detach().double()
                steps += 1
                seen += idx.shape[1]
        return p, loss_sum, steps, seen

    def train_chunk(self, chunk: list[int]) -> None:
        """Train ``chunk`` (users of one step structure) together under ``vmap``; each user's
        delta is clipped on its own, and a non-finite one becomes zero (isolation)."""
        from fedsim.training.local import UserResult, isolated_clip_rows

        chunk, samples = self._load(chunk)
        if not chunk:
            return
        # buffers as the worker built them, whatever a user trained one by one before left in them
        reset_for_user(self.model, self.x0)
        p, loss_sum, steps, seen = self._descend(chunk, samples)
        with torch.no_grad():
            flat = torch.cat([p[k].reshape(len(chunk), -1) for k in self.names], dim=1) - self.x0
        clip = self.spec.clip_norm
        # each row as isolated_clip alone
        clipped, norms, finites = isolated_clip_rows(flat, clip, keep_device=True, stability=self.spec.clip_stability)
        losses = loss_sum.tolist()
        for i, u in enumerate(chunk):
            self.clipped_of[u], norm, finite = clipped[i], norms[i], finites[i]
            self.results[u] = (
                UserResult(u, losses[i] / max(steps, 1), seen, norm, norm > clip)
                if finite
                else UserResult(u, float("nan"), seen, float("inf"), False, nonfinite=True)
            )

    def train_sequentially(self, chunk: list[int]) -> None:
        """A chunk whose batched pass raised: its users one by one, each isolated."""
        from fedsim.training.local import train_one_user

        for u in chunk:
            self.clipped_of[u], self.results[u] = train_one_user(
                self.model, self.x0, self.data, u, self.round_index, self.seed, self.spec, keep_device=True
            )


def train_users_vectorized(
    model: nn.Module, x0: torch.Tensor, data: Any, users: list[int], round_index: int, seed: int, spec: Any
) -> tuple[torch.Tensor, list[Any]]:
    """Like :func:`fedsim.training.local.train_users` (sum of clipped deltas, per-user results), with
    users trained in groups under ``vmap``. ``spec`` is a :class:`~fedsim.training.local.LocalTraining`."""
    if getattr(spec, "local_update", None) is not None:  # build.resolve_vectorize never asks this
        raise ValueError("a registered local update trains each user on its own copy: it is never vectorized")
    run = _VectorizedPass(model, x0, data, round_index, seed, spec)
    groups = run.group(users)
    size = max(1, min(CHUNK, STACKED_FLOATS // max(1, x0.numel())))
    for key in sorted(groups):
        members = groups[key]
        for c in range(0, len(members), size):
            chunk = members[c : c + size]
            try:
                run.train_chunk(chunk)
            except Exception:
                run.train_sequentially(chunk)
    total = torch.zeros(x0.numel(), dtype=torch.float32, device=run.dev)
    for u in users:  # the sequential path's summation order, on the training device
        total.add_(run.clipped_of[u])
    return total.cpu(), [run.results[u] for u in users]
