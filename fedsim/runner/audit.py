"""Empirical privacy audit: the one-shot estimator of Andrew, Kairouz, Oh, Oprea, McMahan and
Suriyakumar (ICLR 2024), "One-shot empirical privacy estimation for federated learning".

Method
------
1. ``M`` **canary users** join the population (ids ``N..N+M−1``; see the ``synthetic`` hook of
   :func:`fedsim.runner.run_experiment`). Canary ``k`` has a fixed random direction
   ``u_k`` (uniform on the unit sphere of ``R^d``). Whenever the sampler picks it, its clipped
   update is ``c·u_k``, always in the same direction. The sampler, the noise and the
   accountant treat canaries like every other user: the population is ``N + M``.
2. **One training run.** The audit looks only at the final model delta ``Δ = x_T − x_0``.
3. **Cosines.** The observed statistics are ``cos(u_k, Δ)`` for the ``M`` inserted canaries.
   The null statistics are ``cos(v_j, Δ)`` for ``M`` fresh random directions ``v_j`` that
   were never inserted. Because ``v_j`` is independent of ``Δ``, ``cos(v_j, Δ)`` has mean 0
   and variance exactly ``1/d``. It is asymptotically ``N(0, 1/d)``.
4. **ε estimate.** Fit ``N(μ₁, σ₁²)`` to the observed cosines (mean and sample standard
   deviation). The null is ``N(μ₀, σ₀²) = N(0, 1/d)``. This is the paper's algorithm, and it
   is exact for the null. The estimate is the ε at the run's δ of the mechanism whose output
   is one of these two Gaussians: the smallest ``ε ≥ 0`` with ``max(H_ε(P‖Q), H_ε(Q‖P)) ≤ δ``,
   where ``P = N(μ₀, σ₀²)``, ``Q = N(μ₁, σ₁²)`` and ``H_ε(P‖Q) = ∫ max(0, p(x) − e^ε q(x)) dx``
   is the hockey-stick divergence (:func:`epsilon_two_gaussians`).

   - With ``σ₀ = σ₁ = σ`` this is exactly the Gaussian mechanism with sensitivity
     ``|μ₁ − μ₀|`` and noise ``σ``: ``δ(ε) = Φ(−ε/m + m/2) − e^ε·Φ(−ε/m − m/2)`` with
     ``m = |μ₁ − μ₀|/σ``.
   - With ``σ₀ ≠ σ₁`` the same definition is evaluated exactly. The log-likelihood ratio
     ``log p(x) − log q(x)`` is a quadratic in ``x``, so ``S_ε = {x : log p/q > ε}`` is a
     half-line, an interval or the complement of an interval. Then
     ``H_ε(P‖Q) = P(S_ε) − e^ε·Q(S_ε)``, and both probabilities are normal CDFs. The paper
     defines ε this way too (its reference code follows Steinke 2022). A variance mismatch
     alone makes ε positive: ``σ₁/σ₀ = 1.1`` with equal means is ε ≈ 0.7 at δ = 10⁻³.

   The null directions are also fitted, as a check and as the alternative
   ``null_model = "empirical"``: ``N(μ₀, σ₀²)`` fitted to the null cosines, as the issue
   describes it. The fit only adds sampling noise, and any noise in ``σ₀`` adds ε. In a test
   run with ``M = 3000`` the fitted ``σ₀`` came out 2.7 % under ``1/√d`` (2 standard errors),
   which moved the estimate from 0.76 to 1.16. Both estimates are reported.
5. **Confidence.** A bootstrap over canaries. The observed cosines are resampled with
   replacement ``B`` times (default 1000, fixed seed); with the empirical null, the null
   cosines are resampled too. The estimate is recomputed each time. The ``1 − α`` interval
   (default α = 0.05) is the basic (reverse-percentile) bootstrap interval, which corrects the
   estimator's upward bias (:func:`bootstrap_interval`). On synthetic Gaussian cosines its
   coverage is close to nominal; the plain percentile interval's is not.

What the number means (caveats)
-------------------------------
It is an *estimate*. It is not a lower bound in the strict sense (no Clopper–Pearson-style
guarantee): it assumes the cosines are Gaussian, and it fits them from finitely many canaries.
Canary signals can differ. With Poisson sampling a canary takes part a random number of
times, and with server momentum a participation late in training counts less in ``Δ``. The
observed cosines are then a mixture. The Gaussian fitted to that mixture has a larger variance
than the null, and that adds ε, so the estimate is biased upward. The bias is small at the
usual low sampling rates (q ≈ 0.03), but it grows with ``q``. In a simulation of 10 rounds at
a ledger ε of 2, the estimate is about 0.65 at q = 0.03 and about 1.9 at q = 0.3.

It comes from one training run. The interval covers only the resampling of canaries, not the
randomness of the training run itself (noise, sampling). It measures an adversary who sees
only the final model, not every round's update. Such an adversary typically learns far less
than the ledger's ε allows, because the ledger bounds the release of every iterate. The
canaries are worst-case-ish but not worst-case users: each sends a full-norm update in a fixed
random direction, every time it is sampled. The audited run differs slightly from the run
without canaries: the population is ``N + M``, so ``q``, ``δ`` and a calibrated ``z`` change.
So the ledger ε it is compared with is the ε of the audited run. An estimate above the ledger's
ε is *not* by itself a bug: the variance-mismatch bias above can put the point estimate above an
exact ε: for 1,000 canary cosines drawn from a Gaussian whose exact ε is 3.39 (δ = 1e-5), 18 of
20 point estimates exceeded it (median 3.78, range 3.08–4.16).
Treat it as a signal to investigate when the whole interval lies well above the ledger's ε (a
planted tenfold noise shortfall gives 58.8 (49.9–67.2) against 1.57); then look for noise
smaller than accounted, a broken clip, or a leak outside the mechanism. An estimate below it
proves nothing about correctness.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.special import log_ndtr

from fedsim.errors import FedsimError
from fedsim.seeding import derive_seed, make_generator

#: Default number of canary users ``M``.
DEFAULT_CANARIES = 1000
#: Default ``α`` of the ``1 − α`` bootstrap interval.
DEFAULT_ALPHA = 0.05
#: Default number of bootstrap resamples ``B``.
DEFAULT_BOOTSTRAP = 1000
#: Seed streams of the canary and null directions (with the audit seed and the index ``k``).
CANARY_STREAM = "audit-canary"
NULL_STREAM = "audit-null"

CAVEATS = (
    "This is an empirical estimate, not a lower bound in the strict sense. It assumes the canary "
    "cosines are Gaussian and fits them from finitely many canaries. Unequal canary signals (random "
    "participation counts under Poisson sampling, momentum weighting rounds differently) make the "
    "cosines a mixture, which biases the estimate upward. It comes from one training "
    "run: the interval is a bootstrap over canaries and does not include the randomness of the "
    "run itself (noise, sampling). It measures an adversary who sees only the final model, not "
    "the per-round updates; the ledger's epsilon bounds the release of every iterate, so the "
    "estimate is usually far below it. Canaries are strong but not worst-case users. The "
    "upward bias can put the point estimate above the ledger's epsilon without any bug; an "
    "interval lying well above it is the signal to look for less noise than accounted, a broken "
    "clip, or a leak outside the mechanism. An estimate below it does not prove the "
    "implementation correct. The audited run includes the canaries in its population (N + M), "
    "so its sampling rate, delta and calibrated noise differ from the run without them; with M "
    "comparable to N the canaries' random updates also lower its accuracy."
)


# --------------------------------------------------------------------------- directions
def unit_direction(seed: int, stream: str, k: int, dim: int) -> torch.Tensor:
    """The ``k``-th direction of ``stream``: a float64 vector of length ``dim``, uniform on the
    unit sphere. It is ``ξ/‖ξ‖`` (normalised in float64) for ``ξ ~ N(0, I_d)`` drawn in float32
    from a CPU generator seeded with ``derive_seed(seed, stream, k)``. It is regenerated on every
    call, never stored."""
    g = make_generator(seed, stream, int(k))
    v = torch.randn(int(dim), generator=g, dtype=torch.float32).to(torch.float64)  # 5× faster than float64
    return v / torch.linalg.vector_norm(v)


class Canaries:
    """``count`` canary users for :func:`fedsim.runner.run_experiment` (``synthetic=``).

    Canary ``k`` (user id ``first_id + k``) always sends ``c·u_k``. ``u_k`` is
    :func:`unit_direction` ``(seed, CANARY_STREAM, k, d)``. No ``M × d`` matrix is kept: each
    direction is regenerated from ``(seed, k)`` when it is needed. The null directions
    (:meth:`null_direction`) come from another stream, :data:`NULL_STREAM`.

    Parameters
    ----------
    count : ``M ≥ 2``, the number of canaries.
    seed : the audit seed (any non-negative int). Directions depend only on it, ``k`` and ``d``.
    """

    def __init__(self, count: int, seed: int) -> None:
        if int(count) < 2:
            raise FedsimError(f"the audit needs at least 2 canaries (got {count})")
        self.count = int(count)
        self.seed = int(seed)
        self.first_id: int | None = None
        self.dim: int | None = None
        self.participations = np.zeros(self.count, dtype=np.int64)

    def bind(self, first_id: int, dim: int) -> None:
        """Called by ``run_experiment`` before the run: canary ``k`` is user ``first_id + k``;
        the model has ``dim`` parameters. Resets the participation counts."""
        self.first_id = int(first_id)
        self.dim = int(dim)
        self.participations = np.zeros(self.count, dtype=np.int64)

    def _dim(self, dim: int | None) -> int:
        d = dim if dim is not None else self.dim
        if d is None:
            raise RuntimeError("Canaries: call bind(first_id, dim) first or pass dim")
        return int(d)

    def direction(self, k: int, dim: int | None = None) -> torch.Tensor:
        """``u_k`` (float64, unit norm, length ``d``)."""
        if not 0 <= int(k) < self.count:
            raise IndexError(f"canary index {k} outside 0..{self.count - 1}")
        return unit_direction(self.seed, CANARY_STREAM, k, self._dim(dim))

    def null_direction(self, j: int, dim: int | None = None) -> torch.Tensor:
        """``v_j``, the ``j``-th direction that is never inserted (float64, unit norm)."""
        return unit_direction(self.seed, NULL_STREAM, j, self._dim(dim))

    def update_sum(self, user_ids: Sequence[int], t: int, clip_norm: float, dim: int) -> torch.Tensor:
        """``Σ_k c·u_k`` over the canaries among ``user_ids`` in round ``t``: CPU float32, length
        ``dim``. Each term has norm ``c`` (computed in float64). Also counts participations."""
        if self.first_id is None:
            raise RuntimeError("Canaries.update_sum before bind()")
        total = torch.zeros(int(dim), dtype=torch.float64)
        for uid in user_ids:
            k = int(uid) - self.first_id
            total.add_(self.direction(k, dim))
            self.participations[k] += 1
        return total.mul_(float(clip_norm)).to(torch.float32)

    def cosines(self, delta: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``(observed, null)``: ``cos(u_k, Δ)`` for every canary and ``cos(v_j, Δ)`` for as many
        null directions, for the final model delta ``Δ`` (any float tensor of length ``d``)."""
        d = delta.detach().to("cpu", torch.float64).reshape(-1)
        norm = float(torch.linalg.vector_norm(d))
        if not math.isfinite(norm):
            raise FedsimError("the final model delta is not finite; cannot audit")
        if norm == 0.0:
            raise FedsimError("the model did not move (x_T = x_0); cannot audit")
        dim = d.numel()
        obs = np.array([float(self.direction(k, dim) @ d) / norm for k in range(self.count)])
        null = np.array([float(self.null_direction(j, dim) @ d) / norm for j in range(self.count)])
        return obs, null


# --------------------------------------------------------------------------- ε of two Gaussians
def _log_prob(region: tuple[str, float, float], mean: float, std: float) -> float:
    """``log Pr[X ∈ region]`` for ``X ~ N(mean, std²)``; region is ``("above", t, _)``,
    ``("below", t, _)``, ``("between", t1, t2)`` or ``("outside", t1, t2)``, ``t1 ≤ t2``."""
    kind, t1, t2 = region
    z1, z2 = (t1 - mean) / std, (t2 - mean) / std
    if kind == "above":
        return float(log_ndtr(-z1))
    if kind == "below":
        return float(log_ndtr(z1))
    if kind == "outside":
        return float(np.logaddexp(log_ndtr(z1), log_ndtr(-z2)))
    # between: subtract in the tail where both terms are small (no cancellation)
    if z1 >= 0:
        hi, lo = float(log_ndtr(-z1)), float(log_ndtr(-z2))
    elif z2 <= 0:
        hi, lo = float(log_ndtr(z2)), float(log_ndtr(z1))
    else:
        return float(np.log1p(-(math.exp(log_ndtr(z1)) + math.exp(log_ndtr(-z2)))))
    return -math.inf if lo >= hi else hi + math.log1p(-math.exp(lo - hi))


def log_hockey_stick(eps: float, mu_p: float, sigma_p: float, mu_q: float, sigma_q: float) -> float:
    """``log H_ε(P‖Q)`` for ``P = N(mu_p, sigma_p²)``, ``Q = N(mu_q, sigma_q²)`` (``−inf`` if 0).

    ``H_ε(P‖Q) = P(S) − e^ε·Q(S)`` with ``S = {x : log p(x) − log q(x) > ε}``. The log-ratio is
    ``a·x² + b·x + c₀`` with ``a = (1/σ_q² − 1/σ_p²)/2``, ``b = μ_p/σ_p² − μ_q/σ_q²`` and
    ``c₀ = (μ_q²/σ_q² − μ_p²/σ_p²)/2 + log(σ_q/σ_p)``. ``S`` is where ``a·x² + b·x + c₀ − ε > 0``.
    The roots use the cancellation-free form ``r = −(b + sign(b)·√D)/2``, ``x₁ = r/a``,
    ``x₂ = (c₀ − ε)/r``.
    """
    a = 0.5 * (1.0 / sigma_q**2 - 1.0 / sigma_p**2)
    b = mu_p / sigma_p**2 - mu_q / sigma_q**2
    c = 0.5 * (mu_q**2 / sigma_q**2 - mu_p**2 / sigma_p**2) + math.log(sigma_q / sigma_p) - eps
    region: tuple[str, float, float]
    if a == 0.0:
        if b == 0.0:
            return -math.inf  # P = Q, or S is the whole line and H = 1 − e^ε ≤ 0
        t = -c / b
        region = ("above", t, t) if b > 0 else ("below", t, t)
    else:
        disc = b * b - 4.0 * a * c
        if disc <= 0.0:
            return -math.inf  # S is empty (a < 0) or everything (a > 0: H = 1 − e^ε ≤ 0)
        r = -0.5 * (b + math.copysign(math.sqrt(disc), b))
        roots = sorted([r / a, c / r])  # r ≠ 0 because D > 0
        region = ("outside" if a > 0 else "between", roots[0], roots[1])
    lp = _log_prob(region, mu_p, sigma_p)
    if lp == -math.inf:
        return -math.inf
    ratio = eps + _log_prob(region, mu_q, sigma_q) - lp
    if ratio >= 0.0:
        return -math.inf
    return lp + math.log1p(-math.exp(ratio))


def epsilon_two_gaussians(mu0: float, sigma0: float, mu1: float, sigma1: float, delta: float) -> float:
    """ε at ``delta`` of the mechanism whose output is ``N(mu0, sigma0²)`` on one dataset and
    ``N(mu1, sigma1²)`` on the neighbouring one. This is the smallest ``ε ≥ 0`` with
    ``max(H_ε(P‖Q), H_ε(Q‖P)) ≤ δ`` (both directions, as DP requires), found by root-finding on
    the exact :func:`log_hockey_stick`. It is ``inf`` when a standard deviation is 0 and the
    means differ, and ``inf`` when no ``ε ≤ 10⁶`` suffices.

    Parameters
    ----------
    mu0, sigma0 : mean and standard deviation (``> 0``) of the first Gaussian (the null).
    mu1, sigma1 : mean and standard deviation (``> 0``) of the second (the observed canaries).
    delta : δ in (0, 1).
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not all(math.isfinite(v) for v in (mu0, sigma0, mu1, sigma1)):
        raise ValueError("means and standard deviations must be finite")
    if sigma0 <= 0.0 or sigma1 <= 0.0:
        return 0.0 if (mu0 == mu1 and sigma0 == sigma1) else math.inf
    log_delta = math.log(delta)

    def excess(eps: float) -> float:
        ld = max(log_hockey_stick(eps, mu0, sigma0, mu1, sigma1), log_hockey_stick(eps, mu1, sigma1, mu0, sigma0))
        return max(ld, -1e6) - log_delta

    if excess(0.0) <= 0.0:
        return 0.0
    lo, hi = 0.0, 1.0
    while excess(hi) > 0.0:
        lo, hi = hi, 2.0 * hi
        if hi > 1e6:
            return math.inf
    return float(brentq(excess, lo, hi, xtol=1e-12, rtol=1e-10))


def fit_gaussian(x: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof = 1``) of ``x`` (at least 2 values)."""
    a = np.asarray(list(x) if not isinstance(x, np.ndarray) else x, dtype=np.float64)
    if a.size < 2:
        raise ValueError("need at least 2 values to fit a Gaussian")
    return float(a.mean()), float(a.std(ddof=1))


def estimate_epsilon(
    observed: Sequence[float] | np.ndarray,
    null: Sequence[float] | np.ndarray | None,
    delta: float,
    dim: int | None = None,
) -> float:
    """The one-shot ε estimate from canary cosines.

    Parameters
    ----------
    observed : cosines of the inserted canaries with the final model delta (unitless, in [−1, 1]).
    null : cosines of directions never inserted. None uses the closed-form null
        ``N(0, 1/dim)`` (the paper's algorithm) instead of a fit.
    delta : δ at which ε is computed (the run's δ).
    dim : ``d``, the model size (only needed when ``null`` is None).

    Returns ``epsilon_two_gaussians(μ₀, σ₀, μ₁, σ₁, δ)`` for the fitted (or closed-form) null
    ``N(μ₀, σ₀²)`` and the fitted observed ``N(μ₁, σ₁²)``.
    """
    mu1, s1 = fit_gaussian(observed)
    if null is None:
        if dim is None or dim < 1:
            raise ValueError("the closed-form null N(0, 1/d) needs dim")
        mu0, s0 = 0.0, 1.0 / math.sqrt(dim)
    else:
        mu0, s0 = fit_gaussian(null)
    return epsilon_two_gaussians(mu0, s0, mu1, s1, delta)


def bootstrap_interval(
    observed: Sequence[float] | np.ndarray,
    null: Sequence[float] | np.ndarray | None,
    delta: float,
    *,
    dim: int | None = None,
    alpha: float = DEFAULT_ALPHA,
    num_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    method: str = "basic",
) -> tuple[float, float]:
    """A ``1 − alpha`` bootstrap interval of :func:`estimate_epsilon` (unitless ε).

    The observed cosines (and the null ones, when given) are resampled with replacement
    ``num_bootstrap`` times, from a NumPy generator seeded with ``derive_seed(seed,
    "audit-bootstrap")``, so the interval is deterministic for a given ``seed``. With
    ``q_lo, q_hi`` the ``alpha/2`` and ``1 − alpha/2`` quantiles of the re-estimates ``ε*``:

    - ``method = "basic"`` (default), the reverse-percentile interval
      ``[max(0, 2ε̂ − q_hi), max(0, 2ε̂ − q_lo)]``. The plug-in estimate is biased upward,
      because any mismatch of the two fitted variances adds ε. The re-estimates carry the same
      bias again, and this interval reflects it away. On synthetic Gaussian cosines
      (``M = 2000``, μ = 1, δ = 10⁻⁵, a 90 % interval, 150 resamples) it covered the true ε in 46
      of 50 sets with the closed-form null and in 44 of 50 with a fitted null. The interval
      can lie partly below ``ε̂``.
    - ``method = "percentile"``, ``[q_lo, q_hi]``. It is shifted up by the bias and covered
      the true ε in only 27 and 23 of the same 50 sets.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if num_bootstrap < 1:
        raise ValueError("num_bootstrap must be ≥ 1")
    if method not in ("basic", "percentile"):
        raise ValueError(f"method must be 'basic' or 'percentile', got {method!r}")
    obs = np.asarray(observed, dtype=np.float64)
    nul = None if null is None else np.asarray(null, dtype=np.float64)
    rng = np.random.default_rng(derive_seed(seed, "audit-bootstrap"))
    est = np.empty(num_bootstrap)
    for i in range(num_bootstrap):
        o = obs[rng.integers(0, obs.size, obs.size)]
        n = None if nul is None else nul[rng.integers(0, nul.size, nul.size)]
        est[i] = estimate_epsilon(o, n, delta, dim=dim)
    q_lo, q_hi = (float(v) for v in np.quantile(est, [alpha / 2.0, 1.0 - alpha / 2.0]))
    if method == "percentile":
        return q_lo, q_hi
    point = estimate_epsilon(obs, nul, delta, dim=dim)
    if not math.isfinite(point):
        return math.inf, math.inf
    lo = max(0.0, 2.0 * point - q_hi) if math.isfinite(q_hi) else 0.0
    hi = max(0.0, 2.0 * point - q_lo) if math.isfinite(q_lo) else math.inf
    return lo, hi


NULL_MODELS = ("theoretical", "empirical")


def estimate_from_cosines(
    observed: Sequence[float] | np.ndarray,
    null: Sequence[float] | np.ndarray,
    delta: float,
    dim: int,
    *,
    null_model: str = "theoretical",
    alpha: float = DEFAULT_ALPHA,
    num_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
) -> dict[str, Any]:
    """Everything the audit reports about the cosines.

    Parameters
    ----------
    observed : cosines of the inserted canaries with the final model delta.
    null : cosines of as many directions that were never inserted.
    delta : the run's δ.
    dim : ``d``, the number of model parameters.
    null_model : which null the estimate uses. ``"theoretical"`` (default, the paper's
        algorithm) is the closed-form ``N(0, 1/d)``; only the observed cosines are bootstrapped.
        ``"empirical"`` is a Gaussian fitted to ``null``; both samples are bootstrapped.
        The null cosines are exactly mean 0 and variance ``1/d`` (a random unit direction
        independent of ``Δ``). Fitting them only adds sampling noise. Because any fitted
        variance mismatch adds ε, that noise biases the estimate upward. The fitted null
        still checks the pipeline: ``null_cosine`` reports its ``mean_z`` (its mean in
        standard errors) and ``std_ratio`` (its std over ``1/√d``), and ``warnings`` flags a
        mismatch beyond 5 standard errors.
    alpha, num_bootstrap, seed : the ``1 − alpha`` basic bootstrap interval
        (:func:`bootstrap_interval`).

    Both estimates are returned (``epsilon_estimate_theoretical_null`` and
    ``epsilon_estimate_empirical_null``). ``epsilon_estimate`` and ``epsilon_interval`` are for
    ``null_model``. Infinite values stay ``float('inf')``.
    """
    if null_model not in NULL_MODELS:
        raise FedsimError(f"null model {null_model!r}: allowed are {', '.join(NULL_MODELS)}")
    obs = np.asarray(observed, dtype=np.float64)
    nul = np.asarray(null, dtype=np.float64)
    mu1, s1 = fit_gaussian(obs)
    mu0, s0 = fit_gaussian(nul)
    eps = {
        "theoretical": estimate_epsilon(obs, None, delta, dim=dim),
        "empirical": epsilon_two_gaussians(mu0, s0, mu1, s1, delta),
    }
    boot_null = None if null_model == "theoretical" else nul
    lo, hi = bootstrap_interval(obs, boot_null, delta, dim=dim, alpha=alpha, num_bootstrap=num_bootstrap, seed=seed)
    theo = 1.0 / math.sqrt(dim)
    mean_z = mu0 / (theo / math.sqrt(nul.size))
    std_ratio = s0 / theo
    std_ratio_se = math.sqrt(0.5 / (nul.size - 1))  # standard error of a normal sample's std / σ
    warnings = []
    if abs(mean_z) > 5 or abs(std_ratio - 1.0) > 5 * std_ratio_se:
        warnings.append(
            f"the null cosines do not look like N(0, 1/d) (mean {mean_z:.1f} standard errors "
            f"from 0, std {std_ratio:.3f} × 1/√d): the directions may not be independent of "
            f"the model delta; do not trust this estimate"
        )
    resampled = "observed cosines" if boot_null is None else "observed and null cosines"
    return {
        "epsilon_estimate": eps[null_model],
        "epsilon_interval": [lo, hi],
        "confidence": 1.0 - alpha,
        "null_model": null_model,
        "interval_method": (
            f"basic (reverse-percentile) bootstrap over canaries: {resampled} resampled "
            f"with replacement {num_bootstrap} times (seed {seed})"
        ),
        "epsilon_estimate_theoretical_null": eps["theoretical"],
        "epsilon_estimate_empirical_null": eps["empirical"],
        "delta": delta,
        "dimension": int(dim),
        "observed_cosine": {"mean": mu1, "std": s1},
        "null_cosine": {"mean": mu0, "std": s0, "theoretical_std": theo, "mean_z": mean_z, "std_ratio": std_ratio},
        "warnings": warnings,
    }


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


# --------------------------------------------------------------------------- the audit run
def _population_error(cfg: Any, m: int) -> bool:
    """Whether the participation scheme accepts the ``N`` real users but not ``N + m``
    (e.g. ``epochs`` groups sized for ``N``). That check is cheap: no calibration."""
    from fedsim.data import load_federated
    from fedsim.runner import scheme_of

    n = load_federated(cfg.data).population

    def ok(pop: int) -> bool:
        try:
            cfg.validate_population(pop)
            scheme_of(cfg, pop)
        except FedsimError:
            return False
        return True

    return ok(n) and not ok(n + m)


def run_audit(
    cfg: Any,
    out_dir: str | Path | None = None,
    num_canaries: int = DEFAULT_CANARIES,
    *,
    null_model: str = "theoretical",
    alpha: float = DEFAULT_ALPHA,
    num_bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train ``cfg`` once with ``num_canaries`` canary users and estimate ε from the final model.

    Parameters
    ----------
    cfg : the validated experiment config (:class:`fedsim.config.Config`).
    out_dir : run folder (default ``runs/<timestamp>-<name>``). It gets the usual run files
        plus ``audit.json`` (the returned dict) and ``audit_cosines.npz`` (``observed``,
        ``null``, ``participations``).
    num_canaries : ``M ≥ 2``. The population becomes ``N + M``.
    null_model : ``"theoretical"`` (the closed-form null ``N(0, 1/d)``, default) or
        ``"empirical"`` (a Gaussian fitted to the null cosines); see :func:`estimate_from_cosines`.
    alpha : the bootstrap interval has confidence ``1 − alpha`` (default 0.05).
    num_bootstrap : bootstrap resamples (default 1000).
    seed : audit seed for the canary and null directions and the bootstrap (default
        ``derive_seed(cfg.seed, "audit")``).
    progress : print the run's header and progress line.

    Returns the dict written to ``audit.json``. Its keys are ``epsilon_estimate``,
    ``epsilon_interval``, ``confidence``, ``ledger_epsilon`` (the accounted upper bound of
    the same run; ``"inf"`` without noise), ``delta``, ``num_canaries``, ``observed_cosine``
    and ``null_cosine`` (mean, std), ``dimension``, ``warnings``, ``caveats`` and facts about
    the run. Non-finite numbers are written as ``"inf"``.
    """
    from fedsim.runner import default_run_dir, run_experiment

    _check_audit_options(num_canaries, alpha, null_model)
    m = int(num_canaries)
    audit_seed = derive_seed(cfg.seed, "audit") if seed is None else int(seed)
    out = Path(out_dir) if out_dir is not None else default_run_dir(cfg)
    canaries = Canaries(m, audit_seed)
    try:
        summary = run_experiment(cfg, out, progress=progress, synthetic=canaries)
    except FedsimError as e:
        if canaries.first_id is None and _population_error(cfg, m):
            raise FedsimError(f"{e} (the audit adds {m} canary users to the population)") from None
        raise
    delta_model = _model_delta(cfg, summary, out, m)
    observed, null = canaries.cosines(delta_model)
    run_delta = float(summary["delta"])
    stats = estimate_from_cosines(
        observed,
        null,
        run_delta,
        delta_model.numel(),
        null_model=null_model,
        alpha=alpha,
        num_bootstrap=num_bootstrap,
        seed=audit_seed,
    )
    report = _report(stats, summary, canaries.participations, m, run_delta, audit_seed, out)
    np.savez(out / "audit_cosines.npz", observed=observed, null=null, participations=canaries.participations)
    (out / "audit.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def _check_audit_options(num_canaries: int, alpha: float, null_model: str) -> None:
    if int(num_canaries) < 2:
        raise FedsimError(f"--canaries must be ≥ 2 (got {num_canaries})")
    if not 0.0 < alpha < 1.0:
        raise FedsimError(f"--alpha must be in (0, 1) (got {alpha})")
    if null_model not in NULL_MODELS:
        raise FedsimError(f"--null {null_model!r}: allowed are {', '.join(NULL_MODELS)}")


def _model_delta(cfg: Any, summary: dict[str, Any], out: Path, m: int) -> torch.Tensor:
    """``x_T − x_0`` of the audited run (float64): ``x_0`` rebuilt exactly as the run built it,
    with ``z`` fixed to the run's value (no recalibration), ``x_T`` from its checkpoint."""
    from fedsim.checkpoint import load_checkpoint
    from fedsim.runner.build import prepare

    run_cfg = cfg
    if cfg.privacy.mechanism != "none" and cfg.privacy.target_epsilon is not None:
        priv = cfg.privacy.model_copy(
            update={"noise_multiplier": float(summary["noise_multiplier"]), "target_epsilon": None}
        )
        run_cfg = cfg.model_copy(update={"privacy": priv})
    prep = prepare(run_cfg, extra_users=m)
    if prep.spec.population != summary["population"] or prep.num_params != summary["num_parameters"]:
        raise RuntimeError("audit: the prepared run does not match the trained one")
    params = load_checkpoint(out / "checkpoint")["server"]["params"]
    return params.detach().to("cpu", torch.float64) - prep.x0.to(torch.float64)


def _report(
    stats: dict[str, Any],
    summary: dict[str, Any],
    part: np.ndarray,
    m: int,
    run_delta: float,
    audit_seed: int,
    out: Path,
) -> dict[str, Any]:
    """``audit.json``: the estimate next to the ledger's ε and what it rests on."""
    eps = summary["epsilon"]
    report: dict[str, Any] = {
        "epsilon_estimate": stats["epsilon_estimate"],
        "epsilon_interval": stats["epsilon_interval"],
        "confidence": stats["confidence"],
        "ledger_epsilon": eps if isinstance(eps, str) else float(eps),
        "neighboring_relation": summary.get("neighboring_relation"),
        "delta": run_delta,
        "num_canaries": m,
        "null_model": stats["null_model"],
        "interval_method": stats["interval_method"],
        "epsilon_estimate_theoretical_null": stats["epsilon_estimate_theoretical_null"],
        "epsilon_estimate_empirical_null": stats["epsilon_estimate_empirical_null"],
        "observed_cosine": stats["observed_cosine"],
        "null_cosine": stats["null_cosine"],
        "dimension": stats["dimension"],
        "canary_participations": {
            "mean": float(part.mean()),
            "min": int(part.min()),
            "max": int(part.max()),
            "never": int((part == 0).sum()),
        },
        "population": summary["population"],
        "real_users": summary["population"] - m,
        "mechanism": summary["mechanism"],
        "scheme": summary["scheme"],
        "noise_multiplier": summary["noise_multiplier"],
        "rounds": summary["rounds_completed"],
        "seed": audit_seed,
        "run_dir": str(out),
        "method": (
            "one-shot estimate (Andrew et al., ICLR 2024): epsilon at the run's delta between the "
            "null N(0, 1/d) (or a Gaussian fitted to never-inserted directions) and a Gaussian "
            "fitted to the inserted canaries' cosines with the final model delta x_T - x_0"
        ),
        "warnings": stats["warnings"],
        "caveats": CAVEATS,
    }
    return _json_safe(report)


# --------------------------------------------------------------------------- one-run bounds
#: Seed label of the one-run audit's inclusion coins (a sub-key of the audit's PrivacyKey).
INCLUSION_STREAM = "audit-one-run-inclusion"
#: Largest canary-direction matrix the every-model adversary keeps (bytes, float32 m × d).
ONE_RUN_MEMORY = 2 << 30
ADVERSARIES = ("final-model", "every-model", "every-model-raw")


def inclusion_bits(seed: int, m: int) -> np.ndarray:
    """The one-run audit's coins: canary `k` is included when the `k`-th uniform of the keyed
    stream `PrivacyKey.from_seed(seed).derive(INCLUSION_STREAM)` is below 1/2 (fedsim.privacy.rng,
    AES-CTR; independent of every other stream of the run). Returns `m` booleans."""
    from fedsim.privacy.rng import PrivacyKey, uniforms

    key = PrivacyKey.from_seed(int(seed)).derive(INCLUSION_STREAM)
    return (uniforms(key, int(m)) < 0.5).numpy()


#: Stream of the orthogonal canaries' coordinates and signs (auditor's randomness, not privacy noise).
ORTHOGONAL_STREAM = "audit-one-run-orthogonal"
DIRECTIONS = ("random", "orthogonal")


class OneRunCanaries:
    """`m` gradient canaries, each included with probability 1/2.

    Only the included ones join the population: `count` (the users the run samples and
    accounts) is the number of included canaries, and the `j`-th synthetic user is canary
    `index[j]`. Every canary, included or not, is scored afterwards.

    Parameters
    ----------
    num_canaries : m ≥ 2.
    seed : the audit seed (directions and inclusion coins).
    directions : "random" (default: directions as in `Canaries`, uniform on the sphere; the
        every-model adversary keeps them as an m × d matrix) or "orthogonal" (canary `k` is
        `±e_j` for its own coordinate `j`: a keyed permutation of the coordinates and keyed signs;
        needs m ≤ d). Orthogonal canaries do not interfere with each other and need no matrix
        (a projection is a gather), so m can grow to d; the noise is isotropic, so the mechanism
        treats every direction alike.
    """

    def __init__(self, num_canaries: int, seed: int, directions: str = "random") -> None:
        if int(num_canaries) < 2:
            raise FedsimError(f"the one-run audit needs at least 2 canaries (got {num_canaries})")
        if directions not in DIRECTIONS:
            raise FedsimError(f"canary directions {directions!r}: allowed are {', '.join(DIRECTIONS)}")
        self.directions = directions
        self._coord: torch.Tensor | None = None
        self._sign: torch.Tensor | None = None
        self.num_canaries = int(num_canaries)
        self.seed = int(seed)
        self.included = inclusion_bits(self.seed, self.num_canaries)
        self.index = np.flatnonzero(self.included)
        self.count = int(self.index.size)
        self.first_id: int | None = None
        self.dim: int | None = None
        self.participations = np.zeros(self.num_canaries, dtype=np.int64)
        self._matrix: torch.Tensor | None = None

    def bind(self, first_id: int, dim: int) -> None:
        """Called by run_experiment: synthetic user `first_id + j` is canary `index[j]`."""
        self.first_id, self.dim = int(first_id), int(dim)
        self.participations = np.zeros(self.num_canaries, dtype=np.int64)
        if self.directions == "orthogonal":
            if self.num_canaries > self.dim:
                raise FedsimError(
                    f"{self.num_canaries} orthogonal canaries need a model with at least as many parameters "
                    f"(d = {self.dim:,}); use fewer canaries or random directions"
                )
            g = make_generator(self.seed, ORTHOGONAL_STREAM)
            self._coord = torch.randperm(self.dim, generator=g)[: self.num_canaries]
            self._sign = torch.randint(0, 2, (self.num_canaries,), generator=g).to(torch.float64).mul_(2.0).sub_(1.0)

    def direction(self, k: int) -> torch.Tensor:
        """`u_k` (float64, unit norm), for every canary `0 ≤ k < m`."""
        assert self.dim is not None, "bind() first"
        if self._coord is not None and self._sign is not None:
            u = torch.zeros(self.dim, dtype=torch.float64)
            u[int(self._coord[k])] = self._sign[k]
            return u
        return unit_direction(self.seed, CANARY_STREAM, int(k), self.dim)

    def project(self, v: torch.Tensor) -> np.ndarray:
        """`⟨u_k, v⟩` for every canary (float64, length m) of a flat vector `v` (length d), computed
        in `v`'s precision (random directions: the float32 matrix, in blocks of rows for float64)."""
        if self._coord is not None and self._sign is not None:
            return (v[self._coord].double() * self._sign).numpy()
        u = self.matrix()
        if v.dtype == torch.float32:
            return (u @ v).double().numpy()
        return np.concatenate([(blk.to(v.dtype) @ v).double().numpy() for blk in u.split(1024)])

    def matrix(self) -> torch.Tensor:
        """All `m` directions as an `m × d` float32 matrix (built once)."""
        if self._matrix is None:
            assert self.dim is not None, "bind() first"
            if self.num_canaries * self.dim * 4 > ONE_RUN_MEMORY:
                raise FedsimError(
                    f"the one-run audit keeps {self.num_canaries} × {self.dim:,} canary directions "
                    f"({self.num_canaries * self.dim * 4 / 2**30:.1f} GiB); use fewer canaries or a smaller model"
                )
            mat = torch.empty(self.num_canaries, self.dim, dtype=torch.float32)  # filled in place: no second copy
            for k in range(self.num_canaries):
                mat[k] = self.direction(k)
            self._matrix = mat
        return self._matrix

    def update_sum(self, user_ids: Sequence[int], t: int, clip_norm: float, dim: int) -> torch.Tensor:
        """`Σ c·u_k` over the included canaries among `user_ids` (CPU float32, length `dim`)."""
        if self.first_id is None:
            raise RuntimeError("OneRunCanaries.update_sum before bind()")
        total = torch.zeros(int(dim), dtype=torch.float64)
        ks = [int(self.index[int(uid) - self.first_id]) for uid in user_ids]
        for k in ks:
            self.participations[k] += 1
        if self._coord is not None and self._sign is not None:
            idx = torch.as_tensor(ks, dtype=torch.int64)
            total.index_add_(0, self._coord[idx], self._sign[idx])
        elif self._matrix is None:
            for k in ks:
                total.add_(self.direction(k))
        else:  # the rows already built (the every-model recorder's matrix): no direction regenerated
            for i in range(0, len(ks), 1024):
                total.add_(self._matrix[ks[i : i + 1024]].double().sum(dim=0))
        return total.mul_(float(clip_norm)).to(torch.float32)


def _release_recorder(canaries: OneRunCanaries) -> Any:
    """A run callback that records, for every round `t`, `⟨u_k, U_t + noise_t⟩` for all `m`
    canaries (the noisy sum the server releases, times `K̄`), `c_t` and the accounted
    `σ_t = c_t·z·sens`, and
    keeps the run's participation scheme and MF strategy."""
    from fedsim.runner.callbacks import RunCallback

    class ReleaseRecorder(RunCallback):
        def __init__(self) -> None:
            self.rows: list[np.ndarray] = []
            self.clip: list[float] = []
            self.noise_std: list[float] = []
            self.run: Any = None

        def on_start(self, run: Any, out: Path, resumed: bool) -> None:
            if resumed:
                raise FedsimError("the one-run audit cannot resume a run; start it afresh")
            self.run = run
            server = run.server
            inner = server.noisy_mean
            if canaries.directions == "random":
                canaries.matrix()  # built (and its size checked) before the first round

            def recorded(total: torch.Tensor, t: int) -> torch.Tensor:
                g = inner(total, t)
                if int(t) != len(self.rows):  # one release per round, in order
                    raise RuntimeError(f"one-run audit: round {t} released out of order (expected {len(self.rows)})")
                released = g.detach().to("cpu", torch.float32) * server.expected_cohort
                self.rows.append(canaries.project(released))
                self.clip.append(float(server.clip_norm))
                # the accounted std c·z·sens (what the ledger assumes, not what was added)
                self.noise_std.append(float(server.clip_norm * server.noise_multiplier * server.noise.sensitivity))
                return g

            server.noisy_mean = recorded

    return ReleaseRecorder()


def _every_model_scores(rec: Any, raw: bool) -> tuple[np.ndarray, str]:
    """Scores of the every-model adversary from the recorded releases, and how it whitened."""
    from fedsim.attacks.one_run import every_release_scores, whitening
    from fedsim.privacy.participation import GroupScheme

    run = rec.run
    proj = np.stack(rec.rows, axis=1)  # m × T
    t = proj.shape[1]
    clip = np.asarray(rec.clip)
    sigma = np.asarray(rec.noise_std)
    plan = run.prep.plan
    if not (sigma > 0).all():  # no noise: unit scale per round, nothing to decorrelate
        w, how = whitening(clip), "no noise: per-round projections over c"
    elif plan is not None and not raw and plan.C.shape[0] == plan.C.shape[1]:
        w, how = whitening(sigma, plan.C), "decorrelated: W = C·diag(1/σ_t) (noise C⁻¹Z whitened)"
    else:
        stream = run.server.noise.stream
        rv = [stream.row_variance(i) for i in range(t)]
        w, how = whitening(sigma, None, rv), "raw: rounds taken as independent, std σ_t·√(row variance)"
    scheme = run.prep.scheme
    groups = int(scheme.min_separation) if isinstance(scheme, GroupScheme) else 1
    rate = float(scheme.sampling_rate)
    return every_release_scores(proj, clip, w, groups=groups, rate=min(rate, 1.0)), how


def run_one_run_audit(
    cfg: Any,
    out_dir: str | Path | None = None,
    num_canaries: int = DEFAULT_CANARIES,
    *,
    confidence: float = 0.95,
    seed: int | None = None,
    progress: bool = True,
    directions: str = "random",
) -> dict[str, Any]:
    """Train `cfg` once with `num_canaries` gradient canaries, each included with probability
    1/2, and report one-run ε lower bounds (fedsim.attacks.one_run) for each adversary.

    Parameters
    ----------
    cfg : the validated experiment config.
    out_dir : run folder (default runs/<timestamp>-<name>); gets `one_run_audit.json` (the
        returned dict) and `one_run_scores.npz` (scores per adversary, inclusion bits).
    num_canaries : m ≥ 2 canaries with a coin; about m/2 join the population.
    confidence : each bound holds with this probability (default 0.95).
    seed : audit seed (default derive_seed(cfg.seed, "audit")).
    progress : print the run's header and progress line.
    directions : the canaries' directions, "random" (default) or "orthogonal" (keyed signed
        coordinates, m ≤ d; see `OneRunCanaries`).

    Adversaries: `final-model` (cosine of each canary direction with x_T − x_0),
    `every-model` (likelihood-ratio score over every round's released noisy sum, decorrelated
    by the MF strategy C) and, for MF noise, `every-model-raw` (the same score treating the
    rounds as independent). Each gets the Steinke–Nasr–Jagielski bound and the one-run
    f-DP (Gaussian) bound at the run's δ, next to the ledger's ε of the same run.
    """
    from fedsim.attacks.one_run import one_run_bound, perfect_separation_bound
    from fedsim.runner import default_run_dir, run_experiment

    if not 0.0 < confidence < 1.0:
        raise FedsimError(f"--alpha must be in (0, 1) (got {1 - confidence})")
    audit_seed = derive_seed(cfg.seed, "audit") if seed is None else int(seed)
    canaries = OneRunCanaries(num_canaries, audit_seed, directions)
    out = Path(out_dir) if out_dir is not None else default_run_dir(cfg)
    rec = _release_recorder(canaries)
    summary = run_experiment(cfg, out, progress=progress, synthetic=canaries, callbacks=[rec])
    run_delta = float(summary["delta"])
    delta_model = _model_delta(cfg, summary, out, canaries.count)
    d = delta_model.reshape(-1).double()
    final = canaries.project(d) / float(torch.linalg.vector_norm(d))
    scores = {"final-model": (final, "cosine with x_T - x_0")}
    scores["every-model"] = _every_model_scores(rec, raw=False)
    if rec.run.prep.plan is not None:
        scores["every-model-raw"] = _every_model_scores(rec, raw=True)
    m = canaries.num_canaries
    bounds = []
    for adversary, (s, how) in scores.items():
        for method in ("snj", "fdp"):
            b = one_run_bound(s, canaries.included, run_delta, confidence=confidence, method=method)
            bounds.append({"adversary": adversary, "statistic": how, **b.to_dict()})
    eps = summary["epsilon"]
    report = {
        "bounds": bounds,
        "ceiling": {
            meth: perfect_separation_bound(m, run_delta, confidence=confidence, method=meth) for meth in ("snj", "fdp")
        },
        "ledger_epsilon": eps if isinstance(eps, str) else float(eps),
        "neighboring_relation": summary.get("neighboring_relation"),
        "delta": run_delta,
        "confidence": confidence,
        "num_canaries": m,
        "num_included": canaries.count,
        "directions": directions,
        "canary_participations": {
            "mean_included": float(canaries.participations[canaries.included].mean()) if canaries.count else 0.0,
            "excluded_total": int(canaries.participations[~canaries.included].sum()),
        },
        "population": summary["population"],
        "real_users": summary["population"] - canaries.count,
        "mechanism": summary["mechanism"],
        "scheme": summary["scheme"],
        "noise_multiplier": summary["noise_multiplier"],
        "rounds": summary["rounds_completed"],
        "dimension": int(d.numel()),
        "seed": audit_seed,
        "run_dir": str(out),
        "method": (
            "one-run lower bounds: each canary included with probability 1/2 by a keyed coin; the "
            "auditor guesses the k+ highest scores 'in' (k+ on a fixed geometric grid, paid for by a "
            "union bound) and the bound is the largest epsilon rejected at 1 - confidence "
            "(Steinke, Nasr, Jagielski 2023: snj; Mahloujifar et al. 2024, Gaussian f-DP: fdp)"
        ),
    }
    arrays: dict[str, Any] = {k.replace("-", "_"): v[0] for k, v in scores.items()}
    np.savez(out / "one_run_scores.npz", included=canaries.included, **arrays)
    (out / "one_run_audit.json").write_text(json.dumps(_json_safe(report), indent=1), encoding="utf-8")
    return _json_safe(report)
