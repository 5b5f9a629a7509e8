"""Buffered linear Toeplitz (BLT) factorizations (docs/algorithms.md §3, family ``blt``).

A BLT strategy with ``m`` buffers (McMahan et al. 2024, "Efficient and
near-optimal noise generation for streaming differential privacy"; Dvijotham et
al. 2024 for multiple participations) is the lower-triangular Toeplitz ``C`` with

    c_0 = 1,   c_k = Σ_{j=1..m} ω_j θ_j^{k−1}  (k ≥ 1),

decays ``θ_j`` and scales ``ω_j``. In state-space form, with ``Θ = diag(θ)`` and
``𝟙`` the all-ones vector, ``y = C u`` is

    y_t = u_t + ωᵀ s_t,   s_{t+1} = Θ s_t + 𝟙 u_t,   s_0 = 0.                (1)

Inverse (:func:`blt_inverse`). Solving (1) for ``u`` gives ``u_t = y_t − ωᵀ s_t``,
``s_{t+1} = (Θ − 𝟙ωᵀ) s_t + 𝟙 y_t``, so ``C⁻¹`` is again BLT with ``m`` buffers:
its decays ``θ̂`` are the eigenvalues of ``M = Θ − 𝟙ωᵀ``, i.e. the roots ``λ`` of
the secular equation ``1 + Σ_i ω_i/(λ − θ_i) = 0`` (the poles of ``1/C(z)``,
``C(z) = 1 + z Σ_i ω_i/(1 − θ_i z)``), and the residue of ``1/C(z)`` at
``z = 1/θ̂_j`` gives the scales

    ω̂_j = −1 / Σ_i ω_i / (θ̂_j − θ_i)².

For ``ω > 0`` the secular function is monotone between its poles, so the ``θ̂`` are
real and interlace the ``θ``: one in each ``(θ_(i), θ_(i+1))`` and one below
``θ_(1)``; all ``ω̂ < 0``. For general (signed) ``ω`` the ``θ̂`` may come in complex
conjugate pairs; :func:`blt_inverse` then returns complex arrays and
:func:`blt_coefficients` real coefficients.

Streaming (:class:`BLTStream`): ``n_t = (C⁻¹ Z)_t`` solves ``C n = Z`` row by
row with (1) driven by the noise itself: ``n_t = ξ_t − ωᵀ s_t`` and
``s_{t+1} = Θ s_t + n_t``: ``m`` buffers of size ``d``, real arithmetic, no need
for the (possibly complex) inverse parameters.

Error of ``C`` for the prefix-sum workload ``S`` (units of ``(c·z)²``): ``B = S C⁻¹``
is lower-triangular Toeplitz with coefficients ``β = cumsum(r)``, ``r`` the
coefficients of ``C⁻¹``, so

    ‖B‖_F² = Σ_k (n − k) β_k²,   max_t ‖B[t,:]‖² = ‖B[n−1,:]‖² = Σ_k β_k²

(the rows of a lower-triangular Toeplitz matrix grow with ``t``, so the max error
is the final error). ``r`` is computed exactly from ``r_0 = 1``,
``r_k = −ωᵀ M^{k−1} 𝟙`` by repeated squaring of ``M`` (``O(m² n)``, ``log₂ n``
batched products; differentiable).

Sensitivity (:func:`blt_sensitivity_squared`), ``X = CᵀC``:

* single participation: ``max_j ‖C[:, j]‖² = ‖C[:, 0]‖² = Σ_{k<n} c_k²`` (column
  ``j`` is column 0 truncated).
* ``min_sep (k, b)``, at most ``k`` participations at least ``b`` apart: when
  ``c_k ≥ 0`` for all ``k`` and ``c_1 ≥ c_2 ≥ …`` (true for ``θ ∈ [0, 1)``,
  ``ω ≥ 0``), ``X ≥ 0`` elementwise and docs/algorithms.md's
  ``sens² = max_π Σ_{i,j∈π} X[i, j]`` is attained by ``π* = {0, b, 2b, …, (p−1)b}``
  with ``p = min(k, ⌈n/b⌉)``. Proof: ``X[u, v] = Σ_{s=0}^{n−1−max(u,v)} c_s c_{s+|u−v|}``.
  Take any allowed ``π = {j_1 < … < j_q}``; then ``q ≤ p`` and ``j_i ≥ (i−1)b``. Map
  ``j_i ↦ j'_i = (i−1)b``. Every term gets at least as many non-negative summands
  (``max(j'_i, j'_l) ≤ max(j_i, j_l)``) and, off the diagonal, a lag
  ``|i−l|·b ≤ |j_i − j_l|`` that is ``≥ 1``, where ``c`` is non-increasing, so each
  summand ``c_s c_{s+lag}`` does not decrease; diagonal terms only gain summands.
  So ``Σ_π X ≤ Σ_{π'} X ≤ Σ_{π*} X`` (adding participations adds non-negative
  terms). Non-negativity alone is not enough (``c = (1, 0, 1)``, ``b = 1``, ``k = 2``:
  ``{0, 2}`` beats ``{0, 1}``), so both conditions are checked and a ``C`` that
  violates them is refused. The value is computed exactly, in ``O(p·n)``, from
  prefix sums of ``c_s c_{s+δb}``.

Optimisation (:func:`optimize_blt`): ``θ = sigmoid(u)`` and
``ω = (1 + θ) ⊙ softmax(0, v)_{1..m}``, so ``θ ∈ (0, 1)``, ``ω > 0`` (the
conditions above hold everywhere) and ``Σ_i ω_i/(1 + θ_i) < 1``, which is exactly
the condition for the smallest inverse decay ``θ̂_min > −1`` (the secular function
is decreasing below ``θ_min`` and positive at ``λ = −1``); so every ``|θ̂| < 1``,
``C⁻¹`` has decaying coefficients and the loss is finite at every parameter value
(the excluded ``C`` have inverse coefficients that grow geometrically). L-BFGS-B
(SciPy) on the loss divided by its starting value, gradients by torch autograd in
float64.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from fedsim.errors import FedsimError
from fedsim.privacy.mechanisms.base import Mechanism, MechanismOptions, MFOptions, Objective, Strategy
from fedsim.privacy.mechanisms.registry import register
from fedsim.privacy.options import check_optimizer_options
from fedsim.privacy.participation import ParticipationScheme
from fedsim.privacy.sensitivity import toeplitz_pattern_sensitivity_squared
from fedsim.privacy.stream import Draw, NoiseStream

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

__all__ = [
    "BLT",
    "BLTOptions",
    "BLTStrategy",
    "BLTStream",
    "blt_coefficients",
    "blt_errors",
    "blt_inverse",
    "blt_sensitivity_squared",
    "optimize_blt",
]


# --------------------------------------------------------------------------- validation


def _params(theta: Any, omega: Any) -> tuple[np.ndarray, np.ndarray]:
    theta = np.atleast_1d(np.asarray(theta))
    omega = np.atleast_1d(np.asarray(omega))
    if theta.ndim != 1 or omega.shape != theta.shape:
        raise FedsimError(
            f"theta and omega must be 1-D arrays of the same length m (got shapes {theta.shape} and {omega.shape})"
        )
    if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(omega))):
        raise FedsimError("theta and omega must be finite")
    dtype = np.complex128 if (np.iscomplexobj(theta) or np.iscomplexobj(omega)) else np.float64
    return theta.astype(dtype), omega.astype(dtype)


def _check_n(n: int) -> int:
    if isinstance(n, bool) or int(n) != n or int(n) < 1:
        raise FedsimError(f"n (number of rounds) must be an integer ≥ 1 (got {n!r})")
    return int(n)


def _scheme(n: int, max_participations: int, min_sep: int | None) -> tuple[int, int]:
    """``(p, b)``: participations that fit and the separation (``p = 1`` for single)."""
    k = max_participations
    if isinstance(k, bool) or int(k) != k or int(k) < 1:
        raise FedsimError(f"max_participations must be an integer ≥ 1 (got {k!r})")
    k = int(k)
    if min_sep is None:
        b = max(1, n // k)
    else:
        if isinstance(min_sep, bool) or int(min_sep) != min_sep or int(min_sep) < 1:
            raise FedsimError(f"min_sep must be an integer ≥ 1 or None (got {min_sep!r})")
        b = int(min_sep)
    return min(k, -(-n // b)), b


def _real_if_close(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    if np.iscomplexobj(x) and np.all(np.abs(x.imag) <= 1e-12 * max(scale, 1.0)):
        return x.real.copy()
    return x


# --------------------------------------------------------------------------- coefficients


def blt_coefficients(theta: Any, omega: Any, n: int) -> np.ndarray:
    """Toeplitz coefficients ``c_0 … c_{n−1}`` of a BLT matrix.

    ``c_0 = 1`` and ``c_k = Σ_j ω_j θ_j^{k−1}`` for ``k ≥ 1``.

    Parameters
    ----------
    theta : array_like
        Decays ``θ`` (length ``m``; real, or complex conjugate pairs).
    omega : array_like
        Scales ``ω`` (length ``m``).
    n : int
        Number of coefficients (rounds).

    Returns
    -------
    np.ndarray
        Length ``n``; real unless the parameters give genuinely complex coefficients.
    """
    theta, omega = _params(theta, omega)
    n = _check_n(n)
    c = np.zeros(n, dtype=theta.dtype)
    c[0] = 1.0
    if n > 1 and theta.size:
        powers = np.power.outer(theta, np.arange(n - 1))  # θ_j^{k−1}, 0^0 = 1
        c[1:] = omega @ powers
    return _real_if_close(c, float(np.max(np.abs(c))))


def blt_inverse(theta: Any, omega: Any) -> tuple[np.ndarray, np.ndarray]:
    """Parameters ``(θ̂, ω̂)`` of the BLT matrix ``C⁻¹`` (same ``m``, any ``n``).

    ``θ̂ = eig(diag(θ) − 𝟙ωᵀ)`` and ``ω̂_j = −1 / Σ_i ω_i/(θ̂_j − θ_i)²`` (module
    docstring). Buffers with ``ω_i = 0`` and repeated decays are merged first; the
    freed slots are returned as ``θ̂ = 0, ω̂ = 0`` (inert), so the length stays ``m``.

    Parameters
    ----------
    theta : array_like
        Decays of ``C`` (length ``m``).
    omega : array_like
        Scales of ``C`` (length ``m``).

    Returns
    -------
    theta_hat, omega_hat : np.ndarray
        Real arrays when ``C⁻¹``'s decays are real (always when ``ω > 0``), complex
        (conjugate pairs) otherwise.
    """
    theta, omega = _params(theta, omega)
    m = theta.size
    # merge repeated decays and drop inert buffers: the formula needs distinct θ_i, ω_i ≠ 0
    th: list[complex] = []
    om: list[complex] = []
    for t, w in zip(theta.tolist(), omega.tolist()):
        for i, t2 in enumerate(th):
            if t == t2:
                om[i] += w
                break
        else:
            th.append(t)
            om.append(w)
    keep = [i for i, w in enumerate(om) if w != 0]
    th_a = np.asarray([th[i] for i in keep], dtype=theta.dtype)
    om_a = np.asarray([om[i] for i in keep], dtype=theta.dtype)
    r = th_a.size
    theta_hat = np.zeros(m, dtype=np.complex128)
    omega_hat = np.zeros(m, dtype=np.complex128)
    if r:
        M = np.diag(th_a) - np.outer(np.ones(r), om_a)
        lam = np.linalg.eigvals(M).astype(np.complex128)
        diff = lam[:, None] - th_a[None, :]
        if np.any(diff == 0):
            raise FedsimError("BLT inverse is degenerate (an inverse decay coincides with a decay); perturb theta")
        denom = np.sum(om_a[None, :] / diff**2, axis=1)
        if np.any(denom == 0):
            raise FedsimError("BLT inverse has a repeated decay (defective); perturb theta or omega")
        theta_hat[:r] = lam
        omega_hat[:r] = -1.0 / denom
    scale = float(max(np.max(np.abs(theta_hat), initial=0.0), np.max(np.abs(omega_hat), initial=0.0)))
    theta_hat = _real_if_close(theta_hat, scale)
    omega_hat = _real_if_close(omega_hat, scale)
    if np.iscomplexobj(theta_hat) or np.iscomplexobj(omega_hat):
        return theta_hat.astype(np.complex128), omega_hat.astype(np.complex128)
    order = np.argsort(theta_hat)[::-1]
    return theta_hat[order], omega_hat[order]


# --------------------------------------------------------------------------- torch core


def _coefficients_t(theta: torch.Tensor, omega: torch.Tensor, n: int) -> torch.Tensor:
    """``c_0 … c_{n−1}`` (torch, differentiable)."""
    if n == 1:
        return torch.ones(1, dtype=theta.dtype)
    k = torch.arange(n - 1, dtype=theta.dtype)
    powers = theta[:, None] ** k[None, :]  # θ^0 = 1 also for θ = 0
    return torch.cat([torch.ones(1, dtype=theta.dtype), omega @ powers])


def _inverse_coefficients_t(theta: torch.Tensor, omega: torch.Tensor, n: int) -> torch.Tensor:
    """``r_0 … r_{n−1}`` of ``C⁻¹``: ``r_0 = 1``, ``r_k = −ωᵀ M^{k−1} 𝟙``, ``M = Θ − 𝟙ωᵀ``."""
    m = theta.shape[0]
    if n == 1:
        return torch.ones(1, dtype=theta.dtype)
    M = torch.diag(theta) - torch.ones(m, 1, dtype=theta.dtype) * omega[None, :]
    V = torch.ones(m, 1, dtype=theta.dtype)  # columns M^j 𝟙, j = 0 … 2^i − 1
    P = M
    while V.shape[1] < n - 1:
        V = torch.cat([V, P @ V], dim=1)
        P = P @ P
    return torch.cat([torch.ones(1, dtype=theta.dtype), -(omega @ V[:, : n - 1])])


def _errors_t(
    theta: torch.Tensor, omega: torch.Tensor, n: int, p: int, b: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sens², ‖B‖_F², ‖B[n−1,:]‖²)`` for ``B = S C⁻¹``."""
    c = _coefficients_t(theta, omega, n)
    sens2 = torch.sum(c * c) if p == 1 else toeplitz_pattern_sensitivity_squared(c, p, b)
    beta = torch.cumsum(_inverse_coefficients_t(theta, omega, n), dim=0)
    weights = torch.arange(n, 0, -1, dtype=theta.dtype)
    return sens2, torch.sum(weights * beta * beta), torch.sum(beta * beta)


def _check_monotone(c: np.ndarray) -> None:
    scale = float(np.max(np.abs(c)))
    slack = 1e-12 * scale
    if np.any(c < -slack) or np.any(np.diff(c[1:]) > slack):
        raise FedsimError(
            "the multi-participation BLT sensitivity needs coefficients c_k ≥ 0 that do not increase "
            "for k ≥ 1 (θ in [0, 1) and ω ≥ 0 guarantee it); these parameters violate it — use "
            "max_participations = 1, or decays in [0, 1) with non-negative scales"
        )


# --------------------------------------------------------------------------- public numpy API


def blt_sensitivity_squared(
    theta: Any, omega: Any, n: int, max_participations: int = 1, min_sep: int | None = None
) -> float:
    """``sens(C)²`` of the ``n × n`` BLT matrix under single or ``min_sep (k, b)`` participation.

    Parameters
    ----------
    theta, omega : array_like
        BLT parameters of ``C`` (real).
    n : int
        Number of rounds.
    max_participations : int, default 1
        ``k``. With ``k = 1``: ``Σ_{k<n} c_k²``.
    min_sep : int or None, default None
        ``b``, the fewest rounds between two participations; ``None``: ``⌊n/k⌋`` (the
        ``epochs`` separation with ``n = k·b``). Ignored for ``k = 1``.

    Returns
    -------
    float
        ``max_π Σ_{i,j∈π} (CᵀC)[i, j]`` over the allowed patterns, attained at
        ``{0, b, …, (p−1)b}`` (module docstring for the proof and its conditions,
        which are checked: ``c_k ≥ 0`` and non-increasing for ``k ≥ 1``).
    """
    n = _check_n(n)
    p, b = _scheme(n, max_participations, min_sep)
    c = blt_coefficients(theta, omega, n)
    if np.iscomplexobj(c):
        raise FedsimError("BLT sensitivity needs real coefficients; theta and omega give complex ones")
    if p == 1:
        return float(np.sum(c * c))
    _check_monotone(c)
    with torch.no_grad():
        return float(toeplitz_pattern_sensitivity_squared(torch.as_tensor(c), p, b))


def blt_errors(
    theta: Any, omega: Any, n: int, max_participations: int = 1, min_sep: int | None = None
) -> dict[str, float]:
    """Errors of the BLT factorization of the prefix sum ``S`` (units of ``(c·z)²``).

    Parameters
    ----------
    theta, omega : array_like
        Real BLT parameters of ``C``.
    n : int
        Number of rounds.
    max_participations : int, default 1
        ``k``.
    min_sep : int or None, default None
        ``b``; ``None``: ``⌊n/k⌋``.

    Returns
    -------
    dict
        ``loss`` (``sens² ‖S C⁻¹‖_F²``), ``max_error`` and ``final_error`` (equal for
        Toeplitz ``C``), ``sensitivity_squared``.
    """
    n = _check_n(n)
    sens2 = blt_sensitivity_squared(theta, omega, n, max_participations, min_sep)
    th, om = _params(theta, omega)
    if np.iscomplexobj(th) or np.iscomplexobj(om):
        raise FedsimError("blt_errors needs real theta and omega")
    with torch.no_grad():
        beta = torch.cumsum(_inverse_coefficients_t(torch.as_tensor(th), torch.as_tensor(om), n), dim=0).numpy()
    weights = np.arange(n, 0, -1, dtype=np.float64)
    last = float(np.sum(beta * beta))
    return {
        "loss": float(sens2 * np.sum(weights * beta * beta)),
        "max_error": sens2 * last,
        "final_error": sens2 * last,
        "sensitivity_squared": sens2,
    }


# --------------------------------------------------------------------------- optimisation


def _unpack(x: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    theta = torch.sigmoid(x[:m])
    share = torch.softmax(torch.cat([torch.zeros(1, dtype=x.dtype), x[m:]]), dim=0)[1:]
    return theta, (1.0 + theta) * share


def _pack(theta: np.ndarray, omega: np.ndarray) -> np.ndarray:
    theta = np.asarray(theta, dtype=np.float64)
    omega = np.asarray(omega, dtype=np.float64)
    if np.any(theta <= 0) or np.any(theta >= 1) or np.any(omega <= 0):
        raise FedsimError("init needs decays theta in (0, 1) and scales omega > 0")
    share = omega / (1.0 + theta)
    rest = 1.0 - share.sum()
    if rest <= 0:
        raise FedsimError(
            "init has Σ ω_j/(1 + θ_j) ≥ 1, so C⁻¹ has a decay ≤ −1 (growing coefficients); use smaller omega"
        )
    return np.concatenate([np.log(theta) - np.log1p(-theta), np.log(share) - np.log(rest)])


def _default_init(n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Time scales ``1/(1−θ)`` log-spaced from 2 to ``n``; weights ``∝ τ^{-1/2}`` with ``c_1 = 1/2``.

    A sum of exponentials at log-spaced time scales with these weights follows the
    ``k^{-1/2}`` decay of the square-root coefficients.
    """
    if m == 1:
        tau = np.array([max(2.0, math.sqrt(n))])
    else:
        tau = np.logspace(math.log10(2.0), math.log10(max(n, 3)), m)
    theta = 1.0 - 1.0 / tau
    w = tau**-0.5
    omega = 0.5 * w / w.sum()
    return theta, omega


def _initial_params(n: int, m: int, init: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """The optimiser's starting point: ``init`` = ``(θ, ω)`` packed, or the default start."""
    if init is None:
        theta0, omega0 = _default_init(n, m)
    else:
        theta0, omega0 = (np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in init)
        if theta0.shape != (m,) or omega0.shape != (m,):
            raise FedsimError(f"init must be two arrays of length buffers = {m}")
    return _pack(theta0, omega0)


def _minimize_blt(
    x0: np.ndarray, m: int, n: int, p: int, b: int, objective: Objective, tol: float, max_iter: int, history_size: int
) -> tuple[Any, np.ndarray]:
    """L-BFGS-B on the objective relative to its starting value; returns scipy's result and
    the gradient of the relative objective at its end."""
    from scipy.optimize import minimize

    def value(x: torch.Tensor) -> torch.Tensor:
        theta, omega = _unpack(x, m)
        sens2, total, last = _errors_t(theta, omega, n, p, b)
        return sens2 * (total if objective == "total" else last)

    with torch.no_grad():
        scale = float(value(torch.as_tensor(x0)))

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        f = value(xt) / scale
        if not f.requires_grad:  # n = 1: C = [1] whatever the parameters
            return float(f), np.zeros_like(x)
        (g,) = torch.autograd.grad(f, xt)
        return float(f.detach()), g.numpy().copy()

    res = minimize(
        fun,
        x0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "ftol": tol, "gtol": tol, "maxcor": history_size, "maxfun": 20 * max_iter},
    )
    _, grad = fun(res.x)
    return res, grad


def optimize_blt(
    n: int,
    buffers: int,
    max_participations: int = 1,
    min_sep: int | None = None,
    objective: Objective = "total",
    tol: float = 1e-12,
    max_iter: int = 5_000,
    init: tuple[np.ndarray, np.ndarray] | None = None,
    history_size: int = 20,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """BLT parameters minimising the prefix-sum error under the run's scheme.

    Minimises ``sens(C)² · ‖S C⁻¹‖_F²`` (``"total"``) or
    ``sens(C)² · max_t ‖(S C⁻¹)[t,:]‖²`` (``"max"``, which for Toeplitz ``C`` is the
    last row) over ``θ ∈ (0, 1)^m``, ``ω > 0`` with ``Σ ω_j/(1+θ_j) < 1`` (module
    docstring: this keeps ``C⁻¹`` stable and makes the multi-participation
    sensitivity exact).

    Parameters
    ----------
    n : int
        Number of rounds.
    buffers : int
        ``m``, number of buffers (``≥ 1``).
    max_participations : int, default 1
        ``k``: 1 for single participation, else ``min_sep (k, b)``.
    min_sep : int or None, default None
        ``b``; ``None``: ``⌊n/k⌋``. Ignored for ``k = 1``.
    objective : {"total", "max"}, default "total"
        Total squared error of all prefix sums, or the worst (= last) one.
    tol : float, default 1e-12
        Stop when one iteration lowers the objective by less than ``tol`` times its
        starting value, or every gradient entry of that relative objective is below
        ``tol``.
    max_iter : int, default 5000
        Most L-BFGS iterations.
    init : (theta, omega) or None, default None
        Starting point (``θ ∈ (0,1)``, ``ω > 0``, ``Σ ω/(1+θ) < 1``); ``None``: time
        scales log-spaced between 2 and ``n`` with weights ``∝ τ^{-1/2}``.
    history_size : int, default 20
        L-BFGS memory.

    Returns
    -------
    theta, omega : np.ndarray
        Optimised parameters of ``C``, sorted by decreasing ``θ``.
    info : dict
        ``loss``, ``max_error``, ``final_error``, ``sensitivity_squared``,
        ``iterations``, ``evaluations``, ``seconds``, ``grad_norm`` (of the relative
        objective), ``converged``, ``message``, ``n``, ``buffers``,
        ``max_participations``, ``min_sep``, ``objective``.
    """

    n = _check_n(n)
    if isinstance(buffers, bool) or int(buffers) != buffers or int(buffers) < 1:
        raise FedsimError(f"buffers must be an integer ≥ 1 (got {buffers!r})")
    m = int(buffers)
    p, b = _scheme(n, max_participations, min_sep)
    check_optimizer_options(objective, tol, max_iter)

    start = time.perf_counter()
    x0 = _initial_params(n, m, init)
    res, grad = _minimize_blt(x0, m, n, p, b, objective, tol, int(max_iter), history_size)
    with torch.no_grad():
        theta_t, omega_t = _unpack(torch.as_tensor(res.x), m)
    theta, omega = theta_t.numpy().copy(), omega_t.numpy().copy()
    order = np.argsort(theta)[::-1]
    theta, omega = theta[order], omega[order]
    info: dict[str, Any] = blt_errors(theta, omega, n, max_participations, min_sep if p > 1 else None)
    info.update(
        {
            "n": n,
            "buffers": m,
            "max_participations": int(max_participations),
            "min_sep": b if int(max_participations) > 1 else None,
            "objective": objective,
            "iterations": int(res.nit),
            "evaluations": int(res.nfev),
            "grad_norm": float(np.linalg.norm(grad)),
            "converged": bool(res.success),
            "message": str(res.message),
            "seconds": time.perf_counter() - start,
        }
    )
    return theta, omega, info


# --------------------------------------------------------------------------- streaming


class BLTStream(NoiseStream):
    """Streaming noise of a buffered-linear-Toeplitz ``C = BLT(θ, ω)`` with ``m`` buffers of
    size ``d``: ``n_t = ξ_t − Σ_j ω_j s_{j,t}``, then ``s_{j,t+1} = θ_j s_{j,t} + n_t`` — in
    place, so memory is the ``m`` buffers plus ``ξ_t``.

    Rows are drawn in order; the state (:meth:`state_dict`) is the next round ``t`` and the
    buffers (None before round 0: all zero).

    Parameters
    ----------
    theta, omega : real BLT parameters of the strategy ``C`` (not of ``C⁻¹``).
    sens : ``sens(C)`` under the run's scheme.
    name : the mechanism's name (default ``blt``).
    """

    in_order = True

    def __init__(self, theta: Any, omega: Any, sens: float, name: str = "blt") -> None:
        super().__init__(sens, name)
        theta, omega = _params(theta, omega)
        if np.iscomplexobj(theta) or np.iscomplexobj(omega):
            raise FedsimError("the BLT noise stream needs real theta and omega (those of C, not of C⁻¹)")
        self.theta, self.omega = theta, omega
        self.t = 0
        self.buffers: tuple[torch.Tensor, ...] | None = None

    def next_round(self) -> int | None:
        return self.t

    def step(self, t: int, draw: Draw) -> torch.Tensor:
        noise = draw(t)
        if self.buffers is None:
            self.buffers = tuple(noise.clone() for _ in range(len(self.theta)))
        else:
            for w, s in zip(self.omega.tolist(), self.buffers):
                noise.sub_(s, alpha=float(w))
            for th, s in zip(self.theta.tolist(), self.buffers):
                s.mul_(float(th)).add_(noise)
        self.t = t + 1
        return noise

    def row_variance(self, t: int) -> float:
        r = blt_coefficients(*blt_inverse(self.theta, self.omega), int(t) + 1)
        return float((r**2).sum())

    def state_dict(self) -> dict[str, Any]:
        bufs = None if self.buffers is None else [b.clone().cpu() for b in self.buffers]
        return {"t": self.t, "buffers": bufs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        bufs = state["buffers"]
        self.t = int(state["t"])
        self.buffers = None if bufs is None else tuple(b.to(self.device) for b in bufs)


# --------------------------------------------------------------------------- the mechanism


class BLTOptions(MFOptions):
    """``privacy.mechanism = "blt"``.

    Parameters
    ----------
    workload : BLT is optimised for the prefix sum only: ``prefix`` (the default; ``momentum``
        cannot be written).
    buffers : ``m``, the number of buffers (model-sized vectors of noise state). Default 4.
    objective : ``total`` (Σ prefix-sum errors, default) or ``max`` (worst prefix).
    """

    mechanism: Literal["blt"] = "blt"
    workload: Literal["prefix"] = Field(default="prefix", description="prefix only")
    buffers: int = Field(default=4, ge=1, le=64, description="m, the number of buffers (default 4)")
    objective: Literal["total", "max"] = Field(default="total", description="total (loss) or max (max_error)")


@dataclass(frozen=True, eq=False)
class BLTStrategy(Strategy):
    """``C = BLT(θ, ω)`` over ``n`` rounds: lower-triangular Toeplitz with ``c_0 = 1``,
    ``c_k = Σ_j ω_j θ_j^{k−1}``.

    Parameters
    ----------
    theta, omega : real decays and scales of ``C`` (``m`` each).
    n : the number of rounds.
    info : the optimiser's report.
    """

    theta: np.ndarray
    omega: np.ndarray
    n: int
    info: dict[str, Any]

    @property
    def rounds(self) -> int:
        return self.n

    def materialize(self) -> np.ndarray:
        from scipy.linalg import toeplitz

        return np.asarray(np.tril(toeplitz(blt_coefficients(self.theta, self.omega, self.n))))

    def sensitivity(self, scheme: ParticipationScheme) -> tuple[float, bool]:
        k = scheme.max_participations or 1
        if scheme.name == "min_sep" and k > 1:
            # Exact for BLT with non-negative, non-increasing coefficients (checked inside;
            # anything else is refused there): worst pattern starts at 0 with gaps of b.
            s2 = blt_sensitivity_squared(
                self.theta, self.omega, self.n, max_participations=k, min_sep=scheme.min_separation
            )
            return float(np.sqrt(s2)), True
        return super().sensitivity(scheme)

    def stream(self, sens: float, name: str) -> NoiseStream:
        return BLTStream(self.theta, self.omega, sens, name=name)


@register
class BLT(Mechanism):
    name = "blt"
    options = BLTOptions
    summary = "buffered linear Toeplitz C with m buffers, optimised for the scheme; noise from m buffers"

    def strategy(self, opts: MechanismOptions, A: np.ndarray, scheme: ParticipationScheme) -> Strategy:
        assert isinstance(opts, BLTOptions)
        n = A.shape[0]
        if A.shape != (n, n) or not np.allclose(A, np.tril(np.ones((n, n)))):
            raise FedsimError(
                "privacy.mechanism = 'blt' is optimised for the prefix-sum workload; set privacy.workload = 'prefix'"
            )
        k = scheme.max_participations or 1
        b = scheme.min_separation or n
        theta, omega, info = remembered_blt(n, opts.buffers, k, b if k > 1 else None, opts.objective)
        return BLTStrategy(theta, omega, n, dict(info, theta=theta, omega=omega))


def remembered_blt(
    n: int, buffers: int, max_participations: int, min_sep: int | None, objective: Objective
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """`optimize_blt` with its default tolerances, remembered on disk next to the cached
    factorizations (`blt-<digest>.npz`; 1.6 s of CPU for the default experiment's 150 rounds).

    Nothing privacy depends on is taken from the file: the plan's sensitivity is recomputed
    from θ and ω by fedsim's checks, and a file written for other inputs, or unreadable, is
    recomputed. `info["cache"]` is "hit" or "miss"."""
    from fedsim.privacy.factorizations import cache_dir, cache_key

    digest = cache_key("blt", n=n, buffers=buffers, k=max_participations, b=min_sep, objective=objective)
    path = cache_dir() / f"blt-{digest[:32]}.npz"
    try:
        with np.load(path, allow_pickle=False) as data:
            info = json.loads(str(data["info"]))
            if info.get("cache_key") == digest:
                return data["theta"].copy(), data["omega"].copy(), dict(info, cache="hit")
    except (OSError, ValueError, KeyError):
        pass
    theta, omega, info = optimize_blt(
        n, buffers, max_participations=max_participations, min_sep=min_sep, objective=objective
    )
    info = {k: v.item() if isinstance(v, np.generic) else v for k, v in info.items()}
    info["cache_key"] = digest
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".blt-", suffix=".npz.tmp")
    except OSError:  # an unwritable cache only costs the optimisation next time
        return theta, omega, dict(info, cache="miss")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, theta=theta, omega=omega, info=np.array(json.dumps(info, default=str)))
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
    return theta, omega, dict(info, cache="miss")
