"""Adaptive clipping to a target quantile (Andrew et al. 2021; docs/algorithms.md §5).

Each sampled user ``i`` reports whether its delta fitted under the current clip norm,
centred: ``b_i − ½`` with ``b_i = 1[‖Δ_i‖ ≤ c_t]``. The centred bit has sensitivity ½
under add/remove adjacency and the server never needs the realised cohort size. The
server releases ``Σ (b_i − ½) + N(0, σ_b²)`` and moves the clip norm geometrically::

    b̄_t     = (Σ_i (b_i − ½) + N(0, σ_b²)) / K̄ + ½
    c_{t+1} = c_t · exp(−η_c · (b̄_t − γ))

so ``c`` shrinks when more than a fraction ``γ`` of users fit, and grows otherwise.

Budget split. The count is a second Gaussian query on the same users. Released
together with the update (multiplier ``z_Δ``), the pair is exactly as private as one
Gaussian mechanism with multiplier ``z`` when (μ-GDP composes in quadrature)::

    z^{−2} = z_Δ^{−2} + k · (2σ_b)^{−2}

where ``k`` is the number of count releases one user can influence *within one
Gaussian mechanism of the accountant*: ``k = 1`` for every scheme accounted per round
or per participation (``poisson``, ``fixed``, amplified banded ``min_sep``), and
``k`` = the maximum participations for matrix-factorization noise accounted as a
single Gaussian over the whole run (``single``/``epochs``/``min_sep`` without
thinning), since the count noise is independent across rounds while each of the
user's ``k`` participations moves one count by ½. The accountant keeps ``z`` (so ε
is computed exactly as without adaptive clipping); the update's noise uses
``z_Δ = (z^{−2} − k·(2σ_b)^{−2})^{−1/2} > z``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedsim.errors import FedsimError
from fedsim.privacy.rng import PrivacyKey, gaussians


def update_noise_multiplier(z: float, count_stddev: float, participations: int = 1) -> float:
    """``z_Δ``, the update's noise multiplier once the count takes its share of ``z``.

    Parameters
    ----------
    z : the total noise multiplier the accountant uses (> 0).
    count_stddev : ``σ_b``, std of the Gaussian noise on the centred count (in users).
    participations : ``k``, count releases per user inside one accounted Gaussian (≥ 1).

    Raises :class:`FedsimError` when ``σ_b`` is too small to leave any budget for the update
    (``2σ_b/√k ≤ z``).
    """
    if z <= 0:
        raise FedsimError("adaptive clipping needs a DP mechanism with noise_multiplier > 0")
    k = int(participations)
    rest = z**-2 - k * (2.0 * count_stddev) ** -2
    if rest <= 0:
        need = z * math.sqrt(k) / 2.0
        raise FedsimError(
            f"clipping.count_stddev = {count_stddev:.4g} takes the whole privacy budget (noise "
            f"multiplier z = {z:.4g}, {k} count release(s) per user): it must be > {need:.4g}; "
            f"raise clipping.count_stddev (default K̄/20; more count noise costs little) "
            f"or accept a smaller z (a larger privacy.target_epsilon)"
        )
    return float(rest**-0.5)


def combined_noise_multiplier(z_update: float, count_stddev: float, participations: int = 1) -> float:
    """Inverse of :func:`update_noise_multiplier`: ``(z_Δ^{−2} + k·(2σ_b)^{−2})^{−1/2}``."""
    return float((z_update**-2 + int(participations) * (2.0 * count_stddev) ** -2) ** -0.5)


class AdaptiveClip:
    """The clip-norm controller; stateful (``state_dict``), seeded per round.

    Parameters
    ----------
    initial : ``c_0``, the first round's clip norm (``client.clip_norm``).
    target_quantile : ``γ``, the fraction of users whose delta should fit. Default 0.5.
    lr : ``η_c``, the geometric step size. Default 0.2.
    count_stddev : ``σ_b``, noise std on the centred count (users).
    expected_cohort : ``K̄``.
    seed : the count noise's :class:`~fedsim.privacy.rng.PrivacyKey` (or an int config seed); one
        draw per round ``t`` from its sub-key ``("count", t)``.
    """

    def __init__(
        self,
        initial: float,
        target_quantile: float,
        lr: float,
        count_stddev: float,
        expected_cohort: float,
        seed: PrivacyKey | int,
    ) -> None:
        if not 0 < target_quantile < 1:
            raise FedsimError("clipping.target_quantile must be in (0, 1)")
        self.clip_norm = float(initial)
        self.target_quantile = float(target_quantile)
        self.lr = float(lr)
        self.count_stddev = float(count_stddev)
        self.expected_cohort = float(expected_cohort)
        self.key = PrivacyKey.of(seed)
        self.history: list[float] = []  # c_0 .. c_{t} of the rounds run so far
        self.last_fraction: float | None = None

    def count_noise(self, t: int) -> float:
        """The count noise ``N(0, σ_b²)`` of round ``t``: a pure function of (key, t), from the
        keyed CSPRNG (:func:`fedsim.privacy.rng.gaussians`, float64)."""
        return self.count_stddev * float(gaussians(self.key.derive("count", int(t)), 1, dtype=torch.float64)[0])

    def step(self, centred_count: float, t: int) -> float:
        """Finish round ``t`` with ``Σ(b_i − ½)`` over the accepted users; return ``c_{t+1}``."""
        self.history.append(self.clip_norm)
        frac = (float(centred_count) + self.count_noise(t)) / self.expected_cohort + 0.5
        self.last_fraction = frac
        self.clip_norm = self.clip_norm * math.exp(-self.lr * (frac - self.target_quantile))
        return self.clip_norm

    def state_dict(self) -> dict[str, Any]:
        return {
            "clip_norm": self.clip_norm,
            "history": list(self.history),
            "key": self.key.state_dict(),
            "last_fraction": self.last_fraction,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clip_norm = float(state["clip_norm"])
        self.history = [float(c) for c in state["history"]]
        self.key = PrivacyKey.from_state_dict(state["key"])
        self.last_fraction = state.get("last_fraction")
