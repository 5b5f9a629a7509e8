"""Torch models named by the config (``model.name``)."""

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


MODELS = {
    "shakespeare_lstm": dict(embed_dim=8, hidden=256, layers=2),
    "shakespeare_lstm_small": dict(embed_dim=8, hidden=64, layers=2),
}


def make_model(name: str, vocab_size: int, seed: int = 0, dp_layers: bool = False) -> nn.Module:
    """Build model ``name`` with parameters initialised from ``seed`` (deterministic);
    ``dp_layers``: the Opacus-compatible variant (example-level DP, ``privacy.unit = "example"``)."""
    if name not in MODELS:
        raise FedsimError(f"model.name = {name!r}: allowed are {', '.join(MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CharLSTM(vocab_size, **MODELS[name], dp_layers=dp_layers)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
