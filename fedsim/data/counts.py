"""Per-user sample counts shared by the federated datasets."""

from __future__ import annotations

import numpy as np


class UserCounts:
    """Mixin: ``_num_train`` and ``_num_test`` (int64 arrays of length N) give the population
    and each user's train and test sample counts."""

    _num_train: np.ndarray
    _num_test: np.ndarray

    @property
    def population(self) -> int:
        return len(self._num_train)

    def num_train(self, u: int) -> int:
        return int(self._num_train[u])

    def num_test(self, u: int) -> int:
        return int(self._num_test[u])

    def examples_per_user(self) -> np.ndarray:
        """Train samples per user (array of length N)."""
        return self._num_train.copy()
