"""``sqrt``: the square-root factorization, Toeplitz ``C = S^{1/2}`` with coefficients
``r_k = binom(2k, k)/4^k`` — closed form and near-optimal for the prefix sum."""

from __future__ import annotations

from typing import Literal

import numpy as np
import scipy.linalg

from fedsim.errors import FedsimError
from fedsim.privacy.factorizations import Factorization, check_workload, right_divide_lower
from fedsim.privacy.mechanisms.base import DenseStrategy, Mechanism, MechanismOptions, MFOptions, Strategy
from fedsim.privacy.mechanisms.registry import register
from fedsim.privacy.participation import ParticipationScheme


def sqrt_toeplitz_coefficients(n: int) -> np.ndarray:
    """``r_k = binom(2k, k) / 4^k`` for ``k = 0..n−1``: the Taylor coefficients of ``(1−x)^{−1/2}``.

    Computed by the recurrence ``r_0 = 1``, ``r_k = r_{k−1}·(2k−1)/(2k)`` (no overflow).

    Parameters
    ----------
    n : int
        Number of coefficients; a positive integer.
    """
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise FedsimError(f"the number of rounds n must be a positive integer, got {n!r}")
    k = np.arange(1, int(n), dtype=np.float64)
    return np.concatenate(([1.0], np.cumprod((2.0 * k - 1.0) / (2.0 * k))))


def sqrt_toeplitz(A: np.ndarray) -> Factorization:
    """Square-root factorization: Toeplitz ``C = S^{1/2}``, ``B = A·C⁻¹``.

    ``C[i, j] = r_{i−j}`` for ``i ≥ j`` with ``r_k = binom(2k, k)/4^k``; ``C·C = S`` exactly
    (in exact arithmetic), so for ``A = S`` also ``B = C``. Near-optimal for the prefix
    sum without any optimisation.

    Parameters
    ----------
    A : np.ndarray
        The ``n×n`` lower-triangular workload.
    """
    A = check_workload(A)
    n = A.shape[0]
    r = sqrt_toeplitz_coefficients(n)
    C = scipy.linalg.toeplitz(r, np.zeros(n))
    return Factorization("sqrt", A, C, right_divide_lower(A, C), {})


class SqrtOptions(MFOptions):
    """``privacy.mechanism = "sqrt"``: only the shared ``workload``."""

    mechanism: Literal["sqrt"] = "sqrt"


@register
class Sqrt(Mechanism):
    name = "sqrt"
    options = SqrtOptions
    summary = "Toeplitz C = S^(1/2): closed form, near-optimal for the prefix sum"

    def strategy(self, opts: MechanismOptions, A: np.ndarray, scheme: ParticipationScheme) -> Strategy:
        return DenseStrategy.of(sqrt_toeplitz(A))
