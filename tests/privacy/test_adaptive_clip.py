"""Adaptive clipping (docs/algorithms.md §5): budget split, controller, Φ_t, a Ray run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant

from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.privacy.adaptive_clip import AdaptiveClip, combined_noise_multiplier, update_noise_multiplier
from fedsim.privacy.ledger import check_budget_split, recompute_epsilon
from fedsim.server.step import noise_variance_fn


def _pld_eps(events, delta):
    acc = PLDAccountant()
    for e in events:
        acc.compose(e)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("z,sigma_b,k", [(1.0, 1.5, 1), (0.8, 2.0, 1), (1.2, 5.0, 4), (3.0, 40.0, 10)])
def test_split_is_as_private_as_one_gaussian(z, sigma_b, k):
    """The update (multiplier z_Δ, sensitivity 1) and k count releases (std σ_b, sensitivity ½
    each) composed by dp-accounting's PLD give the ε of one GaussianDpEvent(z)."""
    z_u = update_noise_multiplier(z, sigma_b, k)
    assert z_u > z
    assert combined_noise_multiplier(z_u, sigma_b, k) == pytest.approx(z, rel=1e-12)
    delta = 1e-5
    # k releases of a sensitivity-½ count with std σ_b ≡ one Gaussian of sensitivity √k/2.
    count = dp_event.GaussianDpEvent(sigma_b / (math.sqrt(k) / 2))
    split = _pld_eps([dp_event.GaussianDpEvent(z_u), count], delta)
    whole = _pld_eps([dp_event.GaussianDpEvent(z)], delta)
    assert split == pytest.approx(whole, rel=2e-3)


def test_count_noise_too_small_is_refused():
    with pytest.raises(FedsimError, match="clipping.count_stddev"):
        update_noise_multiplier(2.0, 1.0, 1)  # 2σ_b = 2 ≤ z
    with pytest.raises(FedsimError, match="clipping.count_stddev"):
        update_noise_multiplier(1.0, 1.0, 4)  # 2σ_b/√k = 1 ≤ z


def test_controller_step_matches_closed_form():
    ctl = AdaptiveClip(initial=2.0, target_quantile=0.3, lr=0.5, count_stddev=1.5, expected_cohort=20, seed=7)
    c, centred = 2.0, [3.0, -2.5, 10.0]
    for t, s in enumerate(centred):
        noise = ctl.count_noise(t)
        c = c * math.exp(-0.5 * ((s + noise) / 20 + 0.5 - 0.3))
        assert ctl.step(s, t) == pytest.approx(c, rel=1e-14)
    assert len(ctl.history) == 3 and ctl.history[0] == 2.0
    # Seeded per round: the same (seed, t) gives the same draw; another seed does not.
    assert ctl.count_noise(1) == AdaptiveClip(1, 0.5, 0.2, 1.5, 20, 7).count_noise(1)
    assert ctl.count_noise(1) != AdaptiveClip(1, 0.5, 0.2, 1.5, 20, 8).count_noise(1)
    # state_dict round trip
    other = AdaptiveClip(5.0, 0.3, 0.5, 1.5, 20, 0)
    other.load_state_dict(ctl.state_dict())
    assert other.clip_norm == ctl.clip_norm and other.history == ctl.history and other.key == ctl.key


@pytest.mark.parametrize("gamma", [0.2, 0.5, 0.8])
def test_controller_tracks_the_target_quantile(gamma):
    """Users' delta norms ~ Exp(1): the γ-quantile is −ln(1−γ). With noisy counts over many
    rounds the clip norm settles near it (the geometric update's fixed point)."""
    rng = np.random.default_rng(0)
    k_bar = 100
    ctl = AdaptiveClip(
        initial=0.05, target_quantile=gamma, lr=0.2, count_stddev=k_bar / 20, expected_cohort=k_bar, seed=1
    )
    late = []
    for t in range(1500):
        norms = rng.exponential(1.0, size=rng.poisson(k_bar))
        centred = float(np.sum((norms <= ctl.clip_norm) - 0.5))
        ctl.step(centred, t)
        if t >= 1000:
            late.append(ctl.clip_norm)
    target = -math.log(1 - gamma)
    assert np.median(late) == pytest.approx(target, rel=0.1)


def test_phi_uses_the_round_clip_norm():
    """Φ_t with a per-round std (c_τ·z_Δ) equals the closed form for independent noise and a
    first-order filter: Φ_t = Σ_τ (h_{tτ}·s_τ)² / K̄²."""
    from fedsim.server.filters import make_filter

    stds = [1.0, 2.0, 0.5, 3.0, 1.5]
    k_bar = 10
    f = make_filter("ema", kappa=0.6)
    H = f.impulse_response(len(stds))
    phi = noise_variance_fn(lambda tau: stds[tau], k_bar, None, H)
    for t in range(len(stds)):
        want = sum((H[t, tau] * stds[tau]) ** 2 for tau in range(t + 1)) / k_bar**2
        assert phi(t) == pytest.approx(want, rel=1e-12)
    # constant std reduces to the old form
    phi_c = noise_variance_fn(2.0, k_bar, None, H)
    phi_f = noise_variance_fn(lambda tau: 2.0, k_bar, None, H)
    assert [phi_c(t) for t in range(5)] == pytest.approx([phi_f(t) for t in range(5)], rel=1e-12)


def test_privacy_report_shows_the_split_and_same_epsilon():
    from fedsim.runner import privacy_report

    base = [
        "rounds=20",
        "sampling.scheme='poisson'",
        "privacy.mechanism='gaussian'",
        "privacy.noise_multiplier=1.1",
        "sampling.cohort_size=40",
    ]
    plain = privacy_report(load_config(None, base), 800)
    adapt = privacy_report(load_config(None, base + ["clipping.adaptive=true"]), 800)
    assert plain["budget_split"] is None
    assert adapt["epsilon"] == plain["epsilon"]
    split = adapt["budget_split"]
    assert split["count_stddev"] == 2.0 and split["count_releases_per_user"] == 1
    assert split["update_noise_multiplier"] == pytest.approx((1.1**-2 - 4.0**-2) ** -0.5)
    # MF without amplification: k = the user's participations (epochs: ⌈n/b⌉ = 4)
    mf = privacy_report(
        load_config(
            None,
            [
                "rounds=20",
                "sampling.scheme='epochs'",
                "sampling.min_sep=5",
                "privacy.mechanism='blt'",
                "privacy.noise_multiplier=1.1",
                "sampling.cohort_size=160",
                "clipping.adaptive=true",
                "clipping.count_stddev=10.0",
            ],
        ),
        800,
    )
    assert mf["budget_split"]["count_releases_per_user"] == 4
    # too little count noise: refused before anything runs
    with pytest.raises(FedsimError, match="count_stddev"):
        privacy_report(load_config(None, base + ["clipping.adaptive=true", "clipping.count_stddev=0.5"]), 800)


def test_adaptive_without_noise_is_refused():
    with pytest.raises(FedsimError, match="clipping.adaptive"):
        load_config(None, ["privacy.mechanism='none'", "clipping.adaptive=true"])


@pytest.mark.e2e
def test_adaptive_clipping_run(tmp_path):
    """A real 3-round Ray run: the clip norm moves as the controller says, every round's noise
    uses c_t·z_Δ, ε equals dp-accounting's for the accounted z, the ledger reproduces z."""
    from fedsim.runner import run_experiment

    N, K, z = 24, 8, 1.2
    cfg = load_config(
        None,
        [
            "rounds=3",
            "sampling.scheme='poisson'",
            "privacy.mechanism='gaussian'",
            f"privacy.noise_multiplier={z}",
            "model.name='shakespeare_lstm_small'",
            f"data.max_users={N}",
            f"sampling.cohort_size={K}",
            "client.max_examples=8",
            "eval.every=0",
            "eval.max_users=4",
            "eval.max_examples_per_user=4",
            "sim.num_workers=2",
            "clipping.adaptive=true",
            "clipping.lr=1.0",
            "clipping.count_stddev=2.0",
            "client.clip_norm=0.05",
            "server.optimizer='adambc'",
            "filter.name='ema'",
        ],
    )
    out = tmp_path / "run"
    summary = run_experiment(cfg, out, progress=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ledger = json.loads((out / "ledger.json").read_text())
    delta = 1 / N**1.1
    for r, e in zip(rows, ledger["entries"]):
        want = _pld_eps(
            [
                dp_event.SelfComposedDpEvent(
                    dp_event.PoissonSampledDpEvent(K / N, dp_event.GaussianDpEvent(z)), r["round"]
                )
            ],
            delta,
        )
        assert r["epsilon"] == pytest.approx(want, rel=1e-8)
        assert e["clip_norm"] == r["clip_norm"]
    assert recompute_epsilon(ledger) == pytest.approx(summary["epsilon"], rel=1e-8)
    assert check_budget_split(ledger) == pytest.approx(z, rel=1e-12)
    sigma_b = 2.0
    assert summary["update_noise_multiplier"] == pytest.approx((z**-2 - (2 * sigma_b) ** -2) ** -0.5)
    # c_0 = 0.05 is far below typical LSTM delta norms: nearly everyone is clipped and c grows.
    clips = [r["clip_norm"] for r in rows] + [summary["final_clip_norm"]]
    assert clips[0] == 0.05
    assert all(b > a for a, b in zip(clips, clips[1:])), clips
    for r, c_next in zip(rows, clips[1:]):
        assert c_next == pytest.approx(r["clip_norm"] * math.exp(-1.0 * (r["unclipped_fraction_noisy"] - 0.5)))
    assert all(r["dropped_updates"] == 0 for r in rows)
    assert torch.isfinite(torch.tensor([r["train_loss"] for r in rows])).all()
