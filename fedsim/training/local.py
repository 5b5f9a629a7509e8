"""One client's local update, and a worker's pass over many users.

A worker keeps one model object and loads each user's starting point into it in
place (no per-user model, optimizer or serialization). Local training is plain
minibatch SGD; each user's randomness (which samples, in which order) comes from
``derive_seed(seed, "client", round, user)``, so a user's update does not depend
on which worker trains it or which users came before.

After local training, the user's delta ``Δ_i = x_local − x_t`` is clipped to
``c`` (:func:`fedsim.privacy.clip_vector`) here, in fedsim's own client code; the
server re-clips the sum of ``m`` users to ``m·c``.

Isolation: one user's data never changes another user's contribution. A user whose local
training raises (any exception: data, forward, backward, Opacus, DiSK, error feedback) or whose
clipped delta is not finite in the float32 that is summed contributes exactly zero and is
counted (``UserResult.failed`` / ``UserResult.nonfinite``); the other users of the same reply
are unaffected, so the server never has to drop a multi-user reply because of one user.
"""

from __future__ import annotations

import copy
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from fedsim.data import FederatedData
from fedsim.models.softmax_head import fused_loss
from fedsim.parameters import load_flat_ as load_flat_  # used here; re-exported for callers
from fedsim.privacy.clipping import clip_rows, clip_vector, is_finite_norm
from fedsim.seeding import make_generator
from fedsim.training.hook_probe import stateful_hook
from fedsim.training.isolation import fresh_copy, reset_for_user
from fedsim.training.step_graphs import graphs_for, sgd_step


@dataclass(frozen=True)
class LocalTraining:
    """Local-training hyperparameters (``client.*`` in the config).

    Parameters
    ----------
    epochs : passes over the user's capped sample set.
    batch_size : samples per SGD step.
    lr : SGD step size.
    max_examples : samples per user per epoch (a seeded draw without replacement).
    clip_norm : ``c``, the per-user L2 bound on the delta.
    fused_softmax : on a CPU, compute the model's output layer and a softmax cross-entropy
        training loss together in row blocks (:mod:`fedsim.models.softmax_head`; ``sim.fused_softmax``),
        where both the model and the data allow it. Equal to the unfused loss up to float rounding.
        Default False.
    cuda_graphs : on a CUDA device, replay a recurrent model's local steps from CUDA graphs
        (:mod:`fedsim.training.step_graphs`; ``sim.cuda_graphs``). The same kernels on the same values as
        eager steps. Default False.
    clip_stability : automatic clipping's ``r`` (``clipping.mode = "automatic"``): every delta
        becomes ``c·Δ/(‖Δ‖ + r)``. None (default): flat clipping ``Δ·min(1, c/‖Δ‖)``.
    """

    epochs: int
    batch_size: int
    lr: float
    max_examples: int
    clip_norm: float
    fused_softmax: bool = False
    cuda_graphs: bool = False
    clip_stability: float | None = None
    local_update: str | None = None


@dataclass
class UserResult:
    """One user's outcome. ``failed``: local training raised; ``nonfinite``: the delta was not
    finite. Either way the user contributed zero, and ``loss`` is NaN. ``code_error``: for a user
    whose training raised outside the dataset's own reads (the model, the loss, a hook: code,
    not data), the traceback; None otherwise."""

    user: int
    loss: float
    num_examples: int
    norm: float
    clipped: bool
    failed: bool = False
    nonfinite: bool = False
    code_error: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.failed or self.nonfinite)


class UserDataError(Exception):
    """A user's own data could not be read (the dataset raised): a data reason, not a code one."""


def read_data(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a read of one user's data; what it raises becomes a `UserDataError`."""
    try:
        return fn(*args)
    except Exception as e:
        raise UserDataError(f"{type(e).__name__}: {e}") from e


def failed_result(user: int, error: BaseException | None = None) -> UserResult:
    """The result of a user whose local training raised (it contributes zero). ``error``: the
    exception; one raised outside the dataset's reads (not a `UserDataError`) keeps its
    traceback as ``code_error``. Default None."""
    code = None
    if error is not None and not isinstance(error, UserDataError):
        code = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return UserResult(user, math.nan, 0, 0.0, False, failed=True, code_error=code)


def isolated_clip(
    delta: torch.Tensor, clip_norm: float, keep_device: bool = False, stability: float | None = None
) -> tuple[torch.Tensor, float, bool]:
    """``(clip(Δ, c) on the CPU, ‖Δ‖, finite)``: a non-finite delta, or one whose clipped copy is
    not finite once cast to the float32 that workers sum and send, becomes zeros with
    ``finite = False``. The dtype of ``Δ`` is kept (the worker's float32 sum casts it); a
    wider ``Δ`` is clipped with float32's margin, so the cast's norm is still at most ``c``.
    ``keep_device``: leave the clipped copy on ``Δ``'s device (a GPU worker sums there and
    copies the sum once, instead of every user's update). Default False. ``stability``: automatic
    clipping's ``r`` (:func:`~fedsim.privacy.clipping.clip_vector`); None (default): flat."""
    clipped, norm = clip_vector(delta, clip_norm, sent_as=torch.float32, stability=stability)
    out = clipped.detach() if keep_device else clipped.detach().cpu()
    if not is_finite_norm(norm):
        return torch.zeros_like(out), math.inf, False
    # A finite float32 (or narrower) vector scaled by at most 1 stays finite; a wider dtype can
    # still overflow the float32 cast, so only then is every entry checked.
    if out.dtype == torch.float64 and not bool(torch.isfinite(out.to(torch.float32)).all()):
        return torch.zeros_like(out), math.inf, False
    return out, norm, True


def isolated_clip_rows(
    rows: torch.Tensor, clip_norm: float, keep_device: bool = False, stability: float | None = None
) -> tuple[torch.Tensor, list[float], list[bool]]:
    """:func:`isolated_clip` on each row of a ``(U, d)`` tensor at once (vectorized training):
    ``(clipped rows on the CPU, norms, finite flags)``, each row exactly what
    :func:`isolated_clip` gives it alone. ``keep_device`` and ``stability`` as there."""
    out, norms = clip_rows(rows, clip_norm, sent_as=torch.float32, stability=stability)
    out = out.detach() if keep_device else out.detach().cpu()
    finite = [is_finite_norm(n) for n in norms]
    if out.dtype == torch.float64:  # a wider dtype can still overflow the float32 cast
        fits = torch.isfinite(out.to(torch.float32)).all(dim=1).tolist()
        for i, ok in enumerate(fits):
            if finite[i] and not ok:
                out[i], norms[i], finite[i] = 0.0, math.inf, False
    return out, norms, finite


def local_delta(
    model: nn.Module,
    x0: torch.Tensor,
    data: FederatedData,
    user: int,
    round_index: int,
    seed: int,
    spec: LocalTraining,
    while_queued: Callable[[], None] | None = None,
) -> tuple[torch.Tensor, float, int]:
    """Local SGD for ``user`` from the flat parameters ``x0``; return ``(Δ, mean loss, samples)``
    with ``Δ = x_local − x0`` (unclipped, on the model's device).

    The samples and their order depend only on ``(seed, round_index, user)``, never on
    ``x0``: two calls from different starting points see the same batches in the same order
    (what DiSK's two-point evaluation needs).

    ``while_queued``: host work to run once every step is queued, before the first value is
    read back (on a GPU the device is still running the steps meanwhile); it must not raise.
    Default None.
    """
    params = list(model.parameters())
    dev = params[0].device
    x0 = x0.to(dev)
    g = make_generator(seed, "client", int(round_index), int(user))
    n = read_data(data.num_train, user)
    if spec.local_update is not None:  # a registered hook trains a fresh copy; fedsim clips (caller)
        return _hook_delta(fresh_copy(model, x0), x0, data, user, g, n, spec)
    reset_for_user(model, x0)  # nothing of the previous user: gradients, buffers, mode
    # the step losses are read once, at the end: a read per step would make the host wait for a
    # GPU's every step instead of queueing the next
    step_losses: list[torch.Tensor] = []
    steps, seen = 0, 0
    fused = fused_loss(model, data, dev) if spec.fused_softmax else None
    lossf = data.loss

    def loss_of(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return fused(xb, yb) if fused is not None else lossf(model(xb), yb)

    # on a GPU, a recurrent model's steps are replayed from CUDA graphs (the same step, queued by
    # one call instead of hundreds: sim.cuda_graphs)
    graphs = graphs_for(model, data, spec.lr, spec.cuda_graphs)
    for _ in range(spec.epochs):
        perm = torch.randperm(n, generator=g)[: spec.max_examples].numpy()
        for s in range(0, len(perm), spec.batch_size):
            xb, yb = read_data(data.train_samples, user, np.sort(perm[s : s + spec.batch_size]))
            if graphs is not None:
                step_losses.append(graphs.step(xb, yb))
            else:
                step_losses.append(sgd_step(params, loss_of, xb.to(dev), yb.to(dev), spec.lr))
            steps += 1
            seen += len(yb)
    with torch.no_grad():
        delta = parameters_to_vector(params) - x0
    if while_queued is not None:
        while_queued()
    loss_sum = 0.0  # in step order, float by float (not sum(), which compensates from Python 3.12)
    for v in torch.stack(step_losses).tolist() if step_losses else []:
        loss_sum += v
    return delta, loss_sum / max(steps, 1), seen


def _hook_delta(
    model: nn.Module,
    x0: torch.Tensor,
    data: FederatedData,
    user: int,
    g: torch.Generator,
    n: int,
    spec: LocalTraining,
) -> tuple[torch.Tensor, float, int]:
    """``(Δ, loss, samples)`` of the registered local update ``spec.local_update``
    (:mod:`fedsim.training.local_updates`) on the user's seeded batches. ``model`` is this user's
    own fresh copy (`fedsim.training.isolation.fresh_copy`), dropped afterwards."""
    from fedsim.training.local_updates import LOCAL_UPDATES

    update = LOCAL_UPDATES.get_part(str(spec.local_update))
    dev = x0.device
    seen = [0]

    def batches():
        for _ in range(spec.epochs):
            perm = torch.randperm(n, generator=g)[: spec.max_examples].numpy()
            for s in range(0, len(perm), spec.batch_size):
                xb, yb = read_data(data.train_samples, user, np.sort(perm[s : s + spec.batch_size]))
                seen[0] += len(yb)
                yield xb.to(dev), yb.to(dev)

    # the hook's own copy of the settings: one it changes (a schedule on spec.lr) reaches no other user
    loss = float(update(model, batches(), data.loss, copy.copy(spec)))
    with torch.no_grad():
        delta = parameters_to_vector(list(model.parameters())) - x0
    return delta, loss, seen[0]


@dataclass(frozen=True)
class DiskClient:
    """DiSK's client side (docs/algorithms.md §6): where to evaluate and how to mix.

    Parameters
    ----------
    mode : ``two_point`` (local updates at ``x_t`` and at ``y_t = x_t + γ·d_{t−1}``, mixed
        ``a·Δ' + (1−a)·Δ`` before clipping) or ``lookahead`` (only at ``y_t``; ``a = 1``).
    gamma : ``γ``, the look-ahead step along the previous server step ``d_{t−1}``.
    a : the mixing weight ``(1−κ)/(κγ)`` (1 in ``lookahead``).
    """

    mode: str
    gamma: float
    a: float

    @property
    def evaluations(self) -> int:
        """Local-training passes per user: 2 for ``two_point``, 1 for ``lookahead``."""
        return 2 if self.mode == "two_point" else 1

    def update(
        self, delta_at: Callable[[torch.Tensor], torch.Tensor], x_t: torch.Tensor, d_prev: torch.Tensor
    ) -> torch.Tensor:
        """The unclipped DiSK update ``v = a·Δ(y_t) + (1−a)·Δ(x_t)``.

        ``delta_at(x)`` runs the user's local training from ``x`` and returns its delta; it
        must use the same data, order and seed for every starting point.
        """
        y_t = x_t + self.gamma * d_prev.to(x_t.device, x_t.dtype)
        d_y = delta_at(y_t)
        if self.mode == "lookahead":
            return d_y
        d_x = delta_at(x_t)
        return d_y.mul_(self.a).add_(d_x, alpha=1.0 - self.a)


def user_delta(
    model: nn.Module,
    x0: torch.Tensor,
    data: FederatedData,
    user: int,
    round_index: int,
    seed: int,
    spec: LocalTraining,
    disk: DiskClient | None = None,
    d_prev: torch.Tensor | None = None,
    example_dp: Any = None,
    while_queued: Callable[[], None] | None = None,
) -> tuple[torch.Tensor, float, int]:
    """The user's unclipped update from ``x0``: ``(Δ, loss, samples)``.

    With ``disk`` (and the previous server step ``d_prev``), ``Δ`` is DiSK's mixed update
    (:meth:`DiskClient.update`); the reported loss is the one at ``x0`` (``two_point``) or
    at the look-ahead point (``lookahead``). With ``example_dp`` (an
    :class:`~fedsim.training.example_dp.ExampleDP`), local training is Opacus DP-SGD on the silo's
    examples (:func:`~fedsim.training.example_dp.local_delta_example_dp`). ``while_queued``: as in
    :func:`local_delta` (not run under ``example_dp``).
    """
    if example_dp is not None:
        from fedsim.training.example_dp import local_delta_example_dp, silo_samples

        samples = read_data(silo_samples, data, user)
        return local_delta_example_dp(
            model,
            x0,
            samples,
            round_index,
            user,
            seed,
            spec.lr,
            spec.batch_size,
            spec.epochs,
            example_dp,
            loss_fn=data.loss,
            max_examples=spec.max_examples,
        )
    if disk is None:
        return local_delta(model, x0, data, user, round_index, seed, spec, while_queued=while_queued)
    if d_prev is None:
        raise ValueError("DiSK needs the previous server step d_prev (zeros at round 0)")
    stats: list[tuple[float, int]] = []

    def delta_at(x: torch.Tensor) -> torch.Tensor:
        d, lo, n = local_delta(model, x, data, user, round_index, seed, spec, while_queued=while_queued)
        stats.append((lo, n))
        return d

    delta = disk.update(delta_at, x0.to(next(model.parameters()).device), d_prev)
    return delta, stats[-1][0], stats[-1][1]


def train_one_user(
    model: nn.Module,
    x0: torch.Tensor,
    data: FederatedData,
    user: int,
    round_index: int,
    seed: int,
    spec: LocalTraining,
    disk: DiskClient | None = None,
    d_prev: torch.Tensor | None = None,
    example_dp: Any = None,
    keep_device: bool = False,
    while_queued: Callable[[], None] | None = None,
) -> tuple[torch.Tensor, UserResult]:
    """Train ``user`` from the flat parameters ``x0``; return ``(clip(Δ, c), result)``
    (``Δ`` from :func:`user_delta`, clipped after any DiSK mixing).
    Training runs on the model's device; the returned update is on the CPU, or on the model's
    device with ``keep_device`` (default False). ``while_queued``: as in :func:`local_delta`.
    """
    try:
        delta, loss, seen = user_delta(
            model, x0, data, user, round_index, seed, spec, disk, d_prev, example_dp, while_queued
        )
    except Exception as e:  # this user's data or training failed: it contributes zero (isolation)
        where = next(model.parameters()).device if keep_device else "cpu"
        return torch.zeros(x0.numel(), dtype=torch.float32, device=where), failed_result(user, e)
    clipped, norm, finite = isolated_clip(delta, spec.clip_norm, keep_device, spec.clip_stability)
    if not finite:
        return clipped, UserResult(user, math.nan, seen, math.inf, False, nonfinite=True)
    return clipped, UserResult(user, loss, seen, norm, norm > spec.clip_norm)


def train_users(
    model: nn.Module,
    x0: torch.Tensor,
    data: FederatedData,
    users: list[int],
    round_index: int,
    seed: int,
    spec: LocalTraining,
    disk: DiskClient | None = None,
    d_prev: torch.Tensor | None = None,
    example_dp: Any = None,
) -> tuple[torch.Tensor, list[UserResult]]:
    """Train each user from ``x0``; return the running sum of their clipped deltas and their results.
    ``disk``/``d_prev``: DiSK's client evaluation; ``example_dp``: Opacus DP-SGD in each silo
    (:func:`user_delta`). The sum is kept on the model's device and returned on the CPU.

    Where the dataset reads users' rows lazily (``prepare_train``, e.g. Stack Overflow), the
    next user's rows are read while this user's steps are queued: on a GPU, the host's reading
    and decoding overlaps the device's training instead of following it."""
    dev = next(model.parameters()).device
    total = torch.zeros(x0.numel(), dtype=torch.float32, device=dev)
    x0 = x0.to(dev)  # once, not once per user
    refused = _refused_hook(model, x0, data, users, round_index, seed, spec)
    if refused is not None:
        return total.cpu(), refused
    results = []
    for i, u in enumerate(users):
        ahead = prepare_next(data, users[i + 1]) if i + 1 < len(users) else None
        clipped, res = train_one_user(
            model, x0, data, u, round_index, seed, spec, disk, d_prev, example_dp, keep_device=True, while_queued=ahead
        )
        total.add_(clipped)
        results.append(res)
    return total.cpu(), results


def _refused_hook(
    model: nn.Module,
    x0: torch.Tensor,
    data: FederatedData,
    users: list[int],
    round_index: int,
    seed: int,
    spec: LocalTraining,
) -> list[UserResult] | None:
    """Every user failed in code with the reason, when the registered local update keeps state
    between calls (`fedsim.training.hook_probe`); None otherwise (no hook, or an honest one)."""
    if spec.local_update is None or not users:
        return None
    reason = stateful_hook(local_delta, model, x0, data, users[0], round_index, seed, spec)
    if reason is None:
        return None
    return [UserResult(u, math.nan, 0, 0.0, False, failed=True, code_error=reason) for u in users]


def prepare_next(data: FederatedData, user: int) -> Callable[[], None] | None:
    """``data.prepare_train(user)`` as a call that never raises, or None where the dataset has
    no ``prepare_train``. Reading ahead must not touch the user being trained: if the next
    user's rows fail to load, nothing happens here, and that user's own training meets the
    error again and fails alone (isolation)."""
    prepare = getattr(data, "prepare_train", None)
    if prepare is None:
        return None

    def read_ahead() -> None:
        try:
            prepare(user)
        except Exception:  # the next user's problem, met again (and counted) when it trains
            pass

    return read_ahead


def train_users_ef(
    model: nn.Module,
    x0: torch.Tensor,
    data: FederatedData,
    users: list[int],
    round_index: int,
    seed: int,
    spec: LocalTraining,
    mode: str,
    ef_clip: float,
    states: dict[int, torch.Tensor] | None = None,
    disk: DiskClient | None = None,
    d_prev: torch.Tensor | None = None,
    example_dp: Any = None,
) -> tuple[torch.Tensor, list[UserResult], dict[int, torch.Tensor] | torch.Tensor]:
    """Train users with clipping error feedback (:mod:`fedsim.training.error_feedback`).

    Parameters
    ----------
    mode : ``client`` (send ``clip(Δ, c₁) + clip(e_i, c₂)``, return the new ``e_i``) or
        ``server`` (send ``clip(Δ, c₁)``, return the summed residuals ``Σ(Δ − clip(Δ, c₁))``).
    ef_clip : ``c₂``; ``spec.clip_norm`` is ``c₁``.
    states : ``client`` mode: each user's ``e_i`` (flat, CPU).

    Returns ``(Σ u_i, results, new states | residual sum)``; all on the CPU.
    """
    from fedsim.training.error_feedback import client_ef_update

    if mode not in ("client", "server"):
        raise ValueError(f"error feedback mode {mode!r}")
    total = torch.zeros(x0.numel(), dtype=torch.float32)
    extra: dict[int, torch.Tensor] | torch.Tensor = {} if mode == "client" else torch.zeros_like(total)
    refused = _refused_hook(model, x0, data, users, round_index, seed, spec)
    if refused is not None:  # nobody trained: client states stay as they were
        return total, refused, ({u: states[u] for u in users} if mode == "client" and states is not None else extra)
    results = []
    for u in users:
        if mode == "client":
            assert states is not None and isinstance(extra, dict)
            extra[u] = states[u]  # unchanged unless this participation succeeds
        try:
            delta, loss, seen = user_delta(model, x0, data, u, round_index, seed, spec, disk, d_prev, example_dp)
            delta = delta.detach().to("cpu", torch.float32)
            if mode == "client":
                assert states is not None
                upd, new_state, norm = client_ef_update(delta, states[u], spec.clip_norm, ef_clip)
                residual = None
            else:
                upd, norm = clip_vector(delta, spec.clip_norm)
                residual, new_state = delta - upd, None
        except Exception as e:  # isolation: a failing user contributes zero and keeps its state
            results.append(failed_result(u, e))
            continue
        parts = [upd] + [x for x in (new_state, residual) if x is not None]
        if not (is_finite_norm(norm) and all(bool(torch.isfinite(x).all()) for x in parts)):
            results.append(UserResult(u, math.nan, seen, math.inf, False, nonfinite=True))
            continue
        total.add_(upd)
        if isinstance(extra, dict):  # client mode
            assert new_state is not None
            extra[u] = new_state
        else:
            assert residual is not None
            extra.add_(residual)
        results.append(UserResult(u, loss, seen, norm, norm > spec.clip_norm))
    return total, results, extra


@torch.no_grad()
def evaluate_users(
    model: nn.Module, x: torch.Tensor, data: FederatedData, users: list[int], max_examples: int | None
) -> dict[str, float]:
    """Evaluation sums over ``users``' test samples (:meth:`eval_sums` of the dataset, summed):
    ``loss_sum``/``loss_count``, ``correct``/``count`` (the headline accuracy), ``examples`` and
    any dataset-specific ``<name>_correct``/``<name>_count`` pairs. A user whose evaluation raises
    or gives a non-finite sum is left out and counted in ``failed_users`` (isolation: one user's
    data cannot turn the metrics into NaN). The counts every dataset sums start at 0, so workers
    whose users hold no test samples reply with zeros (a valid reply that adds nothing), not with
    a reply that lacks ``count`` and is taken for a failed one."""
    params = list(model.parameters())
    dev = params[0].device
    load_flat_(params, x.to(dev))
    model.eval()
    sums: dict[str, float] = dict.fromkeys(
        ("loss_sum", "loss_count", "correct", "count", "examples", "failed_users"), 0.0
    )
    for u in users:
        mine: dict[str, float] = {}
        try:
            xb, yb = data.test_samples(u, max_examples)
            xb, yb = xb.to(dev), yb.to(dev)
            for s in range(0, len(yb), 256):
                for k, v in data.eval_sums(model(xb[s : s + 256]), yb[s : s + 256]).items():
                    mine[k] = mine.get(k, 0.0) + v
        except Exception:
            mine = {"": math.nan}
        if not all(math.isfinite(v) for v in mine.values()):
            sums["failed_users"] += 1
            continue
        for k, v in mine.items():
            sums[k] = sums.get(k, 0.0) + v
    return sums
