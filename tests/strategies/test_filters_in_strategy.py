"""Filters and DP-AdamBC composed with the noise mechanisms: exact Φ_t, ε unchanged, a Ray run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.privacy.noise import NoiseMechanism, gaussian_noise
from fedsim.server.step import noise_variance_fn

BASE = [
    "rounds=6",
    "data.max_users=24",
    "client.max_examples=8",
    "eval.every=0",
    "eval.max_users=4",
    "eval.max_examples_per_user=4",
    "sim.num_workers=2",
    "privacy.noise_multiplier=1.5",
]


@pytest.mark.parametrize("which", ["gaussian", "blt"])
@pytest.mark.parametrize("filt", [("doppler", {"preset": "first_order_v1"}), ("ema", {"kappa": 0.7}), (None, {})])
def test_phi_matches_empirical_variance_of_filtered_noise(which, filt):
    """Push real streamed noise through the real filter over d = 40,000 i.i.d. coordinates;
    the per-coordinate variance at each t must match Φ_t within 5 standard errors."""
    from fedsim.server.filters import make_filter

    n, d, std, k_bar = 8, 40_000, 3.0, 10
    if which == "gaussian":
        noise, M = gaussian_noise(d, 1), None
    else:
        from scipy.linalg import toeplitz

        from fedsim.privacy.mechanisms.blt import blt_coefficients

        theta, omega = np.array([0.8, 0.3]), np.array([0.2, 0.1])
        C = np.tril(toeplitz(blt_coefficients(theta, omega, n)))
        from fedsim.privacy.mechanisms.blt import BLTStream

        noise, M = NoiseMechanism(d, 1, "cpu", BLTStream(theta, omega, 1.0)), np.linalg.inv(C)
    f = make_filter(filt[0], **filt[1]) if filt[0] else None
    phi = noise_variance_fn(std, k_bar, M, None if f is None else f.impulse_response(n))
    for t in range(n):
        g = noise.row(t).double() * std / k_bar
        out = g if f is None else f.step(g)
        emp = float(out.var())
        assert emp == pytest.approx(phi(t), abs=5 * phi(t) * np.sqrt(2 / d)), (t, emp, phi(t))


def test_epsilon_unchanged_by_filter_and_optimizer():
    from fedsim.runner import privacy_report

    base = BASE + [
        "sampling.scheme='epochs'",
        "sampling.min_sep=3",
        "sampling.cohort_size=8",
        "privacy.mechanism='blt'",
    ]
    reports = [
        privacy_report(load_config(None, base + extra), 24)
        for extra in (
            ["server.optimizer='sgd'"],
            ["filter.name='doppler'", "server.optimizer='adambc'"],
            ["filter.name='ema'", "server.optimizer='adam'"],
            ["filter.name='disk'", "server.optimizer='yogi'"],
        )
    ]
    assert all(r == reports[0] for r in reports)


def test_momentum_on_top_of_a_filter_is_refused():
    with pytest.raises(FedsimError, match="filter.name"):
        load_config(None, ["filter.name='doppler'", "server.optimizer='momentum'"])


@pytest.mark.e2e
def test_blt_doppler_adambc_run(tmp_path):
    from fedsim.runner import run_experiment

    cfg = load_config(
        None,
        BASE
        + [
            "sampling.scheme='epochs'",
            "sampling.min_sep=3",
            "sampling.cohort_size=8",
            "privacy.mechanism='blt'",
            "filter.name='doppler'",
            "server.optimizer='adambc'",
            "server.lr=0.01",
        ],
    )
    summary = run_experiment(cfg, tmp_path / "run", progress=False)
    assert summary["rounds_completed"] == 6
    from fedsim.checkpoint import load_checkpoint

    ck = load_checkpoint(tmp_path / "run" / "checkpoint")
    assert torch.isfinite(ck["server"]["params"]).all()
    assert ck["server"]["filter"] is not None and ck["server"]["optimizer"]["name"] == "adambc"
