"""Privacy accounting (docs/algorithms.md §4) against independent dp-accounting
computations written out here, a closed form for the un-subsampled Gaussian, and
the ledger's self-reproducibility."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import dp_accounting
import pytest
from dp_accounting import dp_event
from scipy import optimize
from scipy.stats import norm

from fedsim.errors import FedsimError
from fedsim.privacy.accounting import (
    AccountingSpec,
    EpsilonCurve,
    calibrate_noise_multiplier,
    default_delta,
    epsilon,
)
from fedsim.privacy.ledger import Ledger, recompute_epsilon, spec_from_ledger

# z >= 1.5 keeps every PLD construction well under a second.
N, K, Z, DELTA = 100, 10, 1.5, 1e-5


def spec(**kw) -> AccountingSpec:
    base = dict(
        mechanism="gaussian",
        scheme="poisson",
        population=N,
        cohort_size=K,
        noise_multiplier=Z,
        delta=DELTA,
        accountant="pld",
    )
    base.update(kw)
    return AccountingSpec(**base)


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# --- independent dp-accounting computations --------------------------------------


def independent_poisson_pld(q: float, z: float, t: int, delta: float) -> float:
    acc = dp_accounting.pld.PLDAccountant()  # library default discretization (1e-4)
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), t))
    return acc.get_epsilon(delta)


def independent_poisson_rdp(q: float, z: float, t: int, delta: float) -> float:
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), t))
    return acc.get_epsilon(delta)


def independent_fixed_rdp(n: int, k: int, z: float, t: int, delta: float) -> float:
    # Replace-one: one user's clipped update u becomes u', the sum moves by ≤ 2c, so the
    # Gaussian event's multiplier (std / sensitivity) is c·z / 2c = z/2.
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(
        dp_event.SelfComposedDpEvent(
            dp_event.SampledWithoutReplacementDpEvent(n, k, dp_event.GaussianDpEvent(z / 2)), t
        )
    )
    return acc.get_epsilon(delta)


def gaussian_epsilon_closed_form(mu: float, delta: float) -> float:
    """Exact ε(δ) of a Gaussian mechanism with sensitivity/σ = μ (Balle & Wang 2018):
    δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)."""

    def gap(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta

    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-14, rtol=1e-14)


# --- epsilon ------------------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 7])
def test_epsilon_poisson_pld_matches_dp_accounting(t):
    s = spec()
    assert s.sampling_rate == pytest.approx(K / N, rel=0, abs=0)
    expected = independent_poisson_pld(K / N, Z, t, DELTA)
    assert rel(epsilon(s, t), expected) < 1e-9


@pytest.mark.parametrize("t", [1, 10, 50])
def test_epsilon_poisson_rdp_matches_dp_accounting(t):
    s = spec(accountant="rdp", noise_multiplier=1.1)
    assert rel(epsilon(s, t), independent_poisson_rdp(K / N, 1.1, t, DELTA)) < 1e-9


@pytest.mark.parametrize("t", [1, 25])
def test_epsilon_fixed_uses_rdp_replace_one(t):
    # fixed sampling always uses RDP with replace-one adjacency, even if accountant="pld"
    s = spec(scheme="fixed", population=200, cohort_size=20, noise_multiplier=1.2, accountant="pld")
    assert s.effective_accountant == "rdp"
    assert replace(s, accountant="rdp").effective_accountant == "rdp"
    assert s.neighboring_relation == "replace_one"
    assert spec().neighboring_relation == "add_or_remove_one"
    expected = independent_fixed_rdp(200, 20, 1.2, t, DELTA)
    assert rel(epsilon(s, t), expected) < 1e-9


def test_full_participation_pld_matches_gaussian_closed_form():
    # q = 1: t rounds of the Gaussian mechanism with multiplier z are one Gaussian
    # mechanism with multiplier z/√t. The PLD is a pessimistic discretization
    # (interval 1e-4), so it may only over-estimate, and only slightly.
    t, z, delta = 4, 2.0, 1e-5
    s = spec(population=10, cohort_size=10, noise_multiplier=z, delta=delta)
    exact = gaussian_epsilon_closed_form(math.sqrt(t) / z, delta)
    got = epsilon(s, t)
    assert got >= exact * (1 - 1e-9)
    assert got <= exact + 1e-2
    # RDP is an upper bound on the exact ε too
    assert epsilon(replace(s, accountant="rdp"), t) >= exact


def test_zero_rounds_is_zero_epsilon():
    assert epsilon(spec(), 0) == 0.0
    assert EpsilonCurve(spec())(0) == 0.0


def test_mechanism_none_is_infinite():
    s = spec(mechanism="none", noise_multiplier=0.0)
    assert epsilon(s, 1) == math.inf
    assert epsilon(s, 10) == math.inf
    assert EpsilonCurve(s)(3) == math.inf
    assert isinstance(s.round_event(), dp_event.NonPrivateDpEvent)


def test_unknown_mechanism_or_scheme_refused():
    with pytest.raises(FedsimError, match="laplace"):
        epsilon(spec(mechanism="laplace"), 3)
    with pytest.raises(FedsimError, match="epochs"):
        epsilon(spec(scheme="epochs"), 3)


# --- EpsilonCurve ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {},  # poisson, PLD
        {"accountant": "rdp"},
        {"scheme": "fixed", "noise_multiplier": 1.0},
    ],
    ids=["poisson-pld", "poisson-rdp", "fixed-rdp"],
)
def test_epsilon_curve_equals_epsilon(kw):
    s = spec(**kw)
    curve = EpsilonCurve(s)
    for t in (1, 5) if s.scheme == "fixed" else (1, 5, 20):
        assert rel(curve(t), epsilon(s, t)) < 1e-8


@pytest.mark.parametrize(
    "kw",
    [
        {"accountant": "rdp"},
        {"scheme": "fixed", "noise_multiplier": 1.0},
        {"scheme": "fixed", "noise_multiplier": 0.6, "cohort_size": 50},
        {"mechanism": "blt", "scheme": "min_sep", "min_sep": 4, "amplified": True, "accountant": "rdp"},
    ],
    ids=["poisson-rdp", "fixed-rdp", "fixed-rdp-q0.5", "mf-amplified-rdp"],
)
def test_rdp_curve_is_bit_identical_to_a_fresh_accountant(kw):
    """The cached RDP curve scales one composition's RDP by t; a fresh RdpAccountant
    composes SelfComposedDpEvent(event, t) from zero. Same float, every round — in any
    order of asking (a resumed run asks for round 37 first)."""
    s = spec(**kw)
    curve = EpsilonCurve(s)
    for t in (37, 1, 2, 3, 5, 8, 100, 36):
        fresh = s.make_accountant()
        fresh.compose(s.run_event(t))
        assert curve(t) == fresh.get_epsilon(s.delta), t
    assert curve._rdp_one is not None  # the fast path ran, not the fallback


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"noise_multiplier": 0.7, "cohort_size": 30, "delta": 1e-6},
        {"mechanism": "banded", "scheme": "min_sep", "min_sep": 4, "amplified": True},
    ],
    ids=["poisson-pld", "poisson-pld-q0.3", "mf-amplified-pld"],
)
def test_pld_curve_is_bit_identical_to_a_fresh_accountant(kw):
    """Review: the ledger's per-round PLD ε was the one-round PLD self-composed, a fresh
    accountant's is that composed onto the identity, and the two differed by about 1e-11
    relative, the ledger's below: a printed ε rounded up from it could read one digit under the
    ε recomputed from the ledger's spec. The curve now makes the accountant's calls (and reads z
    and q from the spec's round event): the same float, every round, in any order of asking."""
    s = spec(**kw)
    assert s.effective_accountant == "pld"
    curve = EpsilonCurve(s)
    for t in (7, 1, 2, 3, 20, 6):
        fresh = s.make_accountant()
        fresh.compose(s.run_event(t))
        assert curve(t) == fresh.get_epsilon(s.delta), t
    assert curve._pld is not None  # the fast path ran, not the fallback


# --- monotonicity# --- monotonicity ------------------------------------------------------------------


def test_epsilon_increasing_in_rounds_pld():
    curve = EpsilonCurve(spec(noise_multiplier=2.0))
    eps = [curve(t) for t in (1, 2, 5, 10, 20)]
    assert all(e > 0 for e in eps)
    assert all(a < b for a, b in zip(eps, eps[1:])), eps


@pytest.mark.parametrize("scheme", ["poisson", "fixed"])
def test_epsilon_increasing_in_rounds_rdp(scheme):
    s = spec(scheme=scheme, accountant="rdp", noise_multiplier=1.0)
    eps = [epsilon(s, t) for t in ((1, 5, 100) if scheme == "fixed" else (1, 2, 5, 20, 100))]
    assert all(a < b for a, b in zip(eps, eps[1:])), eps


@pytest.mark.parametrize("kw", [{"accountant": "rdp"}, {"scheme": "fixed"}])
def test_epsilon_decreasing_in_noise_multiplier_rdp(kw):
    zs = [0.7, 1.5, 5.0] if kw.get("scheme") == "fixed" else [0.7, 1.0, 1.5, 2.5, 5.0]
    eps = [epsilon(spec(noise_multiplier=z, **kw), 10) for z in zs]
    assert all(a > b for a, b in zip(eps, eps[1:])), eps


def test_epsilon_decreasing_in_noise_multiplier_pld():
    eps = [epsilon(spec(noise_multiplier=z), 5) for z in (1.5, 2.0, 3.0)]
    assert all(a > b for a, b in zip(eps, eps[1:])), eps


def test_epsilon_increasing_in_sampling_rate():
    eps = [epsilon(spec(accountant="rdp", cohort_size=k), 10) for k in (2, 10, 50, 100)]
    assert all(a < b for a, b in zip(eps, eps[1:])), eps


# --- calibration -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, rounds, target",
    [
        ({"accountant": "rdp"}, 20, 0.5),
        ({"scheme": "fixed", "population": 200, "cohort_size": 20}, 3, 1.0),
    ],
    ids=["poisson-rdp", "fixed-rdp"],
)
def test_calibrate_noise_multiplier_is_feasible_and_near_tight(kw, rounds, target):
    s = spec(noise_multiplier=123.0, **kw)  # the spec's own z must be ignored
    z = calibrate_noise_multiplier(s, rounds, target)
    assert 0 < z < 123.0
    assert epsilon(replace(s, noise_multiplier=z), rounds) <= target
    assert epsilon(replace(s, noise_multiplier=0.98 * z), rounds) > target


def test_calibrate_noise_multiplier_pld_default():
    # the default (PLD) accountant: feasible and near-tight under PLD itself, and
    # no larger than the RDP-calibrated z (RDP over-estimates ε)
    s = spec(noise_multiplier=123.0)
    rounds, target = 2, 0.3
    z = calibrate_noise_multiplier(s, rounds, target)
    assert epsilon(replace(s, noise_multiplier=z), rounds) <= target
    assert epsilon(replace(s, noise_multiplier=0.98 * z), rounds) > target
    z_rdp = calibrate_noise_multiplier(replace(s, accountant="rdp"), rounds, target)
    assert z <= z_rdp * (1 + 1e-9)


def test_calibrate_refuses_none_and_bad_target():
    with pytest.raises(FedsimError):
        calibrate_noise_multiplier(spec(mechanism="none"), 10, 1.0)
    with pytest.raises(FedsimError, match="target_epsilon"):
        calibrate_noise_multiplier(spec(accountant="rdp"), 10, 0.0)


# --- delta -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 10, 715, 10_000, 1_000_000])
def test_default_delta(n):
    assert default_delta(n) == 1 / n**1.1
    assert default_delta(n) < 1 / n


# --- ledger ------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{}, {"accountant": "rdp"}], ids=["poisson-pld", "poisson-rdp"])
def test_ledger_recompute_equals_recorded(kw):
    s = spec(**kw)
    ledger = Ledger(s, planned_rounds=10)
    assert ledger.epsilon == 0.0
    cohorts = [9, 12, 10, 8]
    eps = [ledger.record_round(t, c) for t, c in enumerate(cohorts)]
    assert ledger.rounds_recorded == len(cohorts)
    assert ledger.epsilon == eps[-1]
    assert all(a < b for a, b in zip(eps, eps[1:]))

    doc = ledger.to_json()
    text = json.dumps(doc, allow_nan=False)  # strict JSON
    doc2 = json.loads(text)
    assert [e["cohort"] for e in doc2["entries"]] == cohorts
    assert [e["round"] for e in doc2["entries"]] == list(range(1, len(cohorts) + 1))
    assert spec_from_ledger(doc2) == s
    assert rel(recompute_epsilon(doc2), eps[-1]) < 1e-8
    assert rel(recompute_epsilon(doc2, rounds=3), eps[2]) < 1e-8
    # and both agree with an independent dp-accounting computation
    if s.accountant == "rdp":
        expected = independent_poisson_rdp(K / N, Z, len(cohorts), DELTA)
    else:
        expected = independent_poisson_pld(K / N, Z, len(cohorts), DELTA)
    assert rel(eps[-1], expected) < 1e-8


@pytest.mark.parametrize(
    "key,value",
    [("neighboring_relation", "add_or_remove_one"), ("effective_accountant", "pld"), ("sampling_rate", 0.5)],
)
def test_a_ledger_stating_another_guarantee_than_its_spec_gives_is_refused(key, value):
    """Attack: a fixed-cohort ledger (RDP, replace one user) edited to state add/remove one user or
    the PLD accountant recomputed to its ε without complaint, so the ε read as a guarantee for the
    edited relation. Every derived statement, and the DP event, must be what the fields give."""
    ledger = Ledger(spec(scheme="fixed", cohort_size=K), planned_rounds=3)
    ledger.record_round(0, K)
    doc = json.loads(json.dumps(ledger.to_json()))
    assert doc["spec"]["neighboring_relation"] == "replace_one" and doc["spec"]["effective_accountant"] == "rdp"
    recompute_epsilon(doc)  # unedited: fine
    edited = json.loads(json.dumps(doc))
    edited["spec"][key] = value
    with pytest.raises(FedsimError, match=key):
        recompute_epsilon(edited)
    edited = json.loads(json.dumps(doc))
    edited["dp_event"] = edited["dp_event"].replace("SampledWithoutReplacement", "PoissonSampled")
    with pytest.raises(FedsimError, match="dp_event"):
        recompute_epsilon(edited)


def test_ledger_nonprivate_is_strict_json():
    ledger = Ledger(spec(mechanism="none", noise_multiplier=0.0), planned_rounds=3)
    assert ledger.record_round(0, 10) == math.inf
    doc = json.loads(json.dumps(ledger.to_json(), allow_nan=False))
    assert doc["entries"][0]["epsilon"] == "inf"
    assert recompute_epsilon(doc) == math.inf


def test_ledger_rejects_out_of_order_rounds_and_resumes():
    s = spec(accountant="rdp")
    ledger = Ledger(s, planned_rounds=5)
    with pytest.raises(RuntimeError):
        ledger.record_round(1, 10)
    ledger.record_round(0, 10)
    ledger.record_round(1, 10)
    with pytest.raises(RuntimeError):
        ledger.record_round(1, 10)

    resumed = Ledger(s, planned_rounds=5)
    resumed.load_state_dict(json.loads(json.dumps(ledger.state_dict())))
    assert resumed.entries == ledger.entries
    e2 = resumed.record_round(2, 10)
    assert rel(e2, independent_poisson_rdp(K / N, Z, 3, DELTA)) < 1e-9


@pytest.mark.parametrize("z", [1.0, 2.0, 4.0])
def test_fixed_full_cohort_is_a_gaussian_with_sensitivity_2c(z):
    """K = N, one round: the release is the sum of all N clipped updates plus N(0, (cz)²);
    under replace-one its sensitivity is 2c, so the exact ε is the Gaussian mechanism's
    with μ = 2/z. RDP must never report less than that exact value (and stays close)."""
    s = spec(scheme="fixed", population=50, cohort_size=50, noise_multiplier=z, delta=1e-5)
    exact = gaussian_epsilon_closed_form(2.0 / z, 1e-5)
    got = epsilon(s, 1)
    assert got >= exact * (1 - 1e-9)
    assert got <= exact * 1.6
