"""ε computed ahead in the background (issue 46): a Poisson run's PLD composition for the next
accounted round runs while the round trains. The prefetched ε must be the very float a fresh
dp-accounting accountant gives (and so the ledger's recompute path), and it must be the one used."""

from __future__ import annotations

import json
import pickle

import pytest

from fedsim.privacy.accounting import AccountingSpec, EpsilonCurve, epsilon
from fedsim.privacy.ledger import Ledger, recompute_epsilon

N, K, Z, DELTA = 200, 10, 1.5, 1e-5


def poisson(**kw) -> AccountingSpec:
    base = dict(mechanism="gaussian", scheme="poisson", population=N, cohort_size=K, noise_multiplier=Z, delta=DELTA)
    return AccountingSpec(**{**base, **kw})


def test_a_prefetched_epsilon_is_used_and_is_a_fresh_accountants_float(monkeypatch):
    curve = EpsilonCurve(poisson())
    curve.prefetch(5)
    pending = curve._pending[5]
    value = pending.result(timeout=60)
    # once computed ahead, asking for it computes nothing
    monkeypatch.setattr(curve, "_compute", lambda *a: pytest.fail("ε computed again"))
    assert curve(5) == value == epsilon(poisson(), 5)
    curve.prefetch(5)  # already known: no new work
    assert not curve._pending


def test_the_ledger_prefetches_the_next_accounted_round_and_every_entry_recomputes():
    ledger = Ledger(poisson(), planned_rounds=7, account_every=3)
    nexts = []
    for t in range(7):
        nexts.append(ledger.next_accounted())
        ledger.record_round(t, K)
        upcoming = ledger.next_accounted()
        if upcoming is not None:  # started in the background at once
            assert upcoming in ledger._curve._pending or upcoming in ledger._curve._cache
    assert nexts == [3, 3, 3, 6, 6, 6, 7] and ledger.next_accounted() is None
    doc = json.loads(json.dumps(ledger.to_json()))
    accounted = {e["round"]: e["epsilon"] for e in doc["entries"] if e["epsilon"] is not None}
    assert sorted(accounted) == [3, 6, 7]
    for t, eps in accounted.items():
        assert eps == epsilon(poisson(), t) == recompute_epsilon(doc, rounds=t)


@pytest.mark.parametrize("kw", [{"accountant": "rdp"}, {"scheme": "fixed"}], ids=["poisson-rdp", "fixed"])
def test_cheap_accountants_are_not_sent_to_the_background(kw):
    curve = EpsilonCurve(poisson(**kw))
    curve.prefetch(4)
    assert not curve._pending and curve(4) == epsilon(poisson(**kw), 4)


def test_a_curve_with_work_in_flight_pickles_without_it():
    curve = EpsilonCurve(poisson())
    curve.prefetch(3)
    copy = pickle.loads(pickle.dumps(curve))
    assert not copy._pending and copy(3) == curve(3) == epsilon(poisson(), 3)
