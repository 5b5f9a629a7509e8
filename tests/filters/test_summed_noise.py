"""What a unit-DC-gain filter does to the noise that server SGD sums into the iterate
(experiments/README.md, "Filter ablation"; experiments/filter_noise_budget.py).

With server SGD the iterate moves by ``η·Σ_t m̂_t``. A filter of DC gain 1 only re-times its input:
the plain IIR filter's ``Σ_t m_t`` differs from ``Σ_t ĝ_t`` by a boundary term in the last few
inputs and outputs (closed form below), so in flat directions the summed noise is unchanged up to
that term. DOPPLER's start-up normalisation divides the early outputs by a step response below 1,
which raises the summed noise's variance: at T = 70, ×1.105 (``first_order_v1``) and ×1.190
(``second_order``) under white noise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.server.filters import PRESETS, EMAFilter, Filter, make_filter

T = 70


def step_response(b: tuple[float, ...], a: tuple[float, ...], n: int) -> np.ndarray:
    """``c_{a,t} = −Σ_τ a_τ c_{a,t−τ} + Σ_{τ ≤ min(t, n_b)} b_τ``, by its own recursion."""
    c = np.zeros(n)
    for t in range(n):
        c[t] = sum(b[: min(t, len(b) - 1) + 1]) - sum(a[k - 1] * c[t - k] for k in range(1, len(a) + 1) if t >= k)
    return c


def stepped(f: Filter, xs: np.ndarray) -> np.ndarray:
    """The filter's outputs for the rows of ``xs`` (one round per row), in float64."""
    return np.stack([f.step(torch.from_numpy(np.ascontiguousarray(x))).numpy() for x in xs])


def summed_weights(f: Filter, n: int) -> np.ndarray:
    """``w_s``: how much of round ``s``'s input ends up in ``Σ_t m̂_t``, by stepping the filter on
    the ``n`` unit impulses at once (coordinate ``s`` carries the impulse at round ``s``)."""
    return stepped(f, np.eye(n)).sum(axis=0)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_unnormalised_sum_differs_from_input_sum_by_a_boundary_term(preset):
    # (1 + Σa)·Σ_t y_t − Σ_τ a_τ Σ_{t ≥ T−τ} y_t = Σb·Σ_t x_t − Σ_τ b_τ Σ_{t ≥ T−τ} x_t, and
    # Σb = 1 + Σa (unit DC gain), so Σy − Σx is a term in the last n_a outputs and n_b inputs.
    b, a = PRESETS[preset]
    x = np.random.default_rng(3).normal(size=(T, 4))
    y = stepped(make_filter("doppler", preset=preset), x) * step_response(b, a, T)[:, None]
    tail_y = sum(a[k - 1] * y[T - k :].sum(axis=0) for k in range(1, len(a) + 1))
    tail_x = sum(b[k] * x[T - k :].sum(axis=0) for k in range(1, len(b)))
    boundary = (tail_y - tail_x) / (1.0 + sum(a))
    np.testing.assert_allclose(y.sum(axis=0) - x.sum(axis=0), boundary, rtol=0, atol=1e-10)


def test_ema_sum_differs_from_input_sum_by_a_boundary_term():
    # g̃_0 = ĝ_0, g̃_t = (1−κ)g̃_{t−1} + κĝ_t: Σg̃ − Σĝ = (1−κ)/κ·(ĝ_0 − g̃_{T−1}).
    kappa = 0.7
    x = np.random.default_rng(4).normal(size=(T, 4))
    y = stepped(EMAFilter(kappa), x)
    np.testing.assert_allclose(y.sum(axis=0) - x.sum(axis=0), (1 - kappa) / kappa * (x[0] - y[-1]), rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("name", "params", "white"),
    [
        ("doppler", {"preset": "first_order_v1"}, 1.1055),
        ("doppler", {"preset": "second_order"}, 1.1902),
        ("ema", {"kappa": 0.7}, 1.0040),
        ("none", {}, 1.0),
    ],
)
def test_startup_normalisation_raises_the_summed_noise(name, params, white):
    # Var(Σ_t m̂_t)/Var(Σ_t ĝ_t) per coordinate = Σ_s w_s²/T for white noise, ‖wᵀM‖²/‖1ᵀM‖² for
    # noise rows n = M·Z. w from stepping the filter; checked against its impulse response and,
    # for DOPPLER, against w_s = Σ_{t ≥ s} k_{t−s}/c_{a,t} from the recursions above.
    w = summed_weights(make_filter(name, **params), T)
    np.testing.assert_allclose(w, make_filter(name, **params).impulse_response(T).sum(axis=0), rtol=1e-12)
    if name == "doppler":
        b, a = PRESETS[params["preset"]]
        k = step_response(b, a, T)
        k = np.diff(k, prepend=0.0)  # impulse response = first difference of the step response
        c = step_response(b, a, T)
        direct = np.array([sum(k[t - s] / c[t] for t in range(s, T)) for s in range(T)])
        np.testing.assert_allclose(w, direct, rtol=1e-10)
    assert np.sum(w**2) / T == pytest.approx(white, abs=5e-5)
    # far from both ends (a longer run) the weights are 1: the filter only moves the noise in time
    assert summed_weights(make_filter(name, **params), 400)[200] == pytest.approx(1.0, abs=1e-9)
    # correlated noise: the closed form equals the variance of simulated summed outputs
    rng = np.random.default_rng(5)
    m = np.linalg.inv(np.eye(T) + np.diag(np.full(T - 1, 0.6), -1))  # anti-correlated rows (C⁻¹)
    z = rng.standard_normal((T, 40_000))
    noise = m @ z
    ratio = np.var(stepped(make_filter(name, **params), noise).sum(axis=0)) / np.var(noise.sum(axis=0))
    closed = np.sum((w @ m) ** 2) / np.sum(m.sum(axis=0) ** 2)
    assert ratio == pytest.approx(closed, rel=0.03)


@pytest.mark.parametrize("preset", ["first_order_v1", "second_order"])
def test_without_normalisation_white_summed_noise_is_not_raised(preset):
    # the plain IIR filter's weights are partial sums of its impulse response: 1 up to the last
    # rounds, whose input has not yet come out in full (so the summed noise is, if anything, smaller)
    b, a = PRESETS[preset]
    y = stepped(make_filter("doppler", preset=preset), np.eye(T)) * step_response(b, a, T)[:, None]
    w = y.sum(axis=0)
    np.testing.assert_allclose(w, step_response(b, a, T)[::-1], rtol=1e-10)  # w_s = c_{a,T−1−s}
    assert w[0] == pytest.approx(1.0, abs=1e-5) and w[-1] == pytest.approx(b[0])
    assert np.sum(w**2) / T < 1.0
