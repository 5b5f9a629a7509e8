"""A fedsim plugin: a model and a dataset defined outside the fedsim package.

``experiment.toml`` beside this file names them (``model.name = "mlp_plugin"``,
``data.name = "blobs_plugin"``) and lists this file under ``plugins``, so every fedsim process
imports it before the config is read: the CLI, Ray workers, Tune trials, audits and resumes.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

import fedsim
from fedsim.data.registry import DataOptions, DatasetKind
from fedsim.data.synthetic import SyntheticClassification
from fedsim.models import ModelKind


class MLP(torch.nn.Module):
    """Two dense layers with a ReLU between them."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 16, dp_layers: bool = False) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(in_features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BlobsOptions(DataOptions):
    """Gaussian blobs per user (the ``data`` table of ``data.name = "blobs_plugin"``).

    users : how many users. Default 40.
    per_user : training samples per user. Default 16.
    """

    name: Literal["blobs_plugin"] = "blobs_plugin"
    users: int = Field(default=40, ge=2)
    per_user: int = Field(default=16, ge=1)


def load_blobs(spec: BlobsOptions) -> SyntheticClassification:
    """The population: fedsim's generated classification data with this plugin's sizes."""
    return SyntheticClassification(spec.users, spec.per_user, 12, 4, spec.subset_seed)


fedsim.register_model(ModelKind("mlp_plugin", "vector", MLP, {"hidden": 16}, "a plugin's two-layer MLP"))
fedsim.register_dataset(DatasetKind("blobs_plugin", BlobsOptions, "vector", load_blobs, "a plugin's blobs"))
