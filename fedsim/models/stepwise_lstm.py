"""``nn.LSTM``'s computation written as matrix products and element-wise gates, so that
``torch.func.vmap`` can batch it over users who each have their own weights.

torch runs ``nn.LSTM`` as one fused kernel per layer (oneDNN on the CPU, cuDNN on a GPU), and
neither batches under ``vmap``. :class:`StepwiseLSTM` has the same parameters, under the same
names, and computes the same function; its forward and backward pass (back-propagation through
time) are one :class:`torch.autograd.Function` per layer whose vmap rule torch generates, so
under ``vmap`` over a leading user dimension every ``h_{t−1} W_hhᵀ`` becomes one batched
matrix product over users, and the weight gradients ``Σ_t δ_t h_{t−1}ᵀ`` one batched product
over all time steps at the end.

Per layer, with ``σ`` the logistic function and gates in torch's order (input, forget, cell,
output)::

    z_t = x_t W_ihᵀ + b_ih + b_hh + h_{t−1} W_hhᵀ,   (i, f, g, o) = (σ, σ, tanh, σ)(z_t)
    c_t = f ⊙ c_{t−1} + i ⊙ g,   h_t = o ⊙ tanh(c_t),   h_0 = c_0 = 0.

Used by :mod:`fedsim.vectorized` for models with recurrent layers. It is meant for a GPU,
where small per-user fused kernels are launch-bound (not yet measured: no GPU was available).
On a CPU it is measured slower: the fused kernel keeps one user's recurrent weights in cache
for the whole sequence, and a batch of users' weights no longer fits
(``benchmarks/lstm_batching.py`` times both).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


class LSTMLayerFunction(torch.autograd.Function):
    """One LSTM layer over a whole batch of sequences, with its own backward pass.

    ``apply(x, w_ih, w_hh, b_ih, b_hh) -> (h, c, gates)``: ``x`` is ``[N, T, I]``; ``h`` and ``c``
    are ``[N, T, H]`` (every step's hidden and cell state); ``gates`` ``[N, T, 4H]`` holds the
    activated ``(i, f, g, o)`` (kept for the backward pass; ``c`` and ``gates`` are not
    differentiable outputs).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(
        x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, hidden = x.shape[0], w_hh.shape[1]
        proj = torch.matmul(x, w_ih.transpose(0, 1)) + (b_ih + b_hh)  # every step's input term at once
        w_hh_t = w_hh.transpose(0, 1).contiguous()  # read row-wise at every step
        h = x.new_zeros(n, hidden)
        c = x.new_zeros(n, hidden)
        hs, cs, gates = [], [], []
        for p in proj.unbind(1):
            i, f, g, o = torch.addmm(p, h, w_hh_t).chunk(4, -1)
            i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
            c = f * c + i * g
            h = o * torch.tanh(c)
            hs.append(h)
            cs.append(c)
            gates.append(torch.cat([i, f, g, o], -1))
        return torch.stack(hs, 1), torch.stack(cs, 1), torch.stack(gates, 1)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
        x, w_ih, w_hh, _, _ = inputs
        hs, cs, gates = output
        ctx.mark_non_differentiable(cs, gates)
        ctx.save_for_backward(x, w_ih, w_hh, hs, cs, gates)

    @staticmethod
    def backward(ctx: Any, d_hs: torch.Tensor, *_unused: Any) -> tuple[torch.Tensor, ...]:
        x, w_ih, w_hh, hs, cs, gates = ctx.saved_tensors
        n, steps, hidden = hs.shape
        zeros = hs.new_zeros(n, hidden)
        dh_next, dc_next = zeros, zeros
        dz: list[torch.Tensor] = [zeros] * steps
        for t in range(steps - 1, -1, -1):
            i, f, g, o = gates[:, t].chunk(4, -1)
            c_prev = cs[:, t - 1] if t > 0 else zeros
            tanh_c = torch.tanh(cs[:, t])
            dh = d_hs[:, t] + dh_next
            dc = dc_next + dh * o * (1 - tanh_c * tanh_c)
            dz[t] = torch.cat(
                [dc * g * i * (1 - i), dc * c_prev * f * (1 - f), dc * i * (1 - g * g), dh * tanh_c * o * (1 - o)], -1
            )
            dc_next = dc * f
            dh_next = torch.matmul(dz[t], w_hh)
        d_z = torch.stack(dz, 1)  # [N, T, 4H]
        h_prev = torch.cat([zeros.unsqueeze(1), hs[:, :-1]], 1)
        flat = d_z.reshape(n * steps, -1).transpose(0, 1)  # [4H, N·T]: every step's gradient in one product
        d_w_hh = torch.matmul(flat, h_prev.reshape(n * steps, hidden))
        d_w_ih = torch.matmul(flat, x.reshape(n * steps, -1))
        d_b = d_z.reshape(n * steps, -1).sum(0)
        d_x = torch.matmul(d_z, w_ih)
        return d_x, d_w_ih, d_w_hh, d_b, d_b


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
