"""The contract every registered noise mechanism keeps (docs/algorithms.md §3 and §9), checked on
each one the registry holds — a new mechanism is tested by being registered:

- the streamed rows equal ``M·Z`` (``M`` the plan's noising matrix, ``C⁻¹`` for square ``C``) for
  the same standard normal rows ``ξ_j``;
- their covariance over coordinates matches ``M·Mᵀ``, and ``row_variance(t) = ‖row_t(M)‖²``;
- the stream's state round-trips through ``state_dict`` mid-stream: a new stream loaded from it
  continues with the identical rows, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.privacy.mechanisms import MECHANISMS, MFPlan, make_noise, plan_mf
from fedsim.privacy.participation import make_scheme
from fedsim.privacy.rng import PrivacyKey

N_ROUNDS, B = 16, 4  # 16 is a power of two (tree); epochs with b = 4 groups, k = 4
KEY = PrivacyKey.from_seed(2024).derive("noise")


def _plan(name: str) -> MFPlan | None:
    if not MECHANISMS[name].correlated:
        return None
    scheme = make_scheme("epochs", 64, None, min_sep=B, rounds=N_ROUNDS)
    return plan_mf(name, scheme, N_ROUNDS)


def _noising(name: str, plan: MFPlan | None) -> np.ndarray:
    if plan is not None:
        return plan.noising
    return np.eye(N_ROUNDS) if name == "gaussian" else np.zeros((N_ROUNDS, N_ROUNDS))


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_streamed_rows_equal_the_noising_matrix_times_z(name: str) -> None:
    d = 64
    plan = _plan(name)
    M = _noising(name, plan)
    noise = make_noise(name, d, KEY, "cpu", plan)
    Z = torch.stack([noise.draw(j) for j in range(M.shape[1])]).double().numpy()
    want = M @ Z
    got = np.stack([noise.row(t).double().numpy() for t in range(N_ROUNDS)])
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale)


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_covariance_and_row_variance_match(name: str) -> None:
    d = 20_000
    plan = _plan(name)
    M = _noising(name, plan)
    noise = make_noise(name, d, KEY, "cpu", plan)
    rows = np.stack([noise.row(t).double().numpy() for t in range(N_ROUNDS)])
    want = M @ M.T
    got = rows @ rows.T / d
    # standard error of an empirical covariance entry: sqrt((Σ_ii Σ_jj + Σ_ij²) / d)
    se = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want**2) / d)
    assert np.all(np.abs(got - want) <= 6 * se + 1e-12), float(np.max(np.abs(got - want) / (se + 1e-12)))
    for t in range(N_ROUNDS):
        assert noise.row_variance(t) == pytest.approx(float((M[t] ** 2).sum()), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", list(MECHANISMS))
@pytest.mark.parametrize("stop", [1, 7])
def test_state_round_trips_mid_stream(name: str, stop: int) -> None:
    d = 33
    plan = _plan(name)
    straight = make_noise(name, d, KEY, "cpu", plan)
    want = [straight.row(t).clone() for t in range(N_ROUNDS)]
    first = make_noise(name, d, KEY, "cpu", plan)
    for t in range(stop):
        assert torch.equal(first.row(t), want[t])
    state = first.state_dict()
    resumed = make_noise(name, d, PrivacyKey.from_seed(999), "cpu", _plan(name))  # another key: the state wins
    resumed.load_state_dict(state)
    for t in range(stop, N_ROUNDS):
        assert torch.equal(resumed.row(t), want[t]), (name, t)


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_prefetched_rows_are_the_rows(name: str) -> None:
    """``prefetch(t)`` before ``row(t)`` (as the server does while workers train) changes no
    bit: every round, a prefetch of a round never drawn, and a prefetch made under the old key
    before a resume loads another key."""
    d = 33
    straight = make_noise(name, d, KEY, "cpu", _plan(name))
    want = [straight.row(t).clone() for t in range(N_ROUNDS)]
    ahead = make_noise(name, d, KEY, "cpu", _plan(name))
    for t in range(N_ROUNDS):
        ahead.prefetch(t)
        ahead.prefetch(t)  # asked twice: one draw
        if t == 3:
            ahead.prefetch(t + 5)  # replaced before use: the right row is drawn directly
        assert torch.equal(ahead.row(t), want[t]), (name, t)
    other = make_noise(name, d, PrivacyKey.from_seed(7), "cpu", _plan(name))
    other.prefetch(4)  # ξ_4 of key 7, then the state of KEY's stream is loaded
    first = make_noise(name, d, KEY, "cpu", _plan(name))
    for t in range(4):
        first.row(t)
    other.load_state_dict(first.state_dict())
    for t in range(4, N_ROUNDS):
        assert torch.equal(other.row(t), want[t]), (name, t)


def test_every_registered_mechanism_is_checked() -> None:
    assert {
        "none",
        "gaussian",
        "identity",
        "tree",
        "sqrt",
        "dense",
        "dpmf_plus",
        "banded",
        "blt",
        "bsr",
        "bisr",
    } <= set(MECHANISMS)
