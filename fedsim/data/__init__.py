"""Federated datasets: a population of users, each with train and test samples.

:func:`load_federated` returns the dataset for ``data.name``: a :class:`FederatedText`
(``shakespeare``) or a :class:`~fedsim.data.stackoverflow.dataset.StackOverflowFederated`
(``stackoverflow_nwp``, ``stackoverflow_tag``). Both offer the same interface to training:
``population``, ``num_train``/``num_test``, ``train_samples``/``test_samples``, ``task``,
``model_dims()``, ``loss(out, y)`` and ``eval_sums(out, y)``. It is
cached per process, so a simulation worker builds it once and reuses it for every
message. Users are indexed ``0..N−1`` in a stable order; ``data.max_users`` keeps a
seeded subset (seed ``data.subset_seed``) whose size is the population that is
reported and accounted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedsim.config import DataConfig
from fedsim.data import shakespeare
from fedsim.data.base import TopOneClassification, UserCounts, majority, test_indices
from fedsim.errors import FedsimError


@dataclass(frozen=True)
class DataSpec:
    """The hashable subset of :class:`DataConfig` that determines the data."""

    name: str
    max_users: int | None
    subset_seed: int
    min_chars: int
    window: int
    cache_dir: str | None
    root: str | None = None
    vocab_size: int = 10000
    tag_vocab_size: int = 500
    seq_len: int = 20
    num_oov_buckets: int = 1
    max_elements_per_user: int = 256
    num_clients: int = 500
    partition_alpha: float = 0.1
    samples_per_user: int = 32
    num_features: int = 64
    num_classes: int = 10

    @classmethod
    def from_config(cls, cfg: DataConfig) -> DataSpec:
        return cls(
            cfg.name,
            cfg.max_users,
            cfg.subset_seed,
            cfg.min_chars,
            cfg.window,
            cfg.cache_dir,
            cfg.root,
            cfg.vocab_size,
            cfg.tag_vocab_size,
            cfg.seq_len,
            cfg.num_oov_buckets,
            cfg.max_elements_per_user,
            cfg.num_clients,
            cfg.partition_alpha,
            cfg.samples_per_user,
            cfg.num_features,
            cfg.num_classes,
        )

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> DataSpec:
        return cls(**json.loads(s))


class FederatedData(Protocol):
    """What training and evaluation need from a federated dataset."""

    task: str
    vocab_size: int

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
    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]: ...
    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...
    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...
    def eval_sums(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, float]: ...
    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float] | None: ...


class FederatedText(TopOneClassification, UserCounts):
    """Next-character prediction data of a population of users.

    Each user ``u`` has encoded text ``x`` (uint8 ids) of length ``L``; sample ``j``
    (``0 ≤ j < L − w``) is ``(x[j:j+w], x[j+w])``. Samples ``j < ⌊0.8·(L−w)⌋`` are
    train, the rest test.
    """

    task = "char"

    def __init__(self, names: list[str], texts: list[np.ndarray], window: int, vocab_size: int) -> None:
        self.names = names
        self.texts = texts
        self.window = window
        self.vocab_size = vocab_size
        m = np.array([max(len(t) - window, 0) for t in texts], dtype=np.int64)
        self._num_train = np.floor(shakespeare.TRAIN_FRACTION * m).astype(np.int64)
        self._num_test = m - self._num_train

    def model_dims(self) -> dict[str, int]:
        """What the model needs: ``vocab_size``."""
        return {"vocab_size": self.vocab_size}

    def _samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.texts[u]
        w = self.window
        windows = np.lib.stride_tricks.sliding_window_view(x, w + 1)[idx]
        t = torch.from_numpy(np.ascontiguousarray(windows).astype(np.int64))
        return t[:, :w], t[:, w]

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Train samples ``idx`` (indices into ``0..num_train(u)−1``) of user ``u``."""
        return self._samples(u, np.asarray(idx, dtype=np.int64))

    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Test samples of user ``u``; with ``max_examples``, that many evenly spaced ones."""
        return self._samples(u, self.num_train(u) + test_indices(self.num_test(u), max_examples))

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float]:
        """The most frequent train target over ``users`` and its accuracy on their test samples
        (the 'always predict the most frequent character' baseline)."""
        train = (self.train_samples(u, np.arange(self.num_train(u)))[1].numpy() for u in users)
        test = (self.test_samples(u, max_examples)[1].numpy() for u in users)
        return majority(train, test, self.vocab_size)


def _subset(n: int, k: int | None, seed: int) -> list[int]:
    if k is None or k >= n:
        return list(range(n))
    rng = np.random.default_rng(seed)  # data subset only; never used for privacy noise
    return sorted(rng.choice(n, size=k, replace=False).tolist())


SO_TASKS = {"stackoverflow_nwp": "nwp", "stackoverflow_tag": "tag"}


def _load_stackoverflow(spec: DataSpec) -> FederatedData:
    from fedsim.data.stackoverflow.database import StackOverflowDB
    from fedsim.data.stackoverflow.dataset import SOSettings, StackOverflowFederated
    from fedsim.data.stackoverflow.files import sqlite_path

    if not spec.root:
        raise FedsimError(
            f"data.name = {spec.name!r} needs data.root: the folder with the TFF Stack Overflow "
            f"files (stackoverflow.sqlite[.lzma], stackoverflow.word_count[.tar.bz2], "
            f"stackoverflow.tag_count[.tar.bz2])"
        )
    n_all = len(StackOverflowDB(sqlite_path(spec.root, spec.cache_dir)).clients("train"))
    keep = (
        None if spec.max_users is None or spec.max_users >= n_all else _subset(n_all, spec.max_users, spec.subset_seed)
    )
    settings = SOSettings(
        SO_TASKS[spec.name],
        spec.vocab_size,
        spec.tag_vocab_size,
        spec.seq_len,
        spec.num_oov_buckets,
        spec.max_elements_per_user,
    )
    data = StackOverflowFederated(spec.root, settings, spec.cache_dir, keep)
    if data.population < 2:
        raise FedsimError(f"data: {spec.root} has {data.population} train client(s); at least 2 are needed")
    return data


def _load_images(spec: DataSpec) -> FederatedData:
    from fedsim.data.images import FederatedImages

    if not spec.root:
        raise FedsimError(
            f"data.name = {spec.name!r} needs data.root: the local Hugging Face folder "
            f"(datasets.save_to_disk output or downloaded parquet files)"
        )
    full = FederatedImages(
        spec.name, spec.root, spec.num_clients, spec.partition_alpha, spec.subset_seed, spec.cache_dir
    )
    if spec.max_users is None or spec.max_users >= full.population:
        return full
    keep = _subset(full.population, spec.max_users, spec.subset_seed)
    return FederatedImages(
        spec.name, spec.root, spec.num_clients, spec.partition_alpha, spec.subset_seed, spec.cache_dir, keep
    )


def _load_leaf_shakespeare(spec: DataSpec) -> FederatedData:
    from fedsim.data.leaf_shakespeare import LeafShakespeare

    if not spec.root:
        raise FedsimError("data.name = 'shakespeare_leaf' needs data.root: the flwrlabs/shakespeare folder")
    full = LeafShakespeare(spec.root, spec.cache_dir)
    if spec.max_users is None or spec.max_users >= full.population:
        return full
    return LeafShakespeare(spec.root, spec.cache_dir, _subset(full.population, spec.max_users, spec.subset_seed))


@functools.lru_cache(maxsize=4)
def load_federated(spec: DataSpec) -> FederatedData:
    """Load (building once if needed) the federated dataset described by ``spec``."""
    if spec.name in SO_TASKS:
        return _load_stackoverflow(spec)
    if spec.name in ("femnist", "cifar100"):
        return _load_images(spec)
    if spec.name == "shakespeare_leaf":
        return _load_leaf_shakespeare(spec)
    if spec.name == "synthetic":
        from fedsim.data.synthetic import SyntheticClassification

        return SyntheticClassification(
            spec.num_clients, spec.samples_per_user, spec.num_features, spec.num_classes, spec.subset_seed
        )
    if spec.name != "shakespeare":
        raise FedsimError(
            f"data.name = {spec.name!r}: allowed are 'shakespeare', 'shakespeare_leaf', 'femnist', "
            f"'cifar100', {', '.join(map(repr, SO_TASKS))}"
        )
    import datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    datasets.disable_progress_bars()
    folder = shakespeare.build_corpus(spec.cache_dir)
    ds = datasets.load_from_disk(str(folder))
    part = NaturalIdPartitioner(partition_by="user")
    part.dataset = ds
    _ = part.num_partitions  # builds the partition-id ↔ natural-id (user) index
    names_all: list[str] = []
    texts_all: list[np.ndarray] = []
    # One pass over the speech column in storage order, grouped by partition index.
    pid_of = {nid: pid for pid, nid in part.partition_id_to_natural_id.items()}
    chunks: dict[int, list[str]] = {}
    for user, text in zip(ds["user"], ds["text"]):
        chunks.setdefault(pid_of[user], []).append(text)
    for pid in sorted(chunks):
        joined = " ".join(chunks[pid])
        if len(joined) >= spec.min_chars and len(joined) - spec.window >= 5:
            names_all.append(part.partition_id_to_natural_id[pid])
            texts_all.append(shakespeare.encode(joined))
    keep = _subset(len(names_all), spec.max_users, spec.subset_seed)
    if len(keep) < 2:
        raise FedsimError(f"data: only {len(keep)} users have ≥ {spec.min_chars} characters; lower data.min_chars")
    return FederatedText(
        [names_all[i] for i in keep], [texts_all[i] for i in keep], spec.window, shakespeare.VOCAB_SIZE
    )
