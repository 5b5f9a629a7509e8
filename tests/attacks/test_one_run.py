"""fedsim.attacks.one_run: one-run ε lower bounds (Steinke–Nasr–Jagielski 2023; Mahloujifar et
al. 2024) checked against closed forms, an independent computation of the theorem, repeated
audits of a Gaussian mechanism whose ε is known (coverage), a planted noise bug, and (slow)
jax_privacy 2.0's CanaryScoreAuditor on identical scores."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
from pathlib import Path

import dp_accounting
import numpy as np
import pytest

from fedsim.attacks.one_run import (
    fdp_rejects,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    one_run_bound,
    one_run_bound_in_out,
    perfect_separation_bound,
    snj_p_value,
    two_sided_grid,
)
from fedsim.errors import FedsimError

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- independent theorem
def _log_binom_pmf(n: int, j: int, q: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * math.log(q) + (n - j) * math.log1p(-q)


def _p_all_correct(m: int, k: int, eps: float, delta: float) -> float:
    """Steinke et al.'s p-value for k guesses that are all correct, written out term by term."""
    q = math.exp(eps) / (1.0 + math.exp(eps))
    beta = q**k
    best, window = 0.0, 0.0
    for i in range(1, k + 1):
        window += math.exp(_log_binom_pmf(k, k - i, q))  # P[k − i ≤ B ≤ k − 1]
        best = max(best, window / i)
    return min(1.0, beta + best * 2 * m * delta)


def _bisect_largest(reject, hi: float = 50.0) -> float:
    lo = 0.0
    if not reject(lo):
        return 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if reject(mid) else (lo, mid)
    return lo


@pytest.mark.parametrize("m", [200, 1000])
def test_perfect_separation_equals_theorem_delta_zero(m):
    """δ = 0: k all-correct guesses reject ε iff q^k ≤ a/K, so the bound is logit((a/K)^(1/k))."""
    grid = [k for k in two_sided_grid(m) if k > 0]
    a = 0.05 / len(grid)
    k = max(g for g in grid if g <= m // 2)
    expected = math.log(a ** (1 / k) / (1 - a ** (1 / k)))
    assert perfect_separation_bound(m, 0.0) == pytest.approx(expected, abs=1e-8)


@pytest.mark.parametrize("m,delta", [(1000, 1e-5), (400, 1e-6)])
def test_perfect_separation_equals_theorem_with_delta(m, delta):
    grid = [k for k in two_sided_grid(m) if k > 0]
    a = 0.05 / len(grid)
    expected = max(_bisect_largest(lambda e, k=k: _p_all_correct(m, k, e, delta) <= a) for k in grid if k <= m // 2)
    assert expected > 0.5
    assert perfect_separation_bound(m, delta) == pytest.approx(expected, abs=1e-7)


def test_p_value_matches_independent_sum():
    for m, k, eps, delta in [(100, 40, 0.7, 1e-3), (1000, 300, 2.0, 1e-5), (50, 10, 0.0, 0.01)]:
        assert snj_p_value(m, k, k, eps, delta) == pytest.approx(_p_all_correct(m, k, eps, delta), rel=1e-9)


def test_gdp_conversion_is_the_gaussian_mechanism():
    """μ-GDP's ε at δ is the Gaussian mechanism's with σ = 1/μ (dp_accounting, independently)."""
    for sigma in (0.5, 1.0, 4.0):
        expected = dp_accounting.get_epsilon_gaussian(sigma, 1e-5)
        assert gdp_epsilon(1 / sigma, 1e-5) == pytest.approx(expected, abs=1e-6)
        assert gdp_delta(1 / sigma, gdp_epsilon(1 / sigma, 1e-5)) == pytest.approx(1e-5, rel=1e-8)
    assert gdp_mu(gdp_epsilon(0.7, 1e-6), 1e-6) == pytest.approx(0.7, abs=1e-8)


def test_fdp_needs_evidence():
    """With half the guesses wrong the f-DP test rejects nothing; with all right it rejects μ = 0."""
    assert fdp_rejects(1000, 100, 50, 0.0, 0.05) <= 0
    assert fdp_rejects(1000, 100, 100, 0.0, 0.05) > 0


# --------------------------------------------------------------------------- Gaussian mechanism
def _gaussian_scores(rng: np.random.Generator, m: int, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """m canaries, each in with probability 1/2; the release is S_i + σ·Z_i per canary, which is
    the Gaussian mechanism with sensitivity 1 for each canary's bit."""
    inc = rng.random(m) < 0.5
    return inc + sigma * rng.normal(size=m), inc


def test_coverage_on_a_gaussian_mechanism_of_known_epsilon():
    """Repeated one-run audits at 95 % confidence: ε_LB ≤ the mechanism's ε in ≥ 95 % of trials
    (both bounds), and the bounds are not vacuous."""
    delta, eps_true, trials = 1e-5, 4.0, 100
    sigma = dp_accounting.get_sigma_gaussian(eps_true, delta)
    rng = np.random.default_rng(2024)
    over = {"snj": 0, "fdp": 0}
    total = {"snj": 0.0, "fdp": 0.0}
    for _ in range(trials):
        s, inc = _gaussian_scores(rng, 1000, sigma)
        for method in over:
            e = one_run_bound(s, inc, delta, method=method).epsilon
            over[method] += e > eps_true
            total[method] += e
    assert over["snj"] <= 0.05 * trials and over["fdp"] <= 0.05 * trials
    assert total["snj"] / trials > 0.5 and total["fdp"] / trials > 1.0


def test_planted_bug_one_tenth_noise_exceeds_ledger():
    """A mechanism that adds a tenth of the accounted noise is caught: ε_LB > ledger ε."""
    delta = 1e-5
    for ledger in (1.0, 2.0):
        sigma = dp_accounting.get_sigma_gaussian(ledger, delta)
        s, inc = _gaussian_scores(np.random.default_rng(7), 1000, sigma / 10)
        for method in ("snj", "fdp"):
            b = one_run_bound(s, inc, delta, method=method)
            assert b.epsilon > ledger, (method, ledger, b)


def test_no_signal_certifies_nothing():
    rng = np.random.default_rng(3)
    inc = rng.random(1000) < 0.5
    s = rng.normal(size=1000)
    assert one_run_bound(s, inc, 1e-5).epsilon == 0.0


def test_report_fields_and_two_groups():
    s_in, s_out = np.arange(10.0, 20.0), np.arange(0.0, 10.0)
    b = one_run_bound_in_out(s_in, s_out, 1e-5, method="fdp", sides="two")
    assert b.num_canaries == 20 and b.num_included == 10
    assert b.guesses == b.guesses_in + b.guesses_out and b.correct == b.guesses
    assert b.mu is not None and b.epsilon == pytest.approx(gdp_epsilon(b.mu, 1e-5))
    assert b.candidates == sum(1 for p in two_sided_grid(20) for n in two_sided_grid(20) if 0 < p + n <= 20)


def test_ties_are_never_split():
    """Tied scores: every rule guesses a whole tied block or none of it."""
    inc = np.array([1, 1, 0, 0] * 50, dtype=bool)
    s = np.where(inc, 1.0, 0.0)  # two blocks
    b = one_run_bound(s, inc, 1e-5, sides="two")
    assert b.guesses_in in (0, 100, 200) and b.guesses_out in (0, 100, 200)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"method": "bayes"}, "method"),
        ({"confidence": 1.0}, "confidence"),
        ({"sides": "two", "selection": "frontier"}, "one-sided"),
    ],
)
def test_bad_input_is_one_line(kwargs, match):
    with pytest.raises(FedsimError, match=match):
        one_run_bound([0.1, 0.2, 0.3], [1, 0, 1], 1e-5, **kwargs)
    with pytest.raises(FedsimError, match="inclusion bits"):
        one_run_bound([0.1, 0.2], [1], 1e-5)


# --------------------------------------------------------------------------- jax_privacy
JAXP = Path(os.environ.get("FEDSIM_JAXP_VENV", "/tmp/jaxp"))


def _side_venv() -> Path | None:
    """The side venv's python with jax-privacy 2.0 (built once if missing); None if it cannot be."""
    py = JAXP / "bin" / "python"
    check = [str(py), "-c", "import jax_privacy.auditing"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    try:
        if not py.exists():
            subprocess.run(["python3", "-m", "venv", str(JAXP)], check=True, capture_output=True, timeout=300)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "jax[cpu]", "jax-privacy==2.0.0"],
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    return py if subprocess.run(check, capture_output=True).returncode == 0 else None


@pytest.mark.slow
def test_equal_to_jax_privacy_canary_score_auditor():
    """fedsim's bounds with jax_privacy's candidate rules equal CanaryScoreAuditor's to 1e-6."""
    py = _side_venv()
    if py is None:
        pytest.skip(f"could not build a side venv with jax-privacy at {JAXP} (no network or no wheel)")
    spec = importlib.util.spec_from_file_location("jpcheck", ROOT / "benchmarks" / "jax_privacy_auditor_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.compare(str(py), tol=1e-6)
    assert len(rows) == 16
    assert max(r["abs_diff"] for r in rows) <= 1e-6
    assert sum(r["jax_privacy"] > 0.5 for r in rows) >= 10  # the cases carry signal
