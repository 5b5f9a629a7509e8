"""A fedsim plugin for the paper-claim sweeps (``experiments/sweeps/paper_*.toml``): one generated
dataset, ``paper_blobs``, held in memory, and a small non-convex model, ``paper_mlp``.

``K`` classes have means ``μ_k ~ N(0, sep²·I_d)``; a sample of class ``y`` is ``x = s ⊙ (μ_y + ξ)``
with ``ξ ~ N(0, I_d)`` and per-feature scales ``s_j`` log-spaced from ``10^-scale_decades`` to 1
(``scale_decades = 0``: every feature at scale 1). The scales make the logistic-regression gradient's
coordinates differ in size by up to ``10^scale_decades``, the case where a per-coordinate (Adam)
step helps; they change nothing else (the classes are as separable in every feature). Every user
holds ``samples_per_user`` train samples and as many test samples, each with its own label drawn
uniformly; with ``samples_per_user = 1`` a user is one example and user-level DP-FedAvg with one
local step is DP-SGD with per-example clipping. The population is drawn from ``data.subset_seed``
only (the run's ``seed`` does not change the data), so every arm and seed of a sweep sees the
same users.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

import fedsim
from fedsim.data.base import TopOneClassification, UserCounts, majority, test_indices
from fedsim.data.registry import DataOptions, DatasetKind
from fedsim.models import ModelKind, batched_linear


class PaperBlobsOptions(DataOptions):
    """``[data]`` of ``name = "paper_blobs"``.

    Parameters
    ----------
    num_clients : users ``N``. Default 10000.
    samples_per_user : train samples per user (and as many test samples). Default 1.
    num_features : ``d``. Default 32.
    num_classes : ``K``. Default 10.
    separation : the class means' standard deviation per feature (smaller: harder). Default 0.5.
    scale_decades : the feature scales span ``10^-scale_decades .. 1``. Default 0.
    """

    name: Literal["paper_blobs"] = "paper_blobs"
    num_clients: int = Field(default=10000, ge=2)
    samples_per_user: int = Field(default=1, ge=1, le=10000)
    num_features: int = Field(default=32, ge=1, le=100000)
    num_classes: int = Field(default=10, ge=2, le=10000)
    separation: float = Field(default=0.5, gt=0)
    scale_decades: float = Field(default=0.0, ge=0, le=8)


class PaperBlobs(TopOneClassification, UserCounts):
    """The generated population (see the module docstring); users' rows are contiguous."""

    task = "vector"

    def __init__(self, spec: PaperBlobsOptions) -> None:
        n, m, d, k = spec.num_clients, spec.samples_per_user, spec.num_features, spec.num_classes
        rng = np.random.default_rng([int(spec.subset_seed), 38])
        means = rng.normal(0.0, spec.separation, (k, d))
        scales = np.logspace(-spec.scale_decades, 0.0, d) if d > 1 else np.ones(1)

        def draw(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
            y = rng.integers(0, k, rows)
            x = (means[y] + rng.normal(0.0, 1.0, (rows, d))) * scales
            return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))

        self.m, self.vocab_size, self.d = m, k, d
        self.x_train, self.y_train = draw(n * m)
        self.x_test, self.y_test = draw(n * m)
        self._num_train = np.full(n, m, dtype=np.int64)
        self._num_test = np.full(n, m, dtype=np.int64)
        self.names = [f"user_{u:07d}" for u in range(n)]

    def model_dims(self) -> dict[str, int]:
        return {"in_features": self.d, "num_classes": self.vocab_size}

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.as_tensor(u * self.m + np.asarray(idx, dtype=np.int64))
        return self.x_train[i], self.y_train[i]

    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.as_tensor(u * self.m + test_indices(self.m, max_examples))
        return self.x_test[i], self.y_test[i]

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float]:
        train = (self.y_train[u * self.m : (u + 1) * self.m].numpy() for u in users)
        test = (self.test_samples(u, max_examples)[1].numpy() for u in users)
        return majority(train, test, self.vocab_size)


_CACHE: dict[str, PaperBlobs] = {}


def load_paper_blobs(spec: PaperBlobsOptions) -> PaperBlobs:
    """The population of ``spec`` (generated once per process)."""
    if spec.max_users is not None:
        raise fedsim.FedsimError("data.max_users does not apply to paper_blobs: set data.num_clients instead")
    key = spec.model_dump_json()
    if key not in _CACHE:
        _CACHE[key] = PaperBlobs(spec)
    return _CACHE[key]


class PaperMLP(torch.nn.Module):
    """``paper_mlp``: one hidden layer of ``hidden`` tanh units (a smooth, non-convex model), with
    its own batched forward pass for fedsim's vectorized local training."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 64, dp_layers: bool = False) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(in_features, hidden)
        self.out = torch.nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of ``U`` users at once: stacked ``params``, inputs ``(U, B, in)``."""
        return batched_linear(params, torch.tanh(batched_linear(params, x, "hidden.")), "out.")


fedsim.register_model(ModelKind("paper_mlp", "vector", PaperMLP, {"hidden": 64}, "a one-hidden-layer tanh MLP"))
fedsim.register_dataset(
    DatasetKind("paper_blobs", PaperBlobsOptions, "vector", load_paper_blobs, "generated blobs for the paper sweeps")
)
