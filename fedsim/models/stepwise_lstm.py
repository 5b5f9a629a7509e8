"""``nn.LSTM``'s computation written as matrix products and element-wise gates, so that
``torch.func.vmap`` can batch it over users who each have their own weights.

torch runs ``nn.LSTM`` as one fused kernel per layer (oneDNN on the CPU, cuDNN on a GPU), and
neither batches under ``vmap``. :class:`StepwiseLSTM` has the same parameters, under the same
names, and computes the same function; its forward and backward pass (back-propagation through
time) are one :class:`torch.autograd.Function` per layer with its own vmap rule, so under
``vmap`` over a leading user dimension every ``h_{t−1} W_hhᵀ`` is one batched matrix product
over users, and the weight gradients ``Σ_t δ_t h_{t−1}ᵀ`` one batched product over all time
steps at the end.

Per layer, with ``σ`` the logistic function and gates in torch's order (input, forget, cell,
output)::

    z_t = x_t W_ihᵀ + b_ih + b_hh + h_{t−1} W_hhᵀ,   (i, f, g, o) = (σ, σ, tanh, σ)(z_t)
    c_t = f ⊙ c_{t−1} + i ⊙ g,   h_t = o ⊙ tanh(c_t),   h_0 = c_0 = 0.

Used by :mod:`fedsim.training.vectorized` for models with recurrent layers (``sim.vectorize = 'on'``).
It was measured slower than the fused kernel user by user on both devices. On a CPU the fused
kernel keeps one user's recurrent weights in cache for the whole sequence, and a batch of
users' weights no longer fits (``benchmarks/lstm_batching.py`` times both). On an H200 GPU the
step-by-step loop launches hundreds of small kernels per sequence (forward and backward, for
every step), which cost more than each user's cuDNN step replayed from a CUDA graph
(``benchmarks/throughput_results_gpu_batched_fixed.json``: W1 0.395× the GPU floor batched
against 0.301× user by user, SO LSTM 2.79× against 0.923×).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


def _layer_forward(
    x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer over ``B`` independent users at once: ``x`` ``[B, N, T, I]``, ``w_ih`` ``[B, 4H, I]``,
    ``w_hh`` ``[B, 4H, H]``, ``b = b_ih + b_hh`` ``[B, 4H]``; returns ``(h, c, gates)``,
    ``[B, N, T, H]``, ``[B, N, T, H]``, ``[B, N, T, 4H]``."""
    users, n, steps, width = x.shape
    hidden = w_hh.shape[-1]
    # every step's input term at once: one batched product over the users
    proj = torch.baddbmm(b.unsqueeze(1), x.reshape(users, n * steps, width), w_ih.transpose(1, 2))
    proj = proj.view(users, n, steps, -1)
    w_hh_t = w_hh.transpose(1, 2).contiguous()  # read row-wise at every step
    h = x.new_zeros(users, n, hidden)
    c = x.new_zeros(users, n, hidden)
    hs, cs, gates = [], [], []
    for p in proj.unbind(2):
        i, f, g, o = torch.baddbmm(p, h, w_hh_t).chunk(4, -1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = f * c + i * g
        h = o * torch.tanh(c)
        hs.append(h)
        cs.append(c)
        gates.append(torch.cat([i, f, g, o], -1))
    return torch.stack(hs, 2), torch.stack(cs, 2), torch.stack(gates, 2)


def _layer_backward(
    d_hs: torch.Tensor,
    x: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    hs: torch.Tensor,
    cs: torch.Tensor,
    gates: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Back-propagation through time for :func:`_layer_forward` (shapes as there):
    ``(d_x, d_w_ih, d_w_hh, d_b)``."""
    users, n, steps, hidden = hs.shape
    zeros = hs.new_zeros(users, n, hidden)
    dh_next, dc_next = zeros, zeros
    dz: list[torch.Tensor] = [zeros] * steps
    for t in range(steps - 1, -1, -1):
        i, f, g, o = gates[:, :, t].chunk(4, -1)
        c_prev = cs[:, :, t - 1] if t > 0 else zeros
        tanh_c = torch.tanh(cs[:, :, t])
        dh = d_hs[:, :, t] + dh_next
        dc = dc_next + dh * o * (1 - tanh_c * tanh_c)
        dz[t] = torch.cat(
            [dc * g * i * (1 - i), dc * c_prev * f * (1 - f), dc * i * (1 - g * g), dh * tanh_c * o * (1 - o)], -1
        )
        dc_next = dc * f
        dh_next = torch.bmm(dz[t], w_hh)
    d_z = torch.stack(dz, 2).reshape(users, n * steps, -1)  # [B, N·T, 4H]
    h_prev = torch.cat([zeros.unsqueeze(2), hs[:, :, :-1]], 2).reshape(users, n * steps, hidden)
    flat = d_z.transpose(1, 2)  # [B, 4H, N·T]: every step's gradient in one product per user
    d_w_hh = torch.bmm(flat, h_prev)
    d_w_ih = torch.bmm(flat, x.reshape(users, n * steps, -1))
    d_b = d_z.sum(1)
    d_x = torch.bmm(d_z, w_ih).view(x.shape)
    return d_x, d_w_ih, d_w_hh, d_b


class LSTMLayerFunction(torch.autograd.Function):
    """One LSTM layer over a whole batch of sequences, with its own backward pass.

    ``apply(x, w_ih, w_hh, b_ih, b_hh) -> (h, c, gates)``: ``x`` is ``[*L, N, T, I]`` and the
    weights ``[*L, …]`` with the same leading dimensions ``L`` (none for one user); ``h`` and
    ``c`` are ``[*L, N, T, H]`` (every step's hidden and cell state); ``gates`` ``[*L, N, T, 4H]``
    holds the activated ``(i, f, g, o)`` (kept for the backward pass; ``c`` and ``gates`` are not
    differentiable outputs).

    Under ``vmap`` its own rule (:meth:`vmap`) moves the user dimension to the front and calls
    the function once on the whole batch: every step is one batched matrix product over the
    users, with none of ``vmap``'s per-operation cost (hundreds of operations per sequence).
    """

    @staticmethod
    def forward(
        x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lead = x.shape[:-3]
        x_, w_ih_, w_hh_ = (t.reshape(-1, *t.shape[len(lead) :]) for t in (x, w_ih, w_hh))
        hs, cs, gates = _layer_forward(x_, w_ih_, w_hh_, (b_ih + b_hh).reshape(-1, b_ih.shape[-1]))
        return tuple(t.view(*lead, *t.shape[1:]) for t in (hs, cs, gates))  # type: ignore[return-value]

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
        x, w_ih, w_hh, _, _ = inputs
        hs, cs, gates = output
        ctx.mark_non_differentiable(cs, gates)
        ctx.save_for_backward(x, w_ih, w_hh, hs, cs, gates)

    @staticmethod
    def backward(ctx: Any, d_hs: torch.Tensor, *_unused: Any) -> tuple[torch.Tensor, ...]:
        saved = ctx.saved_tensors
        lead = saved[0].shape[:-3]
        flat = [t.reshape(-1, *t.shape[len(lead) :]) for t in (d_hs, *saved)]
        grads = _layer_backward(*flat)
        d_x, d_w_ih, d_w_hh, d_b = (g.view(*lead, *g.shape[1:]) for g in grads)
        return d_x, d_w_ih, d_w_hh, d_b, d_b

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], *args: torch.Tensor) -> tuple[Any, tuple[int, int, int]]:
        """The batching rule: the vmapped dimension of every argument to the front (an argument
        without one is expanded), then one call on the whole batch."""
        front = [
            a.movedim(d, 0) if d is not None else a.expand(info.batch_size, *a.shape) for a, d in zip(args, in_dims)
        ]
        return LSTMLayerFunction.apply(*front), (0, 0, 0)


class StepwiseLSTM(nn.Module):
    """A unidirectional, batch-first ``nn.LSTM`` with biases and no dropout or projection,
    computed by :class:`LSTMLayerFunction` (zero initial state). Same parameter names
    (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``, ``bias_hh_l{k}``) and shapes, so
    ``torch.func.functional_call`` with an ``nn.LSTM``'s parameters works on it unchanged.

    Parameters
    ----------
    lstm : the ``nn.LSTM`` whose parameters are copied (see :func:`supported`).
    """

    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        if not supported(lstm):
            raise ValueError(
                "StepwiseLSTM covers batch-first, unidirectional LSTMs with biases, no dropout or projection"
            )
        self.num_layers = lstm.num_layers
        for name, p in lstm.named_parameters():
            self.register_parameter(name, nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))

    def forward(self, x: torch.Tensor, hx: Any = None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``nn.LSTM``'s outputs for a ``[N, T, I]`` input: every step's top-layer ``h``, and the
        last step's ``(h, c)`` of every layer (``[layers, N, H]`` each)."""
        if hx is not None:
            raise ValueError("StepwiseLSTM starts from the zero state; an initial (h, c) is not supported")
        if x.dim() != 3:
            raise ValueError(f"StepwiseLSTM expects a batch-first [N, T, I] input, got shape {tuple(x.shape)}")
        h_last, c_last = [], []
        for k in range(self.num_layers):
            w = [getattr(self, f"{n}_l{k}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            x, c, _ = LSTMLayerFunction.apply(x, *w)
            h_last.append(x[:, -1])
            c_last.append(c[:, -1])
        return x, (torch.stack(h_last), torch.stack(c_last))


def supported(lstm: nn.Module) -> bool:
    """Whether ``lstm`` is an ``nn.LSTM`` that :class:`StepwiseLSTM` reproduces: batch-first,
    unidirectional, with biases, no projection, and no dropout between layers."""
    return (
        type(lstm) is nn.LSTM
        and lstm.batch_first
        and not lstm.bidirectional
        and lstm.bias
        and lstm.proj_size == 0
        and (lstm.dropout == 0 or lstm.num_layers == 1)
    )


def stepwise_twin(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every ``nn.LSTM`` replaced by its :class:`StepwiseLSTM`
    (same parameter names and values); raises ``ValueError`` on an LSTM it does not cover."""
    if isinstance(model, nn.LSTM):
        return StepwiseLSTM(model)
    twin = copy.deepcopy(model)
    for name, module in list(twin.named_modules()):
        if isinstance(module, nn.LSTM):
            parent = twin.get_submodule(name.rpartition(".")[0]) if "." in name else twin
            setattr(parent, name.rpartition(".")[2], StepwiseLSTM(module))
    return twin
