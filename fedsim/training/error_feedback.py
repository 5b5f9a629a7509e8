"""Clipping error feedback (DiceSGD, the DiceSGD paper (Zhang et al.); docs/algorithms.md §8).

``client`` (privacy-standard): user ``i`` keeps ``e_i`` across its participations and sends
``u_i = clip(Δ_i, c₁) + clip(e_i, c₂)``, then ``e_i ← e_i + Δ_i − u_i``. ``‖u_i‖ ≤ c₁ + c₂``,
so the server's per-user bound and the noise use ``c = c₁ + c₂``; accounting is unchanged.
In simulation the users' ``e_i`` live in a :class:`ClientStateStore` held by the simulator
(never by the DP aggregation, which only sees the guarded sum), travel to the worker that
trains the user and come back with the reply; the store is checkpointed. Its worst case
``N·d`` floats must fit ``client.error_feedback_memory_mb``, checked before the run.

Two opt-in changes of what a user keeps (both unset by default, which is the recursion above):
``client.ef_state_bound`` ``B`` keeps ``e_i ← clip(e_new, B)`` and ``client.ef_decay`` ``β``
keeps ``e_i ← β·e_new`` (together ``clip(β·e_new, B)``; :func:`kept_state`). Their privacy
argument: every message is still ``clip(Δ_i, c₁) + clip(e_i, c₂)``, of norm ``≤ c₁ + c₂``
whatever ``e_i`` holds, so the sensitivity and the accounting are those of ``c = c₁ + c₂``; the
state is a function of the user's own deltas and of the broadcast models only, and it reaches
anyone else only through those clipped messages. In simulation the store that keeps it is the
users' memory: the DP server never reads it, it is in no metric or log, only in the checkpoint
(which also holds the noise key; client error feedback is refused in deployment), and a resumed
run restores it as kept, so the bound or the decay is applied once per participation. Without a
bound, a user whose deltas stay above ``c₁ + c₂`` adds ``‖Δ_i‖ − c₁ − c₂`` (or more) to ``e_i`` at
every participation, so ``clip(e_i, c₂) = c₂`` in the direction of ``e_i`` from its second
participation on; the bound and the decay stop that growth (experiments/README.md, "DiceSGD").

``server`` (paper-faithful Algorithm 2, **no privacy guarantee**): clients send ``clip(Δ_i, c₁)``
and their residual ``Δ_i − clip(Δ_i, c₁)``; the server keeps ``e`` and releases
``v_t = (1/K̄)·Σ clip(Δ_i, c₁) + clip(e_t, c₂)`` plus noise, then
``e_{t+1} = e_t − clip(e_t, c₂) + (1/K̄)·Σ(Δ_i − clip(Δ_i, c₁))``. The residuals are not
clipped, so one user's unbounded delta reaches the releases through ``e``: a single user with
``‖Δ‖ = 50`` (``K̄ = 100``, ``c₁ = c₂ = 1``, ``z = 1``, ``q = 0.05``, 200 rounds) shifts them by
28 noise standard deviations, a lower bound of ε ≥ 496 (``tests/redteam/test_server_ef.py``).
The paper's Theorem 3.7 does not cover this. fedsim therefore reports **ε = ∞** for such a run
(the accounting spec's ``no_guarantee`` flag), runs it only with
``privacy.allow_no_guarantee = true``, refuses it with matrix-factorization noise and in
deployment, and labels every output with :data:`SERVER_EF_LABEL`. The noise it adds has std
``z·√(c₁² + 2c₂²)`` on the sum (the theorem's shape), for comparison with the paper only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from fedsim.errors import FedsimError
from fedsim.privacy.clipping import clip_vector

#: Label carried by every output of a run with server-side error feedback.
SERVER_EF_LABEL = (
    "NO PRIVACY GUARANTEE (ε = ∞): server-side error feedback (DiceSGD Algorithm 2) feeds the "
    "unclipped residuals Δ_i − clip(Δ_i, c₁) back into the releases, so one user's data can "
    "move them without bound. A non-private research mode "
    "(privacy.allow_no_guarantee = true); use client.error_feedback = 'client' for DP."
)


def kept_state(e_new: torch.Tensor, bound: float | None = None, decay: float | None = None) -> torch.Tensor:
    """What a user keeps of its new error: ``clip(β·e_new, B)`` (``client.ef_decay`` ``β``,
    ``client.ef_state_bound`` ``B``; either may be unset: ``β = 1``, no bound). With both unset
    ``e_new`` itself is returned (the default recursion, unchanged). A non-finite ``e_new`` is
    returned as it is (not mapped to zeros by the clip), so that the caller still sees it and
    treats the participation as failed (the user contributes zero and keeps its old state)."""
    if decay is not None and decay != 1.0:
        e_new = e_new * decay
    if bound is not None:
        clipped, norm = clip_vector(e_new, bound)
        if math.isfinite(norm):
            e_new = clipped
    return e_new


def client_ef_update(
    delta: torch.Tensor,
    e: torch.Tensor,
    c1: float,
    c2: float,
    bound: float | None = None,
    decay: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One participation of the client variant.

    Parameters
    ----------
    delta : ``Δ_i``, the user's unclipped local delta.
    e : ``e_i``, the user's error state before this participation (same shape).
    c1, c2 : clip norms of the delta and of the error.
    bound, decay : ``B`` and ``β`` of :func:`kept_state` (opt-in; default unset).

    Returns ``(u_i, e_i_new, ‖Δ_i‖)`` with ``u_i = clip(Δ_i, c₁) + clip(e_i, c₂)`` and
    ``e_i_new = e_i + Δ_i − u_i``, or ``clip(β·(e_i + Δ_i − u_i), B)`` with the options.
    ``‖u_i‖ ≤ c₁ + c₂`` whatever ``Δ_i`` and ``e_i`` are (a non-finite one is clipped to zero).
    """
    cd, norm = clip_vector(delta, c1)
    ce, _ = clip_vector(e, c2)
    u = cd + ce
    return u, kept_state(e + delta - u, bound, decay), norm


def state_bytes(population: int, dim: int) -> int:
    """Worst-case bytes of the client store: one float32 ``e_i`` per user."""
    return int(population) * int(dim) * 4


def check_memory(population: int, dim: int, budget_mb: float) -> None:
    """Refuse a population whose error states would not fit ``budget_mb`` (MiB)."""
    need = state_bytes(population, dim) / 2**20
    if need > budget_mb:
        raise FedsimError(
            f"client.error_feedback = 'client' keeps one error vector per user: {population} users × "
            f"{dim:,} parameters need {need:,.0f} MiB, over client.error_feedback_memory_mb = "
            f"{budget_mb:,.0f}; raise client.error_feedback_memory_mb, lower data.max_users or use "
            f"a smaller model"
        )


class ClientStateStore:
    """The users' error states ``e_i`` in simulation (created lazily as zeros).

    Parameters
    ----------
    dim : ``d``.
    population : ``N`` (for the memory check).
    budget_mb : the memory budget in MiB (``client.error_feedback_memory_mb``).
    bound, decay : ``client.ef_state_bound`` ``B`` and ``client.ef_decay`` ``β`` (default unset):
        :meth:`put` keeps ``clip(β·e_new, B)`` of the state a worker returns, as the user would
        (the store is the simulated users' own memory; the worker sends ``u_i`` from the state
        it was given, so the bound and the decay act only on what is kept).
    """

    def __init__(
        self, dim: int, population: int, budget_mb: float, bound: float | None = None, decay: float | None = None
    ) -> None:
        check_memory(population, dim, budget_mb)
        self.dim = int(dim)
        self.bound = bound
        self.decay = decay
        self.states: dict[int, np.ndarray] = {}

    def get(self, user: int) -> np.ndarray:
        """``e_i`` (zeros before the user's first participation); float32, length ``d``."""
        s = self.states.get(int(user))
        return np.zeros(self.dim, dtype=np.float32) if s is None else s

    def valid(self, value: Any) -> bool:
        """A float vector of length ``d`` that is finite after the cast to float32 (what is stored)."""
        if not (
            isinstance(value, np.ndarray) and value.shape == (self.dim,) and np.issubdtype(value.dtype, np.floating)
        ):
            return False
        with np.errstate(over="ignore"):
            return bool(np.all(np.isfinite(value.astype(np.float32))))

    def put(self, user: int, value: np.ndarray) -> None:
        """Keep ``value`` (a user's ``e_new``) as ``e_i``, through :func:`kept_state` when
        ``bound`` or ``decay`` is set."""
        stored = np.asarray(value, dtype=np.float32).copy()
        if not np.all(np.isfinite(stored)):
            raise ValueError("error state is not finite in float32; validate it with valid() first")
        if self.bound is not None or self.decay is not None:
            stored = kept_state(torch.from_numpy(stored), self.bound, self.decay).numpy()
        self.states[int(user)] = stored

    def state_dict(self) -> dict[str, Any]:
        users = sorted(self.states)
        stacked = np.stack([self.states[u] for u in users]) if users else np.zeros((0, self.dim), np.float32)
        return {"users": users, "states": torch.from_numpy(stacked)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        arr = state["states"].numpy()
        self.states = {int(u): arr[i].copy() for i, u in enumerate(state["users"])}


class ServerErrorFeedback:
    """The server variant's error ``e`` (experimental; see the module docstring).

    Parameters
    ----------
    dim : ``d``.
    c2 : ``c₂``, the clip norm of the error fed back each round.
    device : device of ``e``.
    """

    def __init__(self, dim: int, c2: float, device: str | torch.device = "cpu") -> None:
        self.e = torch.zeros(int(dim), dtype=torch.float32, device=device)
        self.c2 = float(c2)

    def feedback(self) -> torch.Tensor:
        """``clip(e_t, c₂)``."""
        return clip_vector(self.e, self.c2)[0].clone()

    def step(self, fed_back: torch.Tensor, residual_mean: torch.Tensor) -> None:
        """``e_{t+1} = e_t − clip(e_t, c₂) + residual_mean`` (``residual_mean = (1/K̄)·Σ r_i``)."""
        self.e.sub_(fed_back).add_(residual_mean.to(self.e.device, self.e.dtype))

    def state_dict(self) -> dict[str, Any]:
        return {"e": self.e.clone(), "c2": self.c2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.e = state["e"].clone().to(self.e.device)
        self.c2 = float(state["c2"])


def server_noise_norm(c1: float, c2: float) -> float:
    """The norm the server variant's noise is scaled by: ``√(c₁² + 2c₂²)``."""
    return math.sqrt(c1 * c1 + 2.0 * c2 * c2)
