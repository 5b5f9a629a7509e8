"""The server's DP step: noise, fixed denominator, server optimizer, ledger.

Given ``U_t`` (the guarded sum of clipped updates), round ``t`` computes
``ĝ_t = (U_t + c·z·sens·n_t) / K̄`` and steps the server optimizer on the
pseudo-gradient ``−ĝ_t`` (docs/algorithms.md §1, steps 4–5). ``K̄`` is the
expected cohort size, never the realised count. Everything after the noise is
post-processing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedsim.privacy.ledger import Ledger
from fedsim.privacy.noise import NoiseMechanism
from fedsim.server.optim import ServerOptimizer


class DPServer:
    """Server state of a user-level DP run.

    Parameters
    ----------
    params : initial flat float32 parameters ``x_0`` (copied).
    noise : the noise mechanism (``row(t)`` and ``sensitivity``).
    optimizer : the server optimizer.
    ledger : the privacy ledger (one entry per completed round).
    clip_norm : ``c``.
    noise_multiplier : ``z`` (0 for no noise).
    expected_cohort : ``K̄``, the fixed denominator.
    filter : optional server-side filter applied to ``ĝ_t`` before the optimizer
        (``step(update) -> update``, ``state_dict()``), e.g. from :func:`fedsim.server.filters.make_filter`.
        An optimizer with ``uses_raw`` (LP-Adam) also gets ``−ĝ_t`` from before the filter.
    clip_controller : optional :class:`~fedsim.privacy.adaptive_clip.AdaptiveClip`; then
        ``clip_norm`` is ``c_t`` of the current round and moves after every step, and
        ``noise_multiplier`` is the update's share ``z_Δ``.
    error_feedback : optional :class:`~fedsim.training.error_feedback.ServerErrorFeedback` (experimental):
        ``ĝ_t = (U_t + noise)/K̄ + clip(e_t, c₂)``, then ``e_{t+1} = e_t − clip(e_t, c₂) + R_t/K̄``
        with ``R_t`` the summed residuals.
    """

    def __init__(
        self,
        params: torch.Tensor,
        noise: NoiseMechanism,
        optimizer: ServerOptimizer,
        ledger: Ledger,
        clip_norm: float,
        noise_multiplier: float,
        expected_cohort: float,
        filter: Any = None,
        clip_controller: Any = None,
        error_feedback: Any = None,
    ) -> None:
        self.params = params.detach().clone().to(torch.float32)
        self.noise = noise
        self.optimizer = optimizer
        self.ledger = ledger
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_cohort = float(expected_cohort)
        self.filter = filter
        self.clip_controller = clip_controller
        self.error_feedback = error_feedback
        #: ``d_{t−1} = x_t − x_{t−1}`` (DiSK's clients evaluate along it); kept when ``track_step``.
        self.track_step = bool(getattr(filter, "mode", "ema") in ("two_point", "lookahead"))
        #: coordinates of ĝ_t logged before/after the filter (``filter.trace_coordinates``).
        self.trace_index: torch.Tensor | None = None
        self.trace: dict[str, list[torch.Tensor]] = {"before": [], "after": []}
        self.last_step = torch.zeros_like(self.params) if self.track_step else None
        if clip_controller is not None:
            self.clip_norm = clip_controller.clip_norm
        self.round = 0  # rounds completed

    @property
    def noise_std(self) -> float:
        """Std of the noise added to the sum: ``c·z·sens``."""
        return self.clip_norm * self.noise_multiplier * self.noise.sensitivity

    def prefetch_noise(self) -> None:
        """Start drawing the new noise row ``ξ_t`` of the next round to finish (``t`` =
        :attr:`round`) in the background; the same numbers as drawing it in :meth:`step`. Asking
        again for the same row is free. The ledger's next ε (a PLD composition under Poisson
        sampling) is started in the background too."""
        if self.noise_std > 0:
            self.noise.prefetch(self.round)
        self.ledger.prefetch()

    def noisy_mean(self, total: torch.Tensor, t: int) -> torch.Tensor:
        """``ĝ_t = (U_t + c·z·sens·n_t) / K̄``."""
        g = total.to(self.params.device, torch.float32).clone()
        if self.noise_std > 0:
            g.add_(self.noise.row(t).to(g.device), alpha=self.noise_std)
        return g.div_(self.expected_cohort)

    def step(
        self,
        total: torch.Tensor,
        realized_cohort: int,
        centred_count: float | None = None,
        residual_sum: torch.Tensor | None = None,
    ) -> float | None:
        """Finish round ``self.round``: noise, optimizer step, ledger. Returns ε so far (None
        when ``privacy.account_every`` skips this round).

        ``centred_count`` is ``Σ(b_i − ½)`` over the accepted users (adaptive clipping only);
        ``residual_sum`` is ``Σ(Δ_i − clip(Δ_i, c₁))`` (server error feedback only).
        """
        t = self.round
        g_hat = self.noisy_mean(total, t)
        if self.error_feedback is not None:
            if residual_sum is None:
                raise ValueError("server error feedback needs the residual sum")
            fed = self.error_feedback.feedback()
            g_hat.add_(fed.to(g_hat.device))
            self.error_feedback.step(fed, residual_sum.to(self.params.device) / self.expected_cohort)
        if self.trace_index is not None:
            self.trace["before"].append(g_hat[self.trace_index].detach().cpu().clone())
        raw = g_hat if self.optimizer.uses_raw else None  # ĝ_t before the filter (LP-Adam's v)
        if self.filter is not None:
            g_hat = self.filter.step(g_hat)  # a new tensor: ``raw`` is unchanged
        if self.trace_index is not None:
            self.trace["after"].append(g_hat[self.trace_index].detach().cpu().clone())
        if self.track_step:
            before = self.params.clone()
            self._optimizer_step(g_hat, raw)
            self.last_step = self.params - before
        else:
            self._optimizer_step(g_hat, raw)
        eps = self.ledger.record_round(t, realized_cohort, clip_norm=self.clip_norm)
        if self.clip_controller is not None:
            if centred_count is None:
                raise ValueError("adaptive clipping needs the centred count of unclipped users")
            self.clip_norm = self.clip_controller.step(centred_count, t)
        self.round += 1
        return eps

    def _optimizer_step(self, g_hat: torch.Tensor, raw: torch.Tensor | None) -> None:
        """Step the optimizer on ``−ĝ_t`` (after the filter) and, for optimizers that read it
        (``uses_raw``), ``−ĝ_t`` before the filter (``raw``; None for the others)."""
        grad = g_hat.neg()
        if raw is None:
            self.optimizer.step(self.params, grad)
        else:
            self.optimizer.step(self.params, grad, grad if raw is g_hat else raw.neg())

    def enable_trace(self, count: int, seed: int) -> None:
        """Log ``count`` seeded coordinates of ``ĝ_t`` before and after the filter each round."""
        from fedsim.seeding import make_generator

        g = make_generator(int(seed), "trace-coordinates")  # which coordinates to log: not private
        d = self.params.numel()
        self.trace_index = torch.randperm(d, generator=g)[: min(int(count), d)].sort().values.to(self.params.device)

    def write_trace(self, path: Any) -> None:
        """Write the logged coordinates to ``path`` (npz: ``index``, ``before``, ``after``; rounds × k)."""
        if self.trace_index is None:
            return
        k = int(self.trace_index.numel())
        stack = {n: (torch.stack(v).numpy() if v else np.zeros((0, k), np.float32)) for n, v in self.trace.items()}
        np.savez(path, index=self.trace_index.cpu().numpy(), before=stack["before"], after=stack["after"])

    def state_dict(self, noise_state: bool = True) -> dict[str, Any]:
        """Everything a resume needs. ``noise_state`` False puts only the noise stream's position
        in (:meth:`fedsim.privacy.noise.NoiseMechanism.position_dict`; its state is then written
        apart, :mod:`fedsim.noise_file`). Default True."""
        return {
            "round": self.round,
            "params": self.params.clone(),
            "optimizer": self.optimizer.state_dict(),
            "noise": self.noise.state_dict() if noise_state else self.noise.position_dict(),
            "ledger": self.ledger.state_dict(),
            "filter": None if self.filter is None else self.filter.state_dict(),
            "clip_norm": self.clip_norm,
            "error_feedback": None if self.error_feedback is None else self.error_feedback.state_dict(),
            "trace": {k: [x.clone() for x in v] for k, v in self.trace.items()},
            "last_step": None if self.last_step is None else self.last_step.clone(),
            "clip_controller": None if self.clip_controller is None else self.clip_controller.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.params = state["params"].clone().to(self.params.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.noise.load_state_dict(state["noise"])
        self.ledger.load_state_dict(state["ledger"])
        if self.filter is not None:
            self.filter.load_state_dict(state["filter"])
        self.clip_norm = float(state.get("clip_norm", self.clip_norm))
        self.trace = {k: [x.clone() for x in v] for k, v in state.get("trace", {"before": [], "after": []}).items()}
        if self.error_feedback is not None:
            self.error_feedback.load_state_dict(state["error_feedback"])
        if self.track_step:
            self.last_step = state["last_step"].clone().to(self.params.device)
        if self.clip_controller is not None:
            self.clip_controller.load_state_dict(state["clip_controller"])


def noise_variance_fn(
    noise_std: float | Callable[[int], float],
    expected_cohort: float,
    noising: np.ndarray | None,
    impulse: np.ndarray | None,
) -> Callable[[int], float]:
    """``Φ_t``: the exact per-coordinate variance of the DP noise inside the (filtered)
    update of round ``t`` (docs/algorithms.md §7), for DP-AdamBC (``impulse`` = the filter's
    ``H``) and LP-AdamBC (``impulse`` None: its second moment reads the unfiltered update).

    The noise in ``ĝ_t`` is ``(c·z·sens/K̄)·n_t`` with ``n = M·Z``; a linear per-coordinate
    filter with impulse response ``H`` turns it into ``(c·z·sens/K̄)·(H·M·Z)_t``, whose
    per-coordinate variance is ``(c·z·sens/K̄)² · ‖(H·M)[t, :]‖²``.

    With adaptive clipping the std of round ``τ`` is ``s_τ = c_τ·z_Δ·sens`` and the rows are
    weighted by it: ``Φ_t = ‖Σ_τ H[t, τ]·s_τ·M[τ, :]‖² / K̄²``.

    Parameters
    ----------
    noise_std : ``c·z·sens``, the std of the noise added to the sum; or a function of the
        round ``τ`` giving it (adaptive clipping; called only for ``τ ≤ t``).
    expected_cohort : ``K̄``.
    noising : ``M`` (``n × m``), or None for independent noise (``M = I``).
    impulse : the filter's ``H`` (``n × n`` lower-triangular), or None for no filter.
    """
    std_of = noise_std if callable(noise_std) else None
    scale = 1.0 / expected_cohort**2 if std_of else (float(noise_std) / expected_cohort) ** 2  # type: ignore[arg-type]
    cache: dict[int, float] = {}

    def phi(t: int) -> float:
        if t not in cache:
            h = np.zeros(t + 1) if impulse is None else np.asarray(impulse[t, : t + 1], dtype=np.float64)
            if impulse is None:
                h[t] = 1.0
            if std_of is not None:
                h = h * np.array([std_of(tau) for tau in range(t + 1)], dtype=np.float64)
            if noising is None:
                cache[t] = scale * float(h @ h)
            else:
                row = h @ np.asarray(noising[: t + 1], dtype=np.float64)
                cache[t] = scale * float(row @ row)
        return cache[t]

    return phi
