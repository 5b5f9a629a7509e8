"""The registry of federated datasets (``data.name``) and the keys every dataset has.

A dataset module defines its options (a :class:`DataOptions` subclass with
``name: Literal["<name>"]`` and its own keys) and registers a :class:`DatasetKind`: the
options, the task its models must fit and the loader. The options model *is* the dataset's
description: the ``[data]`` table of the config, the hashable key of the per-process data cache,
and what the server sends to workers (:func:`spec_to_json` / :func:`spec_from_json`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from fedsim.data.base import FederatedData
from fedsim.errors import FedsimError
from fedsim.registry import ChoiceOptions, Registry, validate_options


class DataOptions(ChoiceOptions):
    """The ``[data]`` keys every dataset has (frozen: the options are the data cache's key).

    Parameters
    ----------
    name : the registered dataset (the discriminator; a ``Literal`` in each dataset's options).
    max_users : keep a stable seeded subset of this many users (None = all). The population that
        is reported and accounted is the subset's size.
    subset_seed : seed of that subset, separate from the run seed so that seeds of a sweep share
        one population. Default 0.
    cache_dir : where the built dataset is cached (None = ``$FEDSIM_CACHE`` or ``~/.cache/fedsim``;
        Stack Overflow: ``<root>/.fedsim-cache``).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    max_users: int | None = Field(default=None, ge=2)
    subset_seed: int = Field(default=0, ge=0)
    cache_dir: str | None = None


class LocalDataOptions(DataOptions):
    """A dataset read from a local folder the user downloaded elsewhere.

    Parameters
    ----------
    root : the folder (each dataset's docstring says what it holds). Required.
    """

    root: str | None = None

    @model_validator(mode="after")
    def _root_given(self) -> LocalDataOptions:
        if not self.root:
            raise ValueError(f"data.name = '{self.name}' needs data.root = {self._root_meaning()} (README 'Datasets')")
        return self

    def _root_meaning(self) -> str:
        return "the local Hugging Face folder (save_to_disk output or parquet files)"


@dataclass(frozen=True)
class DatasetKind:
    """A registered dataset.

    Parameters
    ----------
    name : ``data.name``.
    options : its options model.
    task : what its samples are (``char``, ``nwp``, ``tag``, ``femnist``, ``cifar100``,
        ``vector``): the models registered for this task fit it.
    load : options → the population (built once per process and cached by
        :func:`fedsim.data.load_federated`).
    summary : one line for the docs.
    count : options → the number of users `load` would return, or None where it cannot be told
        without loading (what `fedsim privacy` reads to skip loading the data). Default None:
        always load.
    """

    name: str
    options: type[DataOptions]
    task: str
    load: Callable[[Any], FederatedData]
    summary: str
    count: Callable[[Any], int | None] | None = None


#: The datasets, by ``data.name``.
DATASETS: Registry[DatasetKind] = Registry("dataset", "data.name")


def register_dataset(kind: DatasetKind) -> DatasetKind:
    """Register ``kind`` (its options' ``name`` must default to ``kind.name``)."""
    return DATASETS.add(kind.name, kind, options=kind.options)


def data_spec(name: str, **options: Any) -> DataOptions:
    """The validated options of dataset ``name`` (None values take the defaults)."""
    kind = DATASETS.get_part(name)
    spec: DataOptions = validate_options(kind.options, {"name": name, **options}, f"dataset {name!r}", "data")
    return spec


def spec_to_json(spec: DataOptions) -> str:
    """``spec`` as JSON (what the server sends to workers)."""
    return spec.model_dump_json()


def spec_from_json(text: str) -> DataOptions:
    """The dataset options serialised by :func:`spec_to_json`."""
    raw = json.loads(text)
    return data_spec(str(raw.pop("name")), **raw)


def subset(n: int, k: int | None, seed: int) -> list[int]:
    """A stable seeded subset of ``k`` of the indices ``0..n−1`` (all of them for None or ``k ≥ n``),
    sorted. Data selection only; never used for privacy noise."""
    if k is None or k >= n:
        return list(range(n))
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(n, size=k, replace=False).tolist())


def check_population(data: FederatedData, where: str) -> FederatedData:
    """Refuse a population of fewer than 2 users (``where``: what was loaded)."""
    if data.population < 2:
        raise FedsimError(f"data: {where} has {data.population} user(s); at least 2 are needed")
    return data
