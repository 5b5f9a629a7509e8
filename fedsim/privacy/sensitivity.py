"""Sensitivity ``sens(C)`` of a strategy matrix under a participation scheme (docs/algorithms.md §3).

One user contributes a vector of norm ≤ 1 (in units of ``c``) in each round it
takes part in; with participation pattern ``π`` the change of ``C·G`` is
``Σ_{i∈π} C[:, i] x_iᵀ`` and its squared Frobenius norm is
``Σ_{i,j∈π} X[i,j] ⟨x_i, x_j⟩`` with ``X = CᵀC``. ``sens² = max_π max_x`` of that.

- ``single``: ``max_j ‖C[:, j]‖`` — exact.
- ``epochs (k, b)``: patterns are exactly ``π_g = {g, g+b, …} ∩ [0, n)``. If ``X`` is
  non-negative on every ``π_g × π_g`` the inner max is at aligned ``x_i`` and
  ``sens² = max_g Σ_{i,j∈π_g} X[i,j]`` — exact. Otherwise ``Σ |X[i,j]|`` bounds it
  (Cauchy–Schwarz) — an upper bound.
- ``min_sep (k, b)``: patterns are any ≤ ``k`` indices pairwise ≥ ``b`` apart. If ``C``
  has at most ``b`` bands, ``X[i,j] = 0`` for ``|i − j| ≥ b`` and the cross terms
  vanish: ``sens² = max_π Σ_{i∈π} ‖C[:, i]‖²``, found exactly by dynamic programming
  over positions (it equals ``k·max_j‖C[:,j]‖²`` when columns are normalised and
  ``k·b ≤ n`` — the docs/algorithms.md formula). For a general ``C`` with non-negative
  ``X``: exact by enumeration when the number of patterns is small, otherwise the
  upper bound ``max_π Σ_{i∈π} (X[i,i] + top_{k−1}{X[i,j] : |i−j| ≥ b})`` (each term
  of the pattern sum is bounded by its row's best admissible partners), maximised
  by the same dynamic programme. With negative entries, ``|X|`` is used (bound).

Every function returns ``(sens, exact)``; outputs must say "upper bound" when
``exact`` is False.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from fedsim.errors import FedsimError

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

#: Enumerate min-sep patterns exactly when there are at most this many.
MAX_ENUMERATED_PATTERNS = 200_000


def num_bands(C: np.ndarray, tol: float = 0.0) -> int:
    """Number of bands of a (square, lower-triangular) ``C``: 1 + the largest ``i − j``
    with ``|C[i, j]| > tol``."""
    n = C.shape[1]
    nz = np.argwhere(np.abs(C) > tol)
    if nz.size == 0:
        return 1
    return int((nz[:, 0] - nz[:, 1]).max()) + 1 if C.shape[0] == n else C.shape[0]


def single(C: np.ndarray) -> tuple[float, bool]:
    """Single participation: the largest column norm (exact)."""
    return float(np.sqrt((C * C).sum(axis=0).max())), True


def epochs(C: np.ndarray, k: int, b: int) -> tuple[float, bool]:
    """Fixed epochs: user of group ``g`` takes part in ``g, g+b, …`` (exact if ``X ≥ 0`` on the patterns)."""
    n = C.shape[1]
    _check(n, k, b)
    X = C.T @ C
    best, exact = 0.0, True
    for g in range(min(b, n)):
        idx = np.arange(g, n, b)[:k]
        sub = X[np.ix_(idx, idx)]
        if (sub < 0).any():
            exact = False
            best = max(best, float(np.abs(sub).sum()))
        else:
            best = max(best, float(sub.sum()))
    return math.sqrt(best), exact


def _best_pattern_sum(w: np.ndarray, k: int, b: int) -> float:
    """max over ≤ k indices pairwise ≥ b apart of Σ w[i] (w ≥ 0), by dynamic programming."""
    n = len(w)
    # f[j][t]: best sum using indices ≥ t with at most j picks.
    f = np.zeros((k + 1, n + b + 1))
    for j in range(1, k + 1):
        for t in range(n - 1, -1, -1):
            f[j, t] = max(f[j, t + 1], w[t] + f[j - 1, t + b])
    return float(f[k, 0])


def _num_patterns(n: int, k: int, b: int) -> int:
    total = 0
    for m in range(1, k + 1):
        free = n - (m - 1) * (b - 1)
        if free < m:
            break
        total += math.comb(free, m)
    return total


def _patterns(n: int, k: int, b: int) -> Iterator[list[int]]:
    for m in range(1, k + 1):
        for combo in itertools.combinations(range(n - (m - 1) * (b - 1)), m):
            yield [c + i * (b - 1) for i, c in enumerate(combo)]


def min_sep(C: np.ndarray, k: int, b: int) -> tuple[float, bool]:
    """Min-separation ``(k, b)``: exact for ≤ ``b`` bands or few patterns; else a proven upper bound."""
    n = C.shape[1]
    _check(n, k, b)
    X = C.T @ C
    if C.shape[0] == n and num_bands(C) <= b:
        return math.sqrt(_best_pattern_sum(np.diag(X).copy(), k, b)), True
    if (X >= 0).all() and _num_patterns(n, k, b) <= MAX_ENUMERATED_PATTERNS:
        best = max(float(X[np.ix_(p, p)].sum()) for p in _patterns(n, k, b))
        return math.sqrt(best), True
    A = np.abs(X)
    w = np.empty(n)
    for i in range(n):
        far = np.concatenate([A[i, : max(i - b + 1, 0)], A[i, i + b :]])
        top = np.sort(far)[::-1][: k - 1]
        w[i] = A[i, i] + top.sum()
    return math.sqrt(_best_pattern_sum(w, k, b)), False


def _check(n: int, k: int, b: int) -> None:
    if k < 1 or b < 1:
        raise FedsimError("max_participations k and min_sep b must be ≥ 1")


def sensitivity(C: np.ndarray, scheme: str, *, k: int = 1, b: int = 1) -> tuple[float, bool]:
    """``(sens(C), exact)`` under ``scheme`` (``single`` | ``epochs`` | ``min_sep``).

    Parameters
    ----------
    C : strategy matrix (``m × n``; lower-triangular when square), float64.
    scheme : participation scheme name.
    k : ``max_participations`` (epochs, min_sep).
    b : ``min_sep`` — the number of groups / minimum separation (epochs, min_sep).
    """
    if scheme == "single" or (scheme in ("epochs", "min_sep") and k == 1):
        return single(C)
    if scheme == "epochs":
        return epochs(C, k, b)
    if scheme == "min_sep":
        return min_sep(C, k, b)
    raise FedsimError(f"no MF sensitivity for sampling.scheme = {scheme!r}; use single, epochs or min_sep")


def toeplitz_pattern_sensitivity_squared(c: torch.Tensor, p: int, b: int) -> torch.Tensor:
    """``Σ_{i,l<p} X[ib, lb]`` for ``X = CᵀC``, ``C`` the lower-triangular Toeplitz matrix with
    coefficients ``c`` (``n`` of them): the squared sensitivity of the participation pattern
    ``{0, b, …, (p−1)b}``, which is the worst one under ``min_sep (k, b)`` (``p = min(k, ⌈n/b⌉)``)
    and ``epochs`` when ``c`` is non-negative and non-increasing (the proof is in
    :mod:`fedsim.privacy.mechanisms.blt`). Computed exactly in ``O(p·n)`` from prefix sums of
    ``c_s c_{s+δb}``; differentiable (torch), so the BLT optimiser uses it too.

    Parameters
    ----------
    c : the coefficients ``c_0 … c_{n−1}`` (a 1-D tensor).
    p : participations in the pattern.
    b : the separation between them.
    """
    n = c.shape[0]
    total = torch.zeros((), dtype=c.dtype)
    for delta in range(p):
        lag = delta * b
        prefix = torch.cumsum(c[: n - lag] * c[lag:], dim=0)  # T_δ(L) = prefix[L − 1]
        # pairs at lag δ·b whose larger index is m·b, m = δ … p−1: L = n − m·b summands
        lengths = n - b * torch.arange(delta, p)
        terms = prefix[lengths - 1].sum()
        total = total + (terms if delta == 0 else 2.0 * terms)
    return total
