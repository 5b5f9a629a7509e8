"""The output layer and its softmax cross-entropy computed together, in row blocks (CPU training).

For features ``f`` (``N × E``), an output layer ``W`` (``C × E``), ``b`` (``C``) and targets
``t`` (``N``), the logits are ``z = f·Wᵀ + b`` and the loss is the mean, over the ``n`` rows whose
target is not ``ignore_index``, of ``logsumexp(z_i) − z_{i,t_i}`` — exactly
``cross_entropy(f·Wᵀ + b, t, ignore_index)``. Its gradient with respect to the logits is

    G_i = (softmax(z_i) − e_{t_i}) / n    (rows kept),    G_i = 0    (rows ignored),

and the layer's gradients follow from ``G`` alone: ``∂f = G·W``, ``∂W = Gᵀ·f``, ``∂b = Σ_i G_i``.
An ignored row has ``G_i = 0``: it adds nothing to ``∂W`` or ``∂b`` and its ``∂f`` row is zero, so
only the kept rows are multiplied at all. Padding is the ignored target of the Stack Overflow
model (a sentence shorter than the window is padded), about a quarter of the positions of the
generated data, so this alone saves that share of the layer's products.

Computed one way (a linear layer, then ``log_softmax`` and the negative log-likelihood), the
``N × C`` logits go to memory and come back four times (the logits, the log-probabilities, the
likelihood's one-hot gradient, the log-softmax gradient), with two exponentials per entry. For
a large vocabulary (the Stack Overflow model: ``N = 320`` positions per batch, ``C = 10,004``:
12.8 MB) those passes cost a fifth to a half of the layer's three products. Here each block of
rows is multiplied into a scratch buffer that stays in the core's cache, its softmax is written
straight into ``G`` (one exponential per entry), and ``G`` is finished in place, so backward is
the three products. On the development CPU the forward product on 32-row blocks took 8.3 ms
against 11.6 ms as one product when the machine was quiet, and about the same under load
(``benchmarks/softmax_head.py`` measures the whole layer both ways).

The loss of a row is ``−log p_{i,t_i}`` from the softmax: within a few float32 ulps of
``logsumexp(z_i) − z_{i,t_i}`` while ``p`` is a normal float; the rows whose probability is below
:data:`TINY` (a logit gap beyond about 69) are recomputed exactly with ``log_softmax``. Equal
to the unfused computation up to float rounding (``tests/models/test_softmax_head.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

#: Probabilities below this are too close to float32's smallest normal for ``−log p``; those
#: rows' losses are recomputed with ``log_softmax``.
TINY = 1e-30

#: Bytes of one block of logits: a little over a Zen 4 core's 1 MiB L2, which measured fastest
#: for the Stack Overflow layer (32 rows of 10,004 classes).
BLOCK_BYTES = 5 << 18


def block_rows(classes: int, itemsize: int) -> int:
    """Rows per block for ``classes`` logits of ``itemsize`` bytes: :data:`BLOCK_BYTES` worth,
    between 8 and 1024."""
    return max(8, min(1024, BLOCK_BYTES // max(1, classes * itemsize)))


class LinearCrossEntropy(torch.autograd.Function):
    """``mean_i [logsumexp(f_i·Wᵀ + b) − (f_i·Wᵀ + b)_{t_i}]`` over rows with ``t_i ≠ ignore_index``;
    see the module docstring. Inputs: ``features`` (``N × E``), ``weight`` (``C × E``), ``bias``
    (``C`` or None), ``target`` (``N``, int64), ``ignore_index`` (int), ``rows`` (rows per block)."""

    @staticmethod
    def forward(
        ctx: Any,
        features: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        target: torch.Tensor,
        ignore_index: int,
        rows: int,
    ) -> torch.Tensor:
        n_rows, classes = features.shape[0], weight.shape[0]
        kept = target != ignore_index
        kept_rows = None if bool(kept.all()) else kept.nonzero().squeeze(1)
        # only the kept rows are multiplied: an ignored row's gradient is zero, so it adds
        # nothing to ∂W or ∂b, and its ∂f row is zero
        f = features if kept_rows is None else features.index_select(0, kept_rows)
        t = target if kept_rows is None else target.index_select(0, kept_rows)
        n = f.shape[0]
        grad = torch.empty(n, classes, dtype=features.dtype, device=features.device)
        scratch = torch.empty(min(rows, n), classes, dtype=features.dtype, device=features.device)
        p_target = torch.empty(n, 1, dtype=features.dtype, device=features.device)
        w_t = weight.t()
        inv_n = 1.0 / n if n else 0.0
        for s in range(0, n, rows):
            e = min(s + rows, n)
            z = scratch[: e - s]
            if bias is None:
                torch.mm(f[s:e], w_t, out=z)
            else:
                torch.addmm(bias, f[s:e], w_t, out=z)
            g = grad[s:e]
            torch.softmax(z, 1, out=g)
            torch.gather(g, 1, t[s:e, None], out=p_target[s:e])
            g.mul_(inv_n)
        if n:
            grad[torch.arange(n, device=grad.device), t] -= inv_n
        p = p_target.squeeze(1)
        nll = -torch.log(p)
        tiny = (p < TINY).nonzero().squeeze(1)
        if tiny.numel():
            z = f[tiny] @ w_t if bias is None else torch.addmm(bias, f[tiny], w_t)
            nll[tiny] = -torch.log_softmax(z, 1).gather(1, t[tiny, None]).squeeze(1)
        ctx.save_for_backward(grad, f, weight, kept_rows)
        ctx.has_bias = bias is not None
        ctx.n_rows = n_rows
        return nll.sum() / n  # no rows kept: 0 / 0, NaN, as the unfused loss

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad, f, weight, kept_rows = ctx.saved_tensors
        if bool(d_loss != 1):
            grad = grad * d_loss
        d_features = None
        if ctx.needs_input_grad[0]:
            d_kept = grad @ weight
            if kept_rows is None:
                d_features = d_kept
            else:
                d_features = d_kept.new_zeros(ctx.n_rows, d_kept.shape[1]).index_copy_(0, kept_rows, d_kept)
        d_weight = grad.t() @ f if ctx.needs_input_grad[1] else None
        d_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return d_features, d_weight, d_bias, None, None, None


def linear_cross_entropy(
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    ignore_index: int = -100,
    rows: int | None = None,
) -> torch.Tensor:
    """``cross_entropy(features·weightᵀ + bias, target, ignore_index=ignore_index)`` (mean over
    the rows kept), computed in row blocks without keeping the logits.

    Parameters
    ----------
    features : ``N × E`` inputs of the output layer.
    weight, bias : the output layer (``C × E``, ``C`` or None).
    target : ``N`` class indices in ``[0, C)``; rows equal to ``ignore_index`` are left out.
    ignore_index : the target value of rows to leave out. Default −100 (none).
    rows : rows per block; default :func:`block_rows` (about 1.25 MiB of logits).
    """
    if rows is None:
        rows = block_rows(weight.shape[0], features.element_size())
    out: torch.Tensor = LinearCrossEntropy.apply(features, weight, bias, target, int(ignore_index), int(rows))
    return out


def fused_loss(
    model: nn.Module, data: Any, device: torch.device
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """``loss(x, y)`` computing the model's output layer and the data's training loss together
    (:func:`linear_cross_entropy`), or None where that does not apply.

    It applies when the data's training loss is a softmax cross-entropy over the last dimension
    (the data has a ``softmax_ignore_index`` that is not None), the model's output is
    ``head(features(x))`` with ``head`` an ``nn.Linear``, and ``device`` (where training runs) is
    a CPU: a GPU keeps the unfused kernels."""
    ignore = getattr(data, "softmax_ignore_index", None)
    head = getattr(model, "head", None)
    features = getattr(model, "features", None)
    if ignore is None or not isinstance(head, nn.Linear) or not callable(features) or device.type != "cpu":
        return None

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        f = features(x)
        return linear_cross_entropy(f.reshape(-1, f.shape[-1]), head.weight, head.bias, y.reshape(-1), ignore)

    return loss
