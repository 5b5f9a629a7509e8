"""``bsr``: the banded square root factorization (docs/algorithms.md §3, family ``bsr``).

Kalinin & Lampert 2024, "Banded square root matrix factorization for differentially private
model training" (NeurIPS 2024). The strategy ``C`` is the ``b``-banded truncation of the square
root of the workload: no optimisation, a closed form for every ``n`` and ``b``.

Workloads. Both workloads fedsim builds are lower-triangular Toeplitz matrices: the prefix sum
``S`` has the generating function ``1/(1 − x)``, SGD with heavy-ball momentum ``β`` (unit learning
rates) ``A_β[t, j] = Σ_{s=j..t} β^{s−j}`` has ``1/((1 − x)(1 − βx))``; ``β = 0`` is ``S``.
Products of lower-triangular Toeplitz matrices are products of their power series, so the
square root of ``A_β`` is the Toeplitz matrix of

    (1 − x)^{−1/2} (1 − βx)^{−1/2},   coefficients  m_k = Σ_{i=0..k} β^i r_i r_{k−i},

with ``r_k = binom(2k, k)/4^k`` (the ``sqrt`` mechanism's coefficients, the series of
``(1 − x)^{−1/2}``). It is well defined for every ``β ∈ [0, 1)``, ``m_0 = 1`` and every
``m_k > 0``; for ``β = 0`` it is ``r_k`` itself (:func:`square_root_coefficients`). The workload
is recognised from ``A`` (:func:`workload_beta`: ``β = A[1, 0] − 1``, then ``A`` is checked to
be ``A_β``); any other ``A`` is refused.

Strategy. ``C[i, j] = m_{i−j}`` for ``0 ≤ i − j < b``, else 0; the columns are not normalised
(the paper's BSR), so ``b = n`` is exactly the ``sqrt`` mechanism's ``C`` and ``b = 1`` is
``C = I`` (DP-SGD). ``B = A C⁻¹`` is dense.

Sensitivity. ``C ≥ 0`` elementwise, so ``X = CᵀC ≥ 0`` and the generic computation
(:func:`fedsim.privacy.sensitivity.sensitivity`) is exact under every scheme: single
participation is the largest column norm (column 0); ``epochs`` sums ``X`` over the fixed
patterns; under ``min_sep (k, b')`` with ``b ≤ b'`` bands the cross terms vanish and a dynamic
programme over the column norms is exact. ``bands > min_sep`` under ``min_sep`` is refused (as
for ``banded``): the cross terms would no longer vanish.

Streaming. ``C`` is banded, so noise ``n_t = (C⁻¹ Z)_t`` comes from
:class:`fedsim.privacy.mechanisms.banded.BandedStream`:
``n_t = (ξ_t − Σ_{j=1..b−1} m_j n_{t−j}) / m_0`` with a ring of the last ``b − 1`` noise rows
(``(b − 1)·d`` floats). The truncated square-root polynomial has positive, non-increasing
coefficients, so by the Eneström–Kakeya theorem its roots lie outside the open unit disk and the
recursion does not blow up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field

from fedsim.errors import FedsimError
from fedsim.privacy.mechanisms.banded import BandedStream
from fedsim.privacy.mechanisms.base import Mechanism, MechanismOptions, MFOptions, Strategy
from fedsim.privacy.mechanisms.registry import register
from fedsim.privacy.mechanisms.sqrt import sqrt_toeplitz_coefficients
from fedsim.privacy.participation import ParticipationScheme
from fedsim.privacy.stream import NoiseStream

__all__ = [
    "BSR",
    "BSROptions",
    "BSRStrategy",
    "lower_toeplitz",
    "resolve_bands",
    "square_root_coefficients",
    "workload_beta",
]


def workload_beta(A: np.ndarray) -> float:
    """``β`` of a momentum workload ``A_β`` (``0`` for the prefix sum ``S``).

    Parameters
    ----------
    A : np.ndarray
        The ``n × n`` workload: ``S`` (``privacy.workload = "prefix"``) or ``A_β``
        (``"momentum"``, unit learning rates).

    Returns
    -------
    float
        ``β ∈ [0, 1)`` with ``A = A_β``.

    Raises
    ------
    FedsimError
        ``A`` is not square, or not ``A_β`` for any ``β ∈ [0, 1)`` (e.g. a learning-rate schedule,
        whose square root is not Toeplitz).
    """
    from fedsim.privacy.workloads import momentum

    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 1:
        raise FedsimError(f"workload A must be a square n×n matrix (got shape {A.shape})")
    n = A.shape[0]
    beta = float(A[1, 0] - 1.0) if n > 1 else 0.0
    if abs(beta) < 1e-15:
        beta = 0.0
    if not 0.0 <= beta < 1.0 or not np.allclose(A, momentum(n, beta), rtol=1e-12, atol=1e-12):
        raise FedsimError(
            "the square-root mechanisms (bsr, bisr) need the prefix-sum workload or the momentum workload "
            "with unit learning rates (a lower-triangular Toeplitz A); set privacy.workload = 'prefix' or 'momentum'"
        )
    return beta


def square_root_coefficients(n: int, beta: float = 0.0) -> np.ndarray:
    """First ``n`` coefficients of ``A_β^{1/2}``: the series of ``(1 − x)^{−1/2}(1 − βx)^{−1/2}``.

    ``m_k = Σ_{i=0..k} β^i r_i r_{k−i}`` with ``r_k = binom(2k, k)/4^k``; ``β = 0`` gives ``r_k``
    exactly (the ``sqrt`` mechanism's coefficients).

    Parameters
    ----------
    n : int
        Number of coefficients; a positive integer.
    beta : float, default 0.0
        Momentum ``β ∈ [0, 1)``; ``0`` is the prefix sum.

    Returns
    -------
    np.ndarray
        ``m_0 … m_{n−1}`` (float64, all positive, ``m_0 = 1``).
    """
    r = sqrt_toeplitz_coefficients(n)
    if beta == 0.0:
        return r
    return np.asarray(np.convolve(r, r * beta ** np.arange(n, dtype=np.float64))[:n])


def lower_toeplitz(coefficients: np.ndarray, n: int) -> np.ndarray:
    """The ``n × n`` lower-triangular Toeplitz matrix ``C[i, j] = c_{i−j}`` (``0`` past the coefficients).

    Parameters
    ----------
    coefficients : np.ndarray
        ``c_0, c_1, …``; ``C`` has ``len(coefficients)`` bands when that is below ``n`` (extra
        coefficients are ignored).
    n : int
        Rows and columns.

    Returns
    -------
    np.ndarray
        ``C`` (float64).
    """
    from scipy.linalg import toeplitz

    col = np.zeros(n)
    m = min(n, len(coefficients))
    col[:m] = np.asarray(coefficients, dtype=np.float64)[:m]
    return np.asarray(toeplitz(col, np.zeros(n)))


def resolve_bands(bands: int | None, scheme: ParticipationScheme, rounds: int, *, limit_by_min_sep: bool) -> int:
    """The number of bands ``b`` a square-root mechanism uses, checked.

    Parameters
    ----------
    bands : int or None
        ``privacy.bands``; ``None``: ``sampling.min_sep`` (the rounds when the scheme has none),
        at most the rounds.
    scheme : ParticipationScheme
        The run's participation scheme.
    rounds : int
        ``n``.
    limit_by_min_sep : bool
        Refuse ``bands > sampling.min_sep`` under ``min_sep`` (``bsr``, whose exact sensitivity
        needs it).

    Returns
    -------
    int
        ``b``, ``1 ≤ b ≤ n``.
    """
    sep = scheme.min_separation or rounds
    b = bands if bands is not None else min(sep, rounds)
    if not 1 <= b <= rounds:
        raise FedsimError(f"privacy.bands = {b} must be between 1 and the rounds n = {rounds}; lower privacy.bands")
    if limit_by_min_sep and scheme.name == "min_sep" and b > sep:
        raise FedsimError(
            f"privacy.bands = {b} exceeds sampling.min_sep = {sep}: a banded C under min_sep needs at most "
            f"min_sep bands for its sensitivity; lower privacy.bands or raise sampling.min_sep"
        )
    return b


class BSROptions(MFOptions):
    """``privacy.mechanism = "bsr"``.

    Parameters
    ----------
    workload : ``prefix`` (the prefix sums of SGD, default) or ``momentum`` (SGD with the
        server's momentum β, ``server.momentum``; unit learning rates).
    bands : ``b``, the number of bands of ``C`` (default ``sampling.min_sep``, or the rounds when
        the scheme has no separation; at most the rounds; under ``min_sep`` at most
        ``sampling.min_sep``).
    """

    mechanism: Literal["bsr"] = "bsr"
    bands: int | None = Field(default=None, ge=1)


@dataclass(frozen=True, eq=False)
class BSRStrategy(Strategy):
    """The banded square root: lower-triangular Toeplitz ``C`` with ``C[i, j] = m_{i−j}`` for
    ``i − j < b`` and 0 below.

    Parameters
    ----------
    coefficients : ``m_0 … m_{b−1}``, the first ``b`` coefficients of the workload's square root.
    n : the number of rounds.
    info : how it was obtained (``bands``, ``workload_beta``).
    """

    coefficients: np.ndarray
    n: int
    info: dict[str, Any]

    @property
    def rounds(self) -> int:
        return self.n

    @property
    def bands(self) -> int:
        """``b``: the number of bands of ``C``."""
        return min(len(self.coefficients), self.n)

    def materialize(self) -> np.ndarray:
        return lower_toeplitz(self.coefficients, self.n)

    def stream(self, sens: float, name: str) -> NoiseStream:
        return BandedStream(self.materialize(), sens, name=name)


@register
class BSR(Mechanism):
    name = "bsr"
    options = BSROptions
    summary = "banded square root of the workload (closed form, b bands): exact min-sep sensitivity, ring of b − 1 rows"

    def check(self, opts: MechanismOptions, scheme: ParticipationScheme, rounds: int) -> None:
        assert isinstance(opts, BSROptions)
        resolve_bands(opts.bands, scheme, rounds, limit_by_min_sep=True)

    def strategy(self, opts: MechanismOptions, A: np.ndarray, scheme: ParticipationScheme) -> Strategy:
        assert isinstance(opts, BSROptions)
        n = int(A.shape[0])
        b = resolve_bands(opts.bands, scheme, n, limit_by_min_sep=True)
        beta = workload_beta(A)
        return BSRStrategy(square_root_coefficients(b, beta), n, {"bands": b, "workload_beta": beta})
