"""One-run privacy audits: lower BOUNDS on ε from the canary scores of a single training run.

Setting (both bounds)
---------------------
`m` canaries are each included in the training population independently with probability
1/2 (the inclusion bits `S ∈ {0, 1}^m` are drawn by a keyed draw the auditor keeps, see
`inclusion_bits`). After training, the auditor scores every canary (higher = "more likely
included") and guesses: the `k⁺` highest-scoring canaries "in", the `k⁻` lowest "out",
and abstains on the rest. `r = k⁺ + k⁻` guesses, `v` of them correct.

Steinke, Nasr and Jagielski (NeurIPS 2023), "Privacy auditing with one (1) training run"
------------------------------------------------------------------------------------------
If the training algorithm is (ε, δ)-DP with respect to each canary, then (their Theorem 3 with
δ handled as in their Proposition 5 / Algorithm 2)

    P[W ≥ v] ≤ β + α·2mδ,  β = P[Binomial(r, q) ≥ v],  q = e^ε/(1 + e^ε),
    α = max_{i = 1..v} P[v − i ≤ Binomial(r, q) < v] / i,

where `W` is the number of correct guesses. The p-value of the claim "(ε, δ)-DP" is that right
side (capped at 1), `snj_p_value`. The bound at significance `a` (confidence `1 − a`) is
the largest ε whose p-value is at most `a`: every smaller ε is rejected with error at most
`a` (`snj_epsilon`).

Mahloujifar, Melis and Chaudhuri (2024), "Auditing f-differential privacy in one run"
----------------------------------------------------------------------------------------
For a mechanism that is `f`-DP with `f` the trade-off curve of `μ`-Gaussian DP
(`f(x) = Φ(Φ⁻¹(1 − x) − μ)`), the paper bounds the probability of `v` correct out of `r`
guesses by a recursion over the number of correct guesses (their "audit with cap"): start
with `ρ = a·v/m` and `η = a·(r − v)/m`; for `i = v − 1, …, 0`, `η' = max(η,
Φ(Φ⁻¹(ρ) − μ))` and `ρ' = min(ρ + i/(r − i)·(η' − η), 1)`. The claim "μ-GDP" is rejected
at significance `a` when the final `ρ + η` exceeds `r/m` (`fdp_rejects`). The μ bound is
the largest rejected μ (`fdp_mu`), and the ε bound is the ε at δ of μ-GDP (the Gaussian
mechanism with sensitivity/σ = μ, `gdp_epsilon`): that is, a mechanism whose (ε, δ) curve is a
Gaussian mechanism's cannot have this (ε, δ).

Choosing the guesses (paid for)
-------------------------------
The best `(k⁺, k⁻)` is chosen after seeing the scores, so each candidate is tested at `a/K`
(a union bound over the `K` candidates), as Steinke et al. allow:

- `sides="one"` (default): `k⁻ = 0` and `k⁺` from a fixed geometric grid of about
  `2·log₂ m` counts (`two_sided_grid`: `round(m/2·2^(−j/2))`), `K` = the grid's size
  (18 for `m = 1000`).
- `sides="two"`: `k⁺, k⁻` both from the grid (0 included), `K` = the number of pairs
  (360 for `m = 1000`). More guesses also grow the δ term, so at δ = 10⁻⁵ it is usually
  weaker for "snj" (ceiling 1.99 against 4.26 one-sided at `m = 1000`).

The grid is fixed before the scores are seen. A finer family costs more than it gains: paying
for all `m` thresholds (`a/m`) leaves the δ term `α·2mδ` of the Steinke et al. bound above
`a/m` at `m = 1000`, δ = 10⁻⁵, so even perfect one-sided guesses certify nothing.
- `selection="frontier"` reproduces jax_privacy 2.0's `CanaryScoreAuditor` (one-sided,
  `Bonferroni()` strategy): it divides `a` by the number of vertices of the empirical ROC's
  upper hull and tests only those. That count depends on the scores, so fedsim's default is the
  data-independent `K = m`; the frontier variant is kept for the equality check.

What the bound is about
-----------------------
It is a lower bound on the ε of the *whole release the scores are computed from*, with
respect to one canary, at the stated confidence, and it holds for any scoring rule that uses
only the release (never the inclusion bits). A score that sees only the final model bounds the
final-model release; a score over every published model bounds the sequence. Its ceiling is set
by `m`: even perfect guesses certify at most `perfect_separation_bound`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq
from scipy.special import expit, log_ndtr, ndtr, ndtri
from scipy.stats import binom

from fedsim.errors import FedsimError

Method = Literal["snj", "fdp"]
Sides = Literal["one", "two"]
Selection = Literal["all", "frontier"]

METHODS: tuple[str, ...] = ("snj", "fdp")
#: Default confidence of the bounds.
DEFAULT_CONFIDENCE = 0.95
#: Absolute tolerance of the root-finding in ε (and μ).
XTOL = 1e-10
#: Largest ε (and μ) searched; a bound this large is reported as it is.
_EPS_MAX = 200.0


# --------------------------------------------------------------------------- Steinke–Nasr–Jagielski
def snj_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """p-value of "(ε, δ)-DP per canary" after `v` correct out of `r` guesses on `m` canaries.

    Parameters
    ----------
    m : number of canaries (each included with probability 1/2).
    r : number of guesses (abstentions excluded), `0 ≤ v ≤ r ≤ m`.
    v : number of correct guesses.
    eps : the ε of the claim (≥ 0).
    delta : the δ of the claim, in [0, 1].

    Returns `min(1, β + α·2mδ)` with `β = P[Bin(r, q) ≥ v]`, `q = e^ε/(1 + e^ε)` and
    `α = max_i P[v − i ≤ Bin(r, q) < v]/i` (Steinke, Nasr, Jagielski 2023).
    """
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got m={m}, r={r}, v={v}")
    q = float(expit(eps))
    beta = float(binom.sf(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(beta, 1.0)
    # P[v − i ≤ B < v] for i = 1..v: cumulative sums of the pmf at v−1, v−2, …, 0
    window = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, q))
    alpha = float(np.max(window / np.arange(1, v + 1)))
    return min(beta + alpha * delta * 2.0 * m, 1.0)


def _largest_rejected(reject_margin: Any, lo: float = 0.0) -> float:
    """The largest `x ≥ lo` with `reject_margin(x) > 0` (the margin decreases in `x`), or
    `lo` if the margin at `lo` is not positive."""
    if reject_margin(lo) <= 0.0:
        return lo
    hi = max(1.0, 2.0 * lo)
    while reject_margin(hi) > 0.0:
        lo, hi = hi, 2.0 * hi
        if hi > _EPS_MAX:
            return math.inf
    return float(brentq(reject_margin, lo, hi, xtol=XTOL, rtol=4 * np.finfo(float).eps))


def snj_epsilon(m: int, r: int, v: int, delta: float, significance: float, eps_lo: float = 0.0) -> float:
    """Largest ε rejected by `snj_p_value` at `significance` (0 if none): the ε lower bound of
    one fixed guessing rule. `eps_lo` starts the search (a bound below it is returned as it)."""
    if r == 0 or snj_p_value(m, r, v, eps_lo, 0.0) > significance:
        return eps_lo  # not rejected even at δ = 0, so not at δ > 0 either
    return _largest_rejected(lambda e: significance - snj_p_value(m, r, v, e, delta), eps_lo)


# --------------------------------------------------------------------------- f-DP (Gaussian)
def fdp_rejects(m: int, r: int, v: int, mu: float, significance: float) -> float:
    """Margin of the one-run f-DP test of "μ-GDP" (Mahloujifar et al. 2024); `> 0` rejects.

    Parameters
    ----------
    m, r, v : canaries, guesses, correct guesses (`0 ≤ v ≤ r ≤ m`, `r ≥ 1`).
    mu : the μ of the Gaussian trade-off curve (≥ 0).
    significance : the test's level `a`.

    Returns `ρ + η − r/m` after the paper's recursion (see the module docstring).
    """
    rho = significance * v / m
    eta = significance * (r - v) / m
    for i in range(v - 1, -1, -1):
        # the inverse of the blow-up of μ-GDP's trade-off curve at ρ
        eta_next = max(eta, float(ndtr(ndtri(rho) - mu)))
        if eta_next == eta:
            break  # neither η nor ρ changes again
        rho = min(rho + i / (r - i) * (eta_next - eta), 1.0)
        eta = eta_next
    return rho + eta - r / m


def fdp_mu(m: int, r: int, v: int, significance: float, mu_lo: float = 0.0) -> float:
    """Largest μ whose μ-GDP claim `fdp_rejects` rejects (`mu_lo` if none)."""
    if r == 0:
        return mu_lo
    return _largest_rejected(lambda mu: fdp_rejects(m, r, v, mu, significance), mu_lo)


def gdp_delta(mu: float, eps: float) -> float:
    """δ(ε) of μ-GDP: `Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)` (Dong, Roth, Su, Corollary 2.13)."""
    if mu <= 0.0:
        return 0.0
    a = float(log_ndtr(-eps / mu + mu / 2.0))
    b = eps + float(log_ndtr(-eps / mu - mu / 2.0))
    return 0.0 if b >= a else math.exp(a) * -math.expm1(b - a)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The ε at `delta` of μ-GDP (the smallest ε with `gdp_delta` ≤ δ; 0 for μ = 0)."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1) for a GDP conversion, got {delta}")
    if mu <= 0.0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    if math.isinf(mu):
        return math.inf
    ld = math.log(delta)

    def excess(e: float) -> float:
        a = float(log_ndtr(-e / mu + mu / 2.0))
        b = e + float(log_ndtr(-e / mu - mu / 2.0))
        return (a + math.log(-math.expm1(b - a)) if b < a else -math.inf) - ld

    hi = 1.0
    while excess(hi) > 0.0:
        hi *= 2.0
    return float(brentq(lambda e: max(excess(e), -1e9), 0.0, hi, xtol=XTOL, rtol=4 * np.finfo(float).eps))


def gdp_mu(eps: float, delta: float) -> float:
    """The μ of the Gaussian mechanism that is exactly (ε, δ)-DP (inverse of `gdp_epsilon`)."""
    if eps < 0.0 or not 0.0 < delta < 1.0:
        raise ValueError(f"need eps >= 0 and 0 < delta < 1, got eps={eps}, delta={delta}")
    hi = 1.0
    while gdp_delta(hi, eps) < delta:
        hi *= 2.0
    return float(brentq(lambda mu: gdp_delta(mu, eps) - delta, 0.0, hi, xtol=XTOL, rtol=4 * np.finfo(float).eps))


def fdp_epsilon(m: int, r: int, v: int, delta: float, significance: float) -> float:
    """ε lower bound of one fixed guessing rule from the f-DP audit: `gdp_epsilon` of `fdp_mu`."""
    return gdp_epsilon(fdp_mu(m, r, v, significance), delta)


# --------------------------------------------------------------------------- guessing rules
@dataclass(frozen=True)
class OneRunBound:
    """A one-run ε lower bound and what it rests on.

    Attributes
    ----------
    method : "snj" (Steinke–Nasr–Jagielski) or "fdp" (one-run f-DP audit, Gaussian trade-off).
    epsilon : the ε lower bound at `delta` (unitless; 0 when nothing is certified).
    mu : for "fdp", the μ lower bound it comes from; None for "snj".
    confidence : the bound holds with this probability over the inclusion bits and the run.
    delta : the δ of the bound (the run's δ).
    num_canaries : m, canaries with a coin (included or not).
    num_included : canaries the coins put into the population.
    guesses_in, guesses_out : the chosen k⁺ and k⁻.
    guesses : r = k⁺ + k⁻.
    correct : correct guesses among them.
    candidates : K, the number of guessing rules the selection paid for (each tested at (1 − confidence)/K).
    sides, selection : the candidate family (see the module docstring).
    """

    method: str
    epsilon: float
    mu: float | None
    confidence: float
    delta: float
    num_canaries: int
    num_included: int
    guesses_in: int
    guesses_out: int
    guesses: int
    correct: int
    candidates: int
    sides: str
    selection: str

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (for JSON)."""
        return asdict(self)


def two_sided_grid(m: int) -> list[int]:
    """The counts `k` tried for `k⁺` (and `k⁻` with `sides="two"`): 0 and
    `round(m/2 · 2^(−j/2))` for `j = 0, 1, …` while it is ≥ 1 (fixed before the scores)."""
    ks = {0}
    j = 0
    while (k := int(round(m / 2.0 * 2.0 ** (-j / 2.0)))) >= 1:
        ks.add(k)
        j += 1
    return sorted(ks)


def _frontier(fn: np.ndarray, tn: np.ndarray) -> np.ndarray:
    """Indices of the vertices of the upper hull of the points `(fn_i, tn_i)` (sorted by fn,
    then tn): the strictly concave corners of the empirical ROC, endpoints included."""
    hull: list[int] = []
    for i in range(fn.size):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b unless the turn a → b → i is strictly concave
            cross = (tn[b] - tn[a]) * (fn[i] - fn[b]) - (tn[i] - tn[b]) * (fn[b] - fn[a])
            if cross > 0:
                break
            hull.pop()
        hull.append(i)
    return np.asarray(hull, dtype=np.int64)


def _check(scores: ArrayLike, included: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inc = np.asarray(included).reshape(-1)
    if s.size != inc.size:
        raise FedsimError(f"one-run audit: {s.size} scores but {inc.size} inclusion bits; pass one per canary")
    if s.size < 2:
        raise FedsimError(f"one-run audit: {s.size} canaries; pass at least 2 (1000 or more for a useful bound)")
    if np.isnan(s).any():
        raise FedsimError("one-run audit: a canary score is NaN; score every canary with a finite number")
    if not np.isin(inc, (0, 1, True, False)).all():
        raise FedsimError("one-run audit: inclusion bits must be 0/1 (or booleans)")
    return s, inc.astype(bool)


def one_run_bound(
    scores: ArrayLike,
    included: ArrayLike,
    delta: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    method: str = "snj",
    sides: str = "one",
    selection: str = "all",
) -> OneRunBound:
    """The one-run ε lower bound from canary scores, with the best guessing rule paid for.

    Parameters
    ----------
    scores : one score per canary (higher = more likely included); any real numbers.
    included : the inclusion bits (1 = the canary was in the population), one per canary.
    delta : the δ of the bound, in (0, 1) (the run's δ); "snj" also accepts 0.
    confidence : probability that the bound holds (default 0.95); significance = 1 − confidence.
    method : "snj" (Steinke–Nasr–Jagielski, default) or "fdp" (f-DP audit, Gaussian curve).
    sides : "one" (k⁻ = 0, k⁺ on `two_sided_grid`; default) or "two" (k⁺ and k⁻ on the grid).
    selection : "all" (default: pay for the K grid rules and test them all) or "frontier"
        (one-sided only: jax_privacy's choice, the ROC hull's vertices, paid by their number).

    Returns the largest bound over the candidate rules, each tested at (1 − confidence)/K.
    """
    s, inc = _check(scores, included)
    _check_rule_options(delta, confidence, method, sides, selection)
    m = int(s.size)
    a = 1.0 - float(confidence)
    # descending order; ties broken against the guess (a tied block is guessed all or none below)
    order = np.argsort(-s, kind="stable")
    s_sorted, inc_sorted = s[order], inc[order]
    cum_in = np.concatenate(([0], np.cumsum(inc_sorted)))  # included among the top k
    cum_out_low = np.concatenate(([0], np.cumsum(~inc_sorted[::-1])))  # excluded among the bottom k
    # valid cut points: k such that the top k is a threshold set (no tie across the cut)
    valid_top = np.ones(m + 1, dtype=bool)
    valid_top[1:m] = s_sorted[:-1] != s_sorted[1:]

    rules: list[tuple[int, int]]
    if selection == "frontier":
        rules, k_count = _frontier_rules(s, inc)
    else:
        grid = two_sided_grid(m)
        outs = grid if sides == "two" else [0]
        pairs = [(kp, km) for kp in grid for km in outs if 0 < kp + km <= m]
        k_count = len(pairs)
        rules = [(kp, km) for kp, km in pairs if valid_top[kp] and valid_top[m - km]]
    sig = a / k_count

    best = (0.0, 0.0, 0, 0, 0)  # (eps, mu, k+, k-, correct)
    best_q = 0.5
    ranked = sorted(rules, key=lambda km: -_precision(km, cum_in, cum_out_low))
    for kp, km in ranked:
        r = kp + km
        v = int(cum_in[kp] + cum_out_low[km])
        if v / r <= best_q and method == "snj":
            continue  # a rule at most as precise as e^ε/(1+e^ε) cannot reject that ε
        if method == "snj":
            e = snj_epsilon(m, r, v, delta, sig, best[0])
            if e > best[0]:
                best = (e, 0.0, kp, km, v)
                best_q = float(expit(e)) if math.isfinite(e) else 1.0
        else:
            mu = fdp_mu(m, r, v, sig, best[1])
            if mu > best[1]:
                best = (gdp_epsilon(mu, delta), mu, kp, km, v)
    eps, mu, kp, km, v = best
    if kp + km == 0:  # nothing rejected: report the most precise rule's counts
        kp, km = ranked[0] if ranked else (0, 0)
        v = int(cum_in[kp] + cum_out_low[km])
    return OneRunBound(
        method=method,
        epsilon=float(eps),
        mu=float(mu) if method == "fdp" else None,
        confidence=float(confidence),
        delta=float(delta),
        num_canaries=m,
        num_included=int(inc.sum()),
        guesses_in=int(kp),
        guesses_out=int(km),
        guesses=int(kp + km),
        correct=int(v),
        candidates=int(k_count),
        sides=sides,
        selection=selection,
    )


def _check_rule_options(delta: float, confidence: float, method: str, sides: str, selection: str) -> None:
    """`one_run_bound`'s options, each refused in one line when out of range."""
    if method not in METHODS:
        raise FedsimError(f"one-run audit: method {method!r}; allowed are {', '.join(METHODS)}")
    if sides not in ("one", "two"):
        raise FedsimError(f"one-run audit: sides {sides!r}; allowed are 'one' and 'two'")
    if selection not in ("all", "frontier"):
        raise FedsimError(f"one-run audit: selection {selection!r}; allowed are 'all' and 'frontier'")
    if selection == "frontier" and sides != "one":
        raise FedsimError("one-run audit: selection 'frontier' is one-sided; use sides='one'")
    if not 0.0 < confidence < 1.0:
        raise FedsimError(f"one-run audit: confidence must lie strictly between 0 and 1 (e.g. 0.95), got {confidence}")
    lo_delta = 0.0 if method == "snj" else np.nextafter(0.0, 1.0)
    if not lo_delta <= delta < 1.0:
        raise FedsimError(f"one-run audit: delta must lie in (0, 1) (the run's delta), got {delta}")


def _precision(rule: tuple[int, int], cum_in: np.ndarray, cum_out_low: np.ndarray) -> float:
    kp, km = rule
    return float(cum_in[kp] + cum_out_low[km]) / (kp + km)


def _frontier_rules(s: np.ndarray, inc: np.ndarray) -> tuple[list[tuple[int, int]], int]:
    """jax_privacy's candidates: thresholds t over the distinct scores and +∞, guess "in" for
    score ≥ t, keeping the upper-hull vertices of (false negatives, true negatives); the count
    paid for is the number of vertices. Returns `(rules, count)` with `rules` as `(k⁺, 0)`."""
    thresholds = np.concatenate((np.unique(s), [np.inf]))
    fn = np.searchsorted(np.sort(s[inc]), thresholds, side="left")
    tn = np.searchsorted(np.sort(s[~inc]), thresholds, side="left")
    idx = _frontier(fn, tn)
    m = s.size
    ks = [int(m - fn[i] - tn[i]) for i in idx]  # guesses above the threshold
    return [(k, 0) for k in ks if k > 0], int(idx.size)


def one_run_bound_in_out(
    in_scores: Sequence[float] | np.ndarray,
    out_scores: Sequence[float] | np.ndarray,
    delta: float,
    **kwargs: Any,
) -> OneRunBound:
    """`one_run_bound` for scores given as two groups (included canaries, excluded canaries)."""
    a = np.asarray(in_scores, dtype=np.float64).reshape(-1)
    b = np.asarray(out_scores, dtype=np.float64).reshape(-1)
    inc = np.concatenate((np.ones(a.size, dtype=bool), np.zeros(b.size, dtype=bool)))
    return one_run_bound(np.concatenate((a, b)), inc, delta, **kwargs)


def perfect_separation_bound(
    m: int, delta: float, *, confidence: float = DEFAULT_CONFIDENCE, method: str = "snj", sides: str = "one"
) -> float:
    """The ceiling for `m` canaries: the bound `one_run_bound` gives when every included
    canary scores above every excluded one (`⌈m/2⌉` of them included, distinct scores)."""
    n_in = (m + 1) // 2
    inc = np.zeros(m, dtype=bool)
    inc[:n_in] = True
    scores = np.where(inc, 1.0 + np.arange(m), -1.0 - np.arange(m))
    return one_run_bound(scores, inc, delta, confidence=confidence, method=method, sides=sides).epsilon


# --------------------------------------------------------------------------- every-release scores
def whitening(
    noise_std: ArrayLike, strategy: np.ndarray | None = None, row_variance: ArrayLike | None = None
) -> np.ndarray:
    """`W` (`T × T`) that turns a canary direction's projections of the `T` noisy sums into
    observations with independent N(0, 1) noise: `W·n ~ N(0, I)` for the noise `n` along a unit
    direction.

    Parameters
    ----------
    noise_std : `σ_t = c_t·z·sens`, the std of round `t`'s noise before correlation (length `T`).
    strategy : the strategy matrix `C` of a matrix-factorization run (noise `σ·C⁻¹·Z`, so
        `W = C·diag(1/σ)`: the decorrelated statistic); its leading `T × T` block is used. None
        for independent noise or for the raw statistic.
    row_variance : with `strategy` None, the variance of each noise row relative to `σ_t²`
        (`Σ_j C⁻¹[t, j]²` for MF): the raw statistic treats rounds as independent with
        std `σ_t·√row_variance[t]` (`W` diagonal). Default all ones (independent noise).
    """
    s = np.asarray(noise_std, dtype=np.float64).reshape(-1)
    t = s.size
    if strategy is not None:
        c = np.asarray(strategy, dtype=np.float64)[:t, :t]
        return c / s[None, :]
    rv = np.ones(t) if row_variance is None else np.asarray(row_variance, dtype=np.float64).reshape(-1)[:t]
    return np.diag(1.0 / (s * np.sqrt(rv)))


def every_release_scores(
    projections: ArrayLike,
    clip: ArrayLike,
    whiten: np.ndarray,
    *,
    groups: int = 1,
    rate: float = 1.0,
) -> np.ndarray:
    """Log-likelihood-ratio scores of canaries from every round's noisy sum (higher = more
    likely included).

    Parameters
    ----------
    projections : `m × T`, `⟨u_k, U_t + noise_t⟩` for canary `k`'s unit direction `u_k` and
        round `t`'s noisy sum (sum space, before the division by `K̄`).
    clip : `c_t` per round (the canary's contribution to the sum along `u_k` when it takes part).
    whiten : `W` from `whitening`.
    groups : `b`, rounds cycle through `b` groups (round `t` trains group `t mod b`); 1 for
        Poisson sampling.
    rate : the probability that a canary of the round's group takes part (Poisson thinning;
        1 for fixed epochs).

    Returns, with `y = W·p_k` and `a_τ = W·(c_τ e_τ)`:

    - `rate = 1`: `log mean_g exp(⟨y, a_g⟩ − ‖a_g‖²/2)` with `a_g = Σ_{τ ≡ g} a_τ`, the exact
      likelihood ratio of "included" when the canary's group is unknown and other users' updates
      are noise;
    - `rate < 1`: `log mean_g Π_{τ ≡ g} (1 − rate + rate·exp(⟨y, a_τ⟩ − ‖a_τ‖²/2))`, exact for
      independent noise and a per-round approximation when `W` is not diagonal.

    Any score gives a valid bound; this one is what the noise model says is most powerful.
    """
    p = np.asarray(projections, dtype=np.float64)
    c = np.asarray(clip, dtype=np.float64).reshape(-1)
    t = p.shape[1]
    y = p @ whiten.T  # m × T
    a = whiten * c[None, :]  # column τ is a_τ
    if rate >= 1.0:
        per_group = []
        for g in range(groups):
            ag = a[:, g::groups].sum(axis=1)
            per_group.append(y @ ag - 0.5 * float(ag @ ag))
        return np.logaddexp.reduce(np.stack(per_group), axis=0) - math.log(groups)
    x = y @ a - 0.5 * (a * a).sum(axis=0)[None, :]  # m × T: log LR of one participation at τ
    terms = np.logaddexp(math.log1p(-rate), math.log(rate) + x)
    per_group = [terms[:, g:t:groups].sum(axis=1) for g in range(groups)]
    return np.logaddexp.reduce(np.stack(per_group), axis=0) - math.log(groups)
