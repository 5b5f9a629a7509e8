"""Torch models named by the config (``model.name``), each for one task.

- ``shakespeare_lstm`` / ``shakespeare_lstm_small`` (task ``char``): :class:`CharLSTM`.
- ``so_nwp_lstm`` (task ``nwp``): TFF's Stack Overflow next-word model (embedding 96, LSTM 670,
  dense 96, dense over the ``V + 3 + k`` classes), :class:`WordLSTM`. With ``V = 10000``: 4,053,428
  parameters (Keras's LSTM has one bias vector, torch's two: TFF's count is 4,050,748).
  ``so_nwp_lstm_small``: embedding 16, LSTM 64, dense 16 (for fixtures and quick trials).
- ``so_tag_logreg`` (task ``tag``): TFF's tag model, one dense layer ``W → T`` whose sigmoid
  gives each tag's probability (:class:`TagLogReg`; the sigmoid is inside the loss). With
  ``W = 10000``, ``T = 500``: 5,000,500 parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from fedsim.errors import FedsimError


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

    def __init__(self, vocab_size: int, embed_dim: int = 8, hidden: int = 256, layers: int = 2,
                 dp_layers: bool = False) -> None:
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x))
        return self.head(self.proj(h))


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


#: name → (task, class, fixed keyword arguments)
MODELS: dict[str, tuple[str, type[nn.Module], dict[str, int]]] = {
    "shakespeare_lstm": ("char", CharLSTM, dict(embed_dim=8, hidden=256, layers=2)),
    "shakespeare_lstm_small": ("char", CharLSTM, dict(embed_dim=8, hidden=64, layers=2)),
    "so_nwp_lstm": ("nwp", WordLSTM, dict(embed_dim=96, hidden=670)),
    "so_nwp_lstm_small": ("nwp", WordLSTM, dict(embed_dim=16, hidden=64)),
    "so_tag_logreg": ("tag", TagLogReg, {}),
}
#: the task of each dataset (``data.name``)
DATA_TASKS = {"shakespeare": "char", "stackoverflow_nwp": "nwp", "stackoverflow_tag": "tag"}


def model_task(name: str) -> str:
    """The task (``char``, ``nwp``, ``tag``) that model ``name`` is built for."""
    if name not in MODELS:
        raise FedsimError(f"model.name = {name!r}: allowed are {', '.join(MODELS)}")
    return MODELS[name][0]


def make_model(name: str, dims: int | dict[str, int], seed: int = 0, dp_layers: bool = False) -> nn.Module:
    """Build model ``name`` with parameters initialised from ``seed`` (deterministic).

    ``dims``: the dataset's :meth:`model_dims` (an ``int`` is a character ``vocab_size``);
    ``dp_layers``: the Opacus-compatible variant (example-level DP, ``privacy.unit = "example"``)."""
    model_task(name)
    task, cls, kwargs = MODELS[name]
    if isinstance(dims, int):
        dims = {"vocab_size": dims}
    want = {"char": ("vocab_size",), "nwp": ("num_classes",), "tag": ("in_features", "out_features")}[task]
    if tuple(sorted(dims)) != tuple(sorted(want)):
        raise FedsimError(f"model.name = {name!r} is a {task!r} model; the dataset gives {sorted(dims)} "
                          f"(pick a model for the dataset's task)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(**dims, **kwargs, dp_layers=dp_layers)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
