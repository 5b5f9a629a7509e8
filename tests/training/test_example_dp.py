"""Example-level DP inside silos with Opacus (``privacy.unit = "example"``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from torch.nn.utils import parameters_to_vector

from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.models import make_model
from fedsim.training.example_dp import ExampleDP, SiloLedger, local_delta_example_dp, silo_epsilon, steps_and_rate


@pytest.mark.parametrize("sigma,q,steps", [(1.0, 0.125, 8), (0.8, 0.05, 200), (2.0, 0.5, 40)])
def test_silo_epsilon_matches_dp_accounting_rdp(sigma, q, steps):
    """Opacus's RDP accountant vs dp-accounting's for the same Poisson-subsampled Gaussian."""
    acc = RdpAccountant()
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps))
    want = acc.get_epsilon(1e-5)
    assert silo_epsilon(sigma, q, steps, 1e-5) == pytest.approx(want, rel=0.05)


def test_steps_and_rate():
    assert steps_and_rate(64, 8, 1) == (8, 1 / 8)
    assert steps_and_rate(65, 8, 2) == (18, 1 / 9)
    assert steps_and_rate(3, 8, 1) == (1, 1.0)
    # max_examples bounds the steps, never the rate: the batches come from all n records
    assert steps_and_rate(200, 8, 1, 64) == (8, 1 / 25)
    assert steps_and_rate(200, 8, 2, 20) == (6, 1 / 25)
    assert steps_and_rate(12, 8, 1, 64) == (2, 1 / 2)


def _samples(n=40, window=10, vocab=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, window), generator=g), torch.randint(0, vocab, (n,), generator=g)


@pytest.mark.parametrize("max_examples", [None, 16])
def test_pure_noise_update_has_the_dp_sgd_variance(max_examples):
    """With per-sample clip 1e-9 the gradient signal vanishes and the update is Opacus's noise
    alone: Δ = −lr·Σ_s σ·C·ξ_s/B, per-coordinate variance (lr·σ·C/B)²·steps. The steps taken
    are the ledger's (10 without a bound, 4 with max_examples = 16)."""
    model = make_model("shakespeare_lstm_small", 80, seed=0, dp_layers=True)
    x0 = parameters_to_vector(model.parameters()).detach().clone()
    lr, sigma, c, batch, epochs = 0.5, 2.0, 1e-9, 8, 2
    X, Y = _samples()
    delta, _, _ = local_delta_example_dp(
        model, x0, (X, Y), 3, 5, 0, lr, batch, epochs, ExampleDP(sigma, c), max_examples=max_examples
    )
    steps = steps_and_rate(len(Y), batch, epochs, max_examples)[0]
    assert steps == (10 if max_examples is None else 4)
    want = (lr * sigma * c / batch) ** 2 * steps
    d = delta.numel()
    assert float(delta.double().var()) == pytest.approx(want, rel=5 * np.sqrt(2 / d))


class _Silo:
    """One silo's records (user 0), as a federated dataset serves them."""

    def __init__(self, X: torch.Tensor, Y: torch.Tensor) -> None:
        self.X, self.Y = X, Y

    def num_train(self, user: int) -> int:
        return len(self.Y)

    def train_samples(self, user: int, idx) -> tuple[torch.Tensor, torch.Tensor]:
        sel = torch.from_numpy(np.asarray(idx, dtype=np.int64))
        return self.X[sel], self.Y[sel]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(out, y)


def test_one_added_record_changes_no_other_records_batches(monkeypatch):
    """The attack: example-level DP is accounted for a silo dataset that changes by one record,
    each record joining each step's batch on its own coin. If the records trained on were a
    capped subset (``client.max_examples``) drawn over the silo's ``n`` records, adding one
    record would reshuffle which other records are in it (44 of 64 for n = 200), and the two
    neighbouring datasets would be trained on sets far apart. Here a silo of 41 records and the
    same silo plus one record, under one silo key: every other record's batch memberships are
    the same, and where the added record happens to join no batch the update is bit for bit the
    same."""
    import fedsim.training.example_dp as ex
    from fedsim.privacy.rng import PrivacyKey
    from fedsim.training.local import LocalTraining, user_delta

    X, Y = _samples(n=42, seed=4)
    small, big = _Silo(X[:41], Y[:41]), _Silo(X, Y)
    spec = LocalTraining(epochs=2, batch_size=8, lr=0.5, max_examples=16, clip_norm=1.0)
    round_index, user = 3, 0
    steps, rate = steps_and_rate(41, 8, 1, 16)
    assert steps_and_rate(42, 8, 1, 16) == (steps, rate) == (2, 1 / 6)

    def batches(key, n):
        k = key.derive("example-dp", round_index, user)
        return [b for e in range(spec.epochs) for b in ex.poisson_batches(n, rate, steps, k.derive("batches", e))]

    absent = None
    for i in range(50):
        key = PrivacyKey.from_seed(1000 + i)
        with_r, without_r = batches(key, 42), batches(key, 41)
        for a, b in zip(with_r, without_r):
            assert np.array_equal(a[a < 41], b)  # the other records' coins do not depend on n
        if absent is None and not any(41 in b for b in with_r):
            absent = key
    assert absent is not None

    monkeypatch.setattr(ex, "_SILO_KEY", absent)
    dp = ExampleDP(1.0, 1.0)
    out = []
    for silo in (small, big):
        model = make_model("shakespeare_lstm_small", 80, seed=0, dp_layers=True)
        x0 = parameters_to_vector(model.parameters()).detach().clone()
        out.append(user_delta(model, x0, silo, user, round_index, 0, spec, example_dp=dp))
    assert torch.equal(out[0][0], out[1][0]) and out[0][2] == out[1][2]


def test_a_silo_whose_source_returns_too_few_records_fails():
    """The ledger's rate is over ``num_train`` records; a source that serves fewer would train
    at another rate than the one accounted, so the silo raises (and fails alone)."""
    from fedsim.training.example_dp import silo_samples

    class Short(_Silo):
        def train_samples(self, user, idx):
            X, Y = super().train_samples(user, idx)
            return X[:-1], Y[:-1]

    X, Y = _samples(n=10)
    assert torch.equal(silo_samples(_Silo(X, Y), 0)[1], Y)
    with pytest.raises(ValueError, match="asked for its 10 training records, got 9"):
        silo_samples(Short(X, Y), 0)


def test_seeded_and_differs_from_plain_sgd():
    model = make_model("shakespeare_lstm_small", 80, seed=0, dp_layers=True)
    x0 = parameters_to_vector(model.parameters()).detach().clone()
    dp = ExampleDP(1.0, 1.0)
    X, Y = _samples()
    a, _, seen = local_delta_example_dp(model, x0, (X, Y), 3, 5, 0, 0.5, 8, 1, dp)
    b, _, _ = local_delta_example_dp(model, x0, (X, Y), 3, 5, 0, 0.5, 8, 1, dp)
    c, _, _ = local_delta_example_dp(model, x0, (X, Y), 4, 5, 0, 0.5, 8, 1, dp)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 0 < seen  # Poisson batches: the count varies, some examples are seen
    assert torch.equal(parameters_to_vector(model.parameters()).detach() - x0, c)  # the last call


def test_dp_model_has_the_same_size_but_its_own_layout():
    plain = make_model("shakespeare_lstm_small", 80, seed=0)
    dp = make_model("shakespeare_lstm_small", 80, seed=0, dp_layers=True)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in dp.parameters())


def test_silo_ledger_records_and_recomputes():
    led = SiloLedger(ExampleDP(1.0, 1.0), 1e-5, {0: (8, 0.125), 1: (4, 0.25)})
    e1 = led.record([0, 1])
    eps0 = led.epsilons[0]
    e2 = led.record([0])
    assert led.epsilons[0] > eps0 > 0 and e2 >= e1 > 0
    j = led.to_json()
    assert j["silos"]["0"]["participations"] == 2 and j["silos"]["1"]["participations"] == 1
    for s in j["silos"].values():
        assert s["epsilon"] == pytest.approx(
            silo_epsilon(1.0, s["sample_rate"], s["steps_per_participation"] * s["participations"], 1e-5)
        )
    assert j["max_silo_epsilon"] == max(s["epsilon"] for s in j["silos"].values())
    other = SiloLedger(ExampleDP(1.0, 1.0), 1e-5, {0: (8, 0.125), 1: (4, 0.25)})
    other.load_state_dict(led.state_dict())
    assert other.to_json() == j


def test_config():
    with pytest.raises(FedsimError, match="example_noise_multiplier"):
        load_config(None, ["privacy.unit='example'"])
    with pytest.raises(FedsimError, match="example_noise_multiplier"):
        load_config(None, ["privacy.example_noise_multiplier=1.0"])
    with pytest.raises(FedsimError, match="DiSK"):
        load_config(
            None,
            [
                "privacy.unit='example'",
                "privacy.example_noise_multiplier=1.0",
                "filter.name='disk'",
                "server.optimizer='sgd'",
            ],
        )


@pytest.mark.e2e
def test_example_level_run_records_both_guarantees(tmp_path):
    from dp_accounting.pld import PLDAccountant

    from fedsim.runner import run_experiment

    N, K, z = 20, 6, 1.2
    cfg = load_config(
        None,
        [
            "rounds=2",
            "sampling.scheme='poisson'",
            "privacy.mechanism='gaussian'",
            f"privacy.noise_multiplier={z}",
            "model.name='shakespeare_lstm_small'",
            f"data.max_users={N}",
            f"sampling.cohort_size={K}",
            "client.max_examples=16",
            "client.batch_size=8",
            "eval.every=1",
            "eval.max_users=4",
            "eval.max_examples_per_user=8",
            "sim.num_workers=2",
            "privacy.unit='example'",
            "privacy.example_noise_multiplier=1.0",
            "privacy.example_clip_norm=1.0",
            "privacy.silo_statistics='send'",  # evaluation on the silos' records (withheld by default)
        ],
    )
    out = tmp_path / "run"
    summary = run_experiment(cfg, out, progress=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ledger = json.loads((out / "ledger.json").read_text())
    ex = ledger["example_level"]
    assert ex["accountant"].startswith("opacus") and ex["silos"]
    # Every silo's ε recomputes from its record; the max is what metrics and summary report.
    for s in ex["silos"].values():
        assert s["epsilon"] == pytest.approx(
            silo_epsilon(1.0, s["sample_rate"], s["steps_per_participation"] * s["participations"], ex["delta"]),
            rel=1e-12,
        )
    assert summary["example_epsilon_max"] == ex["max_silo_epsilon"] == rows[-1]["example_epsilon_max"] > 0
    assert sum(s["participations"] for s in ex["silos"].values()) == sum(r["cohort_size"] for r in rows)
    # The user-level guarantee is untouched by the silos' DP-SGD.
    acc = PLDAccountant()
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(K / N, dp_event.GaussianDpEvent(z)), 2))
    assert summary["epsilon"] == pytest.approx(acc.get_epsilon(1 / N**1.1), rel=1e-8)
    assert rows[-1]["eval_accuracy"] is not None
