"""DiSK's client evaluation (docs/algorithms.md §6): two points, same batches, mix before clip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

import fedsim.training.local as training
from fedsim.config import load_config
from fedsim.data import data_spec, load_federated
from fedsim.data.shakespeare import VOCAB_SIZE
from fedsim.errors import FedsimError
from fedsim.models import make_model
from fedsim.server.filters import make_filter
from fedsim.training.local import DiskClient, LocalTraining, local_delta, train_one_user, train_users


def _disk(mode, kappa=0.7, gamma=None):
    f = make_filter("disk", mode=mode, kappa=kappa, gamma=gamma)
    return DiskClient(f.mode, f.gamma, f.a)


@pytest.mark.parametrize("mode", ["two_point", "lookahead"])
def test_quadratic_client_matches_closed_form(monkeypatch, mode):
    """Client objective f(x) = ½‖x − x*‖², local GD with step η for s steps from x gives
    Δ(x) = ρ·(x* − x), ρ = 1 − (1−η)^s. DiSK's mixed update is then
    v = a·Δ(x + γd) + (1−a)·Δ(x) = ρ·(x* − x − a·γ·d), clipped after mixing."""
    eta, s = 0.3, 5
    rho = 1 - (1 - eta) ** s
    rng = np.random.default_rng(1)
    x_star = torch.tensor(rng.normal(size=7))
    starts = []

    def quad_delta(model, x0, data, user, round_index, seed, spec, while_queued=None):
        starts.append(x0.clone())
        x = x0.clone()
        for _ in range(s):
            x = x - eta * (x - x_star)
        return x - x0, 0.0, s

    monkeypatch.setattr(training, "local_delta", quad_delta)
    model = torch.nn.Linear(7, 1, bias=False).double()  # only its device is used
    x_t = torch.tensor(rng.normal(size=7))
    d = torch.tensor(rng.normal(size=7))
    disk = _disk(mode)
    spec = LocalTraining(1, 1, eta, 1, clip_norm=1e6)
    u, res = train_one_user(model, x_t, None, 3, 0, 0, spec, disk, d)
    want = rho * (x_star - x_t - disk.a * disk.gamma * d)
    torch.testing.assert_close(u, want, rtol=1e-12, atol=1e-12)
    # The client really evaluated at x_t + γd (and at x_t for two_point), nowhere else.
    expect = [x_t + disk.gamma * d] + ([x_t] if mode == "two_point" else [])
    assert len(starts) == len(expect) == disk.evaluations
    for a, b in zip(starts, expect):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)
    if mode == "two_point":
        assert disk.a == pytest.approx(0.3 / (0.7 * 0.5))
    else:
        assert disk.a == 1.0 and disk.gamma == pytest.approx(0.3 / 0.7)
    # Clipping happens after mixing: with a small c the update is the clipped mix.
    c = 0.1
    u_c, res_c = train_one_user(model, x_t, None, 3, 0, 0, LocalTraining(1, 1, eta, 1, c), disk, d)
    assert res_c.clipped and res_c.norm == pytest.approx(float(want.norm()), rel=1e-12)
    torch.testing.assert_close(u_c, want * (c / want.norm()), rtol=1e-6, atol=1e-9)


@pytest.fixture(scope="module")
def shakespeare():
    return load_federated(data_spec("shakespeare", max_users=40))


def test_real_client_mixes_two_evaluations_on_the_same_batches(shakespeare):
    """On the real model and data, train_users with DiSK equals a·Δ(y) + (1−a)·Δ(x) from two
    separate local_delta calls with the same (seed, round, user), clipped."""
    model = make_model("shakespeare_lstm_small", VOCAB_SIZE, seed=0)
    x_t = parameters_to_vector(model.parameters()).detach().clone()
    d = torch.randn(x_t.numel(), generator=torch.Generator().manual_seed(3)) * 1e-2
    spec = LocalTraining(epochs=1, batch_size=4, lr=1.0, max_examples=8, clip_norm=0.5)
    disk = _disk("two_point")
    total, res = train_users(model, x_t, shakespeare, [2, 5], 4, 7, spec, disk, d)
    want = torch.zeros_like(x_t)
    for u in (2, 5):
        dx, _, _ = local_delta(model, x_t, shakespeare, u, 4, 7, spec)
        dy, _, _ = local_delta(model, x_t + disk.gamma * d, shakespeare, u, 4, 7, spec)
        v = disk.a * dy + (1 - disk.a) * dx
        want += v * min(1.0, spec.clip_norm / float(v.norm()))
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-7)
    # ... and it is not the single-point update.
    plain, _ = train_users(model, x_t, shakespeare, [2, 5], 4, 7, spec)
    assert not torch.allclose(total, plain, atol=1e-6)


def test_config_lookahead_gamma_and_default_mode():
    cfg = load_config(None, ["filter.name='disk'", "server.optimizer='sgd'"])
    assert cfg.filter.mode == "two_point" and cfg.filter.gamma is None
    load_config(None, ["filter.name='disk'", "server.optimizer='sgd'", "filter.mode='lookahead'"])
    with pytest.raises(FedsimError, match="lookahead"):
        load_config(
            None, ["filter.name='disk'", "server.optimizer='sgd'", "filter.mode='lookahead'", "filter.gamma=0.5"]
        )
