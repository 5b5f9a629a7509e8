"""experiments/iterate_noise.py and adam_states.py: the noise the iterates and Adam's moments carry,
against closed forms and a simulation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from helpers import experiment_script


def _script() -> Any:
    return experiment_script("iterate_noise")


def test_independent_noise_without_a_filter_is_a_random_walk():
    """No filter, M = I: e_t is the sum of t + 1 independent unit normals, Var(e_t) = t + 1."""
    v = _script().iterate_variance(np.eye(50), {"name": "none"})
    np.testing.assert_allclose(v, np.arange(1, 51), rtol=0, atol=1e-12)


def test_a_filtered_correlated_stream_matches_a_simulation():
    """DOPPLER on correlated noise (a random lower-triangular M): the computed Var(e_t) against
    streams pushed through the filter object and summed, 20,000 coordinates (5 standard errors)."""
    from fedsim.server.filters import make_filter

    n, reps = 30, 20_000
    rng = np.random.default_rng(0)
    m = np.tril(rng.normal(size=(n, n)) * 0.3) + np.eye(n)
    v = _script().iterate_variance(m, {"name": "doppler", "preset": "first_order_v1"})
    noise = m @ rng.standard_normal((n, reps))
    f = make_filter("doppler", preset="first_order_v1")
    e = np.zeros(reps)
    sim = []
    for t in range(n):
        e += f.step(torch.from_numpy(noise[t].copy())).numpy()
        sim.append(np.mean(e**2))
    se = np.sqrt(2.0 / reps) * v  # std of a sample variance of a normal
    assert np.all(np.abs(np.array(sim) - v) < 5 * se), np.max(np.abs(np.array(sim) - v) / se)


def test_adam_states_phi_recursion_is_exact_for_a_constant_noise_variance():
    """experiments/adam_states.py: with Φ_t = Φ for every round, the bias-corrected φ_T/(1−β2^T) is Φ."""
    phi, phi_hat = experiment_script("adam_states").phi_hat(np.full(150, 3e-3), 0.999)
    assert abs(phi - 3e-3 * (1 - 0.999**150)) < 1e-15
    assert abs(phi_hat - 3e-3) < 1e-15
