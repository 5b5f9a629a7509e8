"""StepwiseLSTM (nn.LSTM's computation from matrix products and gates, with its own back-propagation
through time) against torch's fused nn.LSTM: outputs, final states and every gradient, alone and
under vmap over users with different weights; and what it refuses to stand in for."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap

from fedsim.models import make_model
from fedsim.models.stepwise_lstm import StepwiseLSTM, stepwise_twin, supported


def _grads(module: nn.Module, x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Output, final (h, c) and the gradients of a weighted sum of every output step (so that
    the backward pass is driven through all steps and both the h and the c recursions)."""
    x = x.clone().requires_grad_(True)
    out, (h, c) = module(x)
    loss = (out * weights).sum() + h.sum() * 0.5
    grads = torch.autograd.grad(loss, [x, *module.parameters()])
    return (out.detach(), h.detach(), c.detach(), *grads)


@pytest.mark.parametrize("layers,inp,hidden,steps", [(1, 5, 7, 1), (2, 8, 16, 11), (3, 4, 6, 5)])
def test_outputs_states_and_gradients_equal_the_fused_lstm(layers, inp, hidden, steps):
    g = torch.Generator().manual_seed(layers)
    lstm = nn.LSTM(inp, hidden, num_layers=layers, batch_first=True).double()
    with torch.no_grad():  # weights large enough that gates saturate somewhere
        for p in lstm.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    twin = StepwiseLSTM(lstm)
    assert [n for n, _ in twin.named_parameters()] == [n for n, _ in lstm.named_parameters()]
    x = torch.randn(3, steps, inp, generator=g, dtype=torch.float64)
    w = torch.randn(3, steps, hidden, generator=g, dtype=torch.float64)
    for a, b in zip(_grads(lstm, x, w), _grads(twin, x, w)):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_gradcheck_of_the_layer_backward():
    from fedsim.models.stepwise_lstm import LSTMLayerFunction

    g = torch.Generator().manual_seed(0)
    shapes = [(2, 4, 3), (12, 3), (12, 3), (12,), (12,)]
    args = [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]
    assert torch.autograd.gradcheck(lambda *a: LSTMLayerFunction.apply(*a)[0], args)


def test_vmap_over_users_equals_each_user_alone():
    """Under vmap each user's slice of the stacked weights drives only that user's output."""
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 6, num_layers=2, batch_first=True)
    twin = StepwiseLSTM(lstm)
    users = 5
    stacked = {n: p.detach() + 0.3 * torch.randn(users, *p.shape) for n, p in lstm.named_parameters()}
    x = torch.randn(users, 3, 9, 4)

    def loss_of(p, xb):
        out, _ = functional_call(twin, p, (xb,))
        return out.pow(2).sum()

    leaves = {n: v.clone().requires_grad_(True) for n, v in stacked.items()}
    losses = vmap(loss_of)(leaves, x)
    grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
    for u in range(users):
        own = {n: v[u].clone().requires_grad_(True) for n, v in stacked.items()}
        out, _ = functional_call(lstm, own, (x[u],))
        lo = out.pow(2).sum()
        torch.testing.assert_close(losses[u], lo.detach(), rtol=1e-5, atol=1e-6)
        for gb, ga in zip(grads, torch.autograd.grad(lo, list(own.values()))):
            torch.testing.assert_close(gb[u], ga, rtol=1e-4, atol=1e-6)


def test_under_vmap_the_layer_runs_once_on_the_whole_batch(monkeypatch):
    """The layer's own vmap rule: one call on the stacked users (their dimension first), not
    vmap's operation-by-operation batching of a one-user call (whose per-operation cost made
    batched users slower than one by one on a GPU); the batched gradients pass gradcheck, with
    the vmapped dimension not first and one argument not batched at all."""
    from fedsim.models import stepwise_lstm
    from fedsim.models.stepwise_lstm import LSTMLayerFunction

    shapes_seen = []
    forward = stepwise_lstm._layer_forward

    def spy(x, *rest):
        shapes_seen.append(tuple(x.shape))
        return forward(x, *rest)

    monkeypatch.setattr(stepwise_lstm, "_layer_forward", spy)
    g = torch.Generator().manual_seed(1)
    users, n, steps, inp, hidden = 3, 2, 4, 3, 5
    x = torch.randn(n, users, steps, inp, generator=g, dtype=torch.float64, requires_grad=True)  # users 2nd
    w_ih = torch.randn(users, 4 * hidden, inp, generator=g, dtype=torch.float64, requires_grad=True)
    w_hh = torch.randn(users, 4 * hidden, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    b_ih = torch.randn(4 * hidden, generator=g, dtype=torch.float64, requires_grad=True)  # shared
    b_hh = torch.randn(users, 4 * hidden, generator=g, dtype=torch.float64, requires_grad=True)

    def batched(*a):
        return vmap(
            lambda x, wi, wh, bi, bh: LSTMLayerFunction.apply(x, wi, wh, bi, bh)[0], in_dims=(1, 0, 0, None, 0)
        )(*a)

    out = batched(x, w_ih, w_hh, b_ih, b_hh)
    assert shapes_seen == [(users, n, steps, inp)]  # one call, users first
    for u in range(users):
        alone = LSTMLayerFunction.apply(x[:, u], w_ih[u], w_hh[u], b_ih, b_hh[u])[0]
        torch.testing.assert_close(out[u], alone, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(batched, (x, w_ih, w_hh, b_ih, b_hh))


def test_twin_of_the_shipped_models_computes_the_same_function():
    for name, dims, x in [
        ("shakespeare_lstm_small", 96, torch.randint(0, 96, (4, 20))),
        ("so_nwp_lstm_small", {"num_classes": 60}, torch.randint(0, 60, (4, 8))),
    ]:
        model = make_model(name, dims, seed=1)
        twin = stepwise_twin(model)
        assert not any(isinstance(m, nn.LSTM) for m in twin.modules())
        assert any(isinstance(m, nn.LSTM) for m in model.modules())  # the original is untouched
        torch.testing.assert_close(twin(x), model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_first=False),
        dict(bidirectional=True),
        dict(bias=False),
        dict(proj_size=2),
        dict(num_layers=2, dropout=0.5),
    ],
)
def test_lstms_it_does_not_reproduce_are_refused(kwargs):
    lstm = nn.LSTM(3, 4, **{"batch_first": True, **kwargs})
    assert not supported(lstm)
    with pytest.raises(ValueError, match="StepwiseLSTM covers"):
        StepwiseLSTM(lstm)
    assert not supported(nn.GRU(3, 4, batch_first=True))


def test_an_initial_state_or_an_unbatched_input_is_refused():
    twin = StepwiseLSTM(nn.LSTM(3, 4, batch_first=True))
    with pytest.raises(ValueError, match="zero state"):
        twin(torch.zeros(2, 5, 3), (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(ValueError, match=r"\[N, T, I\]"):
        twin(torch.zeros(5, 3))
