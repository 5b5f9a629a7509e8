"""Pieces shared by the federated datasets: per-user counts, top-1 classification metrics,
memory-mapped user-contiguous arrays."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch


def test_indices(n: int, max_examples: int | None) -> np.ndarray:
    """Indices of the test samples to evaluate out of ``n``: all, or ``max_examples`` evenly spaced."""
    if max_examples is not None and n > max_examples:
        return np.linspace(0, n - 1, max_examples).round().astype(np.int64)
    return np.arange(n)


def majority(train_labels: Iterable[np.ndarray], test_labels: Iterable[np.ndarray], classes: int) -> tuple[int, float]:
    """The most frequent label of ``train_labels`` and its accuracy on ``test_labels`` (the
    'always predict the most frequent class' baseline)."""
    counts = np.zeros(classes, dtype=np.int64)
    for y in train_labels:
        counts += np.bincount(np.asarray(y, dtype=np.int64), minlength=classes)
    top = int(counts.argmax())
    hit = tot = 0
    for y in test_labels:
        hit += int((np.asarray(y) == top).sum())
        tot += len(y)
    return top, hit / max(tot, 1)


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


class TopOneClassification:
    """Mixin: one label per sample, mean cross-entropy loss, top-1 accuracy."""

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch: mean cross-entropy."""
        return torch.nn.functional.cross_entropy(out, y)

    def batched_loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """:meth:`loss` of ``U`` users' batches at once (vectorized training): ``out`` is
        ``(U, B, classes)``, ``y`` is ``(U, B)``; returns the ``(U,)`` per-user mean losses.
        One plain cross-entropy over all ``U·B`` rows (no ``vmap``: under ``vmap`` torch
        decomposes the loss and imports its symbolic-shape machinery, a second of start-up)."""
        if out.dim() == 3 and y.dim() == 2:
            per = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="none")
            return per.view(y.shape).mean(dim=1)
        return torch.func.vmap(self.loss)(out, y)

    def eval_sums(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Summable evaluation counts of a batch: ``loss_sum``/``loss_count``, top-1
        ``correct``/``count``, ``examples``."""
        n = float(len(y))
        return {
            "loss_sum": float(torch.nn.functional.cross_entropy(out, y, reduction="sum")),
            "loss_count": n,
            "correct": float((out.argmax(-1) == y).sum()),
            "count": n,
            "examples": n,
        }


class CachedArrays(UserCounts):
    """Mixin: users' samples in a cache folder written by
    :func:`fedsim.data.hf_local.user_contiguous` (``<split>_x.npy``, ``<split>_y.npy``, rows
    user by user) with ``meta.json`` (``names``, ``train_counts``, ``test_counts``), memory-mapped.
    Subclasses set ``vocab_size`` (the number of classes) and may override :meth:`_inputs`."""

    names: list[str]
    vocab_size: int

    def _open(self, folder: Path, keep: list[int] | None) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        self._x = {s: np.load(folder / f"{s}_x.npy", mmap_mode="r") for s in ("train", "test")}
        self._y = {s: np.load(folder / f"{s}_y.npy", mmap_mode="r") for s in ("train", "test")}
        counts = {s: np.asarray(meta[f"{s}_counts"], dtype=np.int64) for s in ("train", "test")}
        starts = {s: np.concatenate([[0], np.cumsum(counts[s])[:-1]]).astype(np.int64) for s in counts}
        keep = list(range(len(meta["names"]))) if keep is None else keep
        self.names = [meta["names"][i] for i in keep]
        self._start = {s: starts[s][keep] for s in counts}
        self._num_train = counts["train"][keep]
        self._num_test = counts["test"][keep]
        return meta

    def _inputs(self, x: np.ndarray) -> torch.Tensor:
        """Model inputs from stored rows (default: int64 ids)."""
        return torch.from_numpy(x.astype(np.int64))

    def _rows(self, split: str, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._start[split][u] + np.asarray(idx, dtype=np.int64)
        return self._inputs(np.ascontiguousarray(self._x[split][rows])), torch.from_numpy(
            self._y[split][rows].astype(np.int64)
        )

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Train samples ``idx`` (indices into ``0..num_train(u)−1``) of user ``u``."""
        return self._rows("train", u, idx)

    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Test samples of user ``u``; with ``max_examples``, that many evenly spaced ones."""
        return self._rows("test", u, test_indices(self.num_test(u), max_examples))

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float] | None:
        """The most frequent train label over ``users`` and its accuracy on their test samples."""
        train = (self._y["train"][self._start["train"][u] : self._start["train"][u] + self.num_train(u)] for u in users)
        test = (self.test_samples(u, max_examples)[1].numpy() for u in users)
        return majority(train, test, self.vocab_size)


class Population(Protocol):
    """What the server needs of a population: who the users are and how much data each holds
    (a deployment's census has no samples)."""

    task: str

    @property
    def vocab_size(self) -> int:
        """Classes of the task's output (characters, words, labels)."""
        ...

    @property
    def names(self) -> Sequence[str]:
        """Each user's stable name (what keyed participation hashes), in user-index order."""
        ...

    @property
    def population(self) -> int: ...
    def num_train(self, u: int) -> int: ...
    def num_test(self, u: int) -> int: ...
    def examples_per_user(self) -> np.ndarray: ...
    def model_dims(self) -> dict[str, int]: ...
    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float] | None: ...


class FederatedData(Population, Protocol):
    """What training and evaluation need from a federated dataset: a :class:`Population` with
    samples, a loss and evaluation sums.

    Optional: ``softmax_ignore_index`` (an int, or None), declaring that :meth:`loss` is the mean
    softmax cross-entropy over the last dimension with rows of that target left out; local
    training may then compute it together with the model's output layer
    (:func:`fedsim.models.softmax_head.fused_loss`). Views of a dataset forward it.

    Optional: ``prepare_train(u)``, for a dataset that reads users' rows lazily: read and decode
    user ``u``'s training rows now, so that the next :meth:`train_samples` of ``u`` finds them
    ready (local training calls it for the next user while a GPU runs the current user's steps;
    :func:`fedsim.training.local.train_users`). It must not change what :meth:`train_samples` returns.
    Views of a dataset forward it, mapping ``u`` to the underlying user."""

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]: ...
    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...
    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...
    def eval_sums(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, float]: ...
