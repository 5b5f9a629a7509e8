"""Red team, issue 34 finding 4: ``N`` was read from the data, so adding one user changed
``q = K̄/N`` (Poisson), the expected group size ``K̄ = N/b`` (keyed ``epochs``), the number of
buckets ``⌈N/K⌉`` (keyed ``single``) and the default ``δ = 1/N^1.1`` for everyone else: the
displacement class of the earlier sampler finding. ``privacy.population`` states ``N`` in the
config; a neighbouring pair of populations then gets the same constants and every user present
in both is sampled in the same rounds.
"""

from __future__ import annotations

import pytest

from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.privacy.rng import PrivacyKey
from fedsim.runner import build_run, resolve_privacy, scheme_of
from fedsim.server.sampling import make_sampler

NAMES = [f"user_{i:03d}" for i in range(41)]
BASE = ["data.name='synthetic'", "model.name='logreg'", "rounds=12", "sim.engine='inprocess'", "sim.num_workers=1"]
SCHEMES = {
    "poisson": ["sampling.scheme='poisson'", "sampling.cohort_size=6", "privacy.mechanism='gaussian'"],
    "epochs": ["sampling.scheme='epochs'", "sampling.min_sep=4", "privacy.mechanism='banded'"],
    "single": ["sampling.scheme='single'", "sampling.cohort_size=3", "privacy.mechanism='identity'"],
}


def _rounds_of_each_user(cfg, n: int) -> tuple[dict, dict[str, list[int]]]:
    """The accounting spec for the first ``n`` users and each user's rounds (seeded key)."""
    spec = resolve_privacy(cfg, n)
    sampler = make_sampler(scheme_of(cfg, n), PrivacyKey.from_seed(cfg.seed), NAMES[:n])
    rounds: dict[str, list[int]] = {name: [] for name in NAMES[:n]}
    for t in range(cfg.rounds):
        for u in sampler.sample(t):
            rounds[NAMES[u]].append(t)
    return spec.to_dict(), rounds


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_a_stated_population_gives_a_neighbouring_pair_the_same_constants_and_rounds(scheme):
    cfg = load_config(None, BASE + SCHEMES[scheme] + ["privacy.noise_multiplier=1.0", "privacy.population=41"])
    spec_a, rounds_a = _rounds_of_each_user(cfg, 40)
    spec_b, rounds_b = _rounds_of_each_user(cfg, 41)  # one user added
    assert spec_a == spec_b and spec_a["population"] == 41
    assert {u: rounds_b[u] for u in rounds_a} == rounds_a
    assert sum(len(r) for r in rounds_a.values()) > 0


def test_without_a_stated_population_the_added_user_moves_the_constants():
    """The control: N read from the data differs in the pair, and so does δ (and q for Poisson)."""
    cfg = load_config(None, BASE + SCHEMES["poisson"] + ["privacy.noise_multiplier=1.0"])
    spec_a, _ = _rounds_of_each_user(cfg, 40)
    spec_b, _ = _rounds_of_each_user(cfg, 41)
    assert spec_a["delta"] != spec_b["delta"] and spec_a["sampling_rate"] != spec_b["sampling_rate"]


def test_the_data_are_checked_against_the_stated_population():
    ok = load_config(None, BASE + SCHEMES["poisson"] + ["privacy.noise_multiplier=1.0", "privacy.population=30"])
    with pytest.raises(FedsimError, match=r"privacy.population = 30, but the data hold 31 users"):
        resolve_privacy(ok, 31)
    fixed = load_config(
        None,
        BASE
        + ["sampling.scheme='fixed'", "sampling.cohort_size=6", "privacy.mechanism='gaussian'"]
        + ["privacy.noise_multiplier=1.0", "privacy.population=30"],
    )
    with pytest.raises(FedsimError, match="needs exactly N"):
        scheme_of(fixed, 29)
    assert scheme_of(fixed, 30).population == 30


def test_a_run_accounts_with_the_stated_population_and_says_so(tmp_path):
    cfg = load_config(
        None,
        BASE
        + SCHEMES["poisson"]
        + ["data.num_clients=24", "privacy.noise_multiplier=1.0", "privacy.population=100", "rounds=1"],
    )
    run = build_run(cfg)
    assert run.spec.population == 100 and run.spec.sampling_rate == pytest.approx(6 / 100)
    assert run.spec.delta == pytest.approx(1 / 100**1.1)
    assert any("privacy.population = 100" in n and "24 users" in n for n in run.notes)
    with pytest.raises(FedsimError, match="privacy.population = 20, but the data hold 24 users"):
        build_run(
            load_config(
                None,
                BASE
                + SCHEMES["poisson"]
                + ["data.num_clients=24", "privacy.noise_multiplier=1.0", "privacy.population=20"],
            )
        )
