"""The faster factorization solvers of issue 46 reach the same optimum as independent computations.

- ``dense`` / ``dpmf_plus``: the Anderson-accelerated fixed point against the plain fixed-point
  iteration written out here (the solver fedsim used before), and against jax_privacy's optimum
  (experiments/jax_privacy_comparison.md: ``dense.optimize`` with a projected-gradient tolerance
  of 1e-6, converted to fedsim's total loss).
- ``banded``: the block recursion on ``D = C·A⁻¹`` against the dense evaluation ``‖(A·C⁻¹)[t, :]‖²``
  (values and autograd gradients at random band entries), and the optimum against jax_privacy's
  convex banded solve.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.errors import FedsimError
from fedsim.privacy.mechanisms.banded import (
    _BandedInverseObjective,
    _BandedObjective,
    banded_inverse,
    banded_sqrt_init,
    optimize_banded,
)
from fedsim.privacy.mechanisms.dense import dense
from fedsim.privacy.mechanisms.dpmf_plus import dpmf_plus, lambda_matrix
from fedsim.privacy.workloads import momentum, prefix_sum

# jax_privacy 2.0.0's optima (experiments/jax_privacy_comparison.md, "Results"), fedsim's units.
JAX_DENSE = {64: 282.2014211, 256: 1631.403045}  # dense.optimize, pg ≤ 1e-6, 7 digits as printed
JAX_BANDED_256_16_K16 = 52700.53116747987  # dense.optimize(bands=16, equal_norm=True), min_sep k = b = 16


def plain_fixed_point_loss(A: np.ndarray, tol: float = 1e-10, max_iter: int = 100_000) -> tuple[float, int]:
    """Denisov et al.'s iteration ``v ← diag((V^½WV^½)^½)`` without acceleration, and the loss
    ``max_j ‖C[:, j]‖² · ‖A·C⁻¹‖_F² = tr(W X⁻¹)`` of its ``X`` rescaled to a unit diagonal."""
    W = A.T @ A
    v = np.ones(A.shape[0])
    for iterations in range(1, max_iter + 1):  # noqa: B007 - returned
        s = np.sqrt(v)
        e, U = np.linalg.eigh(s[:, None] * W * s[None, :])
        new = (U * U) @ np.sqrt(np.clip(e, 0, None))
        done = np.max(np.abs(new - v) / v) < tol
        v = new
        if done:
            break
    s = np.sqrt(v)
    e, U = np.linalg.eigh(s[:, None] * W * s[None, :])
    X = (U * np.sqrt(np.clip(e, 0, None))) @ U.T / np.outer(s, s)
    d = np.sqrt(np.diag(X))
    X = X / np.outer(d, d)
    return float(np.trace(W @ np.linalg.inv(X))), iterations


@pytest.mark.parametrize(
    "workload",
    ["prefix", "momentum", "dpmf_plus"],
)
def test_accelerated_dense_equals_the_plain_fixed_point(workload: str) -> None:
    n = 64
    A = {
        "prefix": prefix_sum(n),
        "momentum": momentum(n, 0.9, np.linspace(1.0, 0.2, n)),
        "dpmf_plus": lambda_matrix(n) @ prefix_sum(n),
    }[workload]
    want, plain_iterations = plain_fixed_point_loss(A)
    f = dense(A)
    assert f.info["converged"] and f.info["solver"] == "anderson-fixed-point"
    assert f.loss() == pytest.approx(want, rel=1e-11)
    assert abs(f.info["rel_gap"]) < 1e-10
    assert f.info["iterations"] < plain_iterations / 3  # the point of the change
    if workload == "dpmf_plus":  # DP-MF+ keeps exactly this C: its objective is dense's loss on Λ·A
        g = dpmf_plus(prefix_sum(n))
        assert g.info["objective"] == pytest.approx(want, rel=1e-11)


@pytest.mark.parametrize("n", [64, 256])
def test_dense_matches_jax_privacy(n: int) -> None:
    f = dense(prefix_sum(n))
    assert f.loss() == pytest.approx(JAX_DENSE[n], rel=1e-9)


def test_dense_where_neither_iteration_converges() -> None:
    """Learning rates decaying a thousandfold: neither iteration reaches tol (the plain one stalls
    at a relative change of ~4e-2 after 20,000 steps; the dual optimum is flat). After the same
    number of eigendecompositions both losses agree to 1e-8 (measured: 1.5e-9 apart), and
    the solver warns."""
    n = 64
    A = momentum(n, 0.0, np.geomspace(1.0, 1e-3, n))
    with pytest.warns(RuntimeWarning, match="did not reach"):
        f = dense(A, max_iter=300)
    plain, _ = plain_fixed_point_loss(A, tol=0.0, max_iter=300)
    assert f.loss() == pytest.approx(plain, rel=1e-8)


def _workloads() -> dict[str, tuple[np.ndarray, int]]:
    return {
        "prefix b=8": (prefix_sum(200), 8),
        "momentum with rates b=5": (momentum(150, 0.9, np.linspace(1.0, 0.1, 150)), 5),
        "prefix b=40": (prefix_sum(150), 40),
        "prefix b=n": (prefix_sum(70), 70),
        "momentum b=1": (momentum(77, 0.5), 1),
    }


@pytest.mark.parametrize("case", list(_workloads()))
def test_banded_inverse_evaluator_equals_the_dense_one(case: str) -> None:
    A, b = _workloads()[case]
    U = banded_inverse(A)
    assert U is not None
    inv = np.linalg.inv(A)
    band = sum(np.diag(U[e, : A.shape[0] - e], -e) for e in range(U.shape[0]))
    np.testing.assert_allclose(band, inv, rtol=0, atol=1e-10 * np.abs(inv).max())
    ref, fast = _BandedObjective(A, b), _BandedInverseObjective(A, b, U)
    rng = np.random.default_rng(7)
    x = ref.params_from_dense(banded_sqrt_init(A.shape[0], b)) + 0.05 * rng.standard_normal(ref.num_params)
    out = []
    for obj in (ref, fast):
        p = torch.tensor(x, requires_grad=True)
        rows = obj.row_errors(p)
        value = (rows * torch.linspace(0.5, 2.0, rows.numel(), dtype=torch.float64)).sum()
        (grad,) = torch.autograd.grad(value, p)
        out.append((rows.detach().numpy(), grad.numpy()))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-11)
    if x.size:
        np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-9, atol=1e-11 * np.abs(out[0][1]).max())


def test_banded_optimum_matches_jax_privacy_and_the_dense_evaluator() -> None:
    S = prefix_sum(256)
    _, fast = optimize_banded(S, 16, max_participations=16, evaluator="banded_inverse")
    _, ref = optimize_banded(S, 16, max_participations=16, evaluator="dense")
    assert fast["evaluator"] == "banded_inverse" and ref["evaluator"] == "dense"
    assert fast["converged"] and fast["loss"] == pytest.approx(JAX_BANDED_256_16_K16, rel=1e-9)
    assert fast["loss"] == pytest.approx(ref["loss"], rel=1e-10)


def test_auto_evaluator_choice() -> None:
    # one dense block (n ≤ max(b, 64)): the dense evaluation, bit-identical to earlier releases
    assert optimize_banded(prefix_sum(64), 4)[1]["evaluator"] == "dense"
    assert optimize_banded(prefix_sum(96), 4)[1]["evaluator"] == "banded_inverse"
    # a workload whose inverse is dense: the dense evaluation
    A = np.tril(np.random.default_rng(3).uniform(0.5, 1.0, (96, 96)))
    assert banded_inverse(A) is None
    assert optimize_banded(A, 4)[1]["evaluator"] == "dense"
    with pytest.raises(FedsimError, match="banded_inverse"):
        optimize_banded(A, 4, evaluator="banded_inverse")
    with pytest.raises(FedsimError, match="evaluator must be"):
        optimize_banded(prefix_sum(8), 2, evaluator="fast")  # type: ignore[arg-type]
