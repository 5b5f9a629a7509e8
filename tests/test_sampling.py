"""Cohort samplers honour their participation scheme (docs/algorithms.md §2).

All statistical checks run on fixed seeds (so they are deterministic) with
tolerances of 4-5 standard errors derived from the sampling distribution."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import stats

from fedsim.errors import FedsimError
from fedsim.privacy.participation import (
    FixedScheme,
    ParticipationScheme,
    PoissonScheme,
    make_scheme,
)
from fedsim.server.sampling import FixedSampler, PoissonSampler, make_sampler

N, KBAR, ROUNDS = 200, 20, 2000
Q = KBAR / N


def inclusion_matrix(sampler, rounds: int, n: int) -> np.ndarray:
    x = np.zeros((rounds, n), dtype=np.int8)
    for t in range(rounds):
        cohort = sampler.sample(t)
        assert cohort == sorted(cohort)
        assert len(set(cohort)) == len(cohort)
        assert all(isinstance(i, int) and 0 <= i < n for i in cohort)
        x[t, cohort] = 1
    return x


@pytest.fixture(scope="module")
def poisson_x() -> np.ndarray:
    return inclusion_matrix(make_sampler(PoissonScheme(N, KBAR), seed=2024), ROUNDS, N)


@pytest.fixture(scope="module")
def fixed_x() -> np.ndarray:
    return inclusion_matrix(make_sampler(FixedScheme(N, KBAR), seed=2024), ROUNDS, N)


# --- Poisson --------------------------------------------------------------------------


def test_poisson_per_user_frequency(poisson_x):
    counts = poisson_x.sum(axis=0).astype(float)
    mean, sd = ROUNDS * Q, math.sqrt(ROUNDS * Q * (1 - Q))
    zs = (counts - mean) / sd
    # every user's count within 5 SD of Binomial(ROUNDS, q)
    assert np.abs(zs).max() < 5, np.abs(zs).max()
    # users are independent under Poisson sampling: sum of z² ~ chi²(N); two-sided 1e-4
    chi2 = float((zs**2).sum())
    assert stats.chi2.sf(chi2, N) > 1e-4 and stats.chi2.cdf(chi2, N) > 1e-4, chi2


def test_poisson_cohort_size_mean_and_variance(poisson_x):
    sizes = poisson_x.sum(axis=1).astype(float)
    # size ~ Binomial(N, q): mean N q, variance N q (1-q)
    var = N * Q * (1 - Q)
    se_mean = math.sqrt(var / ROUNDS)
    assert abs(sizes.mean() - KBAR) < 4 * se_mean
    # sample variance SE for a binomial: sqrt((mu4 - var²(n-3)/(n-1)) / n) ≈ var·sqrt(2/n) (+ small kurtosis)
    mu4 = var * (1 + 3 * (N - 2) * Q * (1 - Q))  # 4th central moment of a binomial
    se_var = math.sqrt((mu4 - var**2 * (ROUNDS - 3) / (ROUNDS - 1)) / ROUNDS)
    assert abs(sizes.var(ddof=1) - var) < 5 * se_var
    # cohort size really varies (not a fixed-size sampler in disguise)
    assert len(np.unique(sizes)) >= 10
    assert sizes.min() < KBAR - 5 and sizes.max() > KBAR + 5


def test_poisson_rounds_independent(poisson_x):
    x = poisson_x.astype(float)
    # overlap of consecutive cohorts: E|S_t ∩ S_{t+1}| = N q², var = N q²(1-q²)
    overlap = (x[1:] * x[:-1]).sum(axis=1)
    se = math.sqrt(N * Q**2 * (1 - Q**2) / len(overlap))
    assert abs(overlap.mean() - N * Q**2) < 5 * se
    # lag-1 autocorrelation of cohort sizes ≈ 0 (SE ≈ 1/sqrt(rounds))
    sizes = x.sum(axis=1)
    r = np.corrcoef(sizes[1:], sizes[:-1])[0, 1]
    assert abs(r) < 5 / math.sqrt(ROUNDS)
    # a user's consecutive inclusions: P(in t+1 | in t) = q
    both = (x[1:] * x[:-1]).sum()
    first = x[:-1].sum()
    p_hat = both / first
    assert abs(p_hat - Q) < 5 * math.sqrt(Q * (1 - Q) / first)


def test_poisson_pairwise_coinclusion(poisson_x):
    x = poisson_x.astype(float)
    co = (x.T @ x) / ROUNDS
    off = co[~np.eye(N, dtype=bool)]
    # average pairwise co-inclusion ≈ q² (pairs are independent under Poisson sampling)
    assert abs(off.mean() - Q**2) < 0.1 * Q**2
    # and no pair is wildly off (each co-count ~ Binomial(ROUNDS, q²); loose: 6 SD)
    sd = math.sqrt(Q**2 * (1 - Q**2) / ROUNDS)
    assert np.abs(off - Q**2).max() < 6 * sd


def test_poisson_extreme_rates():
    everyone = make_sampler(PoissonScheme(10, 10), seed=1)
    assert all(everyone.sample(t) == list(range(10)) for t in range(20))


# --- fixed ------------------------------------------------------------------------------


def test_fixed_exact_cohort_size(fixed_x):
    assert (fixed_x.sum(axis=1) == KBAR).all()


def test_fixed_per_user_frequency(fixed_x):
    counts = fixed_x.sum(axis=0).astype(float)
    # each round includes a given user with probability K/N, independently across rounds
    mean, sd = ROUNDS * Q, math.sqrt(ROUNDS * Q * (1 - Q))
    assert np.abs((counts - mean) / sd).max() < 5
    assert counts.sum() == ROUNDS * KBAR


def test_fixed_rounds_independent(fixed_x):
    x = fixed_x.astype(float)
    # |S_t ∩ S_{t+1}| ~ Hypergeometric(N, K, K): mean K²/N
    overlap = (x[1:] * x[:-1]).sum(axis=1)
    hyper_var = KBAR * (KBAR / N) * (1 - KBAR / N) * (N - KBAR) / (N - 1)
    assert abs(overlap.mean() - KBAR**2 / N) < 5 * math.sqrt(hyper_var / len(overlap))
    # pairwise co-inclusion ≈ K(K-1)/(N(N-1))
    co = (x.T @ x) / ROUNDS
    off = co[~np.eye(N, dtype=bool)]
    expect = KBAR * (KBAR - 1) / (N * (N - 1))
    assert abs(off.mean() - expect) < 1e-12 + 1e-3 * expect  # exact: sum of co-counts is fixed


def test_fixed_full_population():
    s = make_sampler(FixedScheme(7, 7), seed=3)
    assert all(s.sample(t) == list(range(7)) for t in range(5))


# --- determinism ------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", [PoissonScheme(50, 5), FixedScheme(50, 5)])
def test_same_seed_same_cohorts_pure_in_t(scheme):
    a = make_sampler(scheme, seed=99)
    b = make_sampler(scheme, seed=99)
    forward = [a.sample(t) for t in range(30)]
    backward = [b.sample(t) for t in reversed(range(30))][::-1]
    assert forward == backward
    assert [a.sample(t) for t in (17, 3, 17)] == [forward[17], forward[3], forward[17]]
    # consecutive rounds are not copies of each other
    assert len({tuple(c) for c in forward}) > 25
    c = make_sampler(scheme, seed=100)
    assert [c.sample(t) for t in range(30)] != forward


def test_sampler_state_round_trip():
    scheme = PoissonScheme(60, 6)
    a = make_sampler(scheme, seed=5)
    b = make_sampler(scheme, seed=0)
    b.load_state_dict(a.state_dict())
    assert [b.sample(t) for t in range(10)] == [a.sample(t) for t in range(10)]
    with pytest.raises(FedsimError):
        make_sampler(FixedScheme(60, 6), seed=5).load_state_dict(a.state_dict())
    with pytest.raises(FedsimError):
        make_sampler(PoissonScheme(60, 7), seed=5).load_state_dict(a.state_dict())


# --- schemes and make_sampler -----------------------------------------------------------


def test_make_sampler_types():
    assert type(make_sampler(PoissonScheme(10, 2), 0)) is PoissonSampler
    assert type(make_sampler(FixedScheme(10, 2), 0)) is FixedSampler
    assert type(make_sampler(make_scheme("poisson", 10, 2), 0)) is PoissonSampler
    assert type(make_sampler(make_scheme("fixed", 10, 2), 0)) is FixedSampler


def test_make_sampler_refuses_unknown_scheme():
    @dataclass(frozen=True)
    class EpochsScheme(ParticipationScheme):
        name = "epochs"

    with pytest.raises(FedsimError, match="epochs"):
        make_sampler(EpochsScheme(10, 2), seed=0)
    with pytest.raises(FedsimError):
        make_sampler(ParticipationScheme(10, 2), seed=0)


def test_make_scheme_validation():
    assert make_scheme("poisson", 100, 10).sampling_rate == 0.1
    with pytest.raises(FedsimError, match="stratified"):
        make_scheme("stratified", 100, 10)
    with pytest.raises(FedsimError, match="sampling.cohort_size"):
        make_scheme("fixed", 10, 11)
    with pytest.raises(FedsimError, match="sampling.cohort_size"):
        make_scheme("poisson", 10, 0)
    with pytest.raises(FedsimError):
        make_scheme("poisson", 0, 0)
