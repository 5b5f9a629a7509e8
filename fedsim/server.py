"""The server's DP step: noise, fixed denominator, server optimizer, ledger.

Given ``U_t`` (the guarded sum of clipped updates), round ``t`` computes
``ĝ_t = (U_t + c·z·sens·n_t) / K̄`` and steps the server optimizer on the
pseudo-gradient ``−ĝ_t`` (ALGORITHMS.md section 1, steps 4–5). ``K̄`` is the
expected cohort size, never the realised count. Everything after the noise is
post-processing.
"""

from __future__ import annotations

from typing import Any

import torch

from fedsim.optim import ServerOptimizer
from fedsim.privacy.ledger import Ledger
from fedsim.privacy.noise import NoiseMechanism


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
    """

    def __init__(self, params: torch.Tensor, noise: NoiseMechanism, optimizer: ServerOptimizer,
                 ledger: Ledger, clip_norm: float, noise_multiplier: float, expected_cohort: int) -> None:
        self.params = params.detach().clone().to(torch.float32)
        self.noise = noise
        self.optimizer = optimizer
        self.ledger = ledger
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_cohort = int(expected_cohort)
        self.round = 0  # rounds completed

    @property
    def noise_std(self) -> float:
        """Std of the noise added to the sum: ``c·z·sens``."""
        return self.clip_norm * self.noise_multiplier * self.noise.sensitivity

    def noisy_mean(self, total: torch.Tensor, t: int) -> torch.Tensor:
        """``ĝ_t = (U_t + c·z·sens·n_t) / K̄``."""
        g = total.to(self.params.device, torch.float32).clone()
        if self.noise_std > 0:
            g.add_(self.noise.row(t).to(g.device), alpha=self.noise_std)
        return g.div_(self.expected_cohort)

    def step(self, total: torch.Tensor, realized_cohort: int) -> float:
        """Finish round ``self.round``: noise, optimizer step, ledger. Returns ε so far."""
        t = self.round
        g_hat = self.noisy_mean(total, t)
        self.optimizer.step(self.params, g_hat.neg_())
        eps = self.ledger.record_round(t, realized_cohort)
        self.round += 1
        return eps

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "params": self.params.clone(),
            "optimizer": self.optimizer.state_dict(),
            "noise": self.noise.state_dict(),
            "ledger": self.ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.params = state["params"].clone().to(self.params.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.noise.load_state_dict(state["noise"])
        self.ledger.load_state_dict(state["ledger"])
