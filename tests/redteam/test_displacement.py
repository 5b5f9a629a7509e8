"""Red team, finding 1: which users a new user displaces.

The attack: neighbouring datasets D and D' = D + x, where x's name sorts in the middle (so
every later user's index shifts). Worst-case updates: every user sends +u, x sends −u, with
‖u‖ = c. Both runs use the same key and the same public constants (N, K̄, b, B). The release is
equivalent to ``C·G + c·z·sens(C)·Z`` (docs/algorithms.md §3), so the pair is a Gaussian
mechanism with sensitivity ``μ = ‖C·(G_D' − G_D)‖ / (c·z·sens)`` in noise standard deviations,
and its ε at δ is exactly dp-accounting's ``GaussianDpEvent(1/μ)``.

With keyed assignment nobody but x changes rounds, so μ ≤ 1/z and the pair's ε never exceeds the
ledger's add/remove ε. With the shuffle assignment the attack succeeds (x displaces users), which
is why fedsim labels that assignment zero-out.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant

from fedsim.privacy.accounting import AccountingSpec, epsilon
from fedsim.privacy.mechanisms import plan_mf
from fedsim.privacy.participation import make_scheme
from fedsim.server.sampling import make_sampler

Z = 1.0
X_NAME = "user-0050x"  # sorts between user-0050 and user-0051


def _names(n: int) -> list[str]:
    return [f"user-{i:04d}" for i in range(n)]


def _with_x(names: list[str]) -> list[str]:
    return sorted(names + [X_NAME])


def _rounds_by_name(sampler, names: list[str], rounds: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {n: [] for n in names}
    for t in range(rounds):
        for i in sampler.sample(t):
            out[names[i]].append(t)
    return out


def _pair_epsilon(mu: float, delta: float) -> float:
    if mu == 0:
        return 0.0
    acc = PLDAccountant()
    acc.compose(dp_event.GaussianDpEvent(1.0 / mu))
    return float(acc.get_epsilon(delta))


def _attack(scheme, n_rounds: int, C: np.ndarray, sens: float, names: list[str]) -> tuple[dict, float]:
    """The pair's (rounds of every user in D and D', μ in noise stds)."""
    names_x = _with_x(names)
    r_d = _rounds_by_name(make_sampler(scheme, 11, names), names, n_rounds)
    r_dx = _rounds_by_name(make_sampler(scheme, 11, names_x), names_x, n_rounds)
    g_d, g_dx = np.zeros(n_rounds), np.zeros(n_rounds)
    for rs in r_d.values():
        g_d[rs] += 1.0
    for name, rs in r_dx.items():
        g_dx[rs] += -1.0 if name == X_NAME else 1.0
    mu = float(np.linalg.norm(C @ (g_dx - g_d))) / (Z * sens)  # c = 1
    return {"D": r_d, "D+x": r_dx}, mu


CASES = {
    # scheme, N, cohort, b, k, rounds, mechanism
    "single": ("single", 100, 100, None, None, 1, "identity"),
    "epochs": ("epochs", 120, None, 4, 3, 12, "blt"),
    "min_sep": ("min_sep", 120, None, 4, 3, 12, "banded"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_keyed_assignment_displaces_nobody_and_the_pair_fits_the_ledger(case):
    name, n, cohort, b, k, rounds, mech = CASES[case]
    scheme = make_scheme(name, n, cohort, min_sep=b, max_participations=k, rounds=rounds)
    assert scheme.neighboring_relation == "add_or_remove_one"
    plan = plan_mf(mech, scheme, rounds, **({"bands": b} if mech == "banded" else {}))
    rounds_of, mu = _attack(scheme, rounds, plan.C, plan.sens, _names(n))
    for user, rs in rounds_of["D"].items():
        assert rounds_of["D+x"][user] == rs, f"{user} moved when x joined"
    delta = 1.0 / n**1.1
    ledger = epsilon(AccountingSpec(mech, name, n, scheme.expected_cohort, Z, delta, min_sep=b or 1), rounds)
    pair = _pair_epsilon(mu, delta)
    assert mu <= 1.0 / Z + 1e-9 and pair <= ledger + 1e-9, (mu, pair, ledger)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_attack_breaks_add_remove_under_shuffle_assignment(case):
    name, n, cohort, b, k, rounds, mech = CASES[case]
    scheme = make_scheme(name, n, cohort, min_sep=b, max_participations=k, rounds=rounds, assignment="shuffle")
    assert scheme.neighboring_relation == "zero_out"
    plan = plan_mf(mech, scheme, rounds, **({"bands": b} if mech == "banded" else {}))
    rounds_of, mu = _attack(scheme, rounds, plan.C, plan.sens, _names(n))
    moved = [u for u, rs in rounds_of["D"].items() if rounds_of["D+x"][u] != rs]
    assert moved, "a shuffle should displace someone"
    delta = 1.0 / n**1.1
    ledger = epsilon(
        AccountingSpec(mech, name, n, scheme.expected_cohort, Z, delta, min_sep=b or 1, assignment="shuffle"), rounds
    )
    assert _pair_epsilon(mu, delta) > ledger  # add/remove would be a false claim: hence zero-out
    if case == "single":  # the review's case: K = N = 100, one round, z = 1 → ledger 2.50, pair ≈ 6.3
        assert ledger == pytest.approx(2.50, abs=0.01) and mu == pytest.approx(2.0)
        assert _pair_epsilon(mu, delta) == pytest.approx(_gaussian_epsilon(mu, delta), abs=2e-3)
        assert _gaussian_epsilon(mu, delta) > 6.3


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Closed form (Balle & Wang 2018): the ε at which the Gaussian mechanism with sensitivity μ
    (in noise stds) has δ(ε) = Φ(μ/2 − ε/μ) − e^ε·Φ(−μ/2 − ε/μ) — independent of dp-accounting."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    return brentq(lambda e: norm.cdf(mu / 2 - e / mu) - math.exp(e) * norm.cdf(-mu / 2 - e / mu) - delta, 0, 100)


def test_thinned_min_sep_others_keep_their_coins_and_x_is_poisson_sampled():
    """Amplified banded MF: the pair differs only through x's own rounds, each kept by x's own
    coin with probability p; every other user's participation is unchanged."""
    n, b, k, kbar = 400, 4, 50, 20
    rounds = b * k
    scheme = make_scheme("min_sep", n, kbar, min_sep=b, max_participations=k, poisson_within_group=True, rounds=rounds)
    names = _names(n)
    names_x = _with_x(names)
    r_d = _rounds_by_name(make_sampler(scheme, 3, names), names, rounds)
    r_dx = _rounds_by_name(make_sampler(scheme, 3, names_x), names_x, rounds)
    assert all(r_dx[u] == rs for u, rs in r_d.items())
    p = scheme.sampling_rate
    assert p == pytest.approx(kbar * b / n)
    # across many keys, x's participation count is Binomial(k, p): its mean over 200 keys
    counts = [len(_rounds_by_name(make_sampler(scheme, s, names_x), names_x, rounds)[X_NAME]) for s in range(200)]
    mean, sd = k * p, math.sqrt(k * p * (1 - p) / 200)
    assert abs(np.mean(counts) - mean) < 5 * sd
    # and the ledger composes ⌈n/b⌉ Poisson-sampled Gaussians at that p, for add/remove
    spec = AccountingSpec("banded", "min_sep", n, kbar, Z, 1e-5, min_sep=b, amplified=True)
    assert spec.sampling_rate == pytest.approx(p) and spec.neighboring_relation == "add_or_remove_one"


def test_the_default_experiment_states_add_remove_and_its_expected_cohort(capsys):
    import json

    from helpers import run_cli

    code, out, _ = run_cli(capsys, "privacy", "--json")
    rep = json.loads(out)
    assert code == 0 and rep["neighboring_relation"] == "add_or_remove_one" and rep["assignment"] == "keyed"
    assert rep["cohort_size"] == pytest.approx(848 / 28)
    code, out, _ = run_cli(capsys, "privacy", "--json", "--set", "sampling.assignment='shuffle'")
    rep = json.loads(out)
    assert code == 0 and rep["neighboring_relation"] == "zero_out" and rep["cohort_size"] == 30
