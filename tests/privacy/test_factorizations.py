"""Matrix factorizations and workloads (docs/algorithms.md sections 3 and 9)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.special

from fedsim.errors import FedsimError
from fedsim.privacy import factorizations as fz
from fedsim.privacy.factorizations import Factorization, cache_key, cached
from fedsim.privacy.mechanisms import options_of
from fedsim.privacy.mechanisms.dense import dense, factorize_dense
from fedsim.privacy.mechanisms.dpmf_plus import dpmf_plus, factorize_dpmf_plus, lambda_matrix
from fedsim.privacy.mechanisms.identity import identity
from fedsim.privacy.mechanisms.sqrt import sqrt_toeplitz, sqrt_toeplitz_coefficients
from fedsim.privacy.mechanisms.tree import tree, tree_nodes
from fedsim.privacy.workloads import make_workload, momentum, prefix_sum

GOLDEN = (3.0 + math.sqrt(5.0)) / 2.0


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _check_valid(f: Factorization) -> None:
    n = f.A.shape[0]
    assert f.B.shape == (n, f.C.shape[0])
    assert f.C.shape[1] == n
    assert _rel(f.B @ f.C, f.A) < 1e-8
    if f.C.shape[0] == n:
        assert np.array_equal(f.C, np.tril(f.C)), "C must be lower-triangular"
        assert np.all(np.abs(np.diag(f.C)) > 0), "C must be invertible"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))


# --------------------------------------------------------------------------- workloads


def test_prefix_sum() -> None:
    S = prefix_sum(5)
    assert S.dtype == np.float64
    assert np.array_equal(S, np.tril(np.ones((5, 5))))


def test_momentum_matches_heavy_ball_simulation() -> None:
    n, beta = 9, 0.7
    rng = np.random.default_rng(0)
    eta = rng.uniform(0.1, 1.0, n)
    A = momentum(n, beta, eta)
    # simulate x_{s+1} = x_s − η_s m_s, m_s = β m_{s−1} + g_s on unit gradients e_j
    for j in range(n):
        x, m = 0.0, 0.0
        for s in range(n):
            m = beta * m + (1.0 if s == j else 0.0)
            x -= eta[s] * m
            assert A[s, j] == pytest.approx(-x, rel=1e-14, abs=1e-15)
    assert np.array_equal(A, np.tril(A))


def test_momentum_beta_zero_is_prefix_sum() -> None:
    assert np.array_equal(momentum(7, 0.0), prefix_sum(7))
    assert np.array_equal(make_workload("momentum", 7, beta=0.0), prefix_sum(7))
    assert np.array_equal(make_workload("prefix", 7), prefix_sum(7))


@pytest.mark.parametrize(
    "call",
    [
        lambda: make_workload("adam", 4),
        lambda: make_workload("prefix", 4, learning_rates=[1, 1, 1, 1]),
        lambda: momentum(4, 1.0),
        lambda: momentum(4, 0.9, [1.0, 1.0]),
        lambda: momentum(4, 0.9, [1.0, 0.0, 1.0, 1.0]),
        lambda: prefix_sum(0),
    ],
)
def test_workload_user_errors(call) -> None:
    with pytest.raises(FedsimError):
        call()


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("n", [1, 2, 7, 32])
def test_identity(n: int) -> None:
    f = identity(prefix_sum(n))
    _check_valid(f)
    assert f.sensitivity() == 1.0
    assert f.loss() == pytest.approx(n * (n + 1) / 2, rel=1e-15)
    assert f.final_error() == pytest.approx(n)
    assert f.max_error() == pytest.approx(n)


def test_sqrt_coefficients_and_square() -> None:
    n = 128
    r = sqrt_toeplitz_coefficients(n)
    k = np.arange(n)
    expected = scipy.special.binom(2 * k, k) / 4.0**k
    np.testing.assert_allclose(r, expected, rtol=1e-12)
    f = sqrt_toeplitz(prefix_sum(n))
    _check_valid(f)
    assert np.max(np.abs(f.C @ f.C - prefix_sum(n))) < 1e-12
    assert np.max(np.abs(f.B - f.C)) < 1e-12  # B = S·C⁻¹ = C


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_tree_sensitivity_and_online_rows(n: int) -> None:
    f = tree(n, "online")
    _check_valid(f)
    assert f.C.shape == (2 * n - 1, n)
    assert f.sensitivity() ** 2 == pytest.approx(math.log2(n) + 1, rel=1e-15)
    assert np.allclose(f.column_norms() ** 2, math.log2(n) + 1)
    assert set(np.unique(f.B)) <= {0.0, 1.0}
    assert np.max(np.sum(f.B, axis=1)) <= math.log2(n) + 1
    assert np.array_equal(f.B @ f.C, prefix_sum(n))  # exact for 0/1 selections
    # causal: round t's estimate reads only nodes complete by round t
    ends = np.array([b for _, b in tree_nodes(n)])
    for t in range(n):
        assert np.all(ends[f.B[t] != 0] <= t)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_tree_full_estimator(n: int) -> None:
    online, full = tree(n, "online"), tree(n, "full")
    _check_valid(full)
    assert np.array_equal(full.C, online.C)
    assert full.loss() <= online.loss() * (1 + 1e-12)
    # least squares is best per release too
    assert np.all(np.sum(full.B**2, axis=1) <= np.sum(online.B**2, axis=1) + 1e-12)


def test_tree_refusals() -> None:
    with pytest.raises(FedsimError, match="power of two"):
        tree(12)
    with pytest.raises(FedsimError, match="estimator"):
        tree(8, "honaker")
    with pytest.raises(FedsimError, match="prefix-sum"):
        tree(8, A=momentum(8, 0.9))
    with pytest.raises(FedsimError, match="power of two"):
        tree(12, A=prefix_sum(12))
    with pytest.raises(FedsimError, match="prefix-sum"):
        tree(8, A=momentum(8, 0.5))


# --------------------------------------------------------------------------- dense


def test_dense_n2_golden_ratio() -> None:
    f = dense(prefix_sum(2))
    _check_valid(f)
    assert f.sensitivity() == pytest.approx(1.0, abs=1e-14)
    assert f.loss() == pytest.approx(GOLDEN, abs=1e-9)
    assert f.info["converged"]


@pytest.mark.parametrize("n", [16, 64])
def test_dense_beats_sqrt_and_identity(n: int) -> None:
    S = prefix_sum(n)
    f = dense(S)
    _check_valid(f)
    assert f.info["converged"]
    assert abs(f.info["rel_gap"]) < 1e-8
    np.testing.assert_allclose(np.diag(f.C.T @ f.C), 1.0, atol=1e-12)
    assert f.loss() < sqrt_toeplitz(S).loss()
    assert f.loss() < identity(S).loss()
    assert f.loss() < tree(n, "full").loss()


def test_dense_momentum_workload() -> None:
    n = 24
    A = momentum(n, 0.9, np.linspace(1.0, 0.2, n))
    f = dense(A)
    _check_valid(f)
    assert f.info["converged"]
    assert f.loss() <= sqrt_toeplitz(A).loss()
    assert f.loss() <= identity(A).loss()


@pytest.mark.parametrize("workload", ["prefix", "momentum"])
def test_dense_torch_path_equals_numpy(workload: str) -> None:
    """The torch path (the one that runs on a GPU with device="cuda"), here on the CPU, solves
    the same fixed point: C and loss equal to numpy's within 1e-9. The Anderson extrapolation
    feels the last bits of the eigendecompositions, so the iteration counts may differ a little
    (76 and 82 here for the momentum workload)."""
    n = 48
    A = prefix_sum(n) if workload == "prefix" else momentum(n, 0.9, np.linspace(1.0, 0.2, n))
    ref = dense(A)
    got = dense(A, device="cpu")
    _check_valid(got)
    assert got.info["device"] == "cpu" and ref.info["device"] == "numpy"
    assert got.info["converged"] and ref.info["converged"]
    assert abs(got.info["iterations"] - ref.info["iterations"]) <= 0.2 * ref.info["iterations"]
    assert _rel(got.C, ref.C) < 1e-9
    assert got.loss() == pytest.approx(ref.loss(), rel=1e-10)
    assert abs(got.info["rel_gap"]) < 1e-8
    via = factorize_dpmf_plus(A, device="cpu", cache=False)
    assert via.info["device"] == "cpu"
    assert _rel(via.C, factorize_dpmf_plus(A, cache=False).C) < 1e-9


def test_dense_device_user_errors() -> None:
    with pytest.raises(FedsimError, match="not a torch device"):
        dense(prefix_sum(4), device="warp-drive")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(FedsimError, match="no CUDA GPU"):
            dense(prefix_sum(4), device="cuda")


def test_dense_not_converged_warns() -> None:
    with pytest.warns(RuntimeWarning, match="did not reach"):
        f = dense(prefix_sum(16), max_iter=2)
    assert not f.info["converged"]
    assert f.info["iterations"] == 2
    _check_valid(f)  # still a valid factorization, just not optimal


def test_noising_matrix() -> None:
    S = prefix_sum(16)
    for f in (identity(S), sqrt_toeplitz(S), dense(S), dpmf_plus(S)):
        np.testing.assert_allclose(f.noising_matrix(), np.linalg.inv(f.C), rtol=1e-9, atol=1e-10)
    A = momentum(16, 0.9)
    f = dense(A)
    np.testing.assert_allclose(f.noising_matrix(), np.linalg.inv(f.C), rtol=1e-9, atol=1e-10)
    for est in ("online", "full"):
        t = tree(16, est)
        N = t.noising_matrix()
        assert N.shape == (16, 31)
        np.testing.assert_allclose(S @ N, t.B, atol=1e-12)
    # full estimator: per-round noise H⁺Z has covariance (HᵀH)⁻¹
    t = tree(16, "full")
    N = t.noising_matrix()
    np.testing.assert_allclose(N @ N.T, np.linalg.inv(t.C.T @ t.C), atol=1e-12)


# --------------------------------------------------------------------------- DP-MF+


def test_lambda_matrix() -> None:
    np.testing.assert_allclose(lambda_matrix(6, 1), np.linalg.inv(prefix_sum(6)), atol=1e-15)
    n = 8
    expected = np.diag([1 / math.sqrt(n)] * (n - 1) + [1.0])
    np.testing.assert_allclose(lambda_matrix(n), expected, atol=1e-15)
    # T = 12, τ = 3 (paper 004, appendix B), 1-indexed rows written out
    lam = lambda_matrix(12, 3)
    w = 1 / math.sqrt(3)
    rows = {
        1: {1: w},
        2: {2: w},
        3: {3: 1.0},
        4: {4: w, 3: -w},
        5: {5: w, 3: -w},
        6: {6: 1.0, 3: -1.0},
        7: {7: w, 6: -w},
        8: {8: w, 6: -w},
        9: {9: 1.0, 6: -1.0},
        10: {10: w, 9: -w},
        11: {11: w, 9: -w},
        12: {12: 1.0, 9: -1.0},
    }
    ref = np.zeros((12, 12))
    for t, cols in rows.items():
        for j, val in cols.items():
            ref[t - 1, j - 1] = val
    np.testing.assert_allclose(lam, ref, atol=1e-15)


def test_dpmf_plus_tau_one_is_dp_sgd() -> None:
    for A in (prefix_sum(16), momentum(16, 0.9)):
        f = dpmf_plus(A, tau=1)
        _check_valid(f)
        # Λ_1·S = I: C = I for the prefix sum; for momentum C is optimal for ‖S⁻¹A C⁻¹‖
        if np.array_equal(A, prefix_sum(16)):
            np.testing.assert_allclose(np.abs(f.C), np.eye(16), atol=1e-12)
            assert f.loss() == pytest.approx(identity(A).loss(), rel=1e-8)


@pytest.mark.parametrize("tau", [None, 1, 4, 7, 32])
def test_dpmf_plus_valid(tau: int | None) -> None:
    f = dpmf_plus(prefix_sum(32), tau=tau)
    _check_valid(f)
    assert f.info["tau"] == (32 if tau is None else tau)
    assert f.info["converged"]
    np.testing.assert_allclose(f.column_norms(), 1.0, atol=1e-12)


def test_dpmf_plus_final_error_beats_dense() -> None:
    # Both are exact minimisers over the same feasible set (diag X = 1): dense of
    # g + f, DP-MF+ (τ = n) of g/n + f, with f the last row's error and g the rest's.
    # Adding the two optimality inequalities gives (f₊ − f)(1 − 1/n) ≤ 0, so f₊ ≤ f;
    # and symmetrically dense's total loss is no larger than DP-MF+'s.
    S = prefix_sum(32)
    d, p = dense(S), dpmf_plus(S)
    assert p.final_error() < d.final_error()
    assert d.loss() <= p.loss()
    assert p.final_error() < 0.6 * d.final_error()  # a large gain, not rounding


# --------------------------------------------------------------------------- entry point, cache


FAMILIES = {
    "identity": identity,
    "tree": lambda A: tree(A.shape[0], A=A),
    "sqrt": sqrt_toeplitz,
    "dense": factorize_dense,
    "dpmf_plus": factorize_dpmf_plus,
}


def test_every_closed_form_and_dense_family() -> None:
    S = prefix_sum(16)
    for mech, factorize in FAMILIES.items():
        f = factorize(S)
        assert f.name == mech
        _check_valid(f)


@pytest.mark.parametrize(
    "call",
    [
        lambda: options_of("banded-x"),
        lambda: factorize_dense(np.ones((4, 4))),
        lambda: factorize_dense(np.ones((4, 3))),
        lambda: factorize_dense(prefix_sum(4) * np.nan),
        lambda: factorize_dense(np.zeros((4, 4))),
        lambda: factorize_dpmf_plus(prefix_sum(4), tau=0),
        lambda: factorize_dpmf_plus(prefix_sum(4), tau=5),
        lambda: options_of("dense", tau=2),
        lambda: factorize_dense(prefix_sum(4), tol=-1.0),
        lambda: tree(4, estimator="exact"),
        lambda: options_of("tree", tree_estimator="exact"),
    ],
)
def test_factorization_user_errors(call) -> None:
    with pytest.raises(FedsimError):
        call()


def test_cache_hit_identical_and_not_recomputed(tmp_path: Path) -> None:
    S = prefix_sum(12)
    calls = {"n": 0}

    def compute() -> Factorization:
        calls["n"] += 1
        return dense(S)

    first = cached("dense", compute, A=S, tol=1e-10)
    second = cached("dense", compute, A=S, tol=1e-10)
    assert calls["n"] == 1
    assert first.info["cache"] == "miss" and second.info["cache"] == "hit"
    for name in ("A", "B", "C"):
        assert np.array_equal(getattr(first, name), getattr(second, name))
    assert second.info["iterations"] == first.info["iterations"]
    folder = tmp_path / "cache" / "factorizations"
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 1 and files[0].endswith(".npz")  # no temp files left behind


def test_factorization_cache() -> None:
    S = prefix_sum(10)
    hits = fz.CACHE_STATS["hits"]
    a = factorize_dpmf_plus(S, tau=5)
    b = factorize_dpmf_plus(S, tau=5)
    assert a.info["cache"] == "miss" and b.info["cache"] == "hit"
    assert fz.CACHE_STATS["hits"] == hits + 1
    assert np.array_equal(a.C, b.C) and np.array_equal(a.B, b.B)
    assert factorize_dpmf_plus(S, tau=2).info["cache"] == "miss"
    assert factorize_dpmf_plus(S, tau=5, tol=1e-9).info["cache"] == "miss"
    assert factorize_dense(S).info["cache"] == "miss"
    assert factorize_dense(S, cache=False).info.get("cache") is None
    # τ = None is τ = n
    factorize_dpmf_plus(S, tau=10)
    assert factorize_dpmf_plus(S).info["cache"] == "hit"


def test_cache_key_covers_inputs() -> None:
    S = prefix_sum(8)
    base = cache_key("dense", A=S, tol=1e-10)
    assert cache_key("dense", A=S, tol=1e-10) == base
    assert cache_key("dense", A=S, tol=1e-9) != base
    assert cache_key("dense", A=momentum(8, 0.1), tol=1e-10) != base
    assert cache_key("dense", A=prefix_sum(9), tol=1e-10) != base
    assert cache_key("dpmf_plus", A=S, tol=1e-10) != base
    assert cache_key("dpmf_plus", A=S, tol=1e-10, tau=2) != cache_key("dpmf_plus", A=S, tol=1e-10, tau=3)


def test_cache_corrupt_file_recomputed(tmp_path: Path) -> None:
    S = prefix_sum(6)
    first = factorize_dense(S)
    path = Path(first.info["cache_file"])
    path.write_bytes(b"not an npz")
    with pytest.warns(UserWarning, match="unreadable cache"):
        again = factorize_dense(S)
    assert again.info["cache"] == "miss"
    assert np.array_equal(again.C, first.C)
    assert factorize_dense(S).info["cache"] == "hit"
