"""BSR (banded square root) and BISR (banded inverse square root): closed forms, streaming
noise, checkpoint state and sensitivity against brute force."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import torch
from scipy.linalg import toeplitz

from fedsim.errors import FedsimError
from fedsim.privacy.mechanisms import factorization_quality, make_noise, mechanism_names, plan_mf, workload_matrix
from fedsim.privacy.mechanisms.bisr import BISRStrategy, inverse_square_root_coefficients, non_increasing
from fedsim.privacy.mechanisms.bsr import square_root_coefficients, workload_beta
from fedsim.privacy.participation import make_scheme
from fedsim.privacy.workloads import momentum

MECHS = ("bsr", "bisr")
WORKLOADS = ("prefix", "momentum")


def single(n: int):
    return make_scheme("single", 10 * n, 10, rounds=n)


def group(name: str, n: int, b: int, k: int):
    """epochs/min_sep (k, b); ``k·b < n`` is allowed here (the sampler would refuse it, the
    sensitivity is still defined: at most k participations)."""
    return make_scheme(name, 100, None, min_sep=b, max_participations=k, rounds=n if n <= k * b else None)


def draws(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, object]:
    """Z (float32 values, as float64) and ``draw(j)`` returning a fresh copy of row j."""
    Z = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return Z.astype(np.float64), lambda j: torch.from_numpy(Z[j].copy())


def run_stream(stream, ts, draw) -> list[torch.Tensor]:
    return [stream.step(t, draw).clone() for t in ts]


# --------------------------------------------------------------------------- closed forms


def test_registered():
    names = mechanism_names(correlated=True)
    assert "bsr" in names and "bisr" in names


@pytest.mark.parametrize("mech", MECHS)
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("bands", [1, 2, 5, 40])
def test_factorization_reproduces_workload(mech, workload, bands):
    n = 40
    plan = plan_mf(mech, single(n), n, workload=workload, bands=bands, momentum=0.9)
    A = workload_matrix(workload, n, 0.9)
    C = plan.C
    assert C.shape == (n, n) and np.array_equal(C, np.tril(C))
    B = A @ plan.noising
    assert np.linalg.norm(B @ C - A) <= 1e-8 * np.linalg.norm(A)
    np.testing.assert_allclose(plan.noising @ C, np.eye(n), atol=1e-9)


def test_bsr_full_band_is_sqrt():
    n = 48
    sq = plan_mf("sqrt", single(n), n)
    bsr = plan_mf("bsr", single(n), n)  # default bands: the rounds under single participation
    np.testing.assert_array_equal(bsr.C, sq.C)
    assert bsr.sens == pytest.approx(sq.sens, rel=1e-14)


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9])
def test_square_roots_of_momentum_workload(beta):
    n = 32
    A = momentum(n, beta)
    R = toeplitz(square_root_coefficients(n, beta), np.zeros(n))  # lower-triangular Toeplitz
    np.testing.assert_allclose(R @ R, A, rtol=1e-12, atol=1e-12)
    P = toeplitz(inverse_square_root_coefficients(n, beta), np.zeros(n))
    np.testing.assert_allclose(P @ P @ A, np.eye(n), atol=1e-10)
    assert workload_beta(A) == pytest.approx(beta, abs=1e-14)
    m = square_root_coefficients(n, beta)
    assert m[0] == 1 and np.all(m > 0) and np.all(np.diff(m) <= 0)
    assert np.all(inverse_square_root_coefficients(n, beta)[1:] < 0)  # so C = (banded C⁻¹)⁻¹ ≥ 0


@pytest.mark.parametrize("mech", MECHS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_one_band_is_identity(mech, workload):
    n = 16
    plan = plan_mf(mech, single(n), n, workload=workload, bands=1)
    np.testing.assert_array_equal(plan.C, np.eye(n))
    np.testing.assert_array_equal(plan.noising, np.eye(n))
    assert plan.sens == 1.0 and plan.sens_exact


def test_bisr_full_band_is_inverse_square_root():
    n = 64
    plan = plan_mf("bisr", single(n), n, bands=n)
    S_inv = np.eye(n) - np.eye(n, k=-1)
    Cinv = plan.noising
    np.testing.assert_allclose(Cinv @ Cinv, S_inv, atol=1e-12)
    np.testing.assert_allclose(Cinv[:4, 0], [1.0, -0.5, -0.125, -0.0625])
    np.testing.assert_allclose(plan.C, plan_mf("sqrt", single(n), n).C, atol=1e-12)
    # banded: C⁻¹ has exactly b bands, C is dense
    banded = plan_mf("bisr", single(n), n, bands=6)
    assert np.all(np.tril(banded.noising, -6) == 0) and np.all(banded.C[np.tril_indices(n)] > 0)


def test_workload_must_be_a_momentum_workload():
    with pytest.raises(FedsimError, match="workload"):
        workload_beta(momentum(8, 0.5, learning_rates=np.linspace(1.0, 0.5, 8)))


# --------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("mech", MECHS)
@pytest.mark.parametrize("bands", [1, 2, 5, 30])
def test_stream_equals_dense_noise(mech, bands):
    n, d = 30, 9
    plan = plan_mf(mech, single(n), n, workload="momentum", bands=bands)
    Z, draw = draws(n, d)
    stream = plan.strategy.stream(plan.sens, mech)
    stream.bind(d, torch.device("cpu"))
    rows = torch.stack(run_stream(stream, range(n), draw)).numpy()
    np.testing.assert_allclose(rows, plan.noising @ Z, rtol=1e-4, atol=1e-4)
    for t in (0, 3, n - 1):
        assert stream.row_variance(t) == pytest.approx(float((plan.noising[t] ** 2).sum()), rel=1e-6)


@pytest.mark.parametrize("mech", MECHS)
def test_noise_mechanism_uses_the_run_key(mech):
    n, d = 12, 5
    plan = plan_mf(mech, group("min_sep", n, 4, 3), n)
    noise = make_noise(mech, d, 7, "cpu", plan)
    rows = np.stack([noise.row(t).numpy() for t in range(n)])
    Z = np.stack([noise.draw(j).numpy() for j in range(n)]).astype(np.float64)
    np.testing.assert_allclose(rows, plan.noising @ Z, atol=1e-5)
    assert noise.sensitivity == plan.sens


@pytest.mark.parametrize("mech", MECHS)
def test_empirical_covariance(mech):
    n, d = 16, 40_000
    plan = plan_mf(mech, group("min_sep", n, 4, 4), n)
    gen = torch.Generator().manual_seed(3)
    Z = torch.randn(n, d, generator=gen)
    stream = plan.strategy.stream(plan.sens, mech)
    stream.bind(d, torch.device("cpu"))
    N = torch.stack(run_stream(stream, range(n), lambda j: Z[j].clone())).double().numpy()
    M = plan.noising
    cov = M @ M.T
    emp = N @ N.T / d
    scale = np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    assert np.max(np.abs(emp - cov) / scale) < 6 / np.sqrt(d)


@pytest.mark.parametrize("mech", MECHS)
@pytest.mark.parametrize("bands,stop", [(6, 3), (6, 9), (2, 5), (1, 4)])
def test_state_round_trips_mid_stream(mech, bands, stop):
    n, d = 20, 6
    plan = plan_mf(mech, single(n), n, bands=bands)
    _, draw = draws(n, d, seed=5)
    whole = plan.strategy.stream(plan.sens, mech)
    whole.bind(d, torch.device("cpu"))
    expected = run_stream(whole, range(n), draw)

    first = plan.strategy.stream(plan.sens, mech)
    first.bind(d, torch.device("cpu"))
    head = run_stream(first, range(stop), draw)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf)

    second = plan.strategy.stream(plan.sens, mech)
    second.bind(d, torch.device("cpu"))
    second.load_state_dict(state)
    assert second.next_round() == stop
    tail = run_stream(second, range(stop, n), draw)
    for a, b in zip(head + tail, expected, strict=True):
        assert torch.equal(a, b)


def test_bisr_stream_refuses_out_of_order_and_past_the_end():
    n = 5
    plan = plan_mf("bisr", single(n), n, bands=3)
    stream = plan.strategy.stream(plan.sens, "bisr")
    stream.bind(2, torch.device("cpu"))
    _, draw = draws(n, 2)
    with pytest.raises(FedsimError, match="in order"):
        stream.step(1, draw)
    run_stream(stream, range(n), draw)
    with pytest.raises(FedsimError, match="rounds"):
        stream.step(n, draw)


# --------------------------------------------------------------------------- sensitivity


def brute_force(C: np.ndarray, patterns) -> float:
    X = C.T @ C
    return float(np.sqrt(max(X[np.ix_(p, p)].sum() for p in patterns)))


def min_sep_patterns(n: int, k: int, b: int):
    for m in range(1, k + 1):
        for p in itertools.combinations(range(n), m):
            if all(q - r >= b for r, q in itertools.pairwise(p)):
                yield list(p)


def epoch_patterns(n: int, k: int, b: int):
    return [list(range(g, n, b))[:k] for g in range(b)]


SCHEMES = [("single", 1, 12), ("epochs", 4, 3), ("min_sep", 4, 3), ("min_sep", 2, 4), ("epochs", 3, 5)]


@pytest.mark.parametrize("mech", MECHS)
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("scheme_name,k,b", SCHEMES)
@pytest.mark.parametrize("bands", [1, 2, 3, 12])
def test_sensitivity_equals_brute_force(mech, workload, scheme_name, k, b, bands):
    n = 12
    if mech == "bsr" and scheme_name == "min_sep" and bands > b:
        pytest.skip("refused (tested below)")
    scheme = single(n) if scheme_name == "single" else group(scheme_name, n, b, k)
    plan = plan_mf(mech, scheme, n, workload=workload, bands=bands)
    if scheme_name == "single":
        patterns = [[j] for j in range(n)]
    elif scheme_name == "epochs":
        patterns = epoch_patterns(n, k, b)
    else:
        patterns = list(min_sep_patterns(n, k, b))
    assert plan.sens_exact
    assert plan.sens == pytest.approx(brute_force(plan.C, patterns), rel=1e-12)


def test_bisr_uses_the_exact_toeplitz_method_at_scale():
    n, b = 512, 16
    plan = plan_mf("bisr", group("min_sep", n, b, n // b), n)
    assert plan.sens_exact and plan.info["coefficients_monotone"]
    assert "exact" in plan.info["sensitivity_method"]
    # the worst pattern {0, b, 2b, …}, summed directly
    pat = list(range(0, n, b))
    X = plan.C.T @ plan.C
    assert plan.sens == pytest.approx(float(np.sqrt(X[np.ix_(pat, pat)].sum())), rel=1e-10)


def test_bisr_without_monotone_coefficients_falls_back_to_a_bound():
    n, k, b = 12, 3, 3
    strategy = BISRStrategy(np.array([1.0, 0.5]), n, {})  # C has coefficients 1, −1/2, 1/4, … (signs alternate)
    assert not non_increasing(strategy.coefficients())
    sens, exact = strategy.sensitivity(group("min_sep", n, b, k))
    assert not exact
    C = strategy.materialize()
    X = C.T @ C
    best = 0.0
    for p in min_sep_patterns(n, k, b):  # aligned or opposite contributions: a lower bound on the true sens²
        for signs in itertools.product((1.0, -1.0), repeat=len(p)):
            s = np.array(signs)
            best = max(best, float(s @ X[np.ix_(p, p)] @ s))
    assert sens >= np.sqrt(best) - 1e-12
    assert strategy.sensitivity(single(n)) == (pytest.approx(np.linalg.norm(C[:, 0])), True)


# --------------------------------------------------------------------------- options


def test_bsr_refuses_more_bands_than_min_sep():
    with pytest.raises(FedsimError, match=r"privacy.bands = 5 exceeds sampling.min_sep = 4"):
        plan_mf("bsr", group("min_sep", 16, 4, 4), 16, bands=5)
    plan_mf("bsr", group("epochs", 16, 4, 4), 16, bands=5)  # epochs: exact without the band limit


@pytest.mark.parametrize("mech", MECHS)
def test_bands_at_most_rounds_and_defaults(mech):
    with pytest.raises(FedsimError, match="between 1 and the rounds"):
        plan_mf(mech, single(8), 8, bands=9)
    with pytest.raises(FedsimError):
        plan_mf(mech, single(8), 8, bands=0)
    with pytest.raises(FedsimError, match="objective"):
        plan_mf(mech, single(8), 8, objective="total")
    assert plan_mf(mech, group("min_sep", 32, 4, 8), 32).info["bands"] == 4
    assert plan_mf(mech, single(32), 32).info["bands"] == 32


def test_bisr_bands_may_exceed_min_sep():
    n = 32
    plan = plan_mf("bisr", group("min_sep", n, 4, 8), n, bands=12)
    assert plan.info["bands"] == 12 and plan.sens_exact


def test_quality_of_full_band_matches_sqrt():
    n = 64
    A = workload_matrix("prefix", n)
    q_bsr = factorization_quality(plan_mf("bsr", single(n), n), A)
    q_sqrt = factorization_quality(plan_mf("sqrt", single(n), n), A)
    assert q_bsr["loss"] == pytest.approx(q_sqrt["loss"], rel=1e-10)
