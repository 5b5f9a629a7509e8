"""The torch modules of the shipped models (`fedsim.models` registers them by name)."""

from __future__ import annotations

import torch
from torch import nn


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model: embedding → stacked LSTM → linear over the vocabulary,
    predicting the character after a window from the last hidden state.

    Parameters
    ----------
    vocab_size : number of character ids (including the unknown id).
    embed_dim : embedding width (LEAF: 8).
    hidden : LSTM hidden size (LEAF: 256).
    layers : stacked LSTM layers (LEAF: 2).
    dp_layers : use Opacus's ``DPLSTM`` (per-sample gradients for example-level DP; Opacus's
        grad samplers do not cover ``nn.LSTM``). Its flat parameter order differs from
        ``nn.LSTM``'s, so the server and every client must build the same variant.
    """

    def __init__(
        self, vocab_size: int, embed_dim: int = 8, hidden: int = 256, layers: int = 2, dp_layers: bool = False
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        if dp_layers:
            from opacus.layers import DPLSTM

            self.lstm = DPLSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        else:
            self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x))
        return self.head(h[:, -1, :])


class WordLSTM(nn.Module):
    """TFF's Stack Overflow next-word model: embedding → LSTM → dense → dense over the classes,
    predicting every position of the sequence (output ``[batch, L, num_classes]``).

    Parameters
    ----------
    num_classes : ``V + 3 + k`` (pad, the vocabulary, OOV buckets, BOS, EOS).
    embed_dim : embedding width (TFF: 96).
    hidden : LSTM hidden size (TFF: 670).
    dp_layers : use Opacus's ``DPLSTM`` (see :class:`CharLSTM`).
    """

    def __init__(self, num_classes: int, embed_dim: int = 96, hidden: int = 670, dp_layers: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_classes, embed_dim)
        if dp_layers:
            from opacus.layers import DPLSTM

            self.lstm = DPLSTM(embed_dim, hidden, batch_first=True)
        else:
            self.lstm = nn.LSTM(embed_dim, hidden, batch_first=True)
        self.proj = nn.Linear(hidden, embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The output layer's inputs, ``[batch, L, embed_dim]``: the forward pass without ``head``."""
        h, _ = self.lstm(self.embed(x))
        out: torch.Tensor = self.proj(h)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def batched_linear(params: dict[str, torch.Tensor], x: torch.Tensor, prefix: str = "linear.") -> torch.Tensor:
    """``U`` users' ``nn.Linear`` at once: ``x[u] · W[u]ᵀ + b[u]`` for stacked parameters
    ``params[prefix + "weight"]`` ``(U, out, in)`` and ``params[prefix + "bias"]`` ``(U, out)``
    and inputs ``x`` ``(U, B, in)``; returns ``(U, B, out)``. The batched matrix product and
    the bias added after it, as ``vmap`` lowers ``nn.Linear`` (without its per-call overhead)."""
    w, b = params[prefix + "weight"], params[prefix + "bias"]
    return torch.matmul(x, w.transpose(-1, -2)) + b.unsqueeze(-2)


class LogReg(nn.Module):
    """Multinomial logistic regression: logits ``x·W + b`` over ``num_classes``."""

    def __init__(self, in_features: int, num_classes: int, dp_layers: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of ``U`` users at once (vectorized training): ``params`` stacked
        ``(U, …)`` under :meth:`named_parameters`' names, ``x`` ``(U, B, in_features)``."""
        return batched_linear(params, x)


class TagLogReg(nn.Module):
    """TFF's Stack Overflow tag model: logits ``x·W + b`` of ``T`` independent tags.

    Parameters
    ----------
    in_features : ``W`` (bag-of-words size).
    out_features : ``T`` (tags).
    """

    def __init__(self, in_features: int, out_features: int, dp_layers: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of ``U`` users at once (see :meth:`LogReg.batched_forward`)."""
        return batched_linear(params, x)


class SmallCNN(nn.Module):
    """Two conv blocks (conv → ReLU → 2×2 max-pool) and two dense layers.

    Parameters
    ----------
    channels, size, num_classes : the input's channels and side, and the classes.
    widths : the two conv layers' channels.
    kernel : conv kernel side (padding keeps the side).
    hidden : the dense layer's width.
    """

    def __init__(
        self,
        channels: int,
        size: int,
        num_classes: int,
        widths: tuple[int, int] = (32, 64),
        kernel: int = 5,
        hidden: int = 2048,
        dp_layers: bool = False,
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, widths[0], kernel, padding=kernel // 2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(widths[0], widths[1], kernel, padding=kernel // 2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(widths[1] * (size // 4) ** 2, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = nn.GroupNorm(groups, cout)
        self.short = (
            nn.Sequential()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(groups, cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.n1(self.conv1(x)))
        return torch.relu(self.n2(self.conv2(h)) + self.short(x))


class ResNet18GN(nn.Module):
    """ResNet-18 for small images: 3×3 stem, four stages of two basic blocks (64, 128, 256, 512
    channels), GroupNorm with ``groups`` groups, global average pooling, dense over the classes."""

    def __init__(self, channels: int, size: int, num_classes: int, groups: int = 2, dp_layers: bool = False) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, 64, 3, 1, 1, bias=False), nn.GroupNorm(groups, 64), nn.ReLU())
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_Block(cin, cout, stride, groups), _Block(cout, cout, 1, groups)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))
