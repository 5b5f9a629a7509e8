"""Federated datasets: a population of users, each with train and test samples.

Every dataset registers itself (:data:`DATASETS`, :mod:`fedsim.data.registry`) with its options
model — the ``[data]`` table of the config — and a loader. :func:`load_federated` returns the
population an options model describes; every dataset offers the same interface to training
(:class:`FederatedData`): ``population``, ``names``, ``num_train``/``num_test``,
``train_samples``/``test_samples``, ``task``, ``model_dims()``, ``loss(out, y)`` and
``eval_sums(out, y)``. It is cached per process, so a simulation worker builds it once and reuses
it for every message. Users are indexed ``0..N−1`` in a stable order; ``data.max_users`` keeps a
seeded subset (seed ``data.subset_seed``) whose size is the population that is reported and
accounted.

Adding a dataset: a module with its options (a :class:`~fedsim.data.registry.DataOptions`
subclass), its loader and ``register_dataset(...)``, imported below (docs/architecture.md).
"""

from __future__ import annotations

import functools

# The datasets, in the order of the docs (importing a module registers its datasets).
# isort: off
from fedsim.data import shakespeare, leaf_shakespeare  # noqa: F401
from fedsim.data.stackoverflow import dataset as _stackoverflow  # noqa: F401
from fedsim.data import images, synthetic, table  # noqa: F401

# isort: on
from fedsim.data.base import FederatedData, Population
from fedsim.data.registry import (
    DATASETS,
    DataOptions,
    DatasetKind,
    data_spec,
    register_dataset,
    spec_from_json,
    spec_to_json,
    subset,
)
from fedsim.data.shakespeare import FederatedText

__all__ = [
    "DATASETS",
    "DataOptions",
    "DatasetKind",
    "FederatedData",
    "FederatedText",
    "Population",
    "data_spec",
    "load_federated",
    "register_dataset",
    "spec_from_json",
    "spec_to_json",
    "subset",
]


@functools.lru_cache(maxsize=4)
def load_federated(spec: DataOptions) -> FederatedData:
    """Load (building once if needed) the federated dataset described by ``spec``."""
    return DATASETS.get_part(spec.name).load(spec)


def population_size(spec: DataOptions) -> int:
    """The number of users of the dataset described by `spec`: from the dataset's own count
    where it can tell without loading (the bundled Shakespeare, once built), else by loading."""
    kind = DATASETS.get_part(spec.name)
    n = kind.count(spec) if kind.count is not None else None
    return n if n is not None else load_federated(spec).population
