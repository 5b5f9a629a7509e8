"""``dense``: the optimal factorization for ``‖B‖_F`` under the run's participation scheme.

Single participation (and any scheme in which a user takes part at most once in the run): Denisov
et al. 2022, "Improved differential privacy for SGD via optimal private linear operators on adaptive
streams", by the fixed-point iteration of docs/algorithms.md §3 (this module). ``epochs`` and
``min_sep`` with ``k ≥ 2`` participations: the multi-epoch optimum of
:mod:`fedsim.privacy.mechanisms.multi_epoch`, unless ``privacy.optimize_for = "single"`` keeps the
single-participation solve. Under ``min_sep`` the multi-participation optimum is
the optimal ``b``-banded ``C``. The sensitivity of the returned ``C`` is computed afterwards for the
scheme either way (:meth:`~fedsim.privacy.mechanisms.base.Strategy.sensitivity`).

Decisions where the specification is silent: the iteration starts at `v = 1` and is
Anderson-accelerated in `log v` (`_anderson_fixed_point`; issue 46: about 5 times fewer
eigendecompositions than the plain iteration, e.g. 35 against 193 at `n = 256`), stops when the
largest relative change `|G(v) − v| / v` of the plain step at the current point is below `tol`
(the plain iteration's rule), and then rescales `X` to an exact unit diagonal (so every column
of `C` has norm 1 and `sens = 1` under single participation). The
gap it reports is the Lagrangian duality gap of ``min tr(W X⁻¹) s.t. diag X ≤ 1``: dual value
``2·tr((V^{1/2} W V^{1/2})^{1/2}) − Σ v`` (a lower bound for every ``v > 0``) against the primal
``‖A·C⁻¹‖_F²`` of the returned ``C``. Results are cached on disk
(:func:`fedsim.privacy.factorizations.cached`), keyed by every input.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from pydantic import Field

from fedsim.errors import FedsimError
from fedsim.privacy.factorizations import Factorization, cached, check_workload, right_divide_lower
from fedsim.privacy.mechanisms.base import DenseStrategy, Mechanism, MechanismOptions, MFOptions, Strategy
from fedsim.privacy.mechanisms.linalg import lower_factor, torch_device
from fedsim.privacy.mechanisms.registry import register
from fedsim.privacy.participation import ParticipationScheme

#: Anderson acceleration of the fixed point: how many past steps each extrapolation mixes.
ANDERSON_MEMORY = 10
#: An extrapolated point whose residual is more than this many times the previous one is
#: rejected: the plain step from the previous point is taken instead and the history cleared.
ANDERSON_GUARD = 2.0
#: The single-participation solver; part of the cache key of `dense` and `dpmf_plus`, so that
#: a solution cached by another solver (the plain iteration before issue 46) is recomputed.
SOLVER = "anderson-fixed-point"


def _sqrt_psd(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of symmetric PSD ``M``: returns ``(√eigenvalues, eigenvectors)``."""
    e, U = np.linalg.eigh(M)
    return np.sqrt(np.clip(e, 0.0, None)), U


def _anderson_fixed_point(
    step: Callable[[np.ndarray], tuple[np.ndarray, Any]], n: int, tol: float, max_iter: int
) -> tuple[np.ndarray, Any, int, float, bool]:
    """The fixed point `v = G(v)` of the dual multipliers, Anderson-accelerated in `log v`.

    `step(v)` returns `(G(v), aux)` (`aux`: the eigendecomposition at `v`). Each iteration
    evaluates `G` once at the current point `v`; it stops when
    `max_i |G(v)_i − v_i| / |v_i| < tol` (the plain iteration's rule, at the point where `G`
    was evaluated). The next point mixes the last `ANDERSON_MEMORY + 1` steps: with
    `x = log v`, `f = log G(v) − x` and the differences `ΔX`, `ΔF` of past `x` and `f`,
    `x ← x + f − (ΔX + ΔF)·γ`, `γ = argmin ‖f − ΔF·γ‖₂` (type-II Anderson acceleration,
    which converges like a quasi-Newton method where the plain step `x ← x + f` converges only
    linearly). Safeguard: a point whose largest `|f|` exceeds `ANDERSON_GUARD` times the
    previous point's is dropped for the plain step `G` of the previous point, and the history
    is cleared.

    Returns `(v, aux, iterations, change, converged)`: `v` the last point at which `G`
    was evaluated, `aux` its eigendecomposition, `change` its relative step.
    """
    v = np.ones(n)
    xs: list[np.ndarray] = []
    fs: list[np.ndarray] = []
    previous: tuple[float, np.ndarray] | None = None  # (largest |f|, G) at the last accepted point
    at, aux, change, converged, iterations = v, None, float("inf"), False, 0
    for iterations in range(1, max_iter + 1):  # noqa: B007 - read after the loop
        at = v
        g, aux = step(at)
        _check_multipliers(g)
        change = float(np.max(np.abs(g - at) / np.abs(at)))
        if change < tol:
            converged = True
            break
        x = np.log(at)
        f = np.log(g) - x
        residual = float(np.max(np.abs(f)))
        if previous is not None and residual > ANDERSON_GUARD * previous[0]:
            v = previous[1]
            xs.clear()
            fs.clear()
            previous = None
            continue
        previous = (residual, g)
        xs.append(x)
        fs.append(f)
        del xs[: -(ANDERSON_MEMORY + 1)], fs[: -(ANDERSON_MEMORY + 1)]
        if len(xs) < 2:
            v = g
            continue
        dF = np.diff(np.array(fs), axis=0).T
        dX = np.diff(np.array(xs), axis=0).T
        gamma = np.linalg.lstsq(dF, f, rcond=None)[0]
        nxt = np.exp(x + f - (dX + dF) @ gamma)
        v = nxt if np.all(np.isfinite(nxt)) and np.all(nxt > 0) else g
    return at, aux, iterations, change, converged


def _dense_iterate_numpy(W: np.ndarray, tol: float, max_iter: int) -> tuple[Any, Any, Any, int, float, bool]:
    """The fixed point of `dense` in numpy; returns `(v, √e, X, iterations, change, converged)`."""

    def step(v: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        s = np.sqrt(v)
        root_e, U = _sqrt_psd(s[:, None] * W * s[None, :])
        return (U * U) @ root_e, (root_e, U)  # diag(U diag(√e) Uᵀ)

    v, (root_e, U), iterations, change, converged = _anderson_fixed_point(step, W.shape[0], tol, max_iter)
    s = np.sqrt(v)
    X = (U * root_e) @ U.T / np.outer(s, s)
    return v, root_e, X, iterations, change, converged


def _dense_iterate_torch(
    W: np.ndarray, tol: float, max_iter: int, device: str
) -> tuple[Any, Any, Any, int, float, bool]:
    """The same fixed point with the eigendecompositions in torch float64 on `device` (the GPU
    path); same returns."""
    import torch

    dev = torch_device(device)
    Wt = torch.as_tensor(W, dtype=torch.float64, device=dev)

    def step(v: np.ndarray) -> tuple[np.ndarray, tuple[Any, Any]]:
        s = torch.as_tensor(v, dtype=torch.float64, device=dev).sqrt()
        e, U = torch.linalg.eigh(s[:, None] * Wt * s[None, :])
        root_e = e.clamp_min(0.0).sqrt()
        return ((U * U) @ root_e).cpu().numpy(), (root_e, U)

    v, (root_e, U), iterations, change, converged = _anderson_fixed_point(step, W.shape[0], tol, max_iter)
    s = torch.as_tensor(v, dtype=torch.float64, device=dev).sqrt()
    X = (U * root_e) @ U.T / torch.outer(s, s)
    return v, root_e.cpu().numpy(), X.cpu().numpy(), iterations, change, converged


def _check_multipliers(v: np.ndarray) -> None:
    if not np.all(v > 0):
        raise FedsimError(
            "the dense factorization broke down (non-positive multipliers); the workload "
            "is too ill-conditioned: use fewer rounds or a better-conditioned schedule"
        )


def dense(A: np.ndarray, tol: float = 1e-10, max_iter: int = 10_000, device: str | None = None) -> Factorization:
    """Optimal factorization for ``‖B‖_F`` under single participation (Denisov et al. 2022).

    Minimises ``tr(W X⁻¹)`` over ``X = CᵀC`` with ``diag X = 1``, ``W = AᵀA``, by the
    fixed point `v = diag((V^{1/2} W V^{1/2})^{1/2})`, `V = diag(v)`, from `v = 1`, with
    Anderson acceleration (one eigendecomposition per iteration). Then
    `X = V^{−1/2}(V^{1/2} W V^{1/2})^{1/2}V^{−1/2}` (rescaled to an exact unit diagonal), ``C = J·Lᵀ·J`` with ``L = chol(J·X·J)``, and ``B = A·C⁻¹``.
    ``O(n³)`` per iteration; :func:`factorize_dense` caches the result on disk.

    Parameters
    ----------
    A : np.ndarray
        The ``n×n`` lower-triangular workload.
    tol : float, optional
        Stop when `max_i |G(v)_i − v_i| / |v_i| < tol` at the current `v`, `G` the plain
        fixed-point step. Default `1e-10`.
    max_iter : int, optional
        Cap on the iterations, i.e. on the eigendecompositions (default 10 000); reaching it
        warns and sets `converged=False`.
    device : str or None, optional
        ``None`` (default): the iteration runs in numpy on the CPU. A torch device string
        (``"cuda"``, ``"cuda:1"``, ``"cpu"``): the iteration and the final eigen-decomposition
        run in torch float64 on that device (the GPU path for large ``n``: each iteration
        is one ``n×n`` symmetric eigen-decomposition, ``O(n³)``); the Cholesky factor and
        ``B`` are then formed in numpy. Both paths stop at the same ``tol``.

    Returns
    -------
    Factorization
        ``C`` lower-triangular with unit-norm columns (``sens = 1``). ``info`` holds
        ``iterations``, ``seconds``, ``converged``, ``tolerance``, ``max_iter``,
        `max_rel_change` (last step), `solver`, `primal` (`‖B‖_F²`), `dual` (Lagrangian
        lower bound) and ``rel_gap`` (``(primal − dual)/primal``).
    """
    A = check_workload(A)
    tol = float(tol)
    if not np.isfinite(tol) or tol <= 0:
        raise FedsimError(f"tol must be a positive number (e.g. 1e-10), got {tol}")
    if isinstance(max_iter, bool) or int(max_iter) != max_iter or max_iter < 1:
        raise FedsimError(f"max_iter must be a positive integer, got {max_iter!r}")
    start = time.perf_counter()
    W = A.T @ A
    W = 0.5 * (W + W.T)
    if device is None:
        v, root_e, X, iterations, change, converged = _dense_iterate_numpy(W, tol, int(max_iter))
    else:
        v, root_e, X, iterations, change, converged = _dense_iterate_torch(W, tol, int(max_iter), device)
    d = np.sqrt(np.diag(X))
    X = X / np.outer(d, d)
    C = lower_factor(X)
    B = right_divide_lower(A, C)
    primal = float(np.sum(B * B))
    dual = float(2.0 * np.sum(root_e) - np.sum(v))
    seconds = time.perf_counter() - start
    if not converged:
        warnings.warn(
            f"dense factorization did not reach tol={tol:g} in {max_iter} iterations "
            f"(last relative change {change:.3g}); raise max_iter or tol",
            RuntimeWarning,
            stacklevel=2,
        )
    info = {
        "iterations": int(iterations),
        "seconds": float(seconds),
        "converged": bool(converged),
        "tolerance": tol,
        "max_iter": int(max_iter),
        "max_rel_change": change,
        "device": "numpy" if device is None else str(device),
        "solver": SOLVER,
        "primal": primal,
        "dual": dual,
        "rel_gap": (primal - dual) / primal,
    }
    return Factorization("dense", A, C, B, info)


def factorize_dense(
    A: np.ndarray, tol: float = 1e-10, max_iter: int = 10_000, device: str | None = None, cache: bool = True
) -> Factorization:
    """`dense`, memoised on disk (key: `A`, `n`, `tol`, `max_iter` and `SOLVER`;
    not the device — both paths solve the same problem to the same `tol`).

    Parameters
    ----------
    A, tol, max_iter, device : as for :func:`dense`.
    cache : read and write the on-disk cache (default True).
    """
    A = check_workload(A)

    def compute() -> Factorization:
        return dense(A, tol=tol, max_iter=max_iter, device=device)

    if not cache:
        return compute()
    return cached("dense", compute, A=A, n=A.shape[0], tol=float(tol), max_iter=max_iter, solver=SOLVER)


class DenseFamilyOptions(MFOptions):
    """Options shared by ``dense`` and ``dpmf_plus``.

    Parameters
    ----------
    factorize_device : torch device that runs the optimiser (``"cuda"``: the GPU path for long
        runs, e.g. ``n = 2048``); default unset = numpy on the CPU (the multi-participation solve:
        torch on the CPU). The result is cached on disk either way.
    optimize_for : the participation the strategy is optimised for. ``scheme`` (default): the run's
        scheme — under ``epochs`` with ``k ≥ 2`` participations the multi-epoch optimum, under
        ``min_sep`` with ``k ≥ 2`` the optimal ``b``-banded ``C`` (docs/algorithms.md §3,
        :mod:`fedsim.privacy.mechanisms.multi_epoch`), otherwise (single participation, amplified
        MF) the single-participation optimum. ``single``:
        always the single-participation optimum (fedsim before issue 38). Either way the
        sensitivity is computed exactly for the scheme afterwards, so only the error changes.
    """

    factorize_device: str | None = Field(
        default=None,
        description="torch device of the optimiser (cuda = the GPU path); default numpy on the CPU",
        json_schema_extra={"cli_aliases": ["--device"]},
    )
    optimize_for: Literal["scheme", "single"] = Field(
        default="scheme",
        description="scheme (multi-epoch optimum under epochs, optimal banded C under min_sep) or single",
    )

    def checked_device(self) -> str | None:
        """``factorize_device``, checked before any result is read from the cache: an unknown
        device or ``cuda`` without a GPU is an error whether or not the solve is cached."""
        if self.factorize_device is not None:
            torch_device(self.factorize_device)
        return self.factorize_device

    def participation(self, scheme: ParticipationScheme, n: int) -> tuple[str, int, int] | None:
        """``(scheme, k, b)`` to optimise for, or None for the single-participation solve."""
        from fedsim.privacy.mechanisms.multi_epoch import multi_participation

        return multi_participation(scheme, n) if self.optimize_for == "scheme" else None


class DenseOptions(DenseFamilyOptions):
    """``privacy.mechanism = "dense"`` (its keys: :class:`DenseFamilyOptions`)."""

    mechanism: Literal["dense"] = "dense"


@register
class Dense(Mechanism):
    name = "dense"
    options = DenseOptions
    summary = "optimal C for ‖B‖_F under the scheme (single: fixed point; epochs: multi-epoch dual; min_sep: banded)"

    def strategy(self, opts: MechanismOptions, A: np.ndarray, scheme: ParticipationScheme) -> Strategy:
        assert isinstance(opts, DenseOptions)
        participation = opts.participation(scheme, A.shape[0])
        if participation is None:
            return DenseStrategy.of(factorize_dense(A, device=opts.checked_device()))
        from fedsim.privacy.mechanisms.multi_epoch import factorize_for_participation

        return DenseStrategy.of(factorize_for_participation(A, participation, device=opts.checked_device()))
