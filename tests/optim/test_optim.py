"""Server optimizers against steps written out by hand in plain Python (docs/algorithms.md §7)."""

from __future__ import annotations

import math

import pytest
import torch

from fedsim.errors import FedsimError
from fedsim.server.optim import SGD, Adam, Momentum, make_optimizer

X0 = [0.5, -1.25, 2.0]
GRADS = [
    [0.3, -0.7, 1.1],
    [-0.2, 0.4, 0.05],
    [1.5, -0.1, -2.25],
]
TOL = 1e-12


def t64(xs):
    return torch.tensor(xs, dtype=torch.float64)


def run(opt, grads=GRADS, x0=X0):
    x = t64(x0)
    out = []
    for g in grads:
        opt.step(x, t64(g))
        out.append(x.tolist())
    return out


def close(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        for u, v in zip(ra, rb):
            assert abs(u - v) <= TOL * max(1.0, abs(v)), (ra, rb)


# --- by-hand references ----------------------------------------------------------------


def sgd_by_hand(lr):
    x = list(X0)
    out = []
    for g in GRADS:
        x = [xi - lr * gi for xi, gi in zip(x, g)]
        out.append(x)
    return out


def momentum_by_hand(lr, beta):
    x, m = list(X0), [0.0, 0.0, 0.0]
    out = []
    for g in GRADS:
        m = [beta * mi + gi for mi, gi in zip(m, g)]
        x = [xi - lr * mi for xi, mi in zip(x, m)]
        out.append(x)
    return out


def adam_by_hand(lr, b1, b2, eps, bias_correction):
    x, m, v = list(X0), [0.0] * 3, [0.0] * 3
    out = []
    for k, g in enumerate(GRADS, start=1):
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        if bias_correction:
            mh = [mi / (1 - b1**k) for mi in m]
            vh = [vi / (1 - b2**k) for vi in v]
        else:
            mh, vh = m, v
        x = [xi - lr * mi / (math.sqrt(vi) + eps) for xi, mi, vi in zip(x, mh, vh)]
        out.append(x)
    return out


def test_sgd_explicit_numbers():
    # lr = 0.5, first step written out: x1 = x0 - 0.5 g0
    x = t64(X0)
    SGD(0.5).step(x, t64(GRADS[0]))
    close([x.tolist()], [[0.5 - 0.15, -1.25 + 0.35, 2.0 - 0.55]])


@pytest.mark.parametrize("lr", [1.0, 0.5, 0.01])
def test_sgd(lr):
    close(run(SGD(lr)), sgd_by_hand(lr))


def test_sgd_lr1_is_fedavg():
    # with lr = 1 and g = -mean delta, the server model becomes x + mean delta
    x = t64(X0)
    delta = t64([0.1, 0.2, -0.3])
    SGD(1.0).step(x, -delta)
    close([x.tolist()], [[0.6, -1.05, 1.7]])


def test_momentum_explicit_numbers():
    # lr = 0.1, β = 0.9:
    # m1 = g0                         = [0.3, -0.7, 1.1];   x1 = x0 - 0.1 m1
    # m2 = 0.9 m1 + g1 = [0.07, -0.23, 1.04];               x2 = x1 - 0.1 m2
    x = t64(X0)
    opt = Momentum(0.1, 0.9)
    opt.step(x, t64(GRADS[0]))
    close([x.tolist()], [[0.47, -1.18, 1.89]])
    opt.step(x, t64(GRADS[1]))
    close([x.tolist()], [[0.463, -1.157, 1.786]])


@pytest.mark.parametrize("lr, beta", [(0.1, 0.9), (1.0, 0.0), (0.3, 0.5)])
def test_momentum(lr, beta):
    close(run(Momentum(lr, beta)), momentum_by_hand(lr, beta))


def test_momentum_beta0_is_sgd():
    close(run(Momentum(0.3, 0.0)), sgd_by_hand(0.3))


def test_adam_explicit_first_step():
    # bias-corrected first step: m̂ = g, v̂ = g², so x1 = x0 - lr·g/(|g| + eps)
    lr, eps = 0.1, 1e-3
    x = t64(X0)
    Adam(lr, 0.9, 0.99, eps, bias_correction=True).step(x, t64(GRADS[0]))
    expect = [x0 - lr * g / (abs(g) + eps) for x0, g in zip(X0, GRADS[0])]
    close([x.tolist()], [expect])
    # uncorrected: m = 0.1 g, v = 0.01 g², so x1 = x0 - lr·0.1g/(0.1|g| + eps)
    x = t64(X0)
    Adam(lr, 0.9, 0.99, eps, bias_correction=False).step(x, t64(GRADS[0]))
    expect = [x0 - lr * 0.1 * g / (0.1 * abs(g) + eps) for x0, g in zip(X0, GRADS[0])]
    close([x.tolist()], [expect])


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("lr, b1, b2, eps", [(0.1, 0.9, 0.99, 1e-3), (1.0, 0.5, 0.9, 0.2), (0.01, 0.0, 0.0, 1e-8)])
def test_adam(lr, b1, b2, eps, bias_correction):
    opt = Adam(lr, b1, b2, eps, bias_correction)
    close(run(opt), adam_by_hand(lr, b1, b2, eps, bias_correction))
    assert opt.t == len(GRADS)


def test_adam_bias_correction_matters():
    a = run(Adam(0.1, 0.9, 0.99, 1e-3, True))
    b = run(Adam(0.1, 0.9, 0.99, 1e-3, False))
    assert max(abs(u - v) for ra, rb in zip(a, b) for u, v in zip(ra, rb)) > 1e-3


def test_step_does_not_modify_grad():
    for opt in (SGD(0.5), Momentum(0.5), Adam(0.5)):
        g = t64(GRADS[0])
        before = g.clone()
        x = t64(X0)
        opt.step(x, g)
        opt.step(x, g)
        assert torch.equal(g, before)


# --- make_optimizer ----------------------------------------------------------------------


def test_make_optimizer_passes_hyperparameters():
    close(run(make_optimizer("sgd", 0.5)), sgd_by_hand(0.5))
    close(run(make_optimizer("momentum", 0.1, momentum=0.5)), momentum_by_hand(0.1, 0.5))
    close(
        run(make_optimizer("adam", 0.2, beta1=0.8, beta2=0.95, eps=0.05, bias_correction=False)),
        adam_by_hand(0.2, 0.8, 0.95, 0.05, False),
    )
    close(run(make_optimizer("adam", 0.2, beta1=0.8, beta2=0.95, eps=0.05)), adam_by_hand(0.2, 0.8, 0.95, 0.05, True))


@pytest.mark.parametrize("name", ["sgdd", "yogi_typo", "", "SGD", "fedadam"])
def test_make_optimizer_rejects_unknown(name):
    with pytest.raises(FedsimError):
        make_optimizer(name, 0.1)


@pytest.mark.parametrize("lr", [0.0, -1.0])
def test_nonpositive_lr_rejected(lr):
    with pytest.raises(FedsimError, match="server.lr"):
        make_optimizer("sgd", lr)


# --- state_dict resume --------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: make_optimizer("sgd", 0.5),
        lambda: make_optimizer("momentum", 0.1, momentum=0.9),
        lambda: make_optimizer("adam", 0.1, bias_correction=True),
        lambda: make_optimizer("adam", 0.1, bias_correction=False),
    ],
    ids=["sgd", "momentum", "adam-bc", "adam-nobc"],
)
def test_state_dict_resume_is_identical(make):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(6)]
    x_full = torch.randn(5, generator=g, dtype=torch.float64)
    x_resumed = x_full.clone()

    full = make()
    for gr in grads:
        full.step(x_full, gr)

    first = make()
    for gr in grads[:3]:
        first.step(x_resumed, gr)
    state = first.state_dict()
    # the saved state is a snapshot: stepping the old optimizer must not change it
    first.step(x_resumed.clone(), grads[3])
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.t == 3
    for gr in grads[3:]:
        resumed.step(x_resumed, gr)
    assert torch.equal(x_resumed, x_full)
    assert resumed.t == full.t == 6


def test_load_state_of_other_optimizer_raises():
    s = make_optimizer("adam", 0.1)
    s.step(t64(X0), t64(GRADS[0]))
    with pytest.raises(FedsimError):
        make_optimizer("momentum", 0.1).load_state_dict(s.state_dict())
    with pytest.raises(FedsimError):
        make_optimizer("sgd", 0.1).load_state_dict(s.state_dict())
