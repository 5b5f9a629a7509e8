"""The server's guard (drop / re-clip / running sum) and the DP step (noise, fixed denominator)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.privacy.accounting import AccountingSpec
from fedsim.privacy.ledger import Ledger
from fedsim.privacy.noise import gaussian_noise, zero_noise
from fedsim.server.aggregation import UpdateAggregator
from fedsim.server.optim import SGD
from fedsim.server.step import DPServer

D = 50


def norm64(v) -> float:
    return float(np.linalg.norm(np.asarray(v, dtype=np.float64)))


def test_accepts_and_sums_valid_updates():
    agg = UpdateAggregator(D, clip_norm=1.0)
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(D) * 0.01).astype(np.float32)
    b = (rng.standard_normal(D) * 0.01).astype(np.float32)
    assert agg.add(a, 1) is None and agg.add(b, 1) is None
    np.testing.assert_allclose(agg.total.numpy(), a + b, rtol=1e-6)
    assert agg.accepted_users == 2 and agg.dropped_users == 0 and agg.server_clipped == 0


@pytest.mark.parametrize(
    "bad,reason",
    [
        (None, "missing"),
        (np.full(D, np.nan, dtype=np.float32), "nonfinite"),
        (np.r_[np.zeros(D - 1), np.inf].astype(np.float32), "nonfinite"),
        (np.zeros(D - 1, dtype=np.float32), "shape"),
        (np.zeros((D, 1), dtype=np.float32), "shape"),
        (np.zeros(D, dtype=np.int64), "dtype"),
        (np.array(["x"] * D), "dtype"),
        ([0.0] * D, "dtype"),
    ],
)
def test_bad_replies_are_dropped_and_counted(bad, reason):
    agg = UpdateAggregator(D, clip_norm=1.0)
    agg.add(np.ones(D, dtype=np.float32) * 0.01, 1)
    before = agg.total.clone()
    assert agg.add(bad, 3) == reason
    assert torch.equal(agg.total, before)
    assert agg.dropped_users == 3 and agg.dropped_replies == 1
    assert agg.drop_counts()[reason] == 1


@pytest.mark.parametrize("users", [1, 3, 7])
def test_huge_reply_is_reclipped_to_m_times_c(users):
    c = 0.5
    agg = UpdateAggregator(D, clip_norm=c)
    v = np.ones(D, dtype=np.float32) * np.float32(1e6 / np.sqrt(D))
    assert agg.add(v, users) is None
    assert agg.server_clipped == 1
    assert norm64(agg.total.numpy()) <= users * c
    assert norm64(agg.total.numpy()) == pytest.approx(users * c, rel=1e-5)
    # Direction is kept.
    cos = float(np.dot(agg.total.numpy(), v) / (norm64(agg.total.numpy()) * norm64(v)))
    assert cos == pytest.approx(1.0, abs=1e-6)


def _server(noise, z=1.0, k_bar=10, c=2.0, d=D):
    spec = AccountingSpec("gaussian" if z > 0 else "none", "poisson", 100, k_bar, z, 1e-3)
    return DPServer(torch.zeros(d), noise, SGD(1.0), Ledger(spec, 5), c, z, k_bar)


def test_fixed_denominator_and_noise_scale():
    """ĝ_t = (U_t + c·z·n_t)/K̄ with K̄ fixed, whatever the realised cohort."""
    noise = gaussian_noise(D, seed=11)
    srv = _server(noise, z=1.7, k_bar=10, c=2.0)
    total = torch.arange(D, dtype=torch.float32)
    g = srv.noisy_mean(total, t=3)
    expected = (total + 2.0 * 1.7 * noise.row(3)) / 10
    torch.testing.assert_close(g, expected)
    # The step uses K̄ = 10 whether 3 or 30 users took part.
    for realised in (3, 30):
        s = _server(gaussian_noise(D, seed=11), z=1.7, k_bar=10, c=2.0)
        s.round = 3
        s.ledger.entries = [{"round": i + 1, "epsilon": 0.0, "cohort": 0} for i in range(3)]
        s.step(total, realized_cohort=realised)
        torch.testing.assert_close(s.params, expected)  # SGD lr 1 on −ĝ: x = 0 + ĝ


def test_zero_noise_gives_plain_mean_over_k_bar():
    srv = _server(zero_noise(D, 0), z=0.0, k_bar=4)
    total = torch.ones(D)
    srv.step(total, realized_cohort=2)
    torch.testing.assert_close(srv.params, torch.full((D,), 0.25))
    assert srv.ledger.epsilon == float("inf")


def test_noise_empirical_std_matches_c_z_over_k_bar():
    d = 200_000
    srv = _server(gaussian_noise(d, seed=3), z=0.8, k_bar=25, c=1.5, d=d)
    g = srv.noisy_mean(torch.zeros(d), t=0)
    expected = 1.5 * 0.8 / 25
    # std of the sample std of n normals ≈ σ/√(2n); allow 5 of those.
    assert float(g.std()) == pytest.approx(expected, abs=5 * expected / np.sqrt(2 * d))


def test_server_state_dict_roundtrip():
    srv = _server(gaussian_noise(D, seed=1), z=1.0)
    srv.step(torch.ones(D), 5)
    state = srv.state_dict()
    other = _server(gaussian_noise(D, seed=999), z=1.0)
    other.load_state_dict(state)
    srv.step(torch.ones(D), 5)
    other.step(torch.ones(D), 5)
    assert torch.equal(srv.params, other.params)
    assert srv.ledger.entries == other.ledger.entries
