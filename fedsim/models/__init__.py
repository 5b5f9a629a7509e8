"""Torch models named by the config (``model.name``), each for one task.

- ``shakespeare_lstm`` / ``shakespeare_lstm_small`` (task ``char``): :class:`CharLSTM`.
- ``so_nwp_lstm`` (task ``nwp``): TFF's Stack Overflow next-word model (embedding 96, LSTM 670,
  dense 96, dense over the ``V + 3 + k`` classes), :class:`WordLSTM`. With ``V = 10000``: 4,053,428
  parameters (Keras's LSTM has one bias vector, torch's two: TFF's count is 4,050,748).
  ``so_nwp_lstm_small``: embedding 16, LSTM 64, dense 16 (for fixtures and quick trials).
- ``so_tag_logreg`` (task ``tag``): TFF's tag model, one dense layer ``W → T`` whose sigmoid
  gives each tag's probability (:class:`TagLogReg`; the sigmoid is inside the loss). With
  ``W = 10000``, ``T = 500``: 5,000,500 parameters.
- ``femnist_cnn`` (task ``femnist``): LEAF's / FedAvg's CNN (two 5×5 conv layers of 32 and 64
  channels, each with 2×2 max-pooling, dense 2048, dense 62): 6,603,710 parameters.
  ``femnist_cnn_small``: 16 and 32 channels, dense 128.
- ``cifar_resnet18_gn`` (task ``cifar100``): ResNet-18 for 32×32 inputs (3×3 stem, no
  max-pool) with group normalization (2 groups) instead of batch normalization, the usual
  federated choice (batch statistics do not survive averaging): 11,220,132 parameters.
  ``cifar_cnn_small``: two 3×3 conv layers of 32 and 64 channels, dense 256.
- ``logreg`` (task ``vector``, the ``synthetic`` dataset): multinomial logistic regression.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedsim.errors import FedsimError
from fedsim.registry import Registry


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


@dataclass(frozen=True)
class ModelKind:
    """A model for `fedsim.register_model` (public as `fedsim.ModelKind`).

    Parameters
    ----------
    name : str
        The name configs give as `model.name`.
    task : str
        The dataset task it is built for: `char`, `nwp`, `tag`, `femnist`, `cifar100`,
        `vector`, or a registered dataset's own task.
    cls : type[torch.nn.Module]
        The module class. fedsim builds it as `cls(**dims, **kwargs, dp_layers=...)`, with the
        parameters initialised from the run's seed. `dims` are the dataset's sizes for the task:
        `char` `vocab_size`; `nwp` `num_classes`; `tag` `in_features` and `out_features`;
        `femnist` and `cifar100` `channels`, `size` and `num_classes`; `vector` `in_features`
        and `num_classes`. `dp_layers` is True under example-level DP
        (`privacy.unit = "example"`), where the module must be Opacus-compatible.
    kwargs : dict
        Fixed keyword arguments for `cls` (layer sizes); `{}` for none.
    summary : str
        One line for the docs and `--help`.
    """

    name: str
    task: str
    cls: type[nn.Module]
    kwargs: dict[str, Any]
    summary: str


#: The models, by ``model.name``.
MODELS: Registry[ModelKind] = Registry("model", "model.name")


def register_model(kind: ModelKind) -> ModelKind:
    """Register ``kind`` under its name."""
    if not isinstance(kind, ModelKind):
        raise FedsimError(
            f"register_model takes a fedsim.models.ModelKind(name, task, cls, kwargs, summary), not "
            f"{type(kind).__name__} {kind!r}"
        )
    return MODELS.add(kind.name, kind)


for _kind in (
    ModelKind(
        "shakespeare_lstm", "char", CharLSTM, dict(embed_dim=8, hidden=256, layers=2), "LEAF: embed 8, 2×LSTM 256"
    ),
    ModelKind(
        "shakespeare_lstm_small",
        "char",
        CharLSTM,
        dict(embed_dim=8, hidden=64, layers=2),
        "embed 8, 2×LSTM 64 (under 100k parameters)",
    ),
    ModelKind("so_nwp_lstm", "nwp", WordLSTM, dict(embed_dim=96, hidden=670), "TFF: embed 96, LSTM 670, dense 96"),
    ModelKind("so_nwp_lstm_small", "nwp", WordLSTM, dict(embed_dim=16, hidden=64), "embed 16, LSTM 64"),
    ModelKind("so_tag_logreg", "tag", TagLogReg, {}, "TFF: one dense sigmoid layer"),
    ModelKind("femnist_cnn", "femnist", SmallCNN, dict(widths=(32, 64), kernel=5, hidden=2048), "LEAF's CNN"),
    ModelKind("femnist_cnn_small", "femnist", SmallCNN, dict(widths=(16, 32), kernel=5, hidden=128), "a smaller CNN"),
    ModelKind("cifar_resnet18_gn", "cifar100", ResNet18GN, dict(groups=2), "ResNet-18 with group norm"),
    ModelKind("cifar_cnn_small", "cifar100", SmallCNN, dict(widths=(32, 64), kernel=3, hidden=256), "a small CNN"),
    ModelKind("logreg", "vector", LogReg, {}, "logistic regression"),
):
    register_model(_kind)


def model_task(name: str) -> str:
    """The task (``char``, ``nwp``, ``tag``, ``femnist``, ``cifar100``, ``vector``) model ``name``
    is built for."""
    return MODELS.get_part(name).task


def make_model(name: str, dims: int | dict[str, int], seed: int = 0, dp_layers: bool = False) -> nn.Module:
    """Build model ``name`` with parameters initialised from ``seed`` (deterministic).

    ``dims``: the dataset's :meth:`model_dims` (an ``int`` is a character ``vocab_size``);
    ``dp_layers``: the Opacus-compatible variant (example-level DP, ``privacy.unit = "example"``)."""
    kind = MODELS.get_part(name)
    task, cls, kwargs = kind.task, kind.cls, kind.kwargs
    if isinstance(dims, int):
        dims = {"vocab_size": dims}
    image = ("channels", "num_classes", "size")
    want = {
        "char": ("vocab_size",),
        "nwp": ("num_classes",),
        "tag": ("in_features", "out_features"),
        "femnist": image,
        "cifar100": image,
        "vector": ("in_features", "num_classes"),
    }[task]
    if tuple(sorted(dims)) != tuple(sorted(want)):
        raise FedsimError(
            f"model.name = {name!r} is a {task!r} model; the dataset gives {sorted(dims)} "
            f"(pick a model for the dataset's task)"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(**dims, **kwargs, dp_layers=dp_layers)
    if not isinstance(model, nn.Module) or not any(p.requires_grad for p in model.parameters()):
        raise FedsimError(
            f"model.name = {name!r} ({getattr(cls, '__name__', cls)}) has no trainable parameters: federated "
            f"training updates a model's parameters; give the module at least one nn.Parameter (e.g. a nn.Linear)"
        )
    return model


def recurrent(model: nn.Module) -> bool:
    """Whether ``model`` has recurrent layers (torch's or Opacus's)."""
    return any(
        isinstance(m, nn.RNNBase) or type(m).__name__.startswith("DPLSTM") or type(m).__name__ == "DPRNNBase"
        for m in model.modules()
    )


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
