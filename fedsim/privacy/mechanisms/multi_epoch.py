"""``dense`` and ``dpmf_plus`` optimised for a multi-participation scheme (docs/algorithms.md §3;
Choquette-Choo, McMahan, Rush & Thakurta, ICML 2023, "Multi-epoch matrix factorization mechanisms
for private machine learning").

``epochs (k, b)``. A user of group ``g`` takes part in the rounds ``π_g = {g, g+b, …}`` (at most
``k`` of them; the same patterns :func:`fedsim.privacy.sensitivity.epochs` reads). With
``X = CᵀC`` non-negative on every ``π_g × π_g`` the squared sensitivity is exactly
``max_g Σ_{i,j∈π_g} X[i,j]``, so the scheme's optimum is

    (F)  min tr(W X⁻¹)  over X ≻ 0,  s.t.  Σ_{i,j∈π_g} X[i,j] ≤ 1,  X[i,j] ≥ 0 (i ≠ j in π_g),

``W = AᵀA`` (the loss of the returned ``C`` is then ``sens² · ‖A C⁻¹‖_F²`` with ``sens ≤ 1``).
Its Lagrange dual is

    max  2·tr((Lᵀ W L)^{1/2}) − Σ_g v_g   over  Λ = L Lᵀ ≻ 0,

where ``Λ`` is zero outside the pattern blocks ``π_g × π_g`` and has the constant diagonal
``v_g`` on block ``g`` (the multipliers ``v_g − Λ[i,j] ≥ 0`` of the non-negativity constraints are
automatically non-negative because ``|Λ[i,j]| < v_g`` for a positive definite ``Λ``). The same dual
belongs to the problem with ``X[i,j] = 0`` for ``i ≠ j`` in a pattern, so the two problems have the
same optimum (strong duality: every constraint is linear and ``X = εI`` is feasible): the
scheme-optimal ``C`` has orthogonal columns inside each pattern (the paper's "white diagonals") but
column norms that differ, only their sum over a pattern being fixed. ``k = 1`` (single
participation) is Denisov et al.'s dual; that case keeps the original fixed-point iteration of
:mod:`fedsim.privacy.mechanisms.dense`.

Solver (decisions where the specification is silent): ``L`` is block lower-triangular (lower-
triangular in round order too, because ``g + a·b ≥ g + c·b`` for ``a ≥ c``); each of its rows inside a
block is ``√v_g · p/‖p‖`` with ``p``'s diagonal entry fixed to 1 and the others free, and
``v_g = v⁰_g · e^{s_g}``, so every parameter is unconstrained and ``Λ`` has the required diagonal.
Start: ``Λ`` diagonal with ``v⁰_g = (Σ_{i∈π_g} (W^{1/2})[i,i])²`` (exact optimum for a workload
with a scalar ``W^{1/2}``). The gradient with respect to ``L`` is ``2·W·L·(LᵀWL)^{−1/2}``, one
``n×n`` symmetric eigendecomposition per evaluation; SciPy's L-BFGS-B maximises the dual divided
by its starting value. The primal ``X = L⁻ᵀ (LᵀWL)^{1/2} L⁻¹`` is then made exactly feasible:
its off-diagonal pattern entries are set to 0, it is scaled so that the largest pattern sum is 1, and
``δ·Σ_g 1_{π_g}1_{π_g}ᵀ`` (``δ = 10⁻¹²·max diag X``, positive semi-definite) is added so that the
rounding of ``CᵀC`` cannot make a pattern entry negative; ``δ`` grows tenfold until
:func:`fedsim.privacy.sensitivity.epochs` confirms non-negative patterns (an exact sensitivity).
``C = J·chol(J·X·J)ᵀ·J``. ``info`` reports the returned ``C``'s loss at its exact sensitivity
(``primal``), the dual lower bound (``dual``, a bound for every ``C`` whose pattern entries of ``X``
are non-negative) and ``rel_gap``; ``converged`` means ``rel_gap ≤`` :data:`GAP_TOLERANCE`.

``min_sep (k, b)``. The patterns are every set of at most ``k`` rounds pairwise ``≥ b`` apart. fedsim
optimises over the ``C`` whose columns ``≥ b`` rounds apart are orthogonal (``X[i,j] = 0`` for
``|i − j| ≥ b``): then no pattern has a cross term and the sensitivity is exact. The Cholesky factor
of such a banded ``X`` is itself banded, so this family is exactly the ``b``-banded ``C``, and the
solve is :func:`fedsim.privacy.mechanisms.banded.optimize_banded` (equal column norms, ``sens² =
min(k, ⌈n/b⌉)``). Not explored: unequal column norms under the min-sep pattern constraint, and ``C``
with positive cross terms (whose exact min-sep sensitivity is a combinatorial maximum). The
``epochs`` optimum for the same ``(k, b)`` is a lower bound for the min-sep optimum (its patterns
are a subset).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import scipy.linalg
import torch

from fedsim.errors import FedsimError
from fedsim.privacy.factorizations import Factorization, cached, check_workload, right_divide_lower
from fedsim.privacy.participation import ParticipationScheme
from fedsim.privacy.sensitivity import epochs as epochs_sensitivity

__all__ = [
    "GAP_TOLERANCE",
    "epoch_patterns",
    "epochs_dense",
    "factorize_for_participation",
    "multi_participation",
]

#: ``converged`` when the relative duality gap of the ``epochs`` solve is at most this.
GAP_TOLERANCE = 1e-6


def multi_participation(scheme: ParticipationScheme, n: int) -> tuple[str, int, int] | None:
    """``(scheme name, k, b)`` when ``scheme`` lets one user take part in more than one of ``n``
    rounds with a bounded pattern (``epochs`` or ``min_sep`` with ``k ≥ 2`` and ``b < n``); None
    otherwise: single participation (the original ``dense`` problem is already the optimum), and
    amplified MF (Poisson thinning inside ``min_sep`` groups), whose sensitivity is the
    per-participation column norm and which needs a banded ``C`` anyway."""
    k, b = scheme.max_participations or 1, scheme.min_separation or n
    if scheme.name not in ("epochs", "min_sep") or k < 2 or b >= n:
        return None
    if getattr(scheme, "poisson_within_group", False):
        return None
    return scheme.name, int(k), int(b)


def epoch_patterns(n: int, k: int, b: int) -> list[np.ndarray]:
    """The participation patterns of ``epochs (k, b)`` over ``n`` rounds: ``{g, g+b, …}[:k]``,
    ``g = 0 … min(b, n) − 1`` (as :func:`fedsim.privacy.sensitivity.epochs` reads them)."""
    return [np.arange(g, n, b)[:k] for g in range(min(b, n))]


class _EpochsDual:
    """The dual of (F) as a smooth function of unconstrained parameters (module docstring)."""

    def __init__(self, W: np.ndarray, k: int, b: int, device: str) -> None:
        n = W.shape[0]
        self.n, self.b = n, min(b, n)
        from fedsim.privacy.mechanisms.linalg import torch_device

        self.dev = torch_device(device)
        self.W = torch.as_tensor(W, dtype=torch.float64, device=self.dev)
        rows, cols, group, free = [], [], [], []
        for g, pat in enumerate(epoch_patterns(n, k, b)):
            for a, i in enumerate(pat):
                for c in range(a + 1):
                    rows.append(int(i))
                    cols.append(int(pat[c]))
                    group.append(g)
                    free.append(c < a)
        self.rows, self.cols, self.group = (
            torch.as_tensor(v, dtype=torch.long, device=self.dev) for v in (rows, cols, group)
        )
        self.free = torch.as_tensor(free, dtype=torch.bool, device=self.dev)
        self.num_params = self.b + int(self.free.sum())
        e, U = torch.linalg.eigh(self.W)
        root_diag = (U * U) @ e.clamp_min(0.0).sqrt()  # diag(W^{1/2})
        v0 = torch.zeros(self.b, dtype=torch.float64, device=self.dev)
        for g, pat in enumerate(epoch_patterns(n, k, b)):
            v0[g] = root_diag[torch.as_tensor(pat, device=self.dev)].sum() ** 2
        self.log_v0 = v0.log()

    def lower(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values of L at (rows, cols), v)`` for parameters ``x`` (differentiable)."""
        s = x[: self.b]
        p = torch.ones(self.rows.shape[0], dtype=torch.float64, device=self.dev)
        p = p.masked_scatter(self.free, x[self.b :])
        norms2 = torch.zeros(self.n, dtype=torch.float64, device=self.dev).index_add(0, self.rows, p * p)
        v = (self.log_v0 + s).exp()
        return v[self.group].sqrt() * p / norms2[self.rows].sqrt(), v

    def matrix(self, vals: torch.Tensor) -> torch.Tensor:
        L = torch.zeros(self.n, self.n, dtype=torch.float64, device=self.dev)
        L[self.rows, self.cols] = vals
        return L

    def evaluate(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """``(dual value, its gradient)`` at ``x``."""
        xt = torch.as_tensor(x, dtype=torch.float64, device=self.dev).requires_grad_(True)
        vals, v = self.lower(xt)
        with torch.no_grad():
            L = self.matrix(vals)
            WL = self.W @ L
            M = L.T @ WL
            e, U = torch.linalg.eigh(0.5 * (M + M.T))
            r = e.clamp_min(1e-300).sqrt()
            G = 2.0 * WL @ ((U / r) @ U.T)
            value = 2.0 * r.sum() - v.sum()
        (grad,) = torch.autograd.grad((vals * G[self.rows, self.cols]).sum() - v.sum(), xt)
        return float(value), grad.detach().cpu().numpy()

    def primal(self, x: np.ndarray) -> np.ndarray:
        """``X = L⁻ᵀ (LᵀWL)^{1/2} L⁻¹``, the minimiser of the Lagrangian at ``x`` (numpy)."""
        with torch.no_grad():
            L = self.matrix(self.lower(torch.as_tensor(x, dtype=torch.float64, device=self.dev))[0])
            M = L.T @ self.W @ L
            e, U = torch.linalg.eigh(0.5 * (M + M.T))
            R = ((U * e.clamp_min(0.0).sqrt()) @ U.T).cpu().numpy()
            Ln = L.cpu().numpy()
        Y = scipy.linalg.solve_triangular(Ln, R, trans="T", lower=True)  # L⁻ᵀ R
        X = scipy.linalg.solve_triangular(Ln, Y.T, trans="T", lower=True).T  # (L⁻ᵀ R) L⁻¹
        return np.asarray(0.5 * (X + X.T))


def _feasible_strategy(X: np.ndarray, n: int, k: int, b: int) -> tuple[np.ndarray, float, float]:
    """The exactly feasible ``C`` from an almost feasible ``X`` (module docstring): returns
    ``(C, sens, δ)`` with ``sens`` exact under ``epochs (k, b)`` by fedsim's own computation."""
    from fedsim.privacy.mechanisms.linalg import lower_factor

    X = X.copy()
    pats = epoch_patterns(n, k, b)
    for pat in pats:
        block = np.ix_(pat, pat)
        X[block] = np.diag(np.diag(X[block]))
    scale = np.ones(n)
    for pat in pats:  # every pattern's sum to 1 (D·X·D stays positive definite)
        scale[pat] = 1.0 / np.sqrt(np.sum(np.diag(X)[pat]))
    X *= np.outer(scale, scale)
    ones = np.zeros_like(X)
    for pat in pats:
        ones[np.ix_(pat, pat)] = 1.0
    delta = 1e-12 * float(np.max(np.diag(X)))
    for _ in range(6):
        C = lower_factor(X + delta * ones)
        sens, exact = epochs_sensitivity(C, k, b)
        if exact:
            return C, sens, delta
        delta *= 10.0
    raise FedsimError(  # pragma: no cover - rounding never reaches 1e-6 of the diagonal
        "the epochs-optimal strategy could not be made exactly non-negative on its participation "
        "patterns; the workload is too ill-conditioned: use fewer rounds or privacy.optimize_for = 'single'"
    )


def epochs_dense(
    A: np.ndarray, k: int, b: int, tol: float = 1e-12, max_iter: int = 10_000, device: str | None = None
) -> Factorization:
    """The optimal ``C`` for ``‖B‖_F`` under ``epochs (k, b)`` participation (module docstring).

    Parameters
    ----------
    A : np.ndarray
        The ``n×n`` lower-triangular workload (``n ≤ k·b``).
    k, b : int
        Participations per user and the number of groups (the separation).
    tol : float, optional
        L-BFGS-B's ``ftol`` on the dual divided by its starting value (default ``1e-12``); the
        solver also stops when its line search reaches the precision of the dual's value.
    max_iter : int, optional
        Most L-BFGS-B iterations (default 10 000).
    device : str or None, optional
        Torch device of the dual's evaluations (``"cuda"``: the GPU path); default the CPU.

    Returns
    -------
    Factorization
        ``C`` lower-triangular, ``X = CᵀC`` non-negative on every pattern, exact squared
        sensitivity ``1 + O(10⁻¹²)``. ``info``: ``optimized_for``, ``iterations``,
        ``evaluations``, ``seconds``, ``converged``, ``message``, ``primal`` (the loss of ``C`` at its
        exact sensitivity), ``dual`` (a lower bound on every ``C``'s loss with non-negative
        pattern entries), ``rel_gap``, ``pattern_margin`` (``δ``), ``num_params``, ``tolerance``,
        ``max_iter``, ``device``.
    """
    from scipy.optimize import minimize

    A = check_workload(A)
    n = A.shape[0]
    if k < 1 or b < 1 or n > k * b:
        raise FedsimError(f"epochs (k = {k}, b = {b}) covers at most k·b = {k * b} rounds, not n = {n}")
    start = time.perf_counter()
    W = A.T @ A
    dual = _EpochsDual(0.5 * (W + W.T), k, b, "cpu" if device is None else device)
    x0 = np.zeros(dual.num_params)
    scale = abs(dual.evaluate(x0)[0]) or 1.0

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = dual.evaluate(x)
        return -value / scale, -grad / scale

    res = minimize(
        fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": int(max_iter), "ftol": tol, "gtol": 0.0, "maxcor": 50}
    )
    C, sens, delta = _feasible_strategy(dual.primal(res.x), n, k, b)
    B = right_divide_lower(A, C)
    primal, lower = sens * sens * float(np.sum(B * B)), -float(res.fun) * scale
    rel_gap = (primal - lower) / primal
    if not rel_gap <= GAP_TOLERANCE:
        warnings.warn(
            f"the epochs-optimal dense factorization stopped at a relative duality gap of {rel_gap:.3g} "
            f"(> {GAP_TOLERANCE:g}; {res.message}); its sensitivity is exact, only its optimality is not proven",
            RuntimeWarning,
            stacklevel=2,
        )
    info = {
        "optimized_for": f"epochs (k={k}, b={b})",
        "iterations": int(res.nit),
        "evaluations": int(res.nfev),
        "seconds": time.perf_counter() - start,
        "converged": bool(rel_gap <= GAP_TOLERANCE),
        "message": str(res.message),
        "primal": primal,
        "dual": lower,
        "rel_gap": rel_gap,
        "pattern_margin": delta,
        "num_params": dual.num_params,
        "tolerance": float(tol),
        "max_iter": int(max_iter),
        "device": "cpu" if device is None else str(device),
    }
    return Factorization("dense", A, C, B, info)


def _min_sep_dense(A: np.ndarray, k: int, b: int) -> Factorization:
    """``min_sep (k, b)``: the optimal ``b``-banded ``C`` (module docstring)."""
    from fedsim.privacy.mechanisms.banded import optimize_banded

    A = check_workload(A)
    C, report = optimize_banded(A, b, max_participations=k)
    keep = ("iterations", "evaluations", "seconds", "converged", "message", "grad_norm", "num_params")
    info = {key: report[key] for key in keep if key in report}
    info["optimized_for"] = f"min_sep (k={k}, b={b}): the optimal {b}-banded C"
    return Factorization("dense", A, C, right_divide_lower(A, C), info)


def factorize_for_participation(
    A: np.ndarray,
    participation: tuple[str, int, int],
    tol: float = 1e-12,
    max_iter: int = 10_000,
    device: str | None = None,
    cache: bool = True,
) -> Factorization:
    """The ``dense`` optimum of ``A`` for a multi-participation scheme, memoised on disk (key:
    ``A``, the scheme, ``tol``, ``max_iter``; under ``min_sep`` also the banded optimiser's
    evaluator).

    Parameters
    ----------
    A : the ``n×n`` lower-triangular workload.
    participation : ``(name, k, b)`` from :func:`multi_participation` (``epochs`` or ``min_sep``).
    tol, max_iter, device : as for :func:`epochs_dense` (``min_sep`` uses the banded optimiser's
        defaults and the CPU).
    cache : read and write the on-disk cache (default True).
    """
    A = check_workload(A)
    name, k, b = participation
    if name not in ("epochs", "min_sep"):
        raise FedsimError(f"no multi-participation dense optimum for scheme {name!r}; use epochs or min_sep")

    def compute() -> Factorization:
        if name == "epochs":
            return epochs_dense(A, k, b, tol=tol, max_iter=max_iter, device=device)
        return _min_sep_dense(A, k, b)

    if not cache:
        return compute()
    key = {"A": A, "n": A.shape[0], "scheme": name, "k": k, "b": b, "tol": float(tol), "max_iter": max_iter}
    if name == "min_sep":  # the banded optimiser's evaluator changed in issue 46: recompute older solutions
        from fedsim.privacy.mechanisms.banded import EVALUATOR

        key["evaluator"] = EVALUATOR
    return cached(f"dense_{name}", compute, **key)
