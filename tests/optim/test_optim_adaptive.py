"""Yogi and DP-AdamBC server optimizers (docs/algorithms.md sections 7 and 9)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pytest
import torch

from fedsim.errors import FedsimError
from fedsim.server.optim import AdamBC, Yogi, make_optimizer

X0 = [1.0, -2.0, 0.5]
GRADS = [[0.5, -0.05, 0.0], [-0.3, 0.2, 1.5], [0.1, 0.4, -0.7]]
PHIS = [0.2, 0.05, 0.5]


def run(opt, grads: list[list[float]] = GRADS, x0: list[float] = X0) -> list[list[float]]:
    """Apply ``grads`` one step each; the parameters after every step."""
    x = torch.tensor(x0, dtype=torch.float64)
    out = []
    for g in grads:
        opt.step(x, torch.tensor(g, dtype=torch.float64))
        out.append(x.tolist())
    return out


def close(a: list[list[float]], b: list[list[float]], tol: float = 1e-12) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        for u, w in zip(ra, rb):
            assert abs(u - w) <= tol * max(1.0, abs(w)), (ra, rb)


def sign(u: float) -> float:
    return (u > 0) - (u < 0)


# --- hand computations in plain Python ---------------------------------------------------


def yogi_by_hand(lr: float, b1: float, b2: float, tau: float, bc: bool, v0: float) -> list[list[float]]:
    x, m, v, out = list(X0), [0.0] * 3, [v0] * 3, []
    for t, g in enumerate(GRADS):
        for i in range(3):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = v[i] - (1 - b2) * g[i] ** 2 * sign(v[i] - g[i] ** 2)
            mh = m[i] / (1 - b1 ** (t + 1)) if bc else m[i]
            vh = v[i] / (1 - b2 ** (t + 1)) if bc else v[i]
            x[i] -= lr * mh / (math.sqrt(vh) + tau)
        out.append(list(x))
    return out


def adambc_by_hand(lr: float, b1: float, b2: float, frac: float, correct: bool) -> list[list[float]]:
    x, m, v, phi, out = list(X0), [0.0] * 3, [0.0] * 3, 0.0, []
    for t, g in enumerate(GRADS):
        phi = b2 * phi + (1 - b2) * PHIS[t]
        floor = frac * PHIS[t]
        for i in range(3):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
            vh = max(((v[i] - phi) if correct else v[i]) / (1 - b2 ** (t + 1)), floor)
            x[i] -= lr * (m[i] / (1 - b1 ** (t + 1))) / math.sqrt(vh)
        out.append(list(x))
    return out


def phis(t: int) -> float:
    return PHIS[t]


# --- Yogi ---------------------------------------------------------------------------------


def test_yogi_matches_hand_computation():
    # step 1 explicitly: m̂ = g; v = τ² − (1−β2) g² sign(τ² − g²); v̂ = v/(1−β2)
    # coord 0: v = 0.01 + 0.1·0.25 = 0.035, v̂ = 0.35 → x = 1 − 0.1·0.5/(√0.35 + 0.1)
    # coord 1: v = 0.01 − 0.1·0.0025 = 0.00975 (g² < v: v shrinks), v̂ = 0.0975
    out = run(Yogi(0.1, beta1=0.9, beta2=0.9, eps=0.1))
    assert abs(out[0][0] - (1 - 0.1 * 0.5 / (math.sqrt(0.35) + 0.1))) < 1e-12
    assert abs(out[0][1] - (-2 + 0.1 * 0.05 / (math.sqrt(0.0975) + 0.1))) < 1e-12
    assert out[0][2] == 0.5
    close(out, yogi_by_hand(0.1, 0.9, 0.9, 0.1, True, 0.01))


def test_yogi_options():
    close(
        run(Yogi(0.2, beta1=0.8, beta2=0.95, eps=0.05, bias_correction=False)),
        yogi_by_hand(0.2, 0.8, 0.95, 0.05, False, 0.05**2),
    )
    close(run(Yogi(0.2, beta1=0.8, beta2=0.95, eps=0.05, v0=0.0)), yogi_by_hand(0.2, 0.8, 0.95, 0.05, True, 0.0))
    with pytest.raises(FedsimError):
        Yogi(0.1, eps=0.0)
    with pytest.raises(FedsimError):
        Yogi(0.1, beta2=1.0)


def test_yogi_v_grows_slower_than_adam_on_a_spike():
    # Yogi's additive update: after a huge gradient, v changes by (1−β2) g² either way,
    # but it decays only additively (by (1−β2) g² per small-g step), never multiplicatively.
    opt = Yogi(0.1, beta2=0.9, eps=1e-3, bias_correction=False)
    x = torch.zeros(1, dtype=torch.float64)
    opt.step(x, torch.tensor([10.0], dtype=torch.float64))
    v_after = opt.v.item()
    opt.step(x, torch.tensor([1.0], dtype=torch.float64))
    assert opt.v.item() == pytest.approx(v_after - 0.1 * 1.0, abs=1e-12)


# --- AdamBC: exact steps ------------------------------------------------------------------


def test_adambc_matches_hand_computation():
    # step 1 explicitly: m̂ = g, φ_0/(1−β2) = Φ_0, so v̂ = max(g² − Φ_0, γ′)
    out = run(AdamBC(0.1, phis, beta1=0.9, beta2=0.9, gamma_frac=0.01))
    assert abs(out[0][0] - (1 - 0.1 * 0.5 / math.sqrt(0.25 - 0.2))) < 1e-12
    assert abs(out[0][1] - (-2 + 0.1 * 0.05 / math.sqrt(0.01 * 0.2))) < 1e-12  # at the γ′ floor
    close(out, adambc_by_hand(0.1, 0.9, 0.9, 0.01, True))
    close(run(AdamBC(0.3, phis, beta1=0.5, beta2=0.8, gamma_frac=0.2)), adambc_by_hand(0.3, 0.5, 0.8, 0.2, True))


def test_adambc_uncorrected_variant_matches_hand_computation():
    close(run(AdamBC(0.1, phis, beta1=0.9, beta2=0.9, bias_correct=False)), adambc_by_hand(0.1, 0.9, 0.9, 0.01, False))


def test_adambc_zero_noise_uses_tiny_floor():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    opt = AdamBC(0.1, lambda t: 0.0)
    opt.step(x, torch.tensor([0.0, 4.0], dtype=torch.float64))
    assert x.tolist() == pytest.approx([1.0, 2.0 - 0.1])  # no noise: v̂ = g², step η·sign(g)
    assert torch.isfinite(x).all()


def test_adambc_phi_in_state_dict_and_round_trip():
    grads = GRADS + [[0.2, -0.1, 0.3], [1.0, 0.0, -1.0]]
    more = PHIS + [0.3, 0.1]
    a = AdamBC(0.1, lambda t: more[t], beta2=0.9)
    run(a, grads[:3])
    st = a.state_dict()
    assert st["name"] == "adambc" and st["t"] == 3
    expected_phi = 0.0
    for p in PHIS:
        expected_phi = 0.9 * expected_phi + 0.1 * p
    assert float(st["phi"]) == pytest.approx(expected_phi, abs=1e-15)
    b = AdamBC(0.1, lambda t: more[t], beta2=0.9)
    b.load_state_dict(st)
    xa = torch.tensor(X0, dtype=torch.float64)
    xb = xa.clone()
    for g in grads[3:]:
        gt = torch.tensor(g, dtype=torch.float64)
        a.step(xa, gt)
        b.step(xb, gt)
    assert torch.equal(xa, xb) and torch.equal(a.phi, b.phi)
    with pytest.raises(FedsimError):
        Yogi(0.1).load_state_dict(st)


def test_yogi_state_dict_round_trip():
    a = Yogi(0.1)
    run(a, GRADS[:2])
    b = Yogi(0.1)
    b.load_state_dict(a.state_dict())
    xa = torch.tensor(X0, dtype=torch.float64)
    xb = xa.clone()
    a.step(xa, torch.tensor(GRADS[2], dtype=torch.float64))
    b.step(xb, torch.tensor(GRADS[2], dtype=torch.float64))
    assert torch.equal(xa, xb)


# --- AdamBC: statistical checks (docs/algorithms.md §9) --------------------------------


def _pure_noise_run(phi: Callable[[int], float], steps: int, d: int = 200_000, b2: float = 0.99):
    """All clients send zeros: g_t = N(0, Φ_t) per coordinate."""
    gen = torch.Generator().manual_seed(1234)
    opt = AdamBC(0.1, phi, beta2=b2)
    x = torch.zeros(d, dtype=torch.float64)
    rows = []
    for t in range(steps):
        opt.step(x, torch.randn(d, generator=gen, dtype=torch.float64) * math.sqrt(phi(t)))
        bias = 1 - b2 ** (t + 1)
        vh = opt.v_hat()
        rows.append(
            (
                t,
                (opt.v.mean() / bias).item(),
                float(opt.phi) / bias,
                phi(t),
                (vh <= opt.gamma(phi(t)) * (1 + 1e-12)).double().mean().item(),
                vh.mean().item(),
            )
        )
    return rows


@pytest.mark.parametrize("kind", ["constant", "time_varying"])
def test_adambc_pure_noise_second_moment_tracks_phi(kind: str):
    phi = (lambda t: 2.0) if kind == "constant" else (lambda t: 1.0 + 0.8 * math.sin(t / 7) + 0.01 * t)
    rows = _pure_noise_run(phi, 60)
    for t, v_mean, phi_bc, _phi_t, at_floor, vhat_mean in rows:
        # E[v_t] = φ_t exactly (bias-corrected both sides), for any Φ_t sequence
        assert v_mean == pytest.approx(phi_bc, rel=0.02), t
        if t >= 10:
            assert at_floor > 0.5, t  # v̂ mostly sits at the γ′ floor
            assert vhat_mean < 0.2 * phi_bc, t  # noise removed: v̂ ≪ noise level (uncorrected: ≈ it)
    if kind == "time_varying":
        # a constant-Φ correction would be wrong: φ_t/(1−β2^{t+1}) is far from Φ_t here
        assert max(abs(r[2] - r[3]) / r[3] for r in rows[10:]) > 0.2
    else:
        assert all(r[2] == pytest.approx(2.0, rel=1e-12) for r in rows)


def _dominated_run(bias_correct: bool, phi: float = 4.0, steps: int = 150, d: int = 100_000):
    gen = torch.Generator().manual_seed(7)
    signal = 0.02 * torch.randn(d, generator=gen, dtype=torch.float64)  # |signal|² ≪ Φ
    lr, b1 = 0.1, 0.9
    opt = AdamBC(lr, lambda t: phi, beta1=b1, bias_correct=bias_correct)
    x = torch.zeros(d, dtype=torch.float64)
    x_ref = torch.zeros(d, dtype=torch.float64)  # momentum SGD with step η/√Φ on the same g
    m = torch.zeros(d, dtype=torch.float64)
    warm = 20  # compare trajectories after v has averaged over some steps
    for t in range(steps):
        if t == warm:
            x_start, ref_start = x.clone(), x_ref.clone()
        g = signal + math.sqrt(phi) * torch.randn(d, generator=gen, dtype=torch.float64)
        before = x.clone()
        opt.step(x, g)
        m = b1 * m + (1 - b1) * g
        m_hat = m / (1 - b1 ** (t + 1))
        x_ref -= lr / math.sqrt(phi) * m_hat
    upd = before - x
    ratio = upd / (lr * m_hat)
    cos = (upd @ m_hat / (upd.norm() * m_hat.norm())).item()
    traj_err = ((x - x_start) - (x_ref - ref_start)).norm().item() / (x_ref - ref_start).norm().item()
    return ratio, cos, traj_err


def test_uncorrected_dp_adam_is_momentum_sgd_when_noise_dominates():
    ratio, cos, traj_err = _dominated_run(bias_correct=False, phi=4.0)
    assert ratio.median().item() == pytest.approx(1 / math.sqrt(4.0), rel=0.02)  # step η/√Φ
    assert (ratio.std() / ratio.mean()).item() < 0.1  # near-constant
    assert cos > 0.99
    assert traj_err < 0.15  # vs ≈6 for AdamBC


def test_adambc_differs_from_momentum_sgd_when_noise_dominates():
    ratio, cos, traj_err = _dominated_run(bias_correct=True, phi=4.0)
    assert ratio.median().item() == pytest.approx(1 / math.sqrt(0.01 * 4.0), rel=0.02)  # at the γ′ floor
    assert (ratio.std() / ratio.mean()).item() > 0.3
    assert cos < 0.95
    assert traj_err > 0.5


# --- warnings and errors ------------------------------------------------------------------


def test_gamma_at_least_phi_warns_once():
    with pytest.warns(UserWarning, match="momentum SGD") as rec:
        opt = AdamBC(0.1, lambda t: 1.0, gamma_frac=1.0)
        run(opt)
    assert sum("momentum SGD" in str(w.message) for w in rec) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(AdamBC(0.1, lambda t: 1.0, gamma_frac=0.5))


def test_adambc_errors():
    with pytest.raises(FedsimError, match="variance"):
        AdamBC(0.1, None)  # type: ignore[arg-type]
    for bad in (0.0, -0.1, float("nan")):
        with pytest.raises(FedsimError, match="gamma_frac"):
            AdamBC(0.1, phis, gamma_frac=bad)
    with pytest.raises(FedsimError, match="Φ"):
        run(AdamBC(0.1, lambda t: -1.0))
    with pytest.raises(FedsimError, match="Φ"):
        run(AdamBC(0.1, lambda t: float("inf")))
    with pytest.raises(FedsimError, match="server.lr"):
        AdamBC(0.0, phis)


def test_make_optimizer_yogi_and_adambc():
    y = make_optimizer("yogi", 0.1, beta1=0.9, beta2=0.9, eps=0.1)
    assert isinstance(y, Yogi)
    close(run(y), yogi_by_hand(0.1, 0.9, 0.9, 0.1, True, 0.01))
    a = make_optimizer("adambc", 0.1, beta1=0.9, beta2=0.9, noise_variance=phis, gamma_frac=0.01)
    assert isinstance(a, AdamBC)
    close(run(a), adambc_by_hand(0.1, 0.9, 0.9, 0.01, True))
    with pytest.raises(FedsimError, match="noise mechanism's per-coordinate variance"):
        make_optimizer("adambc", 0.1)
    with pytest.raises(FedsimError, match="gamma_frac"):
        make_optimizer("adambc", 0.1, noise_variance=phis, gamma_frac=0.0)
    with pytest.raises(FedsimError, match="use one of sgd, momentum, adam, yogi, adambc"):
        make_optimizer("adagrad", 0.1)
