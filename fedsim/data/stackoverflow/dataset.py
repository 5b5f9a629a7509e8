"""Stack Overflow as a federated population for training: next-word (``stackoverflow_nwp``) and
tag (``stackoverflow_tag``) prediction, read lazily from TFF's SQLite file.

Users are the **train** split's clients in sorted id order (``data.max_users`` keeps a seeded
subset). User ``u``'s train samples are the first ``max_elements_per_user`` rows of
(``train``, client) in stored order, as the DP-FTRL pipeline takes them; local training then
shuffles them with the user's own seeded generator. User ``u``'s *test* samples are the same
client id's rows in the ``test`` split (stored order, the first ``eval.max_examples_per_user``);
clients with no test rows contribute nothing to evaluation. (The DP-FTRL code instead pools
the first 10,000 test examples of all clients; evaluating each sampled user's own test posts
keeps evaluation federated and bounded per user.)

Nothing is read up front beyond the client lists and example counts of ``client_metadata``;
a user's rows are read through the ``(split_name, client_id)`` index when a worker first needs
them and kept in a small per-process cache.

Metrics. NWP: TFF's masked accuracies ``pad``, ``pad_oov`` and ``pad_oov_eos`` (the headline
``eval_accuracy`` is ``pad_oov_eos``, what the DP-FTRL papers report), cross-entropy over
non-pad positions (Keras's ``mask_zero`` masking). Tags: micro precision@5 and recall@5
(headline: recall@5) and binary cross-entropy averaged over tags, as Keras computes it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from fedsim.data.base import UserCounts
from fedsim.data.registry import DatasetKind, LocalDataOptions, check_population, register_dataset, subset
from fedsim.data.stackoverflow.database import StackOverflowDB
from fedsim.data.stackoverflow.example_proto import decode_example
from fedsim.data.stackoverflow.files import TAG_COUNT, WORD_COUNT, count_file, sqlite_path
from fedsim.data.stackoverflow.preprocess import NWPSpec, nwp_accuracy_counts, tag_xy, topk_counts
from fedsim.data.stackoverflow.vocab import load_tag_vocab, load_word_vocab
from fedsim.errors import FedsimError

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

CACHE_USERS = 8


@dataclass(frozen=True)
class SOSettings:
    """Preprocessing settings (``data.*``; TFF / DP-FTRL defaults).

    Parameters
    ----------
    task : ``nwp`` or ``tag``.
    vocab_size : ``V`` (NWP) or ``W`` (tag features): words kept from the word-count file. 10000.
    tag_vocab_size : ``T``: tags kept from the tag-count file. 500.
    seq_len : NWP sequence length ``L``. 20.
    num_oov_buckets : NWP OOV buckets ``k`` (1 only). 1.
    max_elements_per_user : the first this many stored rows of a user are its data. 256.
    """

    task: str
    vocab_size: int = 10000
    tag_vocab_size: int = 500
    seq_len: int = 20
    num_oov_buckets: int = 1
    max_elements_per_user: int = 256


class StackOverflowFederated(UserCounts):
    """The train clients of a Stack Overflow folder as users (see the module docstring).

    Parameters
    ----------
    root : the folder with the TFF files (``data.root``).
    settings : preprocessing settings.
    cache_dir : where compressed files are unpacked (None: ``<root>/.fedsim-cache``).
    keep : indices into the sorted train clients to keep (None: all).
    """

    def __init__(
        self, root: str, settings: SOSettings, cache_dir: str | None = None, keep: list[int] | None = None
    ) -> None:
        if settings.task not in ("nwp", "tag"):
            raise FedsimError(f"Stack Overflow task {settings.task!r}: allowed are 'nwp', 'tag'")
        self.settings = settings
        self.task = settings.task
        self.db = StackOverflowDB(sqlite_path(root, cache_dir))
        words = load_word_vocab(count_file(root, WORD_COUNT, cache_dir), settings.vocab_size)
        if self.task == "nwp":
            self.nwp = NWPSpec(words, settings.seq_len, settings.num_oov_buckets)
            self.vocab_size = self.nwp.num_classes
        else:
            tags = load_tag_vocab(count_file(root, TAG_COUNT, cache_dir), settings.tag_vocab_size)
            if not tags:
                raise FedsimError(f"{root}: the tag-count file lists no tags")
            self.word_index = {w: i for i, w in enumerate(words)}
            self.tag_index = {t: j for j, t in enumerate(tags)}
            self.vocab_size = len(words)
        ids, counts = self.db.client_counts("train")
        if not ids:
            raise FedsimError(f"{root}: client_metadata lists no train clients")
        if keep is not None:
            ids = [ids[i] for i in keep]
            counts = [counts[i] for i in keep]
        self.names = ids
        cap = settings.max_elements_per_user
        self._num_train = np.minimum(np.asarray(counts, dtype=np.int64), cap)
        test_ids, test_counts = self.db.client_counts("test")
        test_of = dict(zip(test_ids, test_counts))
        self._num_test = np.array([test_of.get(c, 0) for c in ids], dtype=np.int64)
        self._cache: OrderedDict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def model_dims(self) -> dict[str, int]:
        """What the model needs: NWP ``num_classes`` (``V + 3 + k``); tags ``in_features`` ``W``
        and ``out_features`` ``T``."""
        if self.task == "nwp":
            return {"num_classes": self.nwp.num_classes}
        return {"in_features": len(self.word_index), "out_features": len(self.tag_index)}

    # --------------------------------------------------------------------- samples
    def _tensors(self, rows: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
        ex = [decode_example(b) for b in rows]
        if self.task == "nwp":
            return self.nwp.xy([str(e["tokens"]).encode("utf-8") for e in ex])
        W, T = len(self.word_index), len(self.tag_index)
        x = np.zeros((len(ex), W), dtype=np.float32)
        y = np.zeros((len(ex), T), dtype=np.float32)
        for r, e in enumerate(ex):
            x[r], y[r] = tag_xy(
                str(e["tokens"]).encode("utf-8"),
                str(e["title"]).encode("utf-8"),
                str(e["tags"]).encode("utf-8"),
                self.word_index,
                self.tag_index,
            )
        return torch.from_numpy(x), torch.from_numpy(y)

    def _user(self, split: str, u: int, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (split, u, limit)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        rows = self.db.examples(split, self.names[u], limit)
        expected = min(limit, self.num_train(u) if split == "train" else self.num_test(u))
        if len(rows) != expected:
            raise FedsimError(
                f"{self.db.path}: client_metadata gives client {self.names[u]!r} {expected} "
                f"{split} example(s) within the first {limit}, the examples table "
                f"{len(rows)}; the database is inconsistent: download it again"
            )
        t = self._tensors(rows)
        self._cache[key] = t
        while len(self._cache) > CACHE_USERS:
            self._cache.popitem(last=False)
        return t

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Train samples ``idx`` (indices into ``0..num_train(u)−1``) of user ``u``."""
        x, y = self._user("train", u, self.settings.max_elements_per_user)
        i = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return x[i], y[i]

    def prepare_train(self, u: int) -> None:
        """Read and decode user ``u``'s train rows into the per-process cache now (local training
        does this for the next user while a GPU runs the current user's steps)."""
        self._user("train", u, self.settings.max_elements_per_user)

    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``max_examples`` (None: all) test-split rows of user ``u``'s client id."""
        n = self.num_test(u) if max_examples is None else min(self.num_test(u), max_examples)
        if n == 0:
            return self._tensors([])
        return self._user("test", u, n)

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float] | None:
        """No majority-class baseline for Stack Overflow (it would read every user's data)."""
        return None

    # --------------------------------------------------------------------- metrics
    @property
    def softmax_ignore_index(self) -> int | None:
        """NWP: 0 — :meth:`loss` is the mean softmax cross-entropy over the last dimension with
        pad targets (id 0) left out, so training may compute it together with the model's output
        layer (:mod:`fedsim.models.softmax_head`). Tags: None (a sigmoid loss)."""
        return 0 if self.task == "nwp" else None

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch (mean)."""
        if self.task == "nwp":
            return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=0)
        return torch.nn.functional.binary_cross_entropy_with_logits(out, y)

    def eval_sums(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Summable evaluation counts of a batch: ``loss_sum``/``loss_count``, the headline
        ``correct``/``count`` and every ``<name>_correct``/``<name>_count`` pair."""
        if self.task == "nwp":
            flat_y = y.reshape(-1)
            loss_sum = float(
                torch.nn.functional.cross_entropy(
                    out.reshape(-1, out.shape[-1]), flat_y, ignore_index=0, reduction="sum"
                )
            )
            acc = nwp_accuracy_counts(out.argmax(-1), y, self.nwp)
            sums = {"loss_sum": loss_sum, "loss_count": float((flat_y != 0).sum()), "examples": float(len(y))}
            for name, (c, n) in acc.items():
                sums[f"acc_{name}_correct"], sums[f"acc_{name}_count"] = float(c), float(n)
            sums["correct"], sums["count"] = float(acc["pad_oov_eos"][0]), float(acc["pad_oov_eos"][1])
            return sums
        per_row = torch.nn.functional.binary_cross_entropy_with_logits(out, y, reduction="none").mean(dim=1)
        hits, predicted, true = topk_counts(out, y, 5)
        return {
            "loss_sum": float(per_row.sum()),
            "loss_count": float(len(y)),
            "examples": float(len(y)),
            "precision_at_5_correct": float(hits),
            "precision_at_5_count": float(predicted),
            "recall_at_5_correct": float(hits),
            "recall_at_5_count": float(true),
            "correct": float(hits),
            "count": float(true),
        }


class _StackOverflowOptions(LocalDataOptions):
    """The keys both Stack Overflow tasks have.

    Parameters
    ----------
    root : the folder with ``stackoverflow.sqlite[.lzma]``, ``stackoverflow.word_count[.tar.bz2]``,
        ``stackoverflow.tag_count[.tar.bz2]`` (README "Datasets").
    vocab_size : words kept from the word-count file (NWP ``V``, tag ``W``). Default 10000.
    max_elements_per_user : a user's data is its first this many stored rows (the DP-FTRL
        pipeline). Default 256.
    """

    vocab_size: int = Field(default=10000, ge=1, le=1_000_000)
    max_elements_per_user: int = Field(default=256, ge=1)

    def _root_meaning(self) -> str:
        return "the folder with the TFF Stack Overflow files"


class StackOverflowNWPOptions(_StackOverflowOptions):
    """``data.name = "stackoverflow_nwp"``: next-word prediction.

    Parameters
    ----------
    seq_len : words per sentence ``L``. Default 20.
    num_oov_buckets : OOV buckets ``k`` (FarmHash buckets as in TF). Default 1.
    """

    name: Literal["stackoverflow_nwp"] = "stackoverflow_nwp"
    seq_len: int = Field(default=20, ge=1, le=1024)
    num_oov_buckets: int = Field(default=1, ge=1, le=100_000)


class StackOverflowTagOptions(_StackOverflowOptions):
    """``data.name = "stackoverflow_tag"``: tag prediction.

    Parameters
    ----------
    tag_vocab_size : tags kept (``T``). Default 500.
    """

    name: Literal["stackoverflow_tag"] = "stackoverflow_tag"
    tag_vocab_size: int = Field(default=500, ge=1, le=100_000)


def load_stackoverflow(spec: StackOverflowNWPOptions | StackOverflowTagOptions) -> StackOverflowFederated:
    """The train clients of ``spec.root`` as users (a seeded subset with ``max_users``)."""
    assert spec.root is not None
    n_all = len(StackOverflowDB(sqlite_path(spec.root, spec.cache_dir)).clients("train"))
    keep = (
        None if spec.max_users is None or spec.max_users >= n_all else subset(n_all, spec.max_users, spec.subset_seed)
    )
    if isinstance(spec, StackOverflowNWPOptions):
        settings = SOSettings(
            "nwp", spec.vocab_size, 500, spec.seq_len, spec.num_oov_buckets, spec.max_elements_per_user
        )
    else:
        settings = SOSettings("tag", spec.vocab_size, spec.tag_vocab_size, 20, 1, spec.max_elements_per_user)
    data = StackOverflowFederated(spec.root, settings, spec.cache_dir, keep)
    check_population(data, f"{spec.root}'s train clients")
    return data


register_dataset(
    DatasetKind(
        "stackoverflow_nwp",
        StackOverflowNWPOptions,
        "nwp",
        load_stackoverflow,
        "Stack Overflow (the TFF files, local): next-word prediction",
    )
)
register_dataset(
    DatasetKind(
        "stackoverflow_tag",
        StackOverflowTagOptions,
        "tag",
        load_stackoverflow,
        "Stack Overflow (the TFF files, local): tag prediction",
    )
)
