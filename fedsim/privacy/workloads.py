"""Workload matrices ``A`` for matrix-factorization noise (docs/algorithms.md §3).

A workload says what the server optimizer does with the stream of noisy
pseudo-gradients ``ĝ_0..ĝ_{n-1}``: row ``t`` of ``A·G`` is the (negated) model
displacement after round ``t``. Every workload here is ``n×n``, lower-triangular,
float64 and invertible (positive diagonal).

- ``prefix``: ``S``, the all-ones lower triangle — plain SGD with unit step.
- ``momentum``: heavy-ball momentum ``m_s = β·m_{s−1} + g_s``, ``x_{s+1} = x_s − η_s·m_s``,
  so ``A[t, j] = Σ_{s=j..t} η_s β^{s−j}`` for ``j ≤ t`` and 0 above the diagonal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsim.errors import FedsimError

WORKLOADS = ("prefix", "momentum")


def _check_rounds(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or int(n) < 1:
        raise FedsimError(f"the number of rounds n must be a positive integer, got {n!r}")
    return int(n)


def prefix_sum(n: int) -> np.ndarray:
    """The prefix-sum workload ``S`` (plain SGD).

    Parameters
    ----------
    n : int
        Number of rounds (rows and columns of ``S``); a positive integer.

    Returns
    -------
    np.ndarray
        ``n×n`` float64 matrix with ones on and below the diagonal, zeros above.
    """
    n = _check_rounds(n)
    return np.tril(np.ones((n, n), dtype=np.float64))


def momentum(
    n: int,
    beta: float,
    learning_rates: Sequence[float] | np.ndarray | None = None,
) -> np.ndarray:
    """The momentum-SGD workload with optional per-round learning rates.

    ``A[t, j] = Σ_{s=j..t} η_s β^{s−j}`` for ``j ≤ t`` (0 above the diagonal), the map from
    gradients ``g_j`` to the displacement ``x_0 − x_{t+1}`` of heavy-ball momentum
    ``m_s = β m_{s−1} + g_s``, ``x_{s+1} = x_s − η_s m_s``.

    Parameters
    ----------
    n : int
        Number of rounds; a positive integer.
    beta : float
        Momentum coefficient ``β``, in ``[0, 1)``. ``β = 0`` with unit learning rates is
        :func:`prefix_sum`.
    learning_rates : sequence of float or None, optional
        ``η_0..η_{n−1}``, one positive finite learning rate per round. Default ``None``
        means every ``η_s = 1``.

    Returns
    -------
    np.ndarray
        ``n×n`` float64 lower-triangular matrix with diagonal ``η``.
    """
    n = _check_rounds(n)
    beta = float(beta)
    if not np.isfinite(beta) or not 0.0 <= beta < 1.0:
        raise FedsimError(f"momentum beta must be in [0, 1), got {beta}; pick e.g. beta=0.9")
    if learning_rates is None:
        eta = np.ones(n, dtype=np.float64)
    else:
        eta = np.asarray(learning_rates, dtype=np.float64).reshape(-1)
        if eta.shape != (n,):
            raise FedsimError(f"learning_rates must have one entry per round (n={n}), got {eta.size}")
        if not np.all(np.isfinite(eta)) or np.any(eta <= 0):
            raise FedsimError(
                "learning_rates must all be positive and finite (a zero rate makes the "
                "workload singular); fix the schedule"
            )
    lag = np.subtract.outer(np.arange(n), np.arange(n))  # s - j
    # P[s, j] = η_s β^{s−j} for s ≥ j; beta**0 == 1 also for beta == 0.
    decay = np.where(lag >= 0, np.power(beta, np.maximum(lag, 0).astype(np.float64)), 0.0)
    per_step = eta[:, None] * decay
    return np.cumsum(per_step, axis=0)  # A[t, j] = Σ_{s ≤ t} P[s, j]


def make_workload(
    name: str,
    n: int,
    beta: float = 0.9,
    learning_rates: Sequence[float] | np.ndarray | None = None,
) -> np.ndarray:
    """Build a workload matrix by name.

    Parameters
    ----------
    name : {"prefix", "momentum"}
        ``"prefix"`` is :func:`prefix_sum`; ``"momentum"`` is :func:`momentum`.
    n : int
        Number of rounds; a positive integer.
    beta : float, optional
        Momentum coefficient for ``"momentum"`` (default 0.9); ignored by ``"prefix"``.
    learning_rates : sequence of float or None, optional
        Per-round learning rates for ``"momentum"`` (default ``None`` = all ones).
        Not accepted with ``"prefix"``: use ``"momentum"`` with ``beta=0`` instead.

    Returns
    -------
    np.ndarray
        The ``n×n`` float64 workload.
    """
    if name == "prefix":
        if learning_rates is not None:
            raise FedsimError(
                "the 'prefix' workload has unit learning rates; for a learning-rate "
                "schedule use workload 'momentum' with beta=0"
            )
        return prefix_sum(n)
    if name == "momentum":
        return momentum(n, beta, learning_rates)
    raise FedsimError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
