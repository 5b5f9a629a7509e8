"""``dense`` and ``dpmf_plus`` optimised for the run's participation scheme (issue 38, item 4;
docs/algorithms.md §3): the multi-epoch optimum under ``epochs``, the optimal banded ``C`` under
``min_sep``, the unchanged fixed point under single participation — checked against banded and BLT,
the optimality conditions, an independent brute-force optimiser and an enumeration of participation
patterns."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import minimize

from fedsim.errors import FedsimError
from fedsim.privacy.factorizations import right_divide_lower
from fedsim.privacy.mechanisms import factorization_quality, options_of, plan_mf, workload_matrix
from fedsim.privacy.mechanisms.dense import factorize_dense
from fedsim.privacy.mechanisms.dpmf_plus import factorize_dpmf_plus, lambda_matrix
from fedsim.privacy.mechanisms.multi_epoch import (
    epoch_patterns,
    epochs_dense,
    factorize_for_participation,
    multi_participation,
)
from fedsim.privacy.participation import make_scheme
from fedsim.privacy.workloads import prefix_sum
from fedsim.resources import MAX_CPU_SECONDS, check_factorization_fits, dense_cpu_seconds


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))


def _scheme(name: str, n: int, k: int, b: int):
    """The scheme ``fedsim factorize --scheme name --min-sep b --max-participations k`` builds."""
    if name == "single":
        return make_scheme("single", n, 1, rounds=n)
    return make_scheme(name, b, 1, min_sep=b, max_participations=k, rounds=n)


def _loss(mechanism: str, scheme, n: int, **options) -> tuple[float, object]:
    plan = plan_mf(mechanism, scheme, n, **options)
    return factorization_quality(plan, workload_matrix("prefix", n))["loss"], plan


# --------------------------------------------------------------------------- epochs: better than banded, BLT


@pytest.mark.parametrize(("n", "k", "b"), [(32, 4, 8), (48, 3, 16), (64, 8, 8), (30, 3, 10)])
def test_epochs_dense_is_at_most_banded_and_blt(n, k, b):
    scheme = _scheme("epochs", n, k, b)
    dense_loss, plan = _loss("dense", scheme, n)
    assert plan.sens_exact
    assert dense_loss <= _loss("banded", scheme, n)[0] * (1 + 1e-9)
    assert dense_loss <= _loss("blt", scheme, n)[0] * (1 + 1e-9)
    assert dense_loss < _loss("dense", scheme, n, optimize_for="single")[0]
    assert plan.info["converged"] and plan.info["rel_gap"] < 1e-6
    # the dual is a lower bound on every C with non-negative pattern entries: banded's included
    assert plan.info["dual"] <= dense_loss * (1 + 1e-12)


def test_the_issue_numbers():
    """n = 64, epochs (k = 8, b = 8): 3,143.66 against banded 3,515.96 and BLT 4,085.66 (the
    single-participation solve gave 5,832.31)."""
    scheme = _scheme("epochs", 64, 8, 8)
    assert _loss("dense", scheme, 64)[0] == pytest.approx(3143.6638, rel=1e-6)
    assert _loss("dense", scheme, 64, optimize_for="single")[0] == pytest.approx(5832.3095, rel=1e-6)


# --------------------------------------------------------------------------- optimality


@pytest.mark.parametrize("workload", ["prefix", "momentum"])
def test_first_order_conditions(workload):
    """At the optimum ``X⁻¹WX⁻¹ = Λ`` with ``Λ`` zero outside the pattern blocks, a constant positive
    diagonal on each block, positive definite; every pattern sum of ``X`` is active (= sens²)."""
    n, k, b = 24, 3, 8
    A = workload_matrix(workload, n)
    f = epochs_dense(A, k, b)
    X = f.C.T @ f.C
    Xi = np.linalg.inv(X)
    K = Xi @ (A.T @ A) @ Xi
    K = 0.5 * (K + K.T)
    mask = np.zeros((n, n), dtype=bool)
    for pat in epoch_patterns(n, k, b):
        mask[np.ix_(pat, pat)] = True
        diag = np.diag(K)[pat]
        assert np.ptp(diag) <= 1e-5 * diag.mean()
        assert float(X[np.ix_(pat, pat)].sum()) == pytest.approx(1.0, abs=1e-9)
    scale = np.abs(K).max()
    assert np.abs(K[~mask]).max() <= 1e-5 * scale
    assert np.linalg.eigvalsh(np.where(mask, K, 0.0)).min() > 0


def _brute_force(A: np.ndarray, k: int, b: int) -> float:
    """min ‖A C⁻¹‖_F² over lower-triangular C with Σ_{π} X ≤ 1 and X[i,j] ≥ 0 on every epochs
    pattern (X = CᵀC), by SLSQP on the entries of C — no dual, no fedsim solver."""
    n = A.shape[0]
    rows, cols = np.tril_indices(n)
    pats = epoch_patterns(n, k, b)
    pairs = [(i, j) for p in pats for i in p for j in p if i < j]

    def C_of(x):
        C = np.zeros((n, n))
        C[rows, cols] = x
        return C

    def objective(x):
        return float(np.sum(right_divide_lower(A, C_of(x)) ** 2))

    def constraints(x):
        X = C_of(x).T @ C_of(x)
        return np.array([1.0 - X[np.ix_(p, p)].sum() for p in pats] + [X[i, j] for i, j in pairs])

    x0 = C_of(np.zeros(len(rows)))
    x0[np.diag_indices(n)] = 1.0 / np.sqrt(k)
    res = minimize(
        objective,
        x0[rows, cols],
        method="SLSQP",
        constraints=[{"type": "ineq", "fun": constraints}],
        options={"maxiter": 2000, "ftol": 1e-13},
    )
    assert res.status in (0, 8), res.message  # 8: the line search reached machine precision
    assert constraints(res.x).min() > -1e-9  # feasible
    return float(res.fun)


@pytest.mark.parametrize(("n", "k", "b", "workload"), [(6, 2, 3, "prefix"), (6, 3, 2, "prefix"), (6, 2, 3, "momentum")])
def test_agrees_with_a_brute_force_optimiser(n, k, b, workload):
    A = workload_matrix(workload, n)
    f = epochs_dense(A, k, b)
    assert f.info["primal"] == pytest.approx(_brute_force(A, k, b), rel=1e-5)
    assert f.info["dual"] <= f.info["primal"] * (1 + 1e-12)


# --------------------------------------------------------------------------- exact sensitivity


def _enumerated_sensitivity(C: np.ndarray, patterns: list[list[int]]) -> tuple[float, float]:
    """``(scalar, vector bound)``: the exact sensitivity² for scalar contributions, max over every
    pattern and every ``s ∈ {−1, 0, 1}^π`` of ``sᵀ X_π s`` (a convex quadratic on a box peaks at a
    vertex), and the Cauchy–Schwarz bound ``max_π Σ |X_π|`` that holds for vector contributions."""
    X = C.T @ C
    scalar = vector = 0.0
    for p in patterns:
        sub = X[np.ix_(p, p)]
        vector = max(vector, float(np.abs(sub).sum()))
        for s in itertools.product((-1.0, 0.0, 1.0), repeat=len(p)):
            v = np.array(s)
            scalar = max(scalar, float(v @ sub @ v))
    return scalar, vector


def _min_sep_patterns(n: int, k: int, b: int) -> list[list[int]]:
    """Every maximal set of at most ``k`` rounds pairwise ≥ ``b`` apart (subsets are covered by the
    zeros of the sign vectors)."""
    return [list(c) for m in range(1, k + 1) for c in itertools.combinations(range(n), m) if np.all(np.diff(c) >= b)]


@pytest.mark.parametrize(("name", "n", "k", "b"), [("epochs", 12, 3, 4), ("epochs", 10, 3, 4), ("min_sep", 12, 3, 4)])
@pytest.mark.parametrize("mechanism", ["dense", "dpmf_plus"])
def test_sensitivity_is_the_enumerated_one(name, n, k, b, mechanism):
    """The plan's sensitivity (fedsim's own, exact) equals an enumeration of every participation
    pattern and sign; scalar and vector contributions agree (the pattern entries are ≥ 0)."""
    plan = plan_mf(mechanism, _scheme(name, n, k, b), n)
    pats = [list(p) for p in epoch_patterns(n, k, b)] if name == "epochs" else _min_sep_patterns(n, k, b)
    scalar, vector = _enumerated_sensitivity(plan.C, pats)
    assert plan.sens_exact
    assert plan.sens**2 == pytest.approx(scalar, rel=1e-12)
    assert vector == pytest.approx(scalar, rel=1e-12)


# --------------------------------------------------------------------------- min_sep


@pytest.mark.parametrize(("n", "k", "b"), [(32, 4, 8), (64, 8, 8)])
def test_min_sep_dense_is_the_optimal_banded_c(n, k, b):
    scheme = _scheme("min_sep", n, k, b)
    dense_loss, plan = _loss("dense", scheme, n)
    banded_loss = _loss("banded", scheme, n)[0]
    assert dense_loss == pytest.approx(banded_loss, rel=1e-9)
    assert dense_loss <= _loss("blt", scheme, n)[0]
    assert plan.sens_exact and not np.any(np.tril(plan.C, -b))
    # the epochs optimum (a subset of the min-sep patterns) is a lower bound
    assert _loss("dense", _scheme("epochs", n, k, b), n)[0] <= dense_loss


# --------------------------------------------------------------------------- single participation unchanged


@pytest.mark.parametrize(("name", "k", "b"), [("single", 1, 16), ("epochs", 1, 16), ("min_sep", 2, 16)])
def test_single_participation_is_bit_for_bit_unchanged(name, k, b):
    """Single participation (and k·b ≥ n schemes, which let a user in once) runs the original fixed
    point with the original cache key: the very same C."""
    n = 16
    scheme = _scheme(name, n, k, b)
    assert multi_participation(scheme, n) is None
    S = prefix_sum(n)
    assert np.array_equal(plan_mf("dense", scheme, n).C, factorize_dense(S, cache=False).C)
    assert np.array_equal(plan_mf("dpmf_plus", scheme, n).C, factorize_dpmf_plus(S, cache=False).C)


def test_optimize_for_single_keeps_the_old_solve_under_epochs():
    n, scheme = 32, _scheme("epochs", 32, 4, 8)
    S = prefix_sum(n)
    assert np.array_equal(plan_mf("dense", scheme, n, optimize_for="single").C, factorize_dense(S, cache=False).C)
    old = plan_mf("dpmf_plus", scheme, n, optimize_for="single")
    assert np.array_equal(old.C, factorize_dpmf_plus(S, cache=False).C)
    with pytest.raises(FedsimError, match="optimize_for"):
        options_of("dense", optimize_for="epochs")


def test_amplified_min_sep_keeps_the_single_solve():
    """Poisson thinning inside min_sep groups is accounted per participation and needs a banded C:
    the scheme-optimal solve does not apply (plan_mf refuses a dense C there, as before)."""
    scheme = make_scheme("min_sep", 60, 5, min_sep=2, max_participations=4, poisson_within_group=True, rounds=8)
    assert multi_participation(scheme, 8) is None
    with pytest.raises(FedsimError, match="bands"):
        plan_mf("dense", scheme, 8)


# --------------------------------------------------------------------------- DP-MF+


def test_dpmf_plus_optimises_its_objective_for_the_scheme():
    """DP-MF+'s objective ``sens²·‖Λ_τ B‖_F²`` is lower for the scheme-optimal C than for the
    single-participation one, and equals the epochs solve of ``Λ_τ·A``."""
    n, scheme = 32, _scheme("epochs", 32, 4, 8)
    lam = lambda_matrix(n)

    def objective(plan) -> float:
        B = workload_matrix("prefix", n) @ plan.noising
        return plan.sens**2 * float(np.sum((lam @ B) ** 2))

    new, old = plan_mf("dpmf_plus", scheme, n), plan_mf("dpmf_plus", scheme, n, optimize_for="single")
    assert objective(new) < objective(old)
    inner = factorize_for_participation(lam @ prefix_sum(n), ("epochs", 4, 8), cache=False)
    assert objective(new) == pytest.approx(inner.info["primal"], rel=1e-9)


def test_device_path_and_a_bad_device():
    """The dual's evaluations run in torch on the named device (``cuda``: the GPU path): on the CPU
    the same C as the default; an unknown device is a clear error."""
    A = prefix_sum(24)
    assert np.allclose(epochs_dense(A, 3, 8, device="cpu").C, epochs_dense(A, 3, 8).C, rtol=0, atol=1e-12)
    with pytest.raises(FedsimError, match="torch device"):
        epochs_dense(A, 3, 8, device="warp")


def test_cached_result_is_reused(tmp_path):
    A = prefix_sum(16)
    first = factorize_for_participation(A, ("epochs", 2, 8))
    again = factorize_for_participation(A, ("epochs", 2, 8))
    assert first.info["cache"] == "miss" and again.info["cache"] == "hit"
    assert np.array_equal(first.C, again.C)


# --------------------------------------------------------------------------- resources


def test_resource_estimate_covers_the_multi_epoch_solve():
    assert dense_cpu_seconds(2048) == dense_cpu_seconds(2048, None)
    assert dense_cpu_seconds(1024, "prefix") > dense_cpu_seconds(1024)
    assert dense_cpu_seconds(1024, "momentum") > dense_cpu_seconds(1024, "prefix")
    check_factorization_fits("dense", 2048)  # the single-participation limit is unchanged
    assert dense_cpu_seconds(2048, "momentum") > MAX_CPU_SECONDS
    with pytest.raises(FedsimError, match="GPU"):
        check_factorization_fits("dense", 2048, None, "momentum")
