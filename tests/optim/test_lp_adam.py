"""DOPPLER's LP-Adam and LP-AdamBC (the DOPPLER paper, App. C.2, Algorithm 3; docs/algorithms.md §7):
the filter's output is the first moment, the second moment reads the unfiltered update, and
LP-AdamBC removes the unfiltered DP-noise variance Φ_t from it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.privacy.accounting import AccountingSpec
from fedsim.privacy.ledger import Ledger
from fedsim.privacy.noise import gaussian_noise
from fedsim.privacy.rng import PrivacyKey
from fedsim.server.filters import make_filter
from fedsim.server.optim import SGD, Adam, AdamBC, LPAdam, LPAdamBC, make_optimizer
from fedsim.server.step import DPServer, noise_variance_fn

X0 = [1.0, -2.0, 0.5]
GRADS = [[0.5, -0.05, 0.0], [-0.3, 0.2, 1.5], [0.1, 0.4, -0.7], [0.2, -0.1, 0.3]]  # filtered g_t
RAWS = [[2.0, 0.1, -1.0], [-1.5, 0.0004, 3.0], [0.7, -2.5, 0.2], [1.1, 0.0, -0.4]]  # unfiltered r_t
PHIS = [0.2, 0.05, 0.5, 0.3]


def run(opt, grads=GRADS, raws=RAWS) -> list[list[float]]:
    """One step per (g, r) pair (``raws`` None: no ``raw`` argument); the parameters after each."""
    x = torch.tensor(X0, dtype=torch.float64)
    out = []
    for i, g in enumerate(grads):
        raw = None if raws is None else torch.tensor(raws[i], dtype=torch.float64)
        opt.step(x, torch.tensor(g, dtype=torch.float64), raw)
        out.append(x.tolist())
    return out


def close(a, b, tol: float = 1e-12) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def lp_by_hand(lr, b2, eps=None, frac=None, phis=PHIS, grads=GRADS, raws=RAWS) -> list[list[float]]:
    """Algorithm 3 in plain Python: ``eps`` given → LP-Adam, ``frac`` given → LP-AdamBC."""
    x, v, phi, out = list(X0), [0.0] * 3, 0.0, []
    for t, (g, r) in enumerate(zip(grads, raws)):
        phi = b2 * phi + (1 - b2) * phis[t]
        for i in range(3):
            v[i] = b2 * v[i] + (1 - b2) * r[i] ** 2
            if frac is None:
                den = max(math.sqrt(v[i] / (1 - b2 ** (t + 1))), eps)
            else:
                den = math.sqrt(max((v[i] - phi) / (1 - b2 ** (t + 1)), max(frac * phis[t], 1e-30)))
            x[i] -= lr * g[i] / den  # m̂_t = g_t: no first-moment EMA
        out.append(list(x))
    return out


# --- the update rule ----------------------------------------------------------------------


def test_lp_adam_matches_hand_computation():
    # step 0, coord 0: v = 0.1·4 = 0.4, v̂ = 4 → x = 1 − 0.1·0.5/2 = 0.975
    # coord 1 at step 1 has v̂ below ε² = 0.01: the floor max{√v̂, ε} acts (checked by hand code)
    rows = run(LPAdam(0.1, beta2=0.9, eps=0.1))
    assert rows[0][0] == pytest.approx(0.975, abs=1e-15)
    close(rows, lp_by_hand(0.1, 0.9, eps=0.1))
    close(run(make_optimizer("lp_adam", 0.05, beta2=0.5, eps=1e-3)), lp_by_hand(0.05, 0.5, eps=1e-3))


def test_lp_adambc_matches_hand_computation():
    opt = make_optimizer("lp_adambc", 0.1, beta2=0.9, gamma_frac=0.01, noise_variance=lambda t: PHIS[t])
    assert isinstance(opt, LPAdamBC) and opt.m is None
    close(run(opt), lp_by_hand(0.1, 0.9, frac=0.01))
    assert float(opt.phi) == pytest.approx(sum(0.1 * 0.9 ** (3 - s) * PHIS[s] for s in range(4)), rel=1e-14)


def _recovered_first_moment(opt: LPAdam, grads, raws) -> list[torch.Tensor]:
    """``m̂_t = −Δx·max(√v̂, ε)/η``, read back from each step of ``opt``."""
    x = torch.zeros(3, dtype=torch.float64)
    out = []
    for g, r in zip(grads, raws):
        before = x.clone()
        opt.step(x, torch.tensor(g, dtype=torch.float64), torch.tensor(r, dtype=torch.float64))
        out.append((before - x) * opt.v_hat().sqrt().clamp(min=opt.eps) / opt.lr)
    return out


def test_first_moment_is_the_filter_output_and_v_the_raw_stream():
    """m̂_t is exactly the g_t given (no β1 EMA on top of the filter); v is the EMA of the raw
    stream's squares: the same g with two raw streams gives two v, two g with one raw stream one v."""
    m = _recovered_first_moment(LPAdam(0.1, beta2=0.9, eps=1e-3), GRADS, RAWS)
    for t, g in enumerate(GRADS):
        close(m[t].tolist(), g, tol=1e-12)
    adam_m = [0.0, 0.0, 0.0]
    for g in GRADS[:2]:
        adam_m = [0.9 * a + 0.1 * u for a, u in zip(adam_m, g)]
    assert abs(adam_m[2] / (1 - 0.9**2) - GRADS[1][2]) > 0.5  # what an extra β1 EMA would give instead

    raws_b = [[3 * u + 0.5 for u in r] for r in RAWS]
    a, b, c = (LPAdam(0.1, beta2=0.9) for _ in range(3))
    run(a, GRADS, RAWS)
    run(b, GRADS, raws_b)
    run(c, [[7 * u - 1 for u in g] for g in GRADS], RAWS)
    v_by_hand = [sum(0.1 * 0.9 ** (3 - s) * RAWS[s][i] ** 2 for s in range(4)) for i in range(3)]
    close(a.v.tolist(), v_by_hand, tol=1e-14)
    assert torch.equal(a.v, c.v)  # v does not see the filtered stream
    assert not torch.allclose(a.v, b.v)


def test_no_raw_means_no_filter():
    """Without ``raw`` (no filter) r_t = g_t: LP-Adam is Adam with β1 = 0 and ε as a floor."""
    close(run(LPAdam(0.1, 0.9, 0.1), GRADS, None), run(LPAdam(0.1, 0.9, 0.1), GRADS, GRADS))
    close(run(LPAdam(0.1, 0.9, 0.1), GRADS, None), lp_by_hand(0.1, 0.9, eps=0.1, raws=GRADS))
    bc = [LPAdamBC(0.1, lambda t: PHIS[t], beta2=0.9) for _ in range(2)]
    close(run(bc[0], GRADS, None), run(bc[1], GRADS, GRADS))


@pytest.mark.parametrize(
    "make",
    [
        lambda: make_optimizer("sgd", 0.5),
        lambda: make_optimizer("momentum", 0.1),
        lambda: make_optimizer("adam", 0.1),
        lambda: make_optimizer("yogi", 0.1),
        lambda: make_optimizer("adambc", 0.1, noise_variance=lambda t: PHIS[t]),
    ],
)
def test_other_optimizers_ignore_raw(make):
    assert not make().uses_raw
    assert run(make(), GRADS, RAWS) == run(make(), GRADS, None)


@pytest.mark.parametrize(
    "make", [lambda: LPAdam(0.1, 0.9, 0.01), lambda: LPAdamBC(0.1, lambda t: PHIS[t % 4], beta2=0.9)]
)
def test_state_dict_resume_is_identical(make):
    a, b = make(), make()
    x = torch.tensor(X0, dtype=torch.float64)
    for g, r in zip(GRADS[:2], RAWS[:2]):
        a.step(x, torch.tensor(g, dtype=torch.float64), torch.tensor(r, dtype=torch.float64))
    state = a.state_dict()
    assert "m" not in state and state["name"] in ("lp_adam", "lp_adambc")
    b.load_state_dict(state)
    xa, xb = x.clone(), x.clone()
    for g, r in zip(GRADS[2:], RAWS[2:]):
        for opt, y in ((a, xa), (b, xb)):
            opt.step(y, torch.tensor(g, dtype=torch.float64), torch.tensor(r, dtype=torch.float64))
    assert torch.equal(xa, xb)
    with pytest.raises(FedsimError, match="checkpoint optimizer"):
        Adam(0.1).load_state_dict(state)


def test_errors():
    with pytest.raises(FedsimError, match="lp_adambc' needs the noise mechanism's per-coordinate variance"):
        make_optimizer("lp_adambc", 0.1)
    with pytest.raises(FedsimError, match="beta1"):
        make_optimizer("lp_adam", 0.1, beta1=0.9)  # no first-moment EMA to set
    with pytest.raises(FedsimError, match="eps"):
        make_optimizer("lp_adam", 0.1, eps=0.0)
    with pytest.raises(FedsimError, match="gamma_frac"):
        make_optimizer("lp_adambc", 0.1, noise_variance=lambda t: 1.0, gamma_frac=0.0)
    with pytest.raises(FedsimError, match="beta2"):
        LPAdam(0.1, beta2=1.0)
    with pytest.raises(FedsimError, match="Φ"):
        run(LPAdamBC(0.1, lambda t: -1.0))


# --- the server's plumbing ----------------------------------------------------------------


def _server(opt, filt, d=64, z=1.2, c=1.5, k_bar=10.0, seed=5, rounds=40) -> DPServer:
    spec = AccountingSpec("gaussian", "poisson", 1000, k_bar, z, 1e-5)
    ledger = Ledger(spec, rounds, account_every=10**6)  # ε only after the last planned round
    return DPServer(torch.zeros(d), gaussian_noise(d, seed), opt, ledger, c, z, k_bar, filter=filt)


class _Recording(LPAdam):
    """LP-Adam that keeps the (grad, raw) pairs it was given."""

    def _step_raw(self, params, grad, raw):
        self.seen.append((grad.clone(), raw.clone()))
        super()._step_raw(params, grad, raw)


@pytest.mark.parametrize("filt", [("doppler", {"preset": "first_order_v1"}), ("ema", {"kappa": 0.6}), None])
def test_server_gives_the_filter_output_and_the_unfiltered_update(filt):
    opt = _Recording(0.1)
    opt.seen = []
    srv = _server(opt, None if filt is None else make_filter(filt[0], **filt[1]))
    ref = None if filt is None else make_filter(filt[0], **filt[1])
    gen = torch.Generator().manual_seed(0)
    for t in range(6):
        total = torch.randn(64, generator=gen)
        g_hat = srv.noisy_mean(total, t)  # the same noise row the step draws
        srv.step(total, realized_cohort=10)
        grad, raw = opt.seen[t]
        assert torch.equal(raw, g_hat.neg())  # before the filter
        assert torch.equal(grad, (g_hat if ref is None else ref.step(g_hat)).neg())  # m̂_t: the filter's output


def test_server_keeps_the_other_optimizers_on_two_arguments():
    calls = []

    class TwoArgs(SGD):
        def step(self, params, grad, *rest):
            calls.append(len(rest))
            super().step(params, grad, *rest)

    srv = _server(TwoArgs(1.0), make_filter("doppler", preset="first_order_v1"))
    srv.step(torch.ones(64), realized_cohort=10)
    assert calls == [0]


# --- Φ_t of the unfiltered noise -----------------------------------------------------------


def _dp_server(extra: list[str], rounds: int = 12):
    from fedsim.runner.build import dp_server, prepare_without_data

    cfg = load_config(None, [f"rounds={rounds}", "privacy.noise_multiplier=1.5", "client.clip_norm=0.7", *extra])
    prep = prepare_without_data(cfg, 40, torch.zeros(10))
    srv, _ = dp_server(cfg, prep, PrivacyKey.from_seed(0), torch.device("cpu"), [])
    return cfg, prep, srv


@pytest.mark.parametrize("filt", ["doppler", "ema", "none"])
def test_phi_is_the_unfiltered_gaussian_variance(filt):
    """Independent noise: Φ_t = (c·z/K̄)² for every t, whatever filter runs (adambc's would shrink)."""
    base = [
        "privacy.mechanism='gaussian'",
        "sampling.scheme='poisson'",
        "sampling.cohort_size=8",
        f"filter.name='{filt}'",
    ]
    _, prep, srv = _dp_server([*base, "server.optimizer='lp_adambc'"])
    want = (0.7 * 1.5 / 8.0) ** 2
    assert prep.scheme.expected_cohort == 8.0 and prep.update_noise_multiplier == 1.5
    assert [srv.optimizer.noise_variance(t) for t in range(12)] == pytest.approx([want] * 12, rel=1e-12)
    _, _, bc = _dp_server([*base, "server.optimizer='adambc'"])
    if filt != "none":  # plain adambc's Φ is the filtered one: want·Σ_s H[t, s]², 0.11·want for doppler
        gain = (make_filter(filt).impulse_response(12)[11] ** 2).sum()
        assert bc.optimizer.noise_variance(11) == pytest.approx(want * gain, rel=1e-12)
        assert gain < (0.12 if filt == "doppler" else 0.6)


@pytest.mark.parametrize("mech", ["blt", "banded"])
def test_phi_is_the_unfiltered_mf_variance(mech):
    """MF noise n = C⁻¹Z: Φ_t = (c·z·sens/K̄)²·‖C⁻¹[t, :]‖², computed here with numpy's inverse."""
    extra = ["sampling.scheme='epochs'", "sampling.min_sep=3", "sampling.cohort_size=8", f"privacy.mechanism='{mech}'"]
    _, prep, srv = _dp_server([*extra, "filter.name='doppler'", "server.optimizer='lp_adambc'"])
    c_inv = np.linalg.inv(prep.plan.C)
    sens = prep.plan.sens
    assert sens > 1 and srv.noise.sensitivity == sens
    want = (0.7 * 1.5 * sens / prep.scheme.expected_cohort) ** 2 * (c_inv**2).sum(axis=1)
    got = [srv.optimizer.noise_variance(t) for t in range(12)]
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert want.max() / want.min() > 1.2  # not a constant: a constant Φ would be wrong


# --- pure noise ---------------------------------------------------------------------------


def test_pure_noise_lp_adambc_v_unbiased_lp_adam_v_tracks_unfiltered_variance():
    """All users send zeros, so ĝ_t is pure Gaussian noise of variance Φ = (c·z/K̄)² = 0.0324
    per coordinate, behind the first_order_v1 filter. Over d = 20,000 coordinates:

    - LP-AdamBC: mean((v_t − φ_t)/(1−β2^{t+1})) = 0 within 5 standard errors,
      ``se_t = Φ·√(2·Σ_s w_s²/d)/(1−β2^{t+1})`` (w_s = (1−β2)β2^{t−s}; r_s² has variance 2Φ²);
    - LP-Adam: mean(v̂_t) = Φ within the same interval (the unfiltered noise variance);
    - plain Adam behind the filter: mean(v̂_t) ≈ E over the filtered stream, ≈ 0.1·Φ by round 60.
    """
    d, rounds, b2, z, c, k_bar = 20_000, 60, 0.95, 1.2, 1.5, 10.0
    phi = (c * z / k_bar) ** 2
    f = "first_order_v1"
    lp = _server(LPAdam(0.01, beta2=b2), make_filter("doppler", preset=f), d=d, rounds=rounds)
    bc = _server(LPAdamBC(0.01, lambda t: phi, beta2=b2), make_filter("doppler", preset=f), d=d, rounds=rounds)
    ad = _server(Adam(0.01, beta2=b2), make_filter("doppler", preset=f), d=d, rounds=rounds)
    phi_filtered = noise_variance_fn(c * z, k_bar, None, make_filter("doppler", preset=f).impulse_response(rounds))
    e_filtered = 0.0
    for t in range(rounds):
        for srv in (lp, bc, ad):
            srv.step(torch.zeros(d), realized_cohort=10)
        bias = 1 - b2 ** (t + 1)
        se = phi * math.sqrt(2 * sum(((1 - b2) * b2 ** (t - s)) ** 2 for s in range(t + 1)) / d) / bias
        assert abs(float((bc.optimizer.v.double() - float(bc.optimizer.phi)).mean()) / bias) < 5 * se, t
        assert abs(float(lp.optimizer.v_hat().double().mean()) - phi) < 5 * se, t
        e_filtered = b2 * e_filtered + (1 - b2) * phi_filtered(t)
    adam_v = float((ad.optimizer.v.double() / (1 - b2**rounds)).mean())
    assert adam_v == pytest.approx(e_filtered / (1 - b2**rounds), rel=0.05)
    assert 0.08 < adam_v / phi < 0.2  # Adam's v from the filtered stream is ~10× too small
    assert bc.optimizer.phi.item() / (1 - b2**rounds) == pytest.approx(phi, rel=1e-12)


# --- config -------------------------------------------------------------------------------


@pytest.mark.parametrize("filt", ["doppler", "ema", "disk", "none"])
@pytest.mark.parametrize("name", ["lp_adam", "lp_adambc"])
def test_config_accepts_the_lp_variants(name, filt):
    extra = [f"filter.name='{filt}'", f"server.optimizer='{name}'", "server.beta2=0.9"]
    if filt == "disk":
        extra.append("filter.mode='ema'")
    cfg = load_config(None, extra)
    assert cfg.server.optimizer == name and cfg.server.beta2 == 0.9
    with pytest.raises(FedsimError, match="beta1"):
        load_config(None, [*extra, "server.beta1=0.9"])


def test_lp_adambc_needs_noise():
    from fedsim.runner.build import make_server_optimizer

    cfg = load_config(None, ["server.optimizer='lp_adambc'", "filter.name='doppler'"])
    opt = make_server_optimizer(cfg, 0.0, None, None, 10.0)
    assert isinstance(opt, AdamBC) and opt.noise_variance(3) == 0.0  # z = 0: Φ = 0, the 1e-30 floor


def test_epsilon_unchanged_by_the_lp_variants():
    from fedsim.runner import privacy_report

    base = ["rounds=6", "privacy.noise_multiplier=1.5", "sampling.min_sep=3", "filter.name='doppler'"]
    reports = [
        privacy_report(load_config(None, [*base, f"server.optimizer='{name}'"]), 24)
        for name in ("sgd", "lp_adam", "lp_adambc")
    ]
    assert reports[1] == reports[0] and reports[2] == reports[0]
