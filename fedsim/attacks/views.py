"""Views of a federated dataset that hide users, for the privacy attacks.

:func:`without_users` presents a dataset without some of its users (the held-out users of user
inference, the donors of canary users): the kept users are renumbered ``0..K−1`` in their
original order, and every method of :class:`~fedsim.data.FederatedData` delegates to the
underlying dataset through that renumbering. Nothing is copied; a view is as cheap as its
index array. :class:`FederatedView` is also the base of the canary view
(:func:`fedsim.attacks.canaries.with_canary_users`), which appends users after the kept ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedsim.data import FederatedData
from fedsim.errors import FedsimError

#: Optional dataset attributes a view passes through unchanged (they do not depend on user
#: indices): the vectorized loss, the NWP vocabulary and settings, the character window.
DELEGATED = frozenset({"batched_loss", "nwp", "settings", "window"})


def check_users(users: Sequence[int], population: int, what: str) -> list[int]:
    """``users`` as distinct ints in ``0..population−1`` (sorted), or a :class:`FedsimError`
    naming ``what`` (the argument the caller should fix)."""
    out = sorted({int(u) for u in users})
    if len(out) != len(users):
        raise FedsimError(f"{what}: user indices must be distinct, got {list(users)}")
    if out and (out[0] < 0 or out[-1] >= population):
        raise FedsimError(f"{what}: user indices must lie in 0..{population - 1}, got {out[0]}..{out[-1]}")
    return out


def check_seed(seed: int, what: str) -> int:
    """``seed`` as an int ≥ 0 (what ``numpy.random.default_rng`` takes in a seed list), or a
    :class:`FedsimError` naming ``what``."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise FedsimError(f"{what} must be an integer ≥ 0, got {seed!r}")
    return int(seed)


class FederatedView:
    """The users ``keep`` of ``data``, renumbered ``0..len(keep)−1`` (a :class:`FederatedData`).

    Parameters
    ----------
    data : the underlying dataset (not copied).
    keep : indices into ``data`` of the users to present, in the order to present them.
    """

    def __init__(self, data: FederatedData, keep: Sequence[int]) -> None:
        self._data = data
        self._keep = np.asarray(list(keep), dtype=np.int64)
        self.task: str = data.task
        self.vocab_size: int = data.vocab_size
        names = data.names
        self._names = [names[int(i)] for i in self._keep]

    # ------------------------------------------------------------------ users
    @property
    def names(self) -> Sequence[str]:
        """Each presented user's stable name (the underlying dataset's names of ``keep``)."""
        return self._names

    @property
    def population(self) -> int:
        return len(self._names)

    @property
    def source(self) -> FederatedData:
        """The underlying dataset."""
        return self._data

    def ordinary_users(self) -> list[int]:
        """The users whose test samples ordinary evaluation may use: all of them in a plain view
        (the canary view leaves its canary users out)."""
        return list(range(len(self._keep)))

    def source_index(self, u: int) -> int:
        """The index in the underlying dataset of presented user ``u`` (an ordinary user)."""
        if not 0 <= u < len(self._keep):
            raise FedsimError(f"user {u} is not an ordinary user of this view (0..{len(self._keep) - 1})")
        return int(self._keep[u])

    # ------------------------------------------------------------------ counts and samples
    def num_train(self, u: int) -> int:
        return self._data.num_train(self.source_index(u))

    def num_test(self, u: int) -> int:
        return self._data.num_test(self.source_index(u))

    def examples_per_user(self) -> np.ndarray:
        """Train samples per presented user (int64 array of length ``population``)."""
        return np.asarray(self._data.examples_per_user(), dtype=np.int64)[self._keep]

    def model_dims(self) -> dict[str, int]:
        return self._data.model_dims()

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Train samples ``idx`` (indices into ``0..num_train(u)−1``) of user ``u``."""
        return self._data.train_samples(self.source_index(u), idx)

    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Test samples of user ``u`` (at most ``max_examples``; None: all)."""
        return self._data.test_samples(self.source_index(u), max_examples)

    @property
    def softmax_ignore_index(self) -> int | None:
        return getattr(self._data, "softmax_ignore_index", None)

    def prepare_train(self, u: int) -> None:
        """Read user ``u``'s train rows ahead where the underlying dataset can; nothing for a
        user it does not hold (a canary user)."""
        prepare = getattr(self._data, "prepare_train", None)
        if prepare is not None and 0 <= u < len(self._keep):
            prepare(self.source_index(u))

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._data.loss(out, y)

    def eval_sums(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        return self._data.eval_sums(out, y)

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float] | None:
        """The underlying dataset's baseline over the ordinary users among ``users`` (other users,
        such as canaries, are left out)."""
        ordinary = set(self.ordinary_users())
        return self._data.majority_baseline([self.source_index(u) for u in users if u in ordinary], max_examples)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found normally; ``__dict__`` avoids recursion while
        # unpickling (``_data`` is not set yet then).
        data = self.__dict__.get("_data")
        if name in DELEGATED and data is not None:
            return getattr(data, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def without_users(data: FederatedData, user_indices: Sequence[int]) -> FederatedView:
    """``data`` without the users ``user_indices``; the others keep their order, renumbered.

    Parameters
    ----------
    data : the dataset.
    user_indices : indices into ``data`` of the users to hide (distinct; may be empty).

    Returns a :class:`FederatedView`: ``population = data.population − len(user_indices)``, and
    ``view.source_index(u)`` is the index in ``data`` of the view's user ``u``.
    """
    hide = set(check_users(user_indices, data.population, "without_users"))
    keep = [u for u in range(data.population) if u not in hide]
    if not keep:
        raise FedsimError(f"without_users: hiding {len(hide)} user(s) leaves no user; hide fewer")
    return FederatedView(data, keep)
