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

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedsim.errors import FedsimError
from fedsim.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import nn
else:
    from fedsim._lazy import torch

#: The classes defined in `fedsim.models.nets`, read from here on first use (PEP 562), so that
#: the registry (which the config schema reads) does not import torch.
_NETS = ("CharLSTM", "WordLSTM", "LogReg", "TagLogReg", "SmallCNN", "ResNet18GN", "batched_linear")


def __getattr__(name: str) -> Any:
    if name in _NETS:
        return getattr(importlib.import_module("fedsim.models.nets"), name)
    raise AttributeError(f"module 'fedsim.models' has no attribute {name!r}")


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
    cls : type[torch.nn.Module] or str
        The module class, or its import path `"package.module:Class"` (imported when the model
        is first built, so that reading a config does not import it). fedsim builds it as `cls(**dims, **kwargs, dp_layers=...)`, with the
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
    cls: type[nn.Module] | str
    kwargs: dict[str, Any]
    summary: str

    def module_class(self) -> type[nn.Module]:
        """`cls`, imported from its path when it is given as `"package.module:Class"`."""
        if not isinstance(self.cls, str):
            return self.cls
        module, _, attr = self.cls.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise FedsimError(
                f"model {self.name!r}: cannot import its class {self.cls!r} ({e}); give ModelKind.cls as "
                f"a class or as 'package.module:Class'"
            ) from None


#: The models, by ``model.name``.
MODELS: Registry[ModelKind] = Registry("model", "model.name")


def register_model(kind: ModelKind) -> ModelKind:
    """Register ``kind`` under its name."""
    if not isinstance(kind, ModelKind):
        raise FedsimError(
            f"register_model takes a fedsim.models.ModelKind(name, task, cls, kwargs, summary), not "
            f"{type(kind).__name__} {kind!r}"
        )
    if isinstance(kind.cls, str) and ":" not in kind.cls:
        raise FedsimError(
            f"ModelKind {kind.name!r}: cls = {kind.cls!r} is not an import path; give the class itself or "
            f"'package.module:Class'"
        )
    return MODELS.add(kind.name, kind)


for _kind in (
    ModelKind(
        "shakespeare_lstm",
        "char",
        "fedsim.models.nets:CharLSTM",
        dict(embed_dim=8, hidden=256, layers=2),
        "LEAF: embed 8, 2×LSTM 256",
    ),
    ModelKind(
        "shakespeare_lstm_small",
        "char",
        "fedsim.models.nets:CharLSTM",
        dict(embed_dim=8, hidden=64, layers=2),
        "embed 8, 2×LSTM 64 (under 100k parameters)",
    ),
    ModelKind(
        "so_nwp_lstm",
        "nwp",
        "fedsim.models.nets:WordLSTM",
        dict(embed_dim=96, hidden=670),
        "TFF: embed 96, LSTM 670, dense 96",
    ),
    ModelKind(
        "so_nwp_lstm_small", "nwp", "fedsim.models.nets:WordLSTM", dict(embed_dim=16, hidden=64), "embed 16, LSTM 64"
    ),
    ModelKind("so_tag_logreg", "tag", "fedsim.models.nets:TagLogReg", {}, "TFF: one dense sigmoid layer"),
    ModelKind(
        "femnist_cnn",
        "femnist",
        "fedsim.models.nets:SmallCNN",
        dict(widths=(32, 64), kernel=5, hidden=2048),
        "LEAF's CNN",
    ),
    ModelKind(
        "femnist_cnn_small",
        "femnist",
        "fedsim.models.nets:SmallCNN",
        dict(widths=(16, 32), kernel=5, hidden=128),
        "a smaller CNN",
    ),
    ModelKind(
        "cifar_resnet18_gn", "cifar100", "fedsim.models.nets:ResNet18GN", dict(groups=2), "ResNet-18 with group norm"
    ),
    ModelKind(
        "cifar_cnn_small",
        "cifar100",
        "fedsim.models.nets:SmallCNN",
        dict(widths=(32, 64), kernel=3, hidden=256),
        "a small CNN",
    ),
    ModelKind("logreg", "vector", "fedsim.models.nets:LogReg", {}, "logistic regression"),
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
    task, cls, kwargs = kind.task, kind.module_class(), kind.kwargs
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
    if not isinstance(model, torch.nn.Module) or not any(p.requires_grad for p in model.parameters()):
        raise FedsimError(
            f"model.name = {name!r} ({getattr(cls, '__name__', cls)}) has no trainable parameters: federated "
            f"training updates a model's parameters; give the module at least one nn.Parameter (e.g. a nn.Linear)"
        )
    return model


def recurrent(model: nn.Module) -> bool:
    """Whether ``model`` has recurrent layers (torch's or Opacus's)."""
    return any(
        isinstance(m, torch.nn.RNNBase) or type(m).__name__.startswith("DPLSTM") or type(m).__name__ == "DPRNNBase"
        for m in model.modules()
    )


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
