"""Private selection: the privacy of releasing the best of a random number of DP trials
(Papernot & Steinke, "Hyperparameter tuning with Rényi differential privacy", ICLR 2022).

The procedure: draw ``K`` from a known distribution, run ``K`` independent trials of one DP
algorithm ``Q`` (each trial draws its hyperparameters at random from a fixed list, so ``Q`` is the
mixture, whose Rényi DP is at most the worst arm's), and release only the best trial by a score
that ``Q`` itself outputs privately. With ``Q`` ``(λ, ε(λ))``-RDP:

- ``K ~ Poisson(μ)`` (Theorem 6): ``ε′(λ) = ε(λ) + μ·δ̂ + log(μ)/(λ − 1)``, where ``Q`` is
  ``(ε̂, δ̂)``-DP at ``ε̂ = log(1 + 1/(λ − 1))``;
- ``K`` truncated negative binomial with ``η > −1``, ``γ ∈ (0, 1)`` (Theorem 2):
  ``ε′(λ) = ε(λ) + (1 + η)(1 − 1/λ̂)·ε(λ̂) + (1 + η)·log(1/γ)/λ̂ + log(E[K])/(λ − 1)`` for any
  ``λ̂ ≥ 1`` (the best of the orders is taken); ``η = 0`` is the logarithmic distribution with
  ``E[K] = (1/γ − 1)/log(1/γ)``, otherwise ``E[K] = η(1 − γ)/(γ(1 − γ^η))``.

``ε′`` is turned into ``(ε, δ)`` with dp-accounting's RDP conversion. ``K`` and the arms are drawn
from the keyed CSPRNG (:mod:`fedsim.privacy.rng`): the analysis needs them unpredictable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from fedsim.errors import FedsimError
from fedsim.privacy.accounting import AccountingSpec
from fedsim.privacy.rng import PrivacyKey, uniforms

#: Rényi orders the selection is evaluated at (dp-accounting's defaults).
ORDERS: tuple[float, ...] = tuple(RdpAccountant().orders)


def expected_trials(distribution: str, mean: float, eta: float, gamma: float) -> float:
    """``E[K]`` of the trial-count distribution."""
    if distribution == "poisson":
        return float(mean)
    if eta == 0:
        return float((1.0 / gamma - 1.0) / math.log(1.0 / gamma))
    return float(eta * (1.0 - gamma) / (gamma * (1.0 - gamma**eta)))


def _tnb_pmf(k: int, eta: float, gamma: float) -> float:
    """``P[K = k]`` (``k ≥ 1``) of the truncated negative binomial (logarithmic when ``η = 0``)."""
    if eta == 0:
        return float((1.0 - gamma) ** k / (k * math.log(1.0 / gamma)))
    # Γ(k+η)/(Γ(k+1)·Γ(η))·(1−γ)^k·γ^η/(1−γ^η). For η ∈ (−1, 0), Γ(η) and 1 − γ^η are both
    # negative and cancel: lgamma gives log|Γ|, so the denominator is taken as |1 − γ^η| too.
    log_binom = math.lgamma(k + eta) - math.lgamma(k + 1) - math.lgamma(eta)
    return float(math.exp(log_binom + k * math.log(1.0 - gamma) + eta * math.log(gamma)) / abs(1.0 - gamma**eta))


def draw_trial_count(distribution: str, mean: float, eta: float, gamma: float, key: PrivacyKey) -> int:
    """``K``, drawn by inverse CDF from one uniform of the keyed stream ``key``."""
    u = float(uniforms(key, 1)[0])
    k, cdf = 0, 0.0
    while True:
        if distribution == "poisson":
            pk = math.exp(-mean + k * math.log(mean) - math.lgamma(k + 1)) if mean > 0 else float(k == 0)
        else:
            k = max(k, 1)
            pk = _tnb_pmf(k, eta, gamma)
        cdf += pk
        if u < cdf or k > 100_000:
            return k
        k += 1


def draw_arms(n_arms: int, count: int, key: PrivacyKey) -> list[int]:
    """``count`` arm indices, each uniform over ``0..n_arms−1`` (from the keyed stream)."""
    if count == 0:
        return []
    u = uniforms(key, count).numpy()
    return [min(int(x * n_arms), n_arms - 1) for x in u]


def _rdp_curve(spec: AccountingSpec, rounds: int) -> np.ndarray:
    """``ε(λ)`` of one run of ``spec`` at the :data:`ORDERS` (RDP, dp-accounting)."""
    from dp_accounting import NeighboringRelation

    rel = NeighboringRelation.REPLACE_ONE if spec.scheme == "fixed" else NeighboringRelation.ADD_OR_REMOVE_ONE
    acc = RdpAccountant(orders=list(ORDERS), neighboring_relation=rel)
    acc.compose(spec.run_event(rounds))
    return np.asarray(acc.rdp, dtype=np.float64)


def _delta_hat(spec: AccountingSpec, rounds: int) -> np.ndarray:
    """``δ̂(λ)``: the run's δ at ``ε̂ = log(1 + 1/(λ − 1))``, for every order (its own accountant)."""
    acc = spec.make_accountant()
    acc.compose(spec.run_event(rounds))
    return np.array([float(acc.get_delta(math.log1p(1.0 / (lam - 1.0)))) for lam in ORDERS])


def selection_rdp(
    rdp: np.ndarray, delta_hat: np.ndarray | None, distribution: str, mean: float, eta: float, gamma: float
) -> np.ndarray:
    """``ε′(λ)`` of releasing the best of ``K`` trials, at the :data:`ORDERS` (module docstring).

    Rényi divergence does not decrease with the order, so a bound at ``λ′`` also holds at every
    ``λ ≤ λ′``: each order keeps the least bound of itself and the orders above it."""
    lam = np.asarray(ORDERS)
    if distribution == "poisson":
        if delta_hat is None:
            raise FedsimError("the Poisson selection bound needs δ̂ of the trials")
        bound = np.asarray(rdp + mean * delta_hat + math.log(mean) / (lam - 1.0))
    else:
        log_ek = math.log(expected_trials(distribution, mean, eta, gamma))
        extra = min(
            (1.0 + eta) * (1.0 - 1.0 / lh) * e + (1.0 + eta) * math.log(1.0 / gamma) / lh
            for lh, e in zip(lam, rdp)
            if lh >= 1.0
        )
        bound = np.asarray(rdp + extra + log_ek / (lam - 1.0))
    order = np.argsort(lam)
    out = np.empty_like(bound)
    out[order] = np.minimum.accumulate(bound[order][::-1])[::-1]
    return out


def selection_epsilon(
    runs: Sequence[tuple[AccountingSpec, int]],
    delta: float,
    distribution: str = "poisson",
    mean: float = 10.0,
    eta: float = 0.0,
    gamma: float = 0.1,
) -> dict[str, Any]:
    """ε at ``delta`` of releasing the best of a random number of trials, each a run drawn from
    ``runs`` (``(accounting spec, rounds)`` per arm; the mixture is bounded by the worst arm).

    Returns ``epsilon``, ``delta``, the per-trial ``trial_epsilon`` (the worst arm's at ``delta``),
    ``expected_trials`` and the ``theorem``."""
    if not runs:
        raise FedsimError("private selection needs at least one arm")
    if any(s.mechanism == "none" or s.no_guarantee for s, _ in runs):
        return {"epsilon": math.inf, "delta": delta, "trial_epsilon": math.inf, "theorem": "no DP trials"}
    rdp = np.max(np.stack([_rdp_curve(s, n) for s, n in runs]), axis=0)
    dh = np.max(np.stack([_delta_hat(s, n) for s, n in runs]), axis=0) if distribution == "poisson" else None
    eps, _ = compute_epsilon(list(ORDERS), list(selection_rdp(rdp, dh, distribution, mean, eta, gamma)), delta)
    trial, _ = compute_epsilon(list(ORDERS), list(rdp), delta)
    theorem = (
        f"Papernot & Steinke 2022, Theorem 6 (K ~ Poisson({mean:g}))"
        if distribution == "poisson"
        else f"Papernot & Steinke 2022, Theorem 2 (K truncated negative binomial, η = {eta:g}, γ = {gamma:g})"
    )
    return {
        "epsilon": float(eps),
        "delta": float(delta),
        "trial_epsilon": float(trial),
        "expected_trials": expected_trials(distribution, mean, eta, gamma),
        "theorem": theorem,
        "events": str(dp_event.SelfComposedDpEvent(runs[0][0].round_event(), runs[0][0].compositions(runs[0][1]))),
    }
