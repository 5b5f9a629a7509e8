"""Server-side filters (docs/algorithms.md sections 6 and 9): DOPPLER = lfilter + normalisation,
constant in / constant out, white-noise variance gain, impulse responses, EMA, DiSK, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.signal import lfilter

from fedsim.errors import FedsimError
from fedsim.server.filters import PRESETS, DiskFilter, DopplerFilter, EMAFilter, Filter, IdentityFilter, make_filter

ALL_PRESETS = ["momentum", "first_order_v1", "first_order_v2", "second_order", "f1", "f2", "f3", "f4", "f5", "f6"]


def run(f: Filter, xs: np.ndarray, dtype: torch.dtype = torch.float64) -> np.ndarray:
    return np.stack([f.step(torch.as_tensor(x, dtype=dtype)).double().numpy() for x in xs])


def test_presets_are_exactly_the_listed_ones():
    assert sorted(PRESETS) == sorted(ALL_PRESETS)
    assert PRESETS["first_order_v1"] == ((1 / 11, 1 / 11), (-9 / 11,))
    assert PRESETS["second_order"] == ((1 / 58, 2 / 58, 1 / 58), (-92 / 58, 38 / 58))
    assert PRESETS["f6"] == ((0.025, 0.025), (-1.8, 0.85))
    assert make_filter("doppler").b == PRESETS["first_order_v1"][0]  # default preset


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_doppler_equals_lfilter_over_step_response(preset):
    b, a = PRESETS[preset]
    T, d = 60, 5
    x = np.random.default_rng(1).normal(size=(T, d))
    den = np.array([1.0, *a])
    ref = lfilter(b, den, x, axis=0) / lfilter(b, den, np.ones(T))[:, None]
    out = run(make_filter("doppler", preset=preset), x)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_constant_passes_unchanged_from_t0(preset):
    f = make_filter("doppler", preset=preset)
    const = torch.tensor([3.0, -1.5, 0.0, 7.25], dtype=torch.float64)
    for _ in range(40):
        torch.testing.assert_close(f.step(const), const, rtol=0, atol=1e-12)


def test_custom_b_a_matches_lfilter_and_fir_allowed():
    b, a = [0.3, 0.2], [-0.5]
    x = np.random.default_rng(2).normal(size=(30, 3))
    ref = lfilter(b, [1, *a], x, axis=0) / lfilter(b, [1, *a], np.ones(30))[:, None]
    np.testing.assert_allclose(run(make_filter("doppler", b=b, a=a), x), ref, atol=1e-12)
    fir = make_filter("doppler", b=[0.5, 0.5], a=None)
    assert fir.a == () and fir.n_a == 0
    np.testing.assert_allclose(run(fir, x)[1:], 0.5 * (x[1:] + x[:-1]), atol=1e-14)
    np.testing.assert_allclose(run(make_filter("doppler", b=[0.5, 0.5]), x)[0], x[0], atol=1e-14)


def test_first_order_v1_white_noise_variance_gain():
    f = make_filter("doppler", preset="first_order_v1")
    n = 400
    gain = f.variance_gain(n)
    h = f.impulse_response(n)
    np.testing.assert_allclose(gain, (h**2).sum(axis=1), rtol=1e-12)
    # Steady-state closed form computed independently from lfilter's impulse response.
    b, a = PRESETS["first_order_v1"]
    k = lfilter(b, [1, *a], np.eye(1, 2000, 0).ravel())
    steady = float(np.sum(k**2))
    assert steady == pytest.approx(1 / 11, rel=1e-12)  # = 0.0909…
    assert gain[-1] == pytest.approx(steady, rel=1e-10)
    assert gain[0] == pytest.approx(1.0)  # first output is the input itself
    assert f.variance_gain_row(n - 1) == pytest.approx(steady, rel=1e-10)
    # Empirical: 200k i.i.d. coordinates through the real filter, variance at t = 99.
    g = torch.Generator().manual_seed(0)
    out = None
    for _ in range(100):
        out = f.step(torch.randn(200_000, generator=g, dtype=torch.float64))
    assert float(out.var()) == pytest.approx(gain[99], rel=0.02)
    assert float(out.var()) == pytest.approx(0.0909, rel=0.02)


def test_variance_gain_row_with_correlated_noise():
    f = make_filter("ema", kappa=0.6)
    M = np.tril(np.random.default_rng(3).normal(size=(6, 6)))
    H = f.impulse_response(6)
    for t in range(6):
        assert f.variance_gain_row(t, M) == pytest.approx(float(np.sum((H @ M)[t] ** 2)), rel=1e-12)


@pytest.mark.parametrize(
    "name,params",
    [("doppler", {"preset": p}) for p in ALL_PRESETS]
    + [
        ("ema", {"kappa": 0.7}),
        ("ema", {"kappa": 0.25}),
        ("disk", {"mode": "two_point"}),
        ("none", {}),
        ("doppler", {"b": [0.6], "a": [-0.4]}),
    ],
)
def test_impulse_response_matches_stepping_unit_impulses(name, params):
    n = 25
    f = make_filter(name, **params)
    H = f.impulse_response(n)
    assert H.shape == (n, n) and H.dtype == np.float64
    assert np.allclose(np.triu(H, 1), 0.0)
    # Coordinate s receives a unit impulse at time s: output_t[s] = H[t, s].
    out = run(make_filter(name, **params), np.eye(n))
    np.testing.assert_allclose(out, H, atol=1e-12)
    np.testing.assert_allclose(H.sum(axis=1), 1.0, atol=1e-12)  # unit DC at every t


@pytest.mark.parametrize(
    "b,a,key",
    [
        ([0.1], [-1.0], "filter.a"),  # pole on the unit circle
        ([0.1, 0.1], [-2.5, 1.7], "filter.a"),  # poles outside (roots of z^2 - 2.5 z + 1.7)
        ([0.2], [0.5, -1.5], "filter.a"),  # z^2 + 0.5 z - 1.5: root at -1.5
        ([0.2, 0.2], [-0.9], "filter.b"),  # DC gain 4
        ([1.0, 1.0], [], "filter.b"),  # FIR DC gain 2
        ([0.0, 0.1], [-0.9], "filter.b"),  # b_0 = 0: normaliser c_0 = 0
    ],
)
def test_unstable_or_non_unit_dc_refused(b, a, key):
    with pytest.raises(FedsimError, match=key):
        make_filter("doppler", b=b, a=a)


def test_stability_uses_the_right_polynomial():
    """[fix] poles are the roots of z^2 + a_1 z + a_2, not of the reciprocal 1 + a_1 z + a_2 z^2."""
    # z^2 - 0.9 z + 0.2 = (z - 0.5)(z - 0.4): stable; its reciprocal has roots 2 and 2.5.
    f = make_filter("doppler", b=[0.2, 0.1], a=[-0.9, 0.2])
    np.testing.assert_allclose(f.impulse_response(200)[-1].sum(), 1.0, atol=1e-12)
    # z^2 - 4.5 z + 5 = (z - 2)(z - 2.5): unstable although its reciprocal's roots lie inside.
    with pytest.raises(FedsimError, match="unstable"):
        make_filter("doppler", b=[1.0, 0.5], a=[-4.5, 5.0])


def test_bad_names_and_params_refused():
    with pytest.raises(FedsimError, match="filter.preset"):
        make_filter("doppler", preset="f7")
    with pytest.raises(FedsimError, match="filter.name"):
        make_filter("kalman")
    with pytest.raises(FedsimError, match="kappa"):
        make_filter("ema", kappa=0.0)
    with pytest.raises(FedsimError, match="gamma"):
        make_filter("ema", gamma=0.5)
    with pytest.raises(FedsimError, match="filter.b"):
        make_filter("doppler", a=[-0.9])
    with pytest.raises(FedsimError, match="filter.mode"):
        make_filter("disk", mode="three_point")
    with pytest.raises(FedsimError, match="filter.gamma = 0 makes DiSK's mixing weight a = .* undefined"):
        make_filter("disk", gamma=0.0)
    with pytest.raises(FedsimError, match=r"\|γ\| must be at least"):  # |a| = 0.3/(0.7·0.001) ≈ 429 > 100
        make_filter("disk", gamma=-0.001)


def test_ema_first_output_is_input_and_closed_form_for_constant_plus_step():
    kappa = 0.7
    f = make_filter("ema", kappa=kappa)
    c0, c1, t0, T = 2.0, 5.0, 10, 30
    xs = [torch.full((3,), c0 if t < t0 else c1, dtype=torch.float64) for t in range(T)]
    outs = [f.step(x) for x in xs]
    torch.testing.assert_close(outs[0], xs[0], rtol=0, atol=0)
    for t in range(T):
        expect = c0 if t < t0 else c1 + (c0 - c1) * (1 - kappa) ** (t - t0 + 1)
        assert float(outs[t][0]) == pytest.approx(expect, rel=1e-12)
    # Random stream vs. the recursion written out.
    x = np.random.default_rng(4).normal(size=(20, 4))
    ref = np.empty_like(x)
    ref[0] = x[0]
    for t in range(1, 20):
        ref[t] = (1 - kappa) * ref[t - 1] + kappa * x[t]
    np.testing.assert_allclose(run(make_filter("ema"), x), ref, atol=1e-13)


def test_disk_with_a_negative_gamma_extrapolates_and_is_clipped_once():
    """DiSK's Corollary 1 uses γ = −1 (STORM-like): a = (1−κ)/(κγ) = −3/7 for κ = 0.7. The mix
    a·Δ' + (1−a)·Δ extrapolates past Δ; the client clips the mix once, so its norm is at most c."""
    from fedsim.config import load_config
    from fedsim.privacy.clipping import clip_vector
    from fedsim.training.local import DiskClient

    f = make_filter("disk", mode="two_point", kappa=0.7, gamma=-1.0)
    assert f.a == pytest.approx(-3 / 7) and f.gamma == -1.0
    x, d = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0])
    torch.testing.assert_close(f.lookahead_point(x, d), x - d)
    dx, dy = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    torch.testing.assert_close(f.mix(dx, dy), torch.tensor([10 / 7, -3 / 7]))
    # the client: two evaluations from x and x − d, mixed, then one clip
    client = DiskClient("two_point", f.gamma, f.a)
    seen = []

    def delta_at(point):
        seen.append(point.clone())
        return 3.0 * point  # a delta that grows with the start, so the mix has a norm to clip

    v = client.update(delta_at, x, d)
    torch.testing.assert_close(seen[0], x - d)  # y_t = x_t + γ·d_{t−1}
    torch.testing.assert_close(v, f.a * 3.0 * (x - d) + (1 - f.a) * 3.0 * x)
    clipped, _ = clip_vector(v, 1.0)
    assert float(clipped.norm()) <= 1.0 + 1e-6 < float(v.norm())
    assert load_config(None, ["filter.name='disk'", "filter.gamma=-1.0", "server.optimizer='sgd'"]).filter.gamma == -1.0


def test_disk_constants_and_helpers():
    f = make_filter("disk", mode="two_point")
    assert isinstance(f, DiskFilter) and f.kappa == 0.7 and f.gamma == 0.5
    assert f.a == pytest.approx(0.3 / (0.7 * 0.5))
    x = torch.tensor([1.0, 2.0])
    d = torch.tensor([0.5, -1.0])
    torch.testing.assert_close(f.lookahead_point(x, d), x + 0.5 * d)
    torch.testing.assert_close(f.lookahead_point(x, None), x)
    dx, dy = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    torch.testing.assert_close(f.mix(dx, dy), f.a * dy + (1 - f.a) * dx)
    assert torch.equal(dx, torch.tensor([1.0, 0.0])) and torch.equal(x, torch.tensor([1.0, 2.0]))
    la = make_filter("disk", mode="lookahead", kappa=0.8)  # γ derived: (1−κ)/κ
    assert la.gamma == pytest.approx(0.25) and la.a == 1.0 and la.gamma_given == 0.5
    with pytest.raises(FedsimError, match="lookahead"):  # another γ is refused, as in the config
        make_filter("disk", mode="lookahead", kappa=0.8, gamma=0.5)
    torch.testing.assert_close(la.mix(dx, dy), dy)
    # The server side of every mode is the same EMA recursion.
    xs = np.random.default_rng(5).normal(size=(15, 3))
    ema = run(make_filter("ema", kappa=0.8), xs)
    for mode in ("two_point", "lookahead", "ema"):
        np.testing.assert_allclose(run(make_filter("disk", mode=mode, kappa=0.8), xs), ema, atol=0)


@pytest.mark.parametrize(
    "name,params",
    [
        ("doppler", {"preset": "second_order"}),
        ("doppler", {"preset": "f6"}),
        ("ema", {"kappa": 0.3}),
        ("disk", {"mode": "two_point"}),
        ("none", {}),
    ],
)
def test_state_dict_round_trip_resumes_identically(name, params):
    xs = np.random.default_rng(6).normal(size=(20, 4))
    full = run(make_filter(name, **params), xs)
    f = make_filter(name, **params)
    run(f, xs[:7])
    state = f.state_dict()
    run(f, xs[7:10])  # advancing the original must not change the saved state
    g = make_filter(name, **params)
    g.load_state_dict(state)
    np.testing.assert_array_equal(run(g, xs[7:]), full[7:])


def test_state_dict_from_another_filter_refused():
    state = make_filter("doppler", preset="f1").state_dict()
    with pytest.raises(FedsimError, match="filter"):
        make_filter("doppler", preset="f2").load_state_dict(state)
    with pytest.raises(FedsimError, match="filter.name"):
        make_filter("ema").load_state_dict(state)


@pytest.mark.parametrize(
    "name,params", [("doppler", {"preset": "second_order"}), ("ema", {}), ("disk", {}), ("none", {})]
)
def test_dtype_and_device_preserved_and_input_untouched(name, params):
    f = make_filter(name, **params)
    x64 = torch.randn(6, dtype=torch.float64)
    ref = run(make_filter(name, **params), np.stack([x64.numpy()] * 5))
    for t in range(5):
        x = x64.float()
        before = x.clone()
        y = f.step(x)
        assert y.dtype == torch.float32 and y.device == x.device and y.shape == x.shape
        assert torch.equal(x, before) and y is not x
        np.testing.assert_allclose(y.double().numpy(), ref[t], atol=1e-5)
    with pytest.raises(FedsimError):
        f.step(torch.arange(3))  # integer update


def test_classes_exported():
    assert isinstance(make_filter("none"), IdentityFilter)
    assert isinstance(make_filter("ema"), EMAFilter)
    assert isinstance(make_filter("doppler", b=None, a=None, preset="f3"), DopplerFilter)
