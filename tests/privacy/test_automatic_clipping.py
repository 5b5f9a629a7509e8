"""Automatic clipping (``clipping.mode = "automatic"``; Bu et al., NeurIPS 2023): every user's
delta becomes ``c·Δ/(‖Δ‖ + r)``. Checked against the closed form, for the norm bound the
sensitivity rests on (below ``c`` after the float32 cast, for tiny and huge deltas alike), on
the batched rows path, through local training, and in the config."""

from __future__ import annotations

import math

import pytest
import torch

from fedsim.config import load_config
from fedsim.data.synthetic import SyntheticClassification
from fedsim.errors import FedsimError
from fedsim.models import make_model
from fedsim.privacy.clipping import clip_rows, clip_vector
from fedsim.training.local import LocalTraining, train_users
from fedsim.training.vectorized import train_users_vectorized

C, R = 1.0, 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm", [1e-6, 0.005, 0.5, 0.99, 1.0, 1.0 - 1e-12, 3.0, 1e6])
def test_every_vector_is_scaled_to_c_times_its_direction_over_norm_plus_r(norm, dtype):
    g = torch.Generator().manual_seed(int(norm * 1e6) % 2**31)
    v = torch.randn(1000, generator=g, dtype=torch.float64)
    v = (v * (norm / v.norm())).to(dtype)
    out, reported = clip_vector(v, C, sent_as=torch.float32, stability=R)
    n = float(v.to(torch.float64).norm())
    assert reported == pytest.approx(n, rel=1e-12)
    want = v.to(torch.float64) * (C / (n + R))  # the closed form
    torch.testing.assert_close(out.to(torch.float64), want, rtol=1e-6, atol=0)
    sent = out.to(torch.float32).to(torch.float64).norm()
    assert float(sent) < C  # the bound the noise is calibrated to, after the cast workers send
    assert float(sent) == pytest.approx(C * n / (n + R), rel=1e-6)


def test_rows_are_scaled_as_each_would_be_alone():
    rows = torch.randn(7, 300, generator=torch.Generator().manual_seed(1)) * torch.tensor(
        [[1e-4], [0.01], [0.3], [1.0], [2.0], [50.0], [float("nan")]]
    )
    out, norms = clip_rows(rows, C, sent_as=torch.float32, stability=R)
    for i in range(6):
        alone, n = clip_vector(rows[i], C, sent_as=torch.float32, stability=R)
        assert torch.equal(out[i], alone) and norms[i] == n
    assert torch.equal(out[6], torch.zeros(300)) and math.isinf(norms[6])  # a non-finite row still contributes 0


def test_local_training_sends_the_normalised_delta_on_both_paths():
    data = SyntheticClassification(users=12, samples=20, features=8, classes=3, seed=2)
    model = make_model("logreg", data.model_dims(), seed=1)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    raw = LocalTraining(epochs=1, batch_size=4, lr=0.3, max_examples=12, clip_norm=1e9)
    auto = LocalTraining(epochs=1, batch_size=4, lr=0.3, max_examples=12, clip_norm=C, clip_stability=R)
    for u in range(4):
        delta, res = train_users(model, x0, data, [u], 0, 7, raw)  # unclipped (c far above the norm)
        sent, res_auto = train_users(model, x0, data, [u], 0, 7, auto)
        n = float(delta.to(torch.float64).norm())
        assert res_auto[0].norm == pytest.approx(n, rel=1e-6)
        torch.testing.assert_close(sent, delta * (C / (n + R)), rtol=1e-5, atol=1e-7)
    seq, _ = train_users(model, x0, data, list(range(12)), 0, 7, auto)
    vec, _ = train_users_vectorized(model, x0, data, list(range(12)), 0, 7, auto)
    torch.testing.assert_close(vec, seq, rtol=1e-5, atol=1e-6)


def test_the_config_sets_it_and_refuses_what_reads_the_cut_off_part():
    cfg = load_config(None, ["clipping.mode='automatic'", "clipping.stability=0.05"])
    from fedsim.runner.build import build_run

    run = build_run(
        load_config(
            None,
            [
                "clipping.mode='automatic'",
                "data.name='synthetic'",
                "model.name='logreg'",
                "rounds=2",
                "sampling.min_sep=2",
                "sim.engine='inprocess'",
                "sim.num_workers=1",
            ],
        )
    )
    assert run.task.local.clip_stability == 0.01 and cfg.clipping.stability == 0.05
    with pytest.raises(FedsimError, match="automatic.*adaptive clipping"):
        load_config(None, ["clipping.mode='automatic'", "clipping.adaptive=true"])
    with pytest.raises(FedsimError, match="automatic.*error feedback"):
        load_config(
            None,
            ["clipping.mode='automatic'", "client.error_feedback='client'", "privacy.mechanism='gaussian'"]
            + ["sampling.scheme='poisson'", "privacy.noise_multiplier=1.0"],
        )
