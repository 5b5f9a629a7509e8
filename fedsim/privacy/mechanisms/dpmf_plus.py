"""``dpmf_plus``: DP-MF+ (Koloskova et al. 2023, "Gradient descent with linearly correlated noise:
theory and applications to differential privacy", section 5) — minimise ``‖Λ_τ·B‖_F`` (the
error of the last iterate) instead of ``‖B‖_F``: solve ``dense`` for ``Λ_τ·A``, keep its ``C``. Like
``dense`` it is solved for the run's participation scheme (``privacy.optimize_for``): single
participation by the fixed point, ``epochs``/``min_sep`` with ``k ≥ 2`` by
:mod:`fedsim.privacy.mechanisms.multi_epoch` on the weighted workload ``Λ_τ·A``.

``tau`` outside ``1..n`` is refused (``τ > n`` would only rescale the objective).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from fedsim.errors import FedsimError
from fedsim.privacy.factorizations import Factorization, cached, check_workload, right_divide_lower
from fedsim.privacy.mechanisms.base import DenseStrategy, Mechanism, MechanismOptions, Strategy
from fedsim.privacy.mechanisms.dense import SOLVER, DenseFamilyOptions, dense
from fedsim.privacy.mechanisms.registry import register
from fedsim.privacy.participation import ParticipationScheme


def lambda_matrix(n: int, tau: int | None = None) -> np.ndarray:
    """DP-MF+'s weighting ``Λ_τ`` (docs/algorithms.md §3; Koloskova et al. 2023, appendix B).

    With 1-indexed ``t``: for ``t mod τ ≠ 0``, ``λ[t,t] = 1/√τ`` and, if ``t > τ``,
    ``λ[t, ⌊t/τ⌋τ] = −1/√τ``; for ``t mod τ = 0``, ``λ[t,t] = 1`` and, if ``t > τ``,
    ``λ[t, t−τ] = −1``. ``Λ_1 = S⁻¹``; ``Λ_n = diag(1/√n, …, 1/√n, 1)``.

    Parameters
    ----------
    n : int
        Number of rounds; a positive integer.
    tau : int or None, optional
        Restart period ``τ`` in ``1..n``. Default ``None`` means ``τ = n``.
    """
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise FedsimError(f"the number of rounds n must be a positive integer, got {n!r}")
    n = int(n)
    tau = n if tau is None else tau
    if isinstance(tau, bool) or int(tau) != tau or not 1 <= int(tau) <= n:
        raise FedsimError(f"DP-MF+ tau must be an integer in 1..n (n={n}), got {tau!r}")
    tau = int(tau)
    lam = np.zeros((n, n))
    w = 1.0 / np.sqrt(tau)
    for t in range(1, n + 1):  # 1-indexed as in the specification
        if t % tau != 0:
            lam[t - 1, t - 1] = w
            if t > tau:
                lam[t - 1, (t // tau) * tau - 1] = -w
        else:
            lam[t - 1, t - 1] = 1.0
            if t > tau:
                lam[t - 1, t - tau - 1] = -1.0
    return lam


def dpmf_plus(
    A: np.ndarray, tau: int | None = None, participation: tuple[str, int, int] | None = None, **dense_kwargs: Any
) -> Factorization:
    """DP-MF+ (Koloskova et al. 2023, section 5): minimise ``‖Λ_τ·B‖_F`` subject to ``B·C = A``.

    Solves :func:`dense` (or, for a multi-participation scheme, the multi-epoch optimum) for the
    workload ``Λ_τ·A``, keeps its ``C`` and sets ``B = A·C⁻¹``. ``τ = 1`` gives ``Λ_1·S = I`` and hence DP-SGD (``C = I``); the default
    ``τ = n`` weights the last release ``n`` times more than the others.

    Parameters
    ----------
    A : np.ndarray
        The ``n×n`` lower-triangular workload.
    tau : int or None, optional
        Restart period ``τ`` in ``1..n``; default ``None`` means ``τ = n``.
    participation : (str, int, int) or None, optional
        ``(scheme, k, b)`` of a multi-participation scheme (``epochs`` or ``min_sep``, see
        :func:`fedsim.privacy.mechanisms.multi_epoch.multi_participation`); default ``None``:
        single participation.
    **dense_kwargs
        Passed to :func:`dense` (``tol``, ``max_iter``, ``device``) or, with ``participation``,
        to :func:`fedsim.privacy.mechanisms.multi_epoch.factorize_for_participation` (uncached).

    Returns
    -------
    Factorization
        ``info`` holds ``dense``'s info for ``Λ_τ·A`` plus ``tau`` and ``objective``
        (``‖Λ_τ·B‖_F²`` at ``sens = 1``).
    """
    A = check_workload(A)
    n = A.shape[0]
    lam = lambda_matrix(n, tau)
    tau = n if tau is None else int(tau)
    if participation is None:
        inner = dense(lam @ A, **dense_kwargs)
    else:
        from fedsim.privacy.mechanisms.multi_epoch import factorize_for_participation

        inner = factorize_for_participation(lam @ A, participation, cache=False, **dense_kwargs)
    C = inner.C
    B = right_divide_lower(A, C)
    info = dict(inner.info)
    info["tau"] = tau
    info["objective"] = float(np.sum((lam @ B) ** 2))
    return Factorization("dpmf_plus", A, C, B, info)


def factorize_dpmf_plus(
    A: np.ndarray,
    tau: int | None = None,
    tol: float = 1e-10,
    max_iter: int = 10_000,
    device: str | None = None,
    cache: bool = True,
    participation: tuple[str, int, int] | None = None,
) -> Factorization:
    """:func:`dpmf_plus`, memoised on disk (key: ``A``, ``n``, ``τ``, ``tol``, ``max_iter`` and the
    solver, or the participation when it is not single).

    Parameters
    ----------
    A : the ``n×n`` lower-triangular workload.
    tau : restart period in ``1..n``; default None = ``n``.
    tol, max_iter, device : as for :func:`fedsim.privacy.mechanisms.dense.dense` (with
        ``participation``, ``tol`` and ``max_iter`` are the multi-epoch solver's own defaults).
    cache : read and write the on-disk cache (default True).
    participation : ``(scheme, k, b)`` of a multi-participation scheme; default None = single.
    """
    A = check_workload(A)
    n = A.shape[0]
    lambda_matrix(n, tau)  # validate tau before any work
    t = n if tau is None else int(tau)

    def compute() -> Factorization:
        if participation is not None:
            return dpmf_plus(A, tau=t, participation=participation, device=device)
        return dpmf_plus(A, tau=t, tol=tol, max_iter=max_iter, device=device)

    if not cache:
        return compute()
    if participation is not None:
        name, k, b = participation
        if name == "min_sep":  # the banded optimiser's evaluator changed in issue 46
            from fedsim.privacy.mechanisms.banded import EVALUATOR

            return cached(f"dpmf_plus_{name}", compute, A=A, n=n, tau=t, scheme=name, k=k, b=b, evaluator=EVALUATOR)
        return cached(f"dpmf_plus_{name}", compute, A=A, n=n, tau=t, scheme=name, k=k, b=b)
    return cached("dpmf_plus", compute, A=A, n=n, tau=t, tol=float(tol), max_iter=max_iter, solver=SOLVER)


class DPMFPlusOptions(DenseFamilyOptions):
    """``privacy.mechanism = "dpmf_plus"``.

    Parameters
    ----------
    tau : τ, the restart period of ``Λ_τ`` (default: ``rounds``).
    factorize_device, optimize_for : as for ``dense`` (:class:`DenseFamilyOptions`).
    """

    mechanism: Literal["dpmf_plus"] = "dpmf_plus"
    tau: int | None = Field(default=None, ge=1, description="τ, the restart period (default n)")


@register
class DPMFPlus(Mechanism):
    name = "dpmf_plus"
    options = DPMFPlusOptions
    summary = "DP-MF+: dense for Λ_τ·A (for the scheme, like dense), optimising the last iterate's error"

    def strategy(self, opts: MechanismOptions, A: np.ndarray, scheme: ParticipationScheme) -> Strategy:
        assert isinstance(opts, DPMFPlusOptions)
        participation = opts.participation(scheme, A.shape[0])
        return DenseStrategy.of(
            factorize_dpmf_plus(A, tau=opts.tau, device=opts.checked_device(), participation=participation)
        )
