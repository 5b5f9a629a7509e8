"""Matrix factorizations ``A = B·C`` for correlated (MF-DP-FTRL) noise.

docs/algorithms.md §3 is the specification. A workload ``A`` (``n×n``,
lower-triangular, see :mod:`fedsim.privacy.workloads`) is factorized into a strategy
(encoder) ``C`` and a decoder ``B`` with ``B·C = A``. The server adds
``c · z · sens(C) · n_t`` to round ``t``'s summed update, where ``n_t`` is row ``t`` of
``A⁻¹·B·Z`` (:meth:`Factorization.noising_matrix`; this is ``C⁻¹·Z`` when ``C`` is
square) and ``Z`` holds i.i.d. standard normals. Everything here is float64
numpy/scipy; nothing touches torch.

Families (all satisfy ``B·C = A`` to ~1e-12 relative; tests demand 1e-8):

- :func:`identity` — ``C = I``: DP-SGD without amplification.
- :func:`tree` — binary-tree aggregation, ``C = H`` of shape ``(2n−1)×n``, with the
  ``online`` (dyadic decomposition) or ``full`` (least squares, ``B = S·H⁺``) estimator.
- :func:`sqrt_toeplitz` — ``C = S^{1/2}``, Toeplitz with ``r_k = binom(2k, k)/4^k``.
- :func:`dense` — the optimum of ``‖B‖_F`` under single participation (Denisov et al.
  2022) by the fixed-point iteration of docs/algorithms.md.
- :func:`dpmf_plus` — DP-MF+ (Koloskova et al. 2023, section 5): ``dense`` for ``Λ_τ·A``,
  then ``B = A·C⁻¹``.

Decisions where the specification is silent (recorded here as it asks):

- Tree nodes are ordered by completion time: node ``[a, b]`` (leaves ``a..b``) comes after
  every node that ends before ``b``, and nodes ending at ``b`` go from the leaf upwards
  (see :func:`tree_nodes`). The ``online`` decoder of round ``t`` then reads only nodes
  that are complete by round ``t``.
- The ``full`` estimator ``B = S·H⁺`` reads nodes that end after ``t`` (it is the offline
  least-squares estimate). This is still private: the per-round noise ``n = S⁻¹·B·Z =
  H⁺·Z`` is drawn in advance, independently of the data, and is distributed as
  ``N(0, (HᵀH)⁻¹)``, i.e. exactly as ``C̃⁻¹·Z`` for the lower-triangular ``C̃`` with
  ``C̃ᵀC̃ = HᵀH``, whose column norms equal ``H``'s. Its privacy is that of ``C̃`` under
  adaptive streams.
- ``dense`` starts the iteration at ``v = 1``, stops when the largest relative change of
  ``v`` is below ``tol``, and then rescales ``X`` to an exact unit diagonal (so every
  column of ``C`` has norm 1 and ``sens = 1`` under single participation). The gap it
  reports is the Lagrangian duality gap of ``min tr(W X⁻¹) s.t. diag X ≤ 1``:
  dual value ``2·tr((V^{1/2} W V^{1/2})^{1/2}) − Σ v`` (a lower bound for every ``v > 0``)
  against the primal ``‖A·C⁻¹‖_F²`` of the returned ``C``.
- ``tau`` outside ``1..n`` is refused (``τ > n`` would only rescale the objective).
- The on-disk cache stores only the iterative families (``dense``, ``dpmf_plus``); the
  closed forms are cheaper to rebuild than to read.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg

from fedsim.errors import FedsimError
from fedsim.privacy.workloads import prefix_sum

__all__ = [
    "CODE_VERSION",
    "MECHANISMS",
    "Factorization",
    "cache_dir",
    "cache_key",
    "cached",
    "dense",
    "dpmf_plus",
    "identity",
    "lambda_matrix",
    "make_factorization",
    "sqrt_toeplitz",
    "sqrt_toeplitz_coefficients",
    "tree",
    "tree_nodes",
]

#: Bump when any construction below changes its output: it is part of every cache key.
CODE_VERSION = "1"

MECHANISMS = ("identity", "tree", "sqrt", "dense", "dpmf_plus")
TREE_ESTIMATORS = ("online", "full")
_CACHED_MECHANISMS = ("dense", "dpmf_plus")

#: Counters of the on-disk cache in this process (``hits``, ``misses``, ``writes``).
CACHE_STATS: dict[str, int] = {"hits": 0, "misses": 0, "writes": 0}


# --------------------------------------------------------------------------- result type


@dataclass(eq=False)
class Factorization:
    """A factorization ``A = B·C`` and how it was obtained.

    Parameters
    ----------
    name : str
        Mechanism that produced it (``"identity"``, ``"tree"``, ``"sqrt"``, ``"dense"``,
        ``"dpmf_plus"``).
    A : np.ndarray
        The ``n×n`` workload.
    C : np.ndarray
        The ``m×n`` strategy (encoder); ``m = n`` except for ``tree`` (``m = 2n − 1``).
    B : np.ndarray
        The ``n×m`` decoder, with ``B·C = A``.
    info : dict
        Construction details, JSON-serialisable (e.g. ``iterations``, ``seconds``,
        ``converged``, ``tolerance``, ``estimator``, ``tau``, ``cache``). Default empty.
    """

    name: str
    A: np.ndarray
    C: np.ndarray
    B: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Number of rounds (rows of ``A``)."""
        return int(self.A.shape[0])

    def column_norms(self) -> np.ndarray:
        """L2 norms of the columns of ``C`` (length ``n``)."""
        return np.asarray(np.linalg.norm(self.C, axis=0))

    def sensitivity(self) -> float:
        """Single-participation sensitivity ``max_j ‖C[:, j]‖``."""
        return float(np.max(self.column_norms()))

    def noising_matrix(self) -> np.ndarray:
        """``A⁻¹·B`` (``n×m``): the per-round noise is ``n_t = (A⁻¹·B·Z)_t``, ``Z`` ``m×d``.

        Equals ``C⁻¹`` when ``C`` is square. With it, running the unchanged optimizer on
        ``ĝ_t = g_t + n_t`` releases ``A·G + B·Z``.
        """
        if np.array_equal(self.A, np.tril(self.A)):
            return np.asarray(scipy.linalg.solve_triangular(self.A, self.B, lower=True))
        return np.linalg.solve(self.A, self.B)

    def _sens2(self, sens: float | None) -> float:
        s = self.sensitivity() if sens is None else float(sens)
        return s * s

    def loss(self, sens: float | None = None) -> float:
        """Total squared error of all releases, ``sens² · ‖B‖_F²``, in units of ``(c·z)²``.

        Parameters
        ----------
        sens : float or None, optional
            Sensitivity of ``C`` under the run's participation scheme. Default ``None``
            uses the single-participation sensitivity :meth:`sensitivity`.
        """
        return self._sens2(sens) * float(np.sum(self.B * self.B))

    def max_error(self, sens: float | None = None) -> float:
        """Worst single-release squared error, ``sens² · max_t ‖B[t, :]‖²``.

        Parameters
        ----------
        sens : float or None, optional
            Sensitivity of ``C``; default ``None`` = single participation.
        """
        return self._sens2(sens) * float(np.max(np.sum(self.B * self.B, axis=1)))

    def final_error(self, sens: float | None = None) -> float:
        """Squared error of the last release, ``sens² · ‖B[n−1, :]‖²`` (DP-MF+'s target).

        Parameters
        ----------
        sens : float or None, optional
            Sensitivity of ``C``; default ``None`` = single participation.
        """
        return self._sens2(sens) * float(np.sum(self.B[-1] * self.B[-1]))

    def residual(self) -> float:
        """Relative reconstruction error ``‖B·C − A‖_F / ‖A‖_F``."""
        return float(np.linalg.norm(self.B @ self.C - self.A) / np.linalg.norm(self.A))


# --------------------------------------------------------------------------- helpers


def _check_workload(A: np.ndarray) -> np.ndarray:
    """Validate a workload: square, finite, lower-triangular, invertible. Returns float64."""
    try:
        arr = np.asarray(A, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise FedsimError(
            f"the workload A must be a numeric n×n matrix ({exc}); build it with fedsim.privacy.workloads.make_workload"
        ) from exc
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] < 1:
        raise FedsimError(f"the workload A must be a non-empty square n×n matrix, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise FedsimError("the workload A contains NaN or infinite entries; fix its parameters")
    if np.any(np.triu(arr, 1) != 0.0):
        raise FedsimError(
            "the workload A must be lower-triangular (round t may only use gradients of "
            "rounds ≤ t); build it with fedsim.privacy.workloads.make_workload"
        )
    if np.any(np.diag(arr) == 0.0):
        raise FedsimError(
            "the workload A is singular (a zero on its diagonal, e.g. a zero learning "
            "rate); give every round a non-zero learning rate"
        )
    return arr


def _right_divide_lower(A: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``A·C⁻¹`` for lower-triangular ``C`` by a triangular solve (``Cᵀ·Bᵀ = Aᵀ``)."""
    return np.asarray(scipy.linalg.solve_triangular(C, A.T, trans="T", lower=True).T)


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


# --------------------------------------------------------------------------- closed forms


def identity(A: np.ndarray) -> Factorization:
    """DP-SGD without amplification: ``C = I``, ``B = A``.

    Parameters
    ----------
    A : np.ndarray
        The ``n×n`` lower-triangular workload.

    Returns
    -------
    Factorization
        With ``loss = ‖A‖_F²`` (``n(n+1)/2`` for the prefix sum).
    """
    A = _check_workload(A)
    n = A.shape[0]
    return Factorization("identity", A, np.eye(n), A.copy(), {})


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
    A = _check_workload(A)
    n = A.shape[0]
    r = sqrt_toeplitz_coefficients(n)
    C = scipy.linalg.toeplitz(r, np.zeros(n))
    return Factorization("sqrt", A, C, _right_divide_lower(A, C), {})


def tree_nodes(n: int) -> list[tuple[int, int]]:
    """Nodes of the complete binary tree over ``n`` leaves, as inclusive leaf ranges.

    Ordered by completion time: by last leaf, then from the leaf upwards, so row ``i`` of
    :func:`tree`'s ``H`` is available once round ``nodes[i][1]`` has finished.

    Parameters
    ----------
    n : int
        Number of leaves (rounds); a power of two.

    Returns
    -------
    list of (int, int)
        ``2n − 1`` pairs ``(first_leaf, last_leaf)``.
    """
    if isinstance(n, bool) or int(n) != n or not _is_power_of_two(int(n)):
        raise FedsimError(
            f"binary-tree aggregation needs the number of rounds n to be a power of two, "
            f"got n={n!r}; change the number of rounds (e.g. to a power of two) or use "
            f"mechanism 'sqrt' or 'dense'"
        )
    n = int(n)
    nodes: list[tuple[int, int]] = []
    for end in range(n):
        size = 1
        while size <= n and (end + 1) % size == 0:
            nodes.append((end - size + 1, end))
            size *= 2
    return nodes


def tree(n: int, estimator: str = "online", A: np.ndarray | None = None) -> Factorization:
    """Binary-tree aggregation (Honaker 2015; Kairouz et al. 2021) for the prefix sum.

    ``C = H`` is the ``(2n−1)×n`` node-incidence matrix: each node is the sum of its
    leaves (row order of :func:`tree_nodes`). Every leaf lies in ``log₂ n + 1`` nodes, so
    the single-participation sensitivity is ``√(log₂ n + 1)``.

    Parameters
    ----------
    n : int
        Number of rounds; a power of two.
    estimator : {"online", "full"}, optional
        ``"online"`` (default): prefix sum ``t`` is the sum of the dyadic nodes that tile
        ``[0, t]`` (rows of ``B`` are 0/1, at most ``log₂ n + 1`` ones, causal).
        ``"full"``: the least-squares estimator ``B = S·H⁺`` (smallest error per release).
    A : np.ndarray or None, optional
        The workload; default ``None`` means the prefix sum. Only the prefix sum is
        supported: any other matrix is refused.
    """
    nodes = tree_nodes(n)
    n = int(n)
    if estimator not in TREE_ESTIMATORS:
        raise FedsimError(f"unknown tree estimator {estimator!r}; choose one of {', '.join(TREE_ESTIMATORS)}")
    S = prefix_sum(n)
    if A is not None:
        A = np.asarray(A, dtype=np.float64)
        if A.shape != (n, n) or not np.array_equal(A, S):
            raise FedsimError(
                "mechanism 'tree' only supports the prefix-sum workload (plain SGD); use "
                "workload 'prefix', or a mechanism such as 'dense' or 'sqrt' for momentum "
                "and learning-rate schedules"
            )
    m = len(nodes)
    H = np.zeros((m, n))
    index = {}
    for i, (a, b) in enumerate(nodes):
        H[i, a : b + 1] = 1.0
        index[(a, b)] = i
    if estimator == "online":
        B = np.zeros((n, m))
        for t in range(n):
            length, start = t + 1, 0
            for k in range(n.bit_length() - 1, -1, -1):
                size = 1 << k
                if length & size:
                    B[t, index[(start, start + size - 1)]] = 1.0
                    start += size
    else:
        H_pinv, *_ = np.linalg.lstsq(H, np.eye(m), rcond=None)
        B = S @ H_pinv
    return Factorization("tree", S, H, B, {"estimator": estimator, "nodes": m})


# --------------------------------------------------------------------------- dense (optimal)


def _sqrt_psd(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of symmetric PSD ``M``: returns ``(√eigenvalues, eigenvectors)``."""
    e, U = np.linalg.eigh(M)
    return np.sqrt(np.clip(e, 0.0, None)), U


def _lower_factor(X: np.ndarray) -> np.ndarray:
    """Lower-triangular ``C`` with ``CᵀC = X``: ``C = J·Lᵀ·J`` with ``L = chol(J·X·J)``."""
    JXJ = X[::-1, ::-1]
    JXJ = 0.5 * (JXJ + JXJ.T)
    try:
        L = np.linalg.cholesky(JXJ)
    except np.linalg.LinAlgError as exc:  # pragma: no cover - only for singular workloads
        raise FedsimError(
            "the optimal strategy is numerically singular (the workload is too "
            "ill-conditioned); use fewer rounds or a better-conditioned schedule"
        ) from exc
    return np.tril(L.T[::-1, ::-1])


def _dense_iterate_numpy(W: np.ndarray, tol: float, max_iter: int) -> tuple[Any, Any, Any, int, float, bool]:
    """The fixed point of :func:`dense` in numpy; returns ``(v, √e, X, iterations, change, converged)``."""
    n = W.shape[0]
    v = np.ones(n)
    change = np.inf
    iterations = 0
    converged = False
    for iterations in range(1, max_iter + 1):  # noqa: B007 - read after the loop
        s = np.sqrt(v)
        root_e, U = _sqrt_psd(s[:, None] * W * s[None, :])
        v_new = (U * U) @ root_e  # diag(U diag(√e) Uᵀ)
        change = float(np.max(np.abs(v_new - v) / np.abs(v)))
        v = v_new
        if change < tol:
            converged = True
            break
    _check_multipliers(v)
    s = np.sqrt(v)
    root_e, U = _sqrt_psd(s[:, None] * W * s[None, :])
    X = (U * root_e) @ U.T / np.outer(s, s)
    return v, root_e, X, iterations, change, converged


def _dense_iterate_torch(
    W: np.ndarray, tol: float, max_iter: int, device: str
) -> tuple[Any, Any, Any, int, float, bool]:
    """The same fixed point in torch float64 on ``device`` (the GPU path); same returns."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise FedsimError(f"factorization device {device!r} is not a torch device; use 'cpu' or 'cuda'") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FedsimError(
            f"factorization device {device!r} asked for, but torch sees no CUDA GPU; "
            "leave the device unset (numpy on the CPU) or run on a GPU machine"
        )
    Wt = torch.as_tensor(W, dtype=torch.float64, device=dev)

    def sqrt_psd(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e, U = torch.linalg.eigh(s[:, None] * Wt * s[None, :])
        return e.clamp_min(0.0).sqrt(), U

    v = torch.ones(W.shape[0], dtype=torch.float64, device=dev)
    change = float("inf")
    iterations = 0
    converged = False
    for iterations in range(1, max_iter + 1):  # noqa: B007 - read after the loop
        root_e, U = sqrt_psd(v.sqrt())
        v_new = (U * U) @ root_e
        change = float(((v_new - v).abs() / v.abs()).max())
        v = v_new
        if change < tol:
            converged = True
            break
    _check_multipliers(v.cpu().numpy())
    s = v.sqrt()
    root_e, U = sqrt_psd(s)
    X = (U * root_e) @ U.T / torch.outer(s, s)
    return (v.cpu().numpy(), root_e.cpu().numpy(), X.cpu().numpy(), iterations, change, converged)


def _check_multipliers(v: np.ndarray) -> None:
    if not np.all(v > 0):
        raise FedsimError(
            "the dense factorization broke down (non-positive multipliers); the workload "
            "is too ill-conditioned: use fewer rounds or a better-conditioned schedule"
        )


def dense(A: np.ndarray, tol: float = 1e-10, max_iter: int = 10_000, device: str | None = None) -> Factorization:
    """Optimal factorization for ``‖B‖_F`` under single participation (Denisov et al. 2022).

    Minimises ``tr(W X⁻¹)`` over ``X = CᵀC`` with ``diag X = 1``, ``W = AᵀA``, by the
    fixed-point iteration ``v ← diag((V^{1/2} W V^{1/2})^{1/2})``, ``V = diag(v)``, from
    ``v = 1``. Then ``X = V^{−1/2}(V^{1/2} W V^{1/2})^{1/2}V^{−1/2}`` (rescaled to an exact
    unit diagonal), ``C = J·Lᵀ·J`` with ``L = chol(J·X·J)``, and ``B = A·C⁻¹``.
    ``O(n³)`` per iteration; :func:`make_factorization` caches the result on disk.

    Parameters
    ----------
    A : np.ndarray
        The ``n×n`` lower-triangular workload.
    tol : float, optional
        Stop when ``max_i |v_new,i − v_i| / |v_i| < tol``. Default ``1e-10``.
    max_iter : int, optional
        Iteration cap (default 10 000); reaching it warns and sets ``converged=False``.
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
        ``max_rel_change`` (last step), ``primal`` (``‖B‖_F²``), ``dual`` (Lagrangian
        lower bound) and ``rel_gap`` (``(primal − dual)/primal``).
    """
    A = _check_workload(A)
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
    C = _lower_factor(X)
    B = _right_divide_lower(A, C)
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
        "primal": primal,
        "dual": dual,
        "rel_gap": (primal - dual) / primal,
    }
    return Factorization("dense", A, C, B, info)


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


def dpmf_plus(A: np.ndarray, tau: int | None = None, **dense_kwargs: Any) -> Factorization:
    """DP-MF+ (Koloskova et al. 2023, section 5): minimise ``‖Λ_τ·B‖_F`` subject to ``B·C = A``.

    Solves :func:`dense` for the workload ``Λ_τ·A``, keeps its ``C`` and sets
    ``B = A·C⁻¹``. ``τ = 1`` gives ``Λ_1·S = I`` and hence DP-SGD (``C = I``); the default
    ``τ = n`` weights the last release ``n`` times more than the others.

    Parameters
    ----------
    A : np.ndarray
        The ``n×n`` lower-triangular workload.
    tau : int or None, optional
        Restart period ``τ`` in ``1..n``; default ``None`` means ``τ = n``.
    **dense_kwargs
        Passed to :func:`dense` (``tol``, ``max_iter``).

    Returns
    -------
    Factorization
        ``info`` holds ``dense``'s info for ``Λ_τ·A`` plus ``tau`` and ``objective``
        (``‖Λ_τ·B‖_F²`` at ``sens = 1``).
    """
    A = _check_workload(A)
    n = A.shape[0]
    lam = lambda_matrix(n, tau)
    tau = n if tau is None else int(tau)
    inner = dense(lam @ A, **dense_kwargs)
    C = inner.C
    B = _right_divide_lower(A, C)
    info = dict(inner.info)
    info["tau"] = tau
    info["objective"] = float(np.sum((lam @ B) ** 2))
    return Factorization("dpmf_plus", A, C, B, info)


# --------------------------------------------------------------------------- disk cache


def cache_dir() -> Path:
    """Folder of cached factorizations: ``$FEDSIM_CACHE/factorizations``.

    ``$FEDSIM_CACHE`` defaults to ``~/.cache/fedsim``; read at every call.
    """
    root = os.environ.get("FEDSIM_CACHE") or str(Path.home() / ".cache" / "fedsim")
    return Path(root) / "factorizations"


def _key_part(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        return {
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
        }
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, float):
        return repr(value)  # exact, so 1e-10 and 1.0000000001e-10 differ
    return value


def cache_key(name: str, **key: Any) -> str:
    """Hex digest identifying a computation: ``name``, every ``key`` item and ``CODE_VERSION``.

    Parameters
    ----------
    name : str
        Mechanism name.
    **key
        Every input of the computation; arrays are hashed by dtype, shape and bytes,
        floats by their exact ``repr``.
    """
    payload = {"name": name, "code_version": CODE_VERSION}
    payload.update({k: _key_part(v) for k, v in key.items()})
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return str(value)


def cached(
    name: str,
    compute_fn: Callable[[], Factorization],
    **key: Any,
) -> Factorization:
    """Return ``compute_fn()``, memoised on disk under :func:`cache_dir`.

    The file is ``<name>-<digest>.npz`` with the digest from :func:`cache_key`; it is
    written to a temporary file in the same folder and moved into place with
    ``os.replace`` (atomic). An unreadable file is recomputed and overwritten; an
    unwritable folder only warns. ``info["cache"]`` is ``"hit"`` or ``"miss"`` and
    :data:`CACHE_STATS` counts both.

    Parameters
    ----------
    name : str
        Mechanism name (part of the key and the file name).
    compute_fn : callable
        Computes the factorization on a miss; takes no arguments.
    **key
        Every input that determines the result (workload, ``tol``, ``tau``, ...).
    """
    digest = cache_key(name, **key)
    folder = cache_dir()
    path = folder / f"{name}-{digest[:32]}.npz"
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as data:
                info = json.loads(str(data["info"]))
                fact = Factorization(str(data["name"]), data["A"].copy(), data["C"].copy(), data["B"].copy(), info)
            if info.get("cache_key") == digest:
                CACHE_STATS["hits"] += 1
                fact.info["cache"] = "hit"
                fact.info["cache_file"] = str(path)
                return fact
        except Exception as exc:  # corrupt or foreign file: recompute
            warnings.warn(f"ignoring unreadable cache file {path}: {exc}", stacklevel=2)
    CACHE_STATS["misses"] += 1
    fact = compute_fn()
    fact.info["cache_key"] = digest
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-", suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(
                    fh,
                    name=np.array(fact.name),
                    A=fact.A,
                    C=fact.C,
                    B=fact.B,
                    info=np.array(json.dumps(fact.info, default=_json_default)),
                )
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            CACHE_STATS["writes"] += 1
            fact.info["cache_file"] = str(path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        warnings.warn(f"could not write factorization cache {path}: {exc}", stacklevel=2)
    fact.info["cache"] = "miss"
    return fact


# --------------------------------------------------------------------------- entry point


def make_factorization(
    mechanism: str,
    A: np.ndarray,
    *,
    tau: int | None = None,
    estimator: str = "online",
    tol: float = 1e-10,
    cache: bool = True,
    max_iter: int = 10_000,
    device: str | None = None,
) -> Factorization:
    """Factorize workload ``A`` with the named mechanism.

    Parameters
    ----------
    mechanism : {"identity", "tree", "sqrt", "dense", "dpmf_plus"}
        The factorization family (docs/algorithms.md §3).
    A : np.ndarray
        The ``n×n`` lower-triangular workload (:func:`fedsim.privacy.workloads.make_workload`).
        ``"tree"`` uses only ``n`` and requires ``A`` to be the prefix sum.
    tau : int or None, optional
        DP-MF+ restart period in ``1..n``; default ``None`` = ``n``. Only for ``"dpmf_plus"``.
    estimator : {"online", "full"}, optional
        Tree estimator (default ``"online"``); only used by ``"tree"``.
    tol : float, optional
        Convergence tolerance of ``"dense"`` / ``"dpmf_plus"`` (default ``1e-10``).
    cache : bool, optional
        Memoise ``"dense"`` and ``"dpmf_plus"`` on disk (default ``True``); see :func:`cached`.
    max_iter : int, optional
        Iteration cap of ``"dense"`` / ``"dpmf_plus"`` (default 10 000).
    device : str or None, optional
        ``"dense"`` / ``"dpmf_plus"``: torch device for the iteration (``"cuda"`` is the GPU
        path); default ``None`` = numpy on the CPU. Not part of the cache key: both paths
        solve the same problem to the same ``tol``.

    Returns
    -------
    Factorization
    """
    if mechanism not in MECHANISMS:
        raise FedsimError(f"unknown factorization mechanism {mechanism!r}; choose one of {', '.join(MECHANISMS)}")
    if estimator not in TREE_ESTIMATORS:
        raise FedsimError(f"unknown tree estimator {estimator!r}; choose one of {', '.join(TREE_ESTIMATORS)}")
    if tau is not None and mechanism != "dpmf_plus":
        raise FedsimError(f"tau only applies to mechanism 'dpmf_plus', not {mechanism!r}; remove tau")
    A = _check_workload(A)
    n = A.shape[0]
    if mechanism == "identity":
        return identity(A)
    if mechanism == "sqrt":
        return sqrt_toeplitz(A)
    if mechanism == "tree":
        return tree(n, estimator=estimator, A=A)
    if mechanism == "dpmf_plus":
        lambda_matrix(n, tau)  # validate tau before any work
        tau = n if tau is None else int(tau)

        def compute() -> Factorization:
            return dpmf_plus(A, tau=tau, tol=tol, max_iter=max_iter, device=device)

        key: dict[str, Any] = {"A": A, "n": n, "tau": tau, "tol": float(tol), "max_iter": max_iter}
    else:

        def compute() -> Factorization:
            return dense(A, tol=tol, max_iter=max_iter, device=device)

        key = {"A": A, "n": n, "tol": float(tol), "max_iter": max_iter}
    if not cache:
        return compute()
    return cached(mechanism, compute, **key)
