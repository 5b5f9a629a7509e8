"""Federated datasets: a population of users, each with train and test samples.

:func:`load_federated` returns a :class:`FederatedText` for ``data.name``; it is
cached per process, so a simulation worker builds it once and reuses it for every
message. Users are indexed ``0..N−1`` in a stable order; ``data.max_users`` keeps a
seeded subset (seed ``data.subset_seed``) whose size is the population that is
reported and accounted.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np
import torch

from fedsim.config import DataConfig
from fedsim.data import shakespeare
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

    @classmethod
    def from_config(cls, cfg: DataConfig) -> "DataSpec":
        return cls(cfg.name, cfg.max_users, cfg.subset_seed, cfg.min_chars, cfg.window, cfg.cache_dir)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> "DataSpec":
        return cls(**json.loads(s))


class FederatedText:
    """Next-character prediction data of a population of users.

    Each user ``u`` has encoded text ``x`` (uint8 ids) of length ``L``; sample ``j``
    (``0 ≤ j < L − w``) is ``(x[j:j+w], x[j+w])``. Samples ``j < ⌊0.8·(L−w)⌋`` are
    train, the rest test.
    """

    def __init__(self, names: list[str], texts: list[np.ndarray], window: int, vocab_size: int) -> None:
        self.names = names
        self.texts = texts
        self.window = window
        self.vocab_size = vocab_size
        m = np.array([max(len(t) - window, 0) for t in texts], dtype=np.int64)
        self._num_train = np.floor(shakespeare.TRAIN_FRACTION * m).astype(np.int64)
        self._num_test = m - self._num_train

    @property
    def population(self) -> int:
        return len(self.texts)

    def num_train(self, u: int) -> int:
        return int(self._num_train[u])

    def num_test(self, u: int) -> int:
        return int(self._num_test[u])

    def examples_per_user(self) -> np.ndarray:
        """Train samples per user (array of length N)."""
        return self._num_train.copy()

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
        n = self.num_test(u)
        idx = np.arange(n)
        if max_examples is not None and n > max_examples:
            idx = np.linspace(0, n - 1, max_examples).round().astype(np.int64)
        return self._samples(u, self.num_train(u) + idx)

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float]:
        """The most frequent train target over ``users`` and its accuracy on their test samples
        (the 'always predict the most frequent character' baseline)."""
        counts = np.zeros(self.vocab_size, dtype=np.int64)
        for u in users:
            _, y = self.train_samples(u, np.arange(self.num_train(u)))
            counts += np.bincount(y.numpy(), minlength=self.vocab_size)
        top = int(counts.argmax())
        hit = tot = 0
        for u in users:
            _, y = self.test_samples(u, max_examples)
            hit += int((y == top).sum())
            tot += len(y)
        return top, hit / max(tot, 1)


def _subset(n: int, k: int | None, seed: int) -> list[int]:
    if k is None or k >= n:
        return list(range(n))
    rng = np.random.default_rng(seed)  # data subset only; never used for privacy noise
    return sorted(rng.choice(n, size=k, replace=False).tolist())


@functools.lru_cache(maxsize=4)
def load_federated(spec: DataSpec) -> FederatedText:
    """Load (building once if needed) the federated dataset described by ``spec``."""
    if spec.name != "shakespeare":
        raise FedsimError(f"data.name = {spec.name!r}: allowed is 'shakespeare'")
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
        raise FedsimError(
            f"data: only {len(keep)} users have ≥ {spec.min_chars} characters; lower data.min_chars"
        )
    return FederatedText([names_all[i] for i in keep], [texts_all[i] for i in keep], spec.window,
                         shakespeare.VOCAB_SIZE)
