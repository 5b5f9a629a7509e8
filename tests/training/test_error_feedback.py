"""Clipping error feedback (docs/algorithms.md §8): the Huber example, states, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.privacy.clipping import clip_vector
from fedsim.training.error_feedback import (
    ClientStateStore,
    ServerErrorFeedback,
    check_memory,
    client_ef_update,
    server_noise_norm,
)

# DiceSGD Appendix B.1: C = 1, C' = ⌈C⌉ + 1 = 2, N = C' + 1 = 3 clients with ξ = (−1, −1, C').
C, CP = 1.0, 2.0
XI = [-1.0, -1.0, CP]
ETA = 0.5


def _grad(x: float, xi: float) -> float:
    """∇f(x, ξ) of the Huber loss with threshold C'."""
    return float(np.clip(x - xi, -CP, CP))


def _run(mode: str, rounds: int = 3000, x0: float = 1.5) -> float:
    """Federated: each client's delta is one local step −η∇f; full participation, no noise,
    FedAvg with server step 1. Clip c₁ = η·C (the per-sample clip C on the gradient scale)."""
    c1 = c2 = ETA * C
    x = x0
    e = [torch.zeros(1, dtype=torch.float64) for _ in XI]
    server = ServerErrorFeedback(1, c2)
    server.e = server.e.double()
    for _ in range(rounds):
        ups, res = [], torch.zeros(1, dtype=torch.float64)
        for i, xi in enumerate(XI):
            delta = torch.tensor([-ETA * _grad(x, xi)], dtype=torch.float64)
            if mode == "client":
                u, e[i], _ = client_ef_update(delta, e[i], c1, c2)
            else:
                u, _ = clip_vector(delta, c1)
                res = res + (delta - u)
            ups.append(u)
        v = sum(ups) / len(XI)
        if mode == "server":
            fed = server.feedback()
            v = v + fed
            server.step(fed, res / len(XI))
        x = x + float(v[0])
    return x


def test_huber_minimiser_and_clipped_fixed_point():
    # Unclipped mean gradient vanishes at x* = 0 (C'(x+1) + (x − C') = 0).
    assert sum(_grad(0.0, xi) for xi in XI) == 0.0
    # [fix] clipped fixed point: C'·(x+1) − C = 0 → x̃ = C/C' − 1 = −0.5 (not C'/(C'+C)).
    x_tilde = C / CP - 1
    assert CP * (x_tilde + 1) + float(np.clip(x_tilde - CP, -C, C)) == pytest.approx(0.0)


def test_clipped_fedavg_stalls_at_the_bias_and_error_feedback_removes_it():
    assert _run("none") == pytest.approx(C / CP - 1, abs=1e-9)
    assert _run("client") == pytest.approx(0.0, abs=1e-6)
    assert _run("server") == pytest.approx(0.0, abs=1e-6)


def test_client_update_bound_and_state_recursion():
    g = torch.Generator().manual_seed(0)
    c1, c2 = 0.5, 0.8
    e = torch.zeros(50)
    for _ in range(20):
        delta = torch.randn(50, generator=g) * 2
        u, e_new, norm = client_ef_update(delta, e, c1, c2)
        assert float(u.double().norm()) <= c1 + c2 + 1e-6
        torch.testing.assert_close(e_new, e + delta - u)
        assert norm == pytest.approx(float(delta.double().norm()), rel=1e-6)
        e = e_new


def test_state_store_round_trip_and_validation():
    s = ClientStateStore(dim=4, population=10, budget_mb=1)
    np.testing.assert_array_equal(s.get(3), np.zeros(4, np.float32))
    s.put(3, np.arange(4, dtype=np.float32))
    s.put(7, np.ones(4, dtype=np.float32))
    t = ClientStateStore(dim=4, population=10, budget_mb=1)
    t.load_state_dict(s.state_dict())
    np.testing.assert_array_equal(t.get(3), np.arange(4))
    np.testing.assert_array_equal(t.get(7), np.ones(4))
    assert not s.valid(np.array([1.0, np.nan, 0, 0], dtype=np.float32))
    assert not s.valid(np.zeros(5, np.float32)) and not s.valid(np.zeros(4, np.int32))
    assert s.valid(np.zeros(4, np.float32))


def test_memory_budget_refuses_big_populations():
    check_memory(1000, 1000, budget_mb=4)  # 3.8 MiB fits
    with pytest.raises(FedsimError, match="error_feedback_memory_mb"):
        check_memory(342_477, 824_000, budget_mb=2048)


def test_server_state_and_noise_norm():
    s = ServerErrorFeedback(3, c2=1.0)
    s.step(s.feedback(), torch.tensor([3.0, 4.0, 0.0]))
    fed = s.feedback()
    torch.testing.assert_close(fed, torch.tensor([0.6, 0.8, 0.0]), rtol=1e-6, atol=1e-6)
    s.step(fed, torch.zeros(3))
    torch.testing.assert_close(s.e, torch.tensor([2.4, 3.2, 0.0]), rtol=1e-6, atol=1e-6)
    assert server_noise_norm(1.0, 2.0) == pytest.approx(3.0)


def test_config_refusals():
    with pytest.raises(FedsimError, match="ef_clip_norm"):
        load_config(None, ["client.error_feedback='client'", "client.clip_norm=1.0", "client.ef_clip_norm=0.5"])
    with pytest.raises(FedsimError, match="matrix-factorization"):
        load_config(None, ["client.error_feedback='server'", "sampling.scheme='epochs'", "privacy.mechanism='blt'"])
    with pytest.raises(FedsimError, match="allow_no_guarantee"):
        load_config(
            None,
            [
                "client.error_feedback='server'",
                "sampling.scheme='poisson'",
                "privacy.mechanism='gaussian'",
                "sampling.cohort_size=10",
            ],
        )
    with pytest.raises(FedsimError, match="adaptive"):
        load_config(
            None,
            [
                "client.error_feedback='client'",
                "clipping.adaptive=true",
                "privacy.mechanism='gaussian'",
                "sampling.scheme='poisson'",
            ],
        )
    # client error feedback works with MF noise
    load_config(None, ["client.error_feedback='client'", "sampling.scheme='epochs'", "privacy.mechanism='blt'"])


def test_server_ef_label_in_fedsim_privacy(capsys):
    from helpers import run_cli

    args = [
        "privacy",
        "--population",
        "800",
        "--set",
        "client.error_feedback='server'",
        "--set",
        "sampling.scheme='poisson'",
        "--set",
        "privacy.mechanism='gaussian'",
        "--set",
        "privacy.noise_multiplier=1.0",
        "--set",
        "sampling.cohort_size=40",
        "--set",
        "rounds=5",
        "--set",
        "privacy.allow_no_guarantee=true",
    ]
    code, out, _ = run_cli(capsys, *args)
    assert code == 0 and "NO PRIVACY GUARANTEE" in out and "ε = inf" in out
    code, out, _ = run_cli(capsys, *args, "--json")
    rep = __import__("json").loads(out)
    assert any("NO PRIVACY GUARANTEE" in n for n in rep["notes"]) and rep["epsilon"] == "inf"
