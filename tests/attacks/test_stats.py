"""fedsim.attacks.stats: exposure, ROC metrics, bootstrap, Clopper–Pearson and ε lower bounds,
checked against closed forms, brute-force enumeration and seeded repeated trials of mechanisms
whose ε is known exactly."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import optimize, special, stats

from fedsim.attacks import (
    bootstrap_ci,
    clopper_pearson,
    epsilon_lower_bound,
    epsilon_lower_bound_from_scores,
    exposure,
    extrapolated_exposure,
    rank,
    roc_auc,
    roc_curve,
    skewnorm_logcdf,
    tpr_at_fpr,
)
from fedsim.errors import FedsimError

# --------------------------------------------------------------------------- rank and exposure


def test_rank_and_exposure_hand_example():
    refs = np.arange(1.0, 16.0)  # 15 references: 1, 2, …, 15; |R| = 16
    r = rank(4.5, refs)
    assert r == 5  # 1, 2, 3, 4 are more likely than the secret
    assert exposure(r, 16) == pytest.approx(4.0 - math.log2(5.0), abs=1e-15)
    assert rank(15.5, refs) == 16 and exposure(16, 16) == 0.0  # least likely candidate: exposure 0


def test_best_secret_has_exposure_log2_of_space():
    refs = np.arange(1.0, 16.0)
    assert rank(0.5, refs) == 1
    assert exposure(rank(0.5, refs), 16) == 4.0
    assert exposure(1, 10**30) == pytest.approx(30 * math.log2(10))  # Python int space sizes work
    assert rank(3.0, []) == 1  # a candidate set of one


def test_ties_count_against_the_secret():
    refs = [1.0, 2.0, 2.0, 2.0, 3.0]
    assert rank(2.0, refs) == 5  # the three tied references rank ahead of the secret
    assert exposure(rank(2.0, refs), 6) == pytest.approx(math.log2(6) - math.log2(5))
    assert rank(7.0, [7.0] * 9) == 10  # tied with everything: worst rank, exposure 0
    assert exposure(10, 10) == 0.0


def test_rank_and_exposure_reject_bad_values():
    with pytest.raises(FedsimError, match="NaN"):
        rank(float("nan"), [1.0])
    with pytest.raises(FedsimError, match="NaN"):
        rank(1.0, [1.0, float("nan")])
    with pytest.raises(FedsimError, match="rank must be"):
        exposure(0, 10)
    with pytest.raises(FedsimError, match="space_size"):
        exposure(11, 10)


# A tiny "model": i.i.d. characters from a categorical distribution over 5 letters. The secret
# format is 3 characters, so |R| = 125 and every candidate's log-perplexity can be enumerated.
LETTERS = "abcde"


def _log_perplexity(s: str, probs: dict[str, float]) -> float:
    # fsum is correctly rounded, so permutations of the same letters tie exactly
    return math.fsum(sorted(-math.log2(probs[c]) for c in s))


def test_rank_on_a_hand_computable_model():
    probs = dict(zip(LETTERS, [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 16]))  # -log2 p = 1, 2, 3, 4, 4
    space = ["".join(t) for t in itertools.product(LETTERS, repeat=3)]

    def rank_of(secret: str) -> int:
        return rank(_log_perplexity(secret, probs), [_log_perplexity(r, probs) for r in space if r != secret])

    # "aab" (4 bits) is beaten only by "aaa" (3 bits) and tied with "aba", "baa": rank 4
    assert rank_of("aab") == 4
    assert exposure(rank_of("aab"), 125) == pytest.approx(math.log2(125) - 2.0)
    # "aac" (5 bits): aaa, 3 perms of aab, 3 of abb and 3 of aac (itself included): rank 10
    assert rank_of("aac") == 10
    assert exposure(rank_of("aaa"), 125) == pytest.approx(math.log2(125))


def test_rank_matches_enumeration_for_every_secret():
    probs = dict(zip(LETTERS, [0.4, 0.25, 0.2, 0.1, 0.05]))
    space = ["".join(t) for t in itertools.product(LETTERS, repeat=3)]
    scores = {s: _log_perplexity(s, probs) for s in space}
    for secret in space:
        # independent rank: the secret's 1-based position when sorted by score, ties placed before it
        ordered = sorted(space, key=lambda r: (scores[r], r == secret))
        expected = ordered.index(secret) + 1
        got = rank(scores[secret], [scores[r] for r in space if r != secret])
        assert got == expected, secret
        assert exposure(got, len(space)) == pytest.approx(math.log2(125) - math.log2(expected), abs=1e-12)


# --------------------------------------------------------------------------- skew-normal tail


@pytest.mark.parametrize("z", [-40.0, -10.0, -3.0, 0.0, 2.0])
def test_skewnorm_logcdf_with_zero_shape_is_log_ndtr(z):
    assert skewnorm_logcdf(z, 0.0) == pytest.approx(float(special.log_ndtr(z)), rel=1e-10)
    assert skewnorm_logcdf(3.0 + 2.0 * z, 0.0, loc=3.0, scale=2.0) == pytest.approx(
        float(special.log_ndtr(z)), rel=1e-10
    )


@pytest.mark.parametrize(
    "shape,z", [(3.0, -10.0), (3.0, -40.0), (10.0, -2.0), (10.0, -10.0), (-5.0, -40.0), (0.5, -40.0)]
)
def test_skewnorm_logcdf_matches_high_precision_quadrature_far_in_the_tail(shape, z):
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40
    a, zz = mp.mpf(shape), mp.mpf(z)
    r = -zz + a * mp.npdf(a * zz) / mp.ncdf(a * zz)  # breakpoints on the density's own scale
    pts = [-mp.inf] + [zz - mp.mpf(k) / r for k in (400, 100, 30, 10, 3, 1, 0)]
    exact = float(mp.log(mp.quad(lambda t: 2 * mp.npdf(t) * mp.ncdf(a * t), pts)))
    got = skewnorm_logcdf(z, shape)
    assert math.isfinite(got)  # scipy's own logcdf is -inf for most of these
    assert got == pytest.approx(exact, rel=1e-9)


# --------------------------------------------------------------------------- extrapolated exposure


@pytest.mark.parametrize(
    "dist", [stats.skewnorm(4.0, loc=60.0, scale=10.0), stats.norm(50.0, 8.0)], ids=["skewnormal", "normal"]
)
def test_extrapolated_exposure_recovers_the_true_tail(dist):
    """References drawn from a known distribution: the estimate approaches −log2 F_true(secret).

    Tolerance (from 20 seeds of 5,000 references each): mean error ≤ 0.4 bits and every seed
    within 1 bit at 10 bits of exposure (F = 1e-3), within 2 bits at 20 bits (F = 1e-6)."""
    n = 5000
    for q, max_err in [(1e-3, 1.0), (1e-6, 2.0)]:
        secret = float(dist.ppf(q))
        errors = []
        for seed in range(10):
            refs = dist.rvs(size=n, random_state=np.random.default_rng(seed))
            est = extrapolated_exposure(secret, refs)
            errors.append(est.extrapolated - (-math.log2(q)))
            assert est.n_references == n
            assert est.empirical_rank == rank(secret, refs)
            assert est.empirical == exposure(est.empirical_rank, n + 1) <= math.log2(n + 1)
        assert abs(np.mean(errors)) <= 0.4
        assert np.max(np.abs(errors)) <= max_err


def test_extrapolated_exposure_does_not_underflow():
    refs = stats.norm(50.0, 8.0).rvs(size=2000, random_state=np.random.default_rng(1))
    est = extrapolated_exposure(50.0 - 80 * 8.0, refs)  # 80 standard deviations below the mean
    assert math.isfinite(est.extrapolated) and est.extrapolated > 3000  # log2-CDF ≈ −4600 bits
    assert est.empirical == pytest.approx(math.log2(2001))  # the sample saturates at rank 1
    above = extrapolated_exposure(50.0 + 10 * 8.0, refs)
    assert 0.0 <= above.extrapolated < 1e-6 and above.empirical == 0.0


def test_extrapolated_exposure_rejects_unusable_references():
    with pytest.raises(FedsimError, match="at least 10"):
        extrapolated_exposure(1.0, [1.0, 2.0, 3.0])
    with pytest.raises(FedsimError, match="all equal"):
        extrapolated_exposure(1.0, [2.0] * 50)
    with pytest.raises(FedsimError, match="infinite"):
        extrapolated_exposure(1.0, [2.0] * 49 + [np.inf])


# --------------------------------------------------------------------------- ROC metrics


def _brute_auc(m, n):
    diff = np.subtract.outer(np.asarray(m, float), np.asarray(n, float))
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


def _brute_tpr_at_fpr(m, n, target):
    m, n = np.asarray(m, float), np.asarray(n, float)
    best = 0.0  # threshold +inf: nothing flagged
    for t in np.unique(np.concatenate([m, n])):
        if np.mean(n >= t) <= target:
            best = max(best, float(np.mean(m >= t)))
    return best


def test_roc_curve_hand_example_and_endpoints():
    fpr, tpr, th = roc_curve([3.0, 2.0], [1.0, 2.0])
    np.testing.assert_array_equal(th, [np.inf, 3.0, 2.0, 1.0])
    np.testing.assert_array_equal(tpr, [0.0, 0.5, 1.0, 1.0])
    np.testing.assert_array_equal(fpr, [0.0, 0.0, 0.5, 1.0])
    rng = np.random.default_rng(3)
    fpr, tpr, th = roc_curve(rng.normal(1, 1, 57), rng.normal(0, 1, 43))
    assert (fpr[0], tpr[0]) == (0.0, 0.0) and (fpr[-1], tpr[-1]) == (1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0) and np.all(np.diff(th) < 0)


@pytest.mark.parametrize("seed", range(5))
def test_auc_and_tpr_at_fpr_match_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    m = rng.integers(0, 12, size=int(rng.integers(5, 80))).astype(float) + 1.5
    n = rng.integers(0, 10, size=int(rng.integers(5, 80))).astype(float)
    auc = roc_auc(m, n)
    assert auc == pytest.approx(_brute_auc(m, n), abs=1e-12)
    fpr, tpr, _ = roc_curve(m, n)
    assert auc == pytest.approx(float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2)), abs=1e-12)  # trapezoid
    for target in [0.0, 0.01, 0.05, 0.1, 1 / 3, 0.5, 1.0]:
        assert tpr_at_fpr(m, n, target) == _brute_tpr_at_fpr(m, n, target)


def test_auc_extremes():
    assert roc_auc([5.0, 6.0, 7.0], [1.0, 2.0]) == 1.0
    assert roc_auc([1.0, 2.0], [5.0, 6.0, 7.0]) == 0.0
    assert roc_auc([1.0, 2.0, 2.0, 3.0], [3.0, 2.0, 1.0, 2.0]) == 0.5  # same multiset
    assert roc_auc([4.0] * 3, [4.0] * 5) == 0.5  # all tied
    assert tpr_at_fpr([5.0, 6.0, 7.0], [1.0, 2.0], 0.0) == 1.0
    with pytest.raises(FedsimError, match="fpr must"):
        tpr_at_fpr([1.0], [0.0], 1.5)
    with pytest.raises(FedsimError, match="at least 1"):
        roc_auc([], [1.0])


def test_bootstrap_matches_normal_theory_for_a_difference_of_means():
    rng = np.random.default_rng(7)
    m, n = rng.normal(1.0, 1.0, 400), rng.normal(0.0, 2.0, 300)

    def diff(a, b):
        return float(a.mean() - b.mean())

    ci = bootstrap_ci(diff, m, n, n_boot=2000, level=0.9, seed=1)
    se = math.sqrt(m.var(ddof=1) / m.size + n.var(ddof=1) / n.size)
    half = stats.norm.ppf(0.95) * se
    assert ci.estimate == pytest.approx(diff(m, n))
    assert ci.low == pytest.approx(ci.estimate - half, abs=0.1 * half)
    assert ci.high == pytest.approx(ci.estimate + half, abs=0.1 * half)
    assert (ci.level, ci.n_boot) == (0.9, 2000)
    assert bootstrap_ci(diff, m, n, n_boot=200, seed=1) == bootstrap_ci(diff, m, n, n_boot=200, seed=1)
    assert bootstrap_ci(diff, m, n, n_boot=200, seed=1) != bootstrap_ci(diff, m, n, n_boot=200, seed=2)


def test_bootstrap_auc_interval_and_errors():
    rng = np.random.default_rng(8)
    m, n = rng.normal(1.0, 1.0, 200), rng.normal(0.0, 1.0, 200)
    ci = bootstrap_ci(roc_auc, m, n, n_boot=300)
    assert ci.low < ci.estimate < ci.high
    true_auc = stats.norm.cdf(1.0 / math.sqrt(2.0))  # P(N(1,1) > N(0,1))
    assert ci.low < true_auc < ci.high
    with pytest.raises(FedsimError, match="level"):
        bootstrap_ci(roc_auc, m, n, level=95)
    with pytest.raises(FedsimError, match="n_boot"):
        bootstrap_ci(roc_auc, m, n, n_boot=0)
    with pytest.raises(FedsimError, match="non-finite"):
        bootstrap_ci(lambda a, b: float("nan"), m, n, n_boot=5)


# --------------------------------------------------------------------------- Clopper–Pearson


@pytest.mark.parametrize("n", [1, 7, 100, 2500])
@pytest.mark.parametrize("conf", [0.9, 0.95, 0.999])
def test_clopper_pearson_closed_forms_at_zero_and_n(n, conf):
    alpha = 1.0 - conf
    assert clopper_pearson(0, n, conf, side="upper") == (0.0, pytest.approx(1.0 - alpha ** (1.0 / n), rel=1e-9))
    assert clopper_pearson(n, n, conf, side="lower") == (pytest.approx(alpha ** (1.0 / n), rel=1e-9), 1.0)
    lo, hi = clopper_pearson(0, n, conf)
    assert lo == 0.0 and hi == pytest.approx(1.0 - (alpha / 2) ** (1.0 / n), rel=1e-9)
    lo, hi = clopper_pearson(n, n, conf)
    assert hi == 1.0 and lo == pytest.approx((alpha / 2) ** (1.0 / n), rel=1e-9)


@pytest.mark.parametrize("k,n", [(1, 10), (37, 200), (199, 200), (500, 1000)])
def test_clopper_pearson_bounds_are_the_binomial_tail_inversions(k, n):
    lo, _ = clopper_pearson(k, n, 0.95, side="lower")
    _, hi = clopper_pearson(k, n, 0.95, side="upper")
    assert stats.binom.sf(k - 1, n, lo) == pytest.approx(0.05, rel=1e-8)  # P(X ≥ k | p = lo) = α
    assert stats.binom.cdf(k, n, hi) == pytest.approx(0.05, rel=1e-8)  # P(X ≤ k | p = hi) = α
    assert lo < k / n < hi
    with pytest.raises(FedsimError):
        clopper_pearson(k + n + 1, n)
    with pytest.raises(FedsimError, match="side"):
        clopper_pearson(k, n, side="both")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- ε lower bounds


def test_epsilon_lower_bound_closed_form_for_a_perfect_test():
    n1, n0, conf, delta = 400, 300, 0.95, 1e-3
    res = epsilon_lower_bound(n1, 0, 0, n0, delta, conf)
    half = (1.0 - conf) / 2
    tpr_lo, fpr_hi = half ** (1 / n1), 1.0 - half ** (1 / n0)  # one-sided CP at level (1 + conf)/2
    expected = max(math.log((tpr_lo - delta) / fpr_hi), math.log((1 - fpr_hi - delta) / (1 - tpr_lo)))
    assert res.epsilon_lb == pytest.approx(expected, rel=1e-9)
    assert res.tpr_lower == pytest.approx(tpr_lo) and res.fpr_upper == pytest.approx(fpr_hi)
    assert (res.tpr, res.fpr, res.tp, res.fn, res.fp, res.tn) == (1.0, 0.0, n1, 0, 0, n0)
    assert (res.method, res.threshold, res.confidence, res.n_candidates) == ("fixed", None, conf, 1)


@pytest.mark.parametrize("tp,fn,fp,tn,delta", [(80, 20, 10, 90, 0.0), (900, 100, 30, 970, 1e-5), (5, 95, 1, 99, 0.01)])
def test_epsilon_lower_bound_matches_independent_computation(tp, fn, fp, tn, delta):
    conf = 0.9
    tpr_lo = clopper_pearson(tp, tp + fn, (1 + conf) / 2, side="lower")[0]
    fpr_hi = clopper_pearson(fp, fp + tn, (1 + conf) / 2, side="upper")[1]
    terms = [0.0]
    if tpr_lo - delta > 0:
        terms.append(math.log((tpr_lo - delta) / fpr_hi))
    if 1 - fpr_hi - delta > 0:
        terms.append(math.log((1 - fpr_hi - delta) / (1 - tpr_lo)))
    assert epsilon_lower_bound(tp, fn, fp, tn, delta, conf).epsilon_lb == pytest.approx(max(terms), rel=1e-12)


def test_a_useless_test_gives_zero_and_bad_arguments_raise():
    assert epsilon_lower_bound(50, 50, 50, 50, 0.0).epsilon_lb == 0.0
    assert epsilon_lower_bound(10, 90, 90, 10, 0.0).epsilon_lb == 0.0  # worse than chance: not flipped
    with pytest.raises(FedsimError, match="delta"):
        epsilon_lower_bound(1, 1, 1, 1, 1.0)
    with pytest.raises(FedsimError, match="confidence"):
        epsilon_lower_bound(1, 1, 1, 1, 0.0, confidence=1.0)
    with pytest.raises(FedsimError, match="member trial"):
        epsilon_lower_bound(0, 0, 1, 1, 0.0)
    with pytest.raises(FedsimError, match="tp"):
        epsilon_lower_bound(-1, 1, 1, 1, 0.0)
    with pytest.raises(FedsimError, match="thresholds="):
        epsilon_lower_bound_from_scores([1.0, 2.0], [0.0, 1.0], 0.0, method="bonferroni")
    with pytest.raises(FedsimError, match="method"):
        epsilon_lower_bound_from_scores([1.0, 2.0], [0.0, 1.0], 0.0, method="same-data")  # type: ignore[arg-type]
    with pytest.raises(FedsimError, match="selection_fraction"):
        epsilon_lower_bound_from_scores([1.0], [0.0, 1.0], 0.0)


def _randomized_response(eps: float, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Outputs (1 = "bit is 1") of ε-DP randomized response on n inputs 1 (members) and n inputs 0."""
    p = math.exp(eps) / (1 + math.exp(eps))  # truthful with probability e^ε/(1 + e^ε)
    return (rng.random(n) < p).astype(float), (rng.random(n) >= p).astype(float)


def test_bound_is_valid_for_randomized_response_with_epsilon_one():
    """The test "output = 1" has TPR/FPR = e^ε exactly, so the bound is tight here: a bound
    without confidence intervals (the point estimate) exceeds ε in about half the trials."""
    eps, n, trials = 1.0, 300, 200
    fixed_ok = split_ok = naive_over = 0
    for seed in range(trials):
        m, nm = _randomized_response(eps, n, np.random.default_rng(seed))
        tp, fp = int(m.sum()), int(nm.sum())
        res = epsilon_lower_bound(tp, n - tp, fp, n - fp, delta=0.0)
        fixed_ok += res.epsilon_lb <= eps
        naive_over += max(math.log(res.tpr / res.fpr), math.log((1 - res.fpr) / (1 - res.tpr))) > eps
        split_ok += epsilon_lower_bound_from_scores(m, nm, 0.0, seed=seed).epsilon_lb <= eps
    assert fixed_ok / trials >= 0.95
    assert split_ok / trials >= 0.95
    assert naive_over / trials >= 0.3  # the trials can expose an invalid bound


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """ε of the Gaussian mechanism with μ = sensitivity/σ: the root of
    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    return optimize.brentq(
        lambda e: stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2) - delta, 0.0, 100.0
    )


def test_bound_is_valid_for_the_gaussian_mechanism():
    mu, delta, n, trials = 2.0, 0.05, 300, 200
    eps = _gaussian_epsilon(mu, delta)
    assert stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) == pytest.approx(
        delta
    )
    grid = np.linspace(-1.0, 5.0, 25)
    ok = {"split": 0, "bonferroni": 0}
    lbs = []
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        m, nm = rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n)
        for method in ok:
            res = epsilon_lower_bound_from_scores(m, nm, delta, method=method, thresholds=grid, seed=seed)  # type: ignore[arg-type]
            ok[method] += res.epsilon_lb <= eps
            lbs.append(res.epsilon_lb)
    assert all(v / trials >= 0.95 for v in ok.values()), ok
    assert np.mean(lbs) > 0.5  # and the attack finds something


def _same_data_bound(m: np.ndarray, nm: np.ndarray, conf: float = 0.95) -> float:
    """The invalid procedure: pick the best threshold and bound ε on the same counts (δ = 0)."""
    ts = np.unique(np.concatenate([m, nm]))
    tp = m.size - np.searchsorted(np.sort(m), ts, side="left")  # #{m ≥ t}
    fp = nm.size - np.searchsorted(np.sort(nm), ts, side="left")
    a = (1 - conf) / 2
    tpr_lo = np.where(tp > 0, stats.beta.ppf(a, np.maximum(tp, 1), m.size - tp + 1), 0.0)
    fpr_hi = np.where(fp < nm.size, stats.beta.ppf(1 - a, fp + 1, np.maximum(nm.size - fp, 1)), 1.0)
    with np.errstate(divide="ignore"):
        e = np.maximum(np.log(tpr_lo / fpr_hi), np.log((1 - fpr_hi) / (1 - tpr_lo)))
    return float(max(0.0, e.max()))


def test_threshold_selection_keeps_the_confidence_for_the_laplace_mechanism():
    """Laplace noise of scale 1/ε on a sensitivity-1 query: every threshold t ≥ 1 has TPR/FPR
    = e^ε exactly, so choosing among many equally tight thresholds on the same data inflates the
    bound past ε too often. Split and Bonferroni selection must not."""
    eps, n, trials = 1.0, 1000, 200
    ok = {"split": 0, "bonferroni": 0}
    same_data_over = 0
    grid = np.linspace(-3.0, 6.0, 37)
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        m, nm = rng.laplace(1.0, 1 / eps, n), rng.laplace(0.0, 1 / eps, n)
        for method in ok:
            res = epsilon_lower_bound_from_scores(m, nm, 0.0, method=method, thresholds=grid, seed=seed)  # type: ignore[arg-type]
            ok[method] += res.epsilon_lb <= eps
        same_data_over += _same_data_bound(m, nm) > eps
    assert all(v / trials >= 0.95 for v in ok.values()), ok
    assert same_data_over / trials > 0.05  # the control: selecting on the evaluation data breaks the guarantee


def test_bound_is_not_vacuous_for_a_strong_attack():
    eps, n = 4.0, 5000
    m, nm = _randomized_response(eps, n, np.random.default_rng(0))
    tp, fp = int(m.sum()), int(nm.sum())
    fixed = epsilon_lower_bound(tp, n - tp, fp, n - fp, 0.0)
    assert 3.5 < fixed.epsilon_lb <= eps
    split = epsilon_lower_bound_from_scores(m, nm, 0.0)
    assert 3.0 < split.epsilon_lb <= eps
    assert split.threshold == 1.0 and split.method == "split" and split.n_candidates == 2
    assert split.tp + split.fn == n - n // 2 and split.fp + split.tn == n - n // 2  # the evaluation half
    bonf = epsilon_lower_bound_from_scores(m, nm, 0.0, method="bonferroni", thresholds=[0.5, 2.0])
    assert bonf.threshold == 0.5 and bonf.n_candidates == 2 and 3.5 < bonf.epsilon_lb <= fixed.epsilon_lb
