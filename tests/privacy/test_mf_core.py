"""MF support: bounded-participation samplers, sensitivity, streaming noise, MF accounting."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant

from fedsim.errors import FedsimError
from fedsim.privacy.accounting import AccountingSpec, EpsilonCurve, epsilon
from fedsim.privacy.mechanisms.banded import BandedStream
from fedsim.privacy.mechanisms.blt import BLTStream
from fedsim.privacy.noise import MatrixStream, NoiseMechanism
from fedsim.privacy.participation import make_scheme
from fedsim.privacy.sensitivity import min_sep, num_bands, sensitivity
from fedsim.seeding import make_generator
from fedsim.server.sampling import make_sampler

# ----------------------------------------------------------------------------- samplers


def _record(sampler, rounds):
    seen = defaultdict(list)
    sizes = []
    for t in range(rounds):
        cohort = sampler.sample(t)
        assert len(cohort) == len(set(cohort))
        sizes.append(len(cohort))
        for u in cohort:
            seen[u].append(t)
    return seen, sizes


def test_single_sampler_each_user_at_most_once():
    # keyed (default): bucket PRF(id) mod ⌈N/K⌉ = 34; every user exactly once over the 34 rounds
    scheme = make_scheme("single", 1000, 30, rounds=34)
    assert scheme.buckets == 34 and scheme.expected_cohort == pytest.approx(1000 / 34)
    seen, sizes = _record(make_sampler(scheme, 5), 34)
    assert all(len(r) == 1 for r in seen.values()) and len(seen) == 1000
    from scipy import stats

    assert stats.chisquare(sizes).pvalue > 1e-4  # multinomial(1000, 1/34) bucket sizes
    with pytest.raises(FedsimError, match="buckets"):
        make_scheme("single", 1000, 30, rounds=35)
    # shuffle: blocks of exactly K positions
    scheme = make_scheme("single", 1000, 30, rounds=33, assignment="shuffle")
    seen, sizes = _record(make_sampler(scheme, 5), 33)
    assert all(len(r) == 1 for r in seen.values())
    assert sizes == [30] * 33 and len(seen) == 990


@pytest.mark.parametrize("assignment", ["keyed", "shuffle"])
def test_epochs_sampler_patterns_are_g_plus_multiples_of_b(assignment):
    n_users, b, k = 103, 5, 4
    scheme = make_scheme("epochs", n_users, None, min_sep=b, max_participations=k, rounds=k * b, assignment=assignment)
    sampler = make_sampler(scheme, 9)
    seen, sizes = _record(sampler, k * b)
    if assignment == "shuffle":
        assert sizes == [n_users // b] * (k * b)
        assert len(seen) == b * (n_users // b)  # the 3 left over never take part
        assert scheme.expected_cohort == n_users // b
    else:
        assert len(seen) == n_users  # every user has a group; sizes vary around N/b
        assert sum(sizes[:b]) == n_users and scheme.expected_cohort == pytest.approx(n_users / b)
    for rounds in seen.values():
        g = rounds[0]
        assert g < b and rounds == list(range(g, k * b, b))


def test_min_sep_poisson_thinning_honours_k_b_and_rate():
    n_users, b, k, kbar = 2000, 10, 50, 40
    scheme = make_scheme(
        "min_sep", n_users, kbar, min_sep=b, max_participations=k, poisson_within_group=True, rounds=k * b
    )
    seen, sizes = _record(make_sampler(scheme, 1), k * b)
    p = kbar / (n_users / b)
    for rounds in seen.values():
        assert len(rounds) <= k
        assert all(y - x >= b for x, y in zip(rounds, rounds[1:]))
        assert len({r % b for r in rounds}) == 1
    # Each eligible user: Binomial(k, p) participations; the total over 2000 users
    # has mean N·k·p and sd √(N·k·p(1−p)); allow 5 sd.
    total = sum(len(r) for r in seen.values())
    mean, sd = n_users * k * p, math.sqrt(n_users * k * p * (1 - p))
    assert abs(total - mean) < 5 * sd
    assert np.std(sizes) > 0


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(name="single", population=100, cohort_size=10, rounds=11), "buckets"),
        (
            dict(name="min_sep", population=100, cohort_size=None, min_sep=10, poisson_within_group=True, rounds=10),
            "needs sampling.cohort_size",
        ),
        (
            dict(name="epochs", population=100, cohort_size=10, min_sep=10, max_participations=2, rounds=21),
            "at most k·b",
        ),
        (
            dict(name="epochs", population=100, cohort_size=5, min_sep=10, poisson_within_group=True, rounds=10),
            "'min_sep' only",
        ),
        (
            dict(name="min_sep", population=100, cohort_size=20, min_sep=10, poisson_within_group=True, rounds=10),
            "group size",
        ),
        (dict(name="poisson", population=100, cohort_size=5, min_sep=3, rounds=10), "sampling.min_sep"),
        (dict(name="min_sep", population=5, cohort_size=1, min_sep=10, rounds=10), "exceeds the population"),
    ],
)
def test_schemes_refuse_what_the_sampler_cannot_honour(kwargs, needle):
    name = kwargs.pop("name")
    with pytest.raises(FedsimError, match=None) as ei:
        make_scheme(name, kwargs.pop("population"), kwargs.pop("cohort_size"), **kwargs)
    assert needle in str(ei.value)


# -------------------------------------------------------------------------- sensitivity


def brute_force_sens2(C, patterns):
    X = C.T @ C
    return max(float(X[np.ix_(p, p)].sum()) for p in patterns)


def minsep_patterns(n, k, b):
    for m in range(1, k + 1):
        for combo in itertools.combinations(range(n), m):
            if all(y - x >= b for x, y in zip(combo, combo[1:])):
                yield list(combo)


def test_identity_sensitivity_is_sqrt_k():
    n = 12
    C = np.eye(n)
    assert sensitivity(C, "single") == (1.0, True)
    assert sensitivity(C, "epochs", k=3, b=4)[0] == pytest.approx(math.sqrt(3))
    assert sensitivity(C, "min_sep", k=3, b=4) == (pytest.approx(math.sqrt(3)), True)


def test_prefix_sum_epochs_sensitivity_matches_loops():
    n, k, b = 12, 3, 4
    S = np.tril(np.ones((n, n)))
    # X[i,j] = #rows ≥ max(i,j) = n − max(i,j); sum over each group's pattern, by loops.
    best = 0
    for g in range(b):
        pat = list(range(g, n, b))[:k]
        best = max(best, sum(n - max(i, j) for i in pat for j in pat))
    sens, exact = sensitivity(S, "epochs", k=k, b=b)
    assert exact and sens == pytest.approx(math.sqrt(best))


def test_banded_min_sep_dp_equals_brute_force():
    rng = np.random.default_rng(0)
    n, b, k = 11, 3, 3
    C = np.tril(rng.standard_normal((n, n)))
    C[np.tril_indices(n, -b)] = 0.0
    assert num_bands(C) == b
    sens, exact = min_sep(C, k, b)
    assert exact
    assert sens**2 == pytest.approx(brute_force_sens2(C, minsep_patterns(n, k, b)), rel=1e-12)


def test_general_min_sep_exact_when_enumerable_and_bound_otherwise():
    n, k, b = 10, 3, 2
    r = [math.comb(2 * i, i) / 4**i for i in range(n)]  # sqrt-Toeplitz: CᵀC ≥ 0
    C = np.array([[r[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])
    truth = brute_force_sens2(C, minsep_patterns(n, k, b))
    sens, exact = min_sep(C, k, b)
    assert exact and sens**2 == pytest.approx(truth, rel=1e-12)
    import fedsim.privacy.sensitivity as sm

    old = sm.MAX_ENUMERATED_PATTERNS
    sm.MAX_ENUMERATED_PATTERNS = 0
    try:
        bound, exact2 = min_sep(C, k, b)
    finally:
        sm.MAX_ENUMERATED_PATTERNS = old
    assert not exact2 and bound**2 >= truth * (1 - 1e-12)


# ------------------------------------------------------------------------------- noise


def dense_reference(M, seed, d):
    from fedsim.privacy.noise import _xi

    Z = torch.stack([_xi(seed, j, d, torch.device("cpu")) for j in range(M.shape[1])]).double().numpy()
    return M @ Z


def random_banded(n, b, seed=0):
    rng = np.random.default_rng(seed)
    C = np.tril(rng.uniform(-0.5, 0.5, (n, n)))
    C[np.tril_indices(n, -b)] = 0.0
    C[np.diag_indices(n)] = rng.uniform(0.8, 1.5, n)
    return C


def test_banded_stream_equals_dense_inverse():
    n, b, d = 12, 3, 7
    C = random_banded(n, b)
    ref = dense_reference(np.linalg.inv(C), 42, d)
    noise = NoiseMechanism(d, 42, "cpu", BandedStream(C, 1.0))
    got = np.stack([noise.row(t).double().numpy() for t in range(n)])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert len(noise.stream.buffer) == b - 1
    Cinv = np.linalg.inv(C)
    for t in range(n):
        assert noise.row_variance(t) == pytest.approx(float((Cinv[t] ** 2).sum()), rel=1e-10)


def test_matrix_noise_equals_dense_in_both_memory_modes():
    n, d = 9, 5
    M = np.linalg.inv(random_banded(n, n, seed=3))
    ref = dense_reference(M, 7, d)
    for budget in (1 << 30, 0):
        noise = NoiseMechanism(d, 7, "cpu", MatrixStream(M, 1.0, memory_budget=budget))
        got = np.stack([noise.row(t).double().numpy() for t in range(n)])
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
        assert noise.row_variance(4) == pytest.approx(float((M[4] ** 2).sum()))


def test_noise_covariance_matches_cinv_cinv_t():
    """Coordinates are i.i.d. draws of the n-vector n_{0..n−1}; their empirical covariance
    over d = 40,000 coordinates must match C⁻¹C⁻ᵀ (entrywise within 5 standard errors)."""
    n, b, d = 6, 3, 40_000
    C = random_banded(n, b, seed=5)
    Cinv = np.linalg.inv(C)
    target = Cinv @ Cinv.T
    noise = NoiseMechanism(d, 3, "cpu", BandedStream(C, 1.0))
    rows = np.stack([noise.row(t).double().numpy() for t in range(n)])
    emp = rows @ rows.T / d
    se = np.sqrt((np.outer(np.diag(target), np.diag(target)) + target**2) / d)
    assert np.all(np.abs(emp - target) <= 5 * se)


def test_banded_noise_resume_is_bit_identical():
    n, b, d = 10, 4, 33
    C = random_banded(n, b, seed=8)
    a = NoiseMechanism(d, 5, "cpu", BandedStream(C, 1.0))
    first = [a.row(t) for t in range(5)]
    state = a.state_dict()
    rest = [a.row(t) for t in range(5, n)]
    other = NoiseMechanism(d, 999, "cpu", BandedStream(C, 1.0))
    other.load_state_dict(state)
    for t in range(5, n):
        assert torch.equal(other.row(t), rest[t - 5])
    with pytest.raises(RuntimeError):
        other.row(0)
    assert first  # rows before the checkpoint were drawn


# -------------------------------------------------------------------------- accounting


def test_mf_epsilon_is_one_gaussian_for_the_whole_run():
    spec = AccountingSpec("dense", "epochs", 1000, 100, 2.0, 1e-5, min_sep=10)
    acc = PLDAccountant()
    acc.compose(dp_event.GaussianDpEvent(2.0))
    expected = acc.get_epsilon(1e-5)
    curve = EpsilonCurve(spec)
    for t in (1, 7, 40):
        assert epsilon(spec, t) == pytest.approx(expected, rel=1e-9)
        assert curve(t) == pytest.approx(expected, rel=1e-9)


def test_amplified_banded_composes_ceil_n_over_b():
    spec = AccountingSpec("banded", "min_sep", 1000, 20, 1.1, 1e-5, min_sep=10, amplified=True)
    p = 20 / 100
    for t in (1, 10, 11, 35):
        acc = PLDAccountant()
        acc.compose(
            dp_event.SelfComposedDpEvent(
                dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(1.1)), math.ceil(t / 10)
            )
        )
        assert epsilon(spec, t) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
        assert EpsilonCurve(spec)(t) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-8)


@pytest.mark.parametrize("mech,scheme", [("dense", "poisson"), ("sqrt", "fixed"), ("gaussian", "epochs")])
def test_incompatible_mechanism_and_scheme_refused(mech, scheme):
    with pytest.raises(FedsimError, match="sampling.scheme|privacy.mechanism"):
        AccountingSpec(mech, scheme, 100, 10, 1.0, 1e-5)


def test_generators_are_independent_per_key():
    a = torch.randn(5, generator=make_generator(1, "noise", 0))
    b = torch.randn(5, generator=make_generator(1, "noise", 1))
    assert not torch.equal(a, b)


def test_blt_noise_stream_equals_dense_and_resumes():
    from scipy.linalg import toeplitz

    from fedsim.privacy.mechanisms.blt import blt_coefficients

    theta, omega = np.array([0.9, 0.5]), np.array([0.3, 0.2])
    n, d = 12, 6
    C = np.tril(toeplitz(blt_coefficients(theta, omega, n)))
    ref = dense_reference(np.linalg.inv(C), 4, d)
    a = NoiseMechanism(d, 4, "cpu", BLTStream(theta, omega, 1.0))
    got = [a.row(t) for t in range(n)]
    np.testing.assert_allclose(np.stack([g.double().numpy() for g in got]), ref, rtol=1e-5, atol=1e-5)
    b = NoiseMechanism(d, 4, "cpu", BLTStream(theta, omega, 1.0))
    for t in range(5):
        b.row(t)
    c = NoiseMechanism(d, 4, "cpu", BLTStream(theta, omega, 1.0))
    c.load_state_dict(b.state_dict())
    for t in range(5, n):
        assert torch.equal(c.row(t), got[t])
