"""The output layer and softmax cross-entropy computed together (fedsim.models.softmax_head):
equal to ``cross_entropy(linear(f))`` and its gradients up to rounding, the ignored rows, the
rows whose target probability underflows, another incoming gradient, and training with it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedsim.data import data_spec, load_federated
from fedsim.data.stackoverflow.synthetic import generate
from fedsim.models import make_model
from fedsim.models.softmax_head import TINY, block_rows, fused_loss, linear_cross_entropy
from fedsim.training.local import LocalTraining, local_delta, train_users


def _both(f, w, b, t, ignore, rows, scale=1.0):
    """(loss, grads) of the fused and the unfused computation from the same leaves."""
    out = []
    for fused in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (f, w) + ((b,) if b is not None else ())]
        bias = leaves[2] if b is not None else None
        if fused:
            loss = linear_cross_entropy(leaves[0], leaves[1], bias, t, ignore, rows)
        else:
            loss = F.cross_entropy(F.linear(leaves[0], leaves[1], bias), t, ignore_index=ignore)
        (loss * scale).backward()
        out.append((loss.detach(), [x.grad for x in leaves]))
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("n,classes,rows", [(37, 1003, 8), (64, 50, 64), (5, 3, 2), (33, 2000, 32)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_equals_cross_entropy_of_the_linear_layer(dtype, tol, n, classes, rows, with_bias):
    g = torch.Generator().manual_seed(n * classes)
    f = torch.randn(n, 12, generator=g, dtype=dtype)
    w = torch.randn(classes, 12, generator=g, dtype=dtype) * 0.7
    b = torch.randn(classes, generator=g, dtype=dtype) if with_bias else None
    t = torch.randint(1, classes, (n,), generator=g)
    t[::4] = 0  # a quarter of the rows ignored (block boundaries cross kept and ignored rows)
    (lf, gf), (lr, gr) = _both(f, w, b, t, 0, rows)
    torch.testing.assert_close(lf, lr, rtol=tol, atol=tol)
    for a, r in zip(gf, gr):
        torch.testing.assert_close(a, r, rtol=tol, atol=tol)
    # an ignored row's logits get a zero gradient, so its features' gradient is exactly zero
    assert torch.count_nonzero(gf[0][t == 0]) == 0


def test_ignored_rows_never_enter_the_products():
    """Only the kept rows are multiplied: whatever an ignored row's features hold (huge values,
    inf, NaN), the loss and every gradient are bit for bit those of the same batch with that row
    zeroed, and the ignored rows' feature gradients are exactly zero. (The unfused layer would
    carry a NaN feature into ∂W through a zero times NaN.)"""
    g = torch.Generator().manual_seed(5)
    f = torch.randn(41, 9, generator=g)
    w, b = torch.randn(300, 9, generator=g), torch.randn(300, generator=g)
    t = torch.randint(1, 300, (41,), generator=g)
    t[[0, 7, 8, 30, 40]] = 0
    runs = []
    for filler in (0.0, 1e30, math.inf, math.nan):
        leaves = [f.clone(), w.clone(), b.clone()]
        leaves[0][t == 0] = filler
        leaves = [x.requires_grad_() for x in leaves]
        loss = linear_cross_entropy(leaves[0], leaves[1], leaves[2], t, 0, 8)
        loss.backward()
        runs.append((loss.detach(), [x.grad for x in leaves]))
    for loss, grads in runs[1:]:
        assert torch.equal(loss, runs[0][0])
        for a, r in zip(grads, runs[0][1]):
            assert torch.equal(a, r)
        assert torch.count_nonzero(grads[0][t == 0]) == 0


def test_another_incoming_gradient_scales_every_gradient():
    g = torch.Generator().manual_seed(1)
    f, w, b = torch.randn(20, 6, generator=g), torch.randn(30, 6, generator=g), torch.randn(30, generator=g)
    t = torch.randint(1, 30, (20,), generator=g)
    (lf, gf), (lr, gr) = _both(f.double(), w.double(), b.double(), t, -100, 8, scale=-3.5)
    torch.testing.assert_close(lf, lr, rtol=1e-12, atol=1e-12)
    for a, r in zip(gf, gr):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


def test_every_row_ignored_gives_nan_loss_and_zero_gradients_like_torch():
    f, w, b = torch.randn(6, 4), torch.randn(9, 4), torch.randn(9)
    t = torch.zeros(6, dtype=torch.long)
    (lf, gf), (lr, gr) = _both(f, w, b, t, 0, 4)
    assert torch.isnan(lf) and torch.isnan(lr)
    for a, r in zip(gf, gr):
        assert torch.equal(a, r) and not a.any()


def test_underflowing_target_probability_keeps_an_exact_finite_loss():
    """A target whose softmax probability is below float32's normal range (a logit gap of 150):
    ``−log p`` would be inf; the row is recomputed with log_softmax and matches torch."""
    f = torch.eye(4, dtype=torch.float32)
    w = torch.zeros(5, 4)
    w[0, 0] = 150.0  # row 0: class 0 dominates by 150 nats; its target is class 3
    w[1, 1] = 3.0
    t = torch.tensor([3, 1, 2, 4])
    (lf, gf), (lr, gr) = _both(f, w, None, t, -100, 2)
    probs = torch.softmax(f @ w.t(), 1).gather(1, t[:, None])
    assert probs[0].item() < TINY  # the case is really exercised
    assert torch.isfinite(lf)
    torch.testing.assert_close(lf, lr, rtol=1e-6, atol=1e-5)
    for a, r in zip(gf, gr):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6)


def test_out_of_range_target_raises_like_torch():
    f, w = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(RuntimeError):
        linear_cross_entropy(f, w, None, torch.tensor([1, 5, 2]))


def test_block_rows_fit_the_cache_budget():
    assert block_rows(10_004, 4) == 32
    assert block_rows(80, 4) == 1024 and block_rows(10**9, 4) == 8


@pytest.fixture(scope="module")
def so_data(tmp_path_factory):
    root: Path = generate(tmp_path_factory.mktemp("so") / "data", users=8, per_user=24, vocab=300, tags=5, seed=4)
    return load_federated(data_spec("stackoverflow_nwp", root=str(root), vocab_size=250, seq_len=12))


def test_only_a_softmax_loss_over_a_linear_head_on_a_cpu_is_fused(so_data, tmp_path):
    word = make_model("so_nwp_lstm_small", so_data.model_dims(), seed=0)
    assert fused_loss(word, so_data, torch.device("cpu")) is not None
    assert fused_loss(word, so_data, torch.device("cuda")) is None  # a GPU keeps the unfused kernels
    root = generate(tmp_path / "tag", users=4, per_user=6, vocab=40, tags=5, seed=1)
    tags = load_federated(data_spec("stackoverflow_tag", root=str(root), vocab_size=30, tag_vocab_size=4))
    assert tags.softmax_ignore_index is None
    assert fused_loss(make_model("so_tag_logreg", tags.model_dims(), seed=0), tags, torch.device("cpu")) is None
    logreg = make_model("logreg", {"in_features": 4, "num_classes": 3}, seed=0)
    assert fused_loss(logreg, so_data, torch.device("cpu")) is None  # no features/head


def test_fused_step_equals_the_model_output_and_loss(so_data):
    model = make_model("so_nwp_lstm_small", so_data.model_dims(), seed=0).double()
    x, y = so_data.train_samples(2, torch.arange(so_data.num_train(2)).numpy())
    loss = fused_loss(model, so_data, torch.device("cpu"))
    lf = loss(x, y)
    gf = torch.autograd.grad(lf, list(model.parameters()))
    lr = so_data.loss(model(x), y)
    gr = torch.autograd.grad(lr, list(model.parameters()))
    torch.testing.assert_close(lf, lr, rtol=1e-12, atol=1e-12)
    for a, r in zip(gf, gr):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)


def test_local_training_with_and_without_fusion_agrees(so_data):
    model = make_model("so_nwp_lstm_small", so_data.model_dims(), seed=0)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    spec = LocalTraining(epochs=2, batch_size=4, lr=0.5, max_examples=16, clip_norm=1.0)
    for u in range(so_data.population):
        d_off, loss_off, n_off = local_delta(model, x0, so_data, u, 3, 7, spec)
        d_on, loss_on, n_on = local_delta(model, x0, so_data, u, 3, 7, dataclasses.replace(spec, fused_softmax=True))
        assert n_on == n_off
        assert loss_on == pytest.approx(loss_off, rel=1e-6)
        torch.testing.assert_close(d_on, d_off, rtol=1e-4, atol=1e-6)


def test_one_users_fused_update_does_not_depend_on_who_trained_before(so_data):
    """The row blocks' scratch and gradient buffers are the call's own: user 3's clipped update
    is bitwise the same trained first, after user 0, or after user 5."""
    model = make_model("so_nwp_lstm_small", so_data.model_dims(), seed=0)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    spec = LocalTraining(epochs=1, batch_size=4, lr=0.5, max_examples=12, clip_norm=0.3, fused_softmax=True)
    alone, _ = train_users(model, x0, so_data, [3], 0, 1, spec)
    assert alone.any()
    for before in (0, 5):
        train_users(model, x0, so_data, [before], 0, 1, spec)  # the same model object, reused
        single, _ = train_users(model, x0, so_data, [3], 0, 1, spec)
        assert torch.equal(single, alone)


def test_the_sim_setting_reaches_the_workers_and_a_bad_value_is_refused(so_data, tmp_path):
    from fedsim.config import load_config
    from fedsim.errors import FedsimError
    from fedsim.protocol import Task
    from fedsim.runner import build_run

    root = generate(tmp_path / "d", users=6, per_user=8, vocab=60, tags=4, seed=2)
    base = [
        "data.name='stackoverflow_nwp'",
        f"data.root='{root}'",
        "data.vocab_size=50",
        "model.name='so_nwp_lstm_small'",
        "sampling.cohort_size=2",
        "sampling.scheme='fixed'",
        "privacy.mechanism='gaussian'",
        "privacy.noise_multiplier=1.0",
    ]
    for setting, expected in (([], True), (["sim.fused_softmax='off'"], False)):
        task = build_run(load_config(None, base + setting)).task
        assert task.local.fused_softmax is expected
        assert Task.from_json(task.to_json()).local.fused_softmax is expected  # what a worker reads
    with pytest.raises(FedsimError, match="fused_softmax"):
        load_config(None, base + ["sim.fused_softmax='on'"])


def test_views_of_the_data_keep_the_fused_loss(so_data):
    """A deployment node's shard and an audit's view present the same loss, so their users
    train the same way as in a plain simulation."""
    from fedsim.attacks.views import FederatedView
    from fedsim.deploy.nodes import NodeView

    cpu = torch.device("cpu")
    model = make_model("so_nwp_lstm_small", so_data.model_dims(), seed=0)
    for view in (NodeView(so_data, [1, 4]), FederatedView(so_data, [4, 1])):
        assert view.softmax_ignore_index == 0
        assert fused_loss(model, view, cpu) is not None
