"""A generated classification population (``data.name = "synthetic"``): for speed benchmarks,
scale tests and quick trials, with nothing stored per user.

``K`` classes have fixed means in ``R^d`` (drawn from ``data.subset_seed``). User ``u`` has its
own label mix (Dirichlet(0.5) over the classes) and ``m`` train and ``⌈m/4⌉`` test samples
``x = μ_y + ε``, ``ε ~ N(0, I)``; all of user ``u``'s samples are drawn from a generator seeded
by ``(seed, u)`` when asked for, so a population of any size costs nothing up front.

Settings: ``data.num_clients`` (``N``), ``data.samples_per_user`` (``m``),
``data.num_features`` (``d``), ``data.num_classes`` (``K``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from fedsim.data.base import TopOneClassification, majority, test_indices
from fedsim.data.registry import DataOptions, DatasetKind, register_dataset

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch


class _Names(Sequence[str]):
    """``user_0000000 ..`` computed on access (no list of N strings)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, u: Any) -> Any:
        if isinstance(u, slice):
            return [self[i] for i in range(*u.indices(self.n))]
        if not -self.n <= u < self.n:
            raise IndexError(u)
        return f"user_{u % self.n:07d}"


class SyntheticClassification(TopOneClassification):
    """The generated population (see the module docstring).

    Parameters
    ----------
    users : ``N``.
    samples : ``m``, train samples per user.
    features : ``d``.
    classes : ``K``.
    seed : the population's seed.
    """

    task = "vector"

    def __init__(self, users: int, samples: int, features: int, classes: int, seed: int = 0) -> None:
        self.users, self.m, self.d, self.k, self.seed = int(users), int(samples), int(features), int(classes), seed
        self.m_test = -(-self.m // 4)
        self.means = torch.from_numpy(
            np.random.default_rng([seed, 2**31]).normal(0.0, 1.0, (classes, features)).astype(np.float32)
        )
        self.vocab_size = classes
        self._cache: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    @property
    def names(self) -> _Names:
        return _Names(self.users)

    @property
    def population(self) -> int:
        return self.users

    def num_train(self, u: int) -> int:
        return self.m

    def num_test(self, u: int) -> int:
        return self.m_test

    def examples_per_user(self) -> np.ndarray:
        return np.full(self.users, self.m, dtype=np.int64)

    def model_dims(self) -> dict[str, int]:
        return {"in_features": self.d, "num_classes": self.k}

    def _user(self, u: int) -> tuple[torch.Tensor, torch.Tensor]:
        hit = self._cache.get(u)
        if hit is not None:
            return hit
        rng = np.random.default_rng([self.seed, int(u)])
        mix = rng.dirichlet(np.full(self.k, 0.5))
        n = self.m + self.m_test
        y = rng.choice(self.k, size=n, p=mix)
        x = self.means[torch.from_numpy(y)] + torch.from_numpy(rng.normal(0.0, 1.0, (n, self.d)).astype(np.float32))
        out = (x, torch.from_numpy(y.astype(np.int64)))
        self._cache[u] = out
        while len(self._cache) > 256:
            self._cache.popitem(last=False)
        return out

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self._user(u)
        i = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return x[i], y[i]

    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self._user(u)
        i = torch.as_tensor(self.m + test_indices(self.m_test, max_examples))
        return x[i], y[i]

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float]:
        train = (self._user(u)[1][: self.m].numpy() for u in users)
        test = (self.test_samples(u, max_examples)[1].numpy() for u in users)
        return majority(train, test, self.k)


class SyntheticOptions(DataOptions):
    """``data.name = "synthetic"``: a generated classification population (nothing stored per user).

    Parameters
    ----------
    num_clients : users. Default 500.
    samples_per_user : train samples per user. Default 32.
    num_features : input dimension. Default 64.
    num_classes : classes. Default 10.
    """

    name: Literal["synthetic"] = "synthetic"
    num_clients: int = Field(default=500, ge=2)
    samples_per_user: int = Field(default=32, ge=1, le=1_000_000)
    num_features: int = Field(default=64, ge=1, le=1_000_000)
    num_classes: int = Field(default=10, ge=2, le=100_000)


def load_synthetic(spec: SyntheticOptions) -> SyntheticClassification:
    """The generated population of ``spec`` (its seed: ``subset_seed``)."""
    return SyntheticClassification(
        spec.num_clients, spec.samples_per_user, spec.num_features, spec.num_classes, spec.subset_seed
    )


register_dataset(
    DatasetKind(
        "synthetic", SyntheticOptions, "vector", load_synthetic, "a generated classification population (benchmarks)"
    )
)
