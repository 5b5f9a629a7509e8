"""Next-word and tag prediction preprocessing and metrics, on bytes, as TFF does
(docs/stackoverflow_format.md A5, A6).

Next-word prediction, with ``V = len(vocab)``, ``k`` OOV buckets and sequence length ``L``:
``words = tokens.split(b' ')`` (empty words kept, like ``tf.strings.split(sep=' ')``), keep
the first ``L``; word ``i`` of the vocabulary → ``i + 1``; OOV → ``V + 1`` (``k = 1``);
append EOS only if fewer than ``L`` words were kept; prepend BOS. Special ids: pad 0, OOV
``V+1..V+k``, BOS ``V+k+1``, EOS ``V+k+2``; ``V + 3 + k`` classes. Rows are padded with 0 to
``L + 1``; ``x = row[:-1]``, ``y = row[1:]``. With ``k > 1`` an OOV word's id is
``V + 1 + Fingerprint64(word) mod k`` (FarmHash, what TF's ``to_hash_bucket_fast`` computes).

Tag prediction, with ``W`` words and ``T`` tags: ``x[i]`` = occurrences of vocabulary word
``i`` in ``(tokens + b' ' + title).split()`` (ASCII whitespace runs, no empty words) divided
by the number of in-vocabulary words (all zeros if none); ``y[j]`` = occurrences of tag ``j``
in ``tags.split(b'|')`` (OOV tags and the empty tag ignored).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fedsim.data.stackoverflow.farmhash import hash_bucket
from fedsim.errors import FedsimError

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch


@dataclass
class NWPSpec:
    """Next-word prediction settings (TFF defaults: ``L = 20``, ``k = 1``).

    Parameters
    ----------
    vocab : the word vocabulary (UTF-8 bytes, file order), ``V = len(vocab)``.
    seq_len : ``L``.
    num_oov_buckets : ``k``; an OOV word goes to bucket ``Fingerprint64(word) mod k`` (FarmHash,
        as ``tf.strings.to_hash_bucket_fast``; :mod:`fedsim.data.stackoverflow.farmhash`).
    """

    vocab: list[bytes]
    seq_len: int = 20
    num_oov_buckets: int = 1
    index: dict[bytes, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise FedsimError("data.seq_len must be ≥ 1")
        if self.num_oov_buckets < 1:
            raise FedsimError("data.num_oov_buckets must be ≥ 1")
        self.index = {w: i + 1 for i, w in enumerate(self.vocab)}

    @property
    def V(self) -> int:
        return len(self.vocab)

    @property
    def oov(self) -> int:
        return self.V + 1

    @property
    def bos(self) -> int:
        return self.V + self.num_oov_buckets + 1

    @property
    def eos(self) -> int:
        return self.V + self.num_oov_buckets + 2

    @property
    def num_classes(self) -> int:
        return self.V + 3 + self.num_oov_buckets

    def ids(self, tokens: bytes) -> list[int]:
        """The unpadded id sequence of one sentence: ``[BOS, w_1..w_m, (EOS)]``, ``m ≤ L``."""
        words = tokens.split(b" ")[: self.seq_len]
        k = self.num_oov_buckets
        if k == 1:
            out = [self.bos] + [self.index.get(w, self.oov) for w in words]
        else:
            out = [self.bos] + [self.index.get(w) or self.oov + hash_bucket(w, k) for w in words]
        if len(words) < self.seq_len:
            out.append(self.eos)
        return out

    def xy(self, tokens_list: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` int64 ``[n, L]`` for a list of sentences (padded with 0)."""
        L = self.seq_len
        rows = np.zeros((len(tokens_list), L + 1), dtype=np.int64)
        for r, tok in enumerate(tokens_list):
            ids = self.ids(tok)
            rows[r, : len(ids)] = ids
        t = torch.from_numpy(rows)
        return t[:, :-1], t[:, 1:]


def nwp_accuracy_counts(pred: torch.Tensor, y: torch.Tensor, spec: NWPSpec) -> dict[str, tuple[int, int]]:
    """Correct and counted predictions under TFF's three masks: ``pad`` (pad excluded),
    ``pad_oov`` (pad and OOV excluded), ``pad_oov_eos`` (pad, OOV and EOS excluded)."""
    correct = pred == y
    pad = y != 0
    oov = (y >= spec.oov) & (y < spec.oov + spec.num_oov_buckets)
    eos = y == spec.eos
    out = {}
    for name, mask in (("pad", pad), ("pad_oov", pad & ~oov), ("pad_oov_eos", pad & ~oov & ~eos)):
        out[name] = (int((correct & mask).sum()), int(mask.sum()))
    return out


def _ws_split(b: bytes) -> list[bytes]:
    return b.split()  # bytes.split(): runs of ASCII whitespace, no empty words


def tag_xy(
    tokens: bytes, title: bytes, tags: bytes, word_index: dict[bytes, int], tag_index: dict[bytes, int]
) -> tuple[np.ndarray, np.ndarray]:
    """One example's ``(x [W], y [T])`` float32 (``word_index``: word → 0..W−1, likewise tags)."""
    W, T = len(word_index), len(tag_index)
    x = np.zeros(W, dtype=np.float32)
    for w in _ws_split(tokens + b" " + title):
        i = word_index.get(w)
        if i is not None:
            x[i] += 1.0
    s = x.sum()
    if s > 0:
        x /= s
    y = np.zeros(T, dtype=np.float32)
    for t in tags.split(b"|"):
        j = tag_index.get(t)
        if j is not None:
            y[j] += 1.0
    return x, y


def topk_counts(scores: torch.Tensor, y: torch.Tensor, k: int = 5) -> tuple[int, int, int]:
    """Counts for micro-averaged precision@k and recall@k, as Keras's ``Precision(top_k=k)`` and
    ``Recall(top_k=k)`` (TFF's tag metrics) accumulate them: ``(hits, predicted, true)`` with
    ``hits`` = true tags among each row's top ``k`` scores, ``predicted = k·rows`` and ``true`` =
    the number of true tags (``y > 0``). Precision = hits/predicted, recall = hits/true."""
    kk = min(k, scores.shape[1])
    top = scores.topk(kk, dim=1).indices
    truth = y > 0
    hits = int(truth.gather(1, top).sum())
    return hits, kk * int(scores.shape[0]), int(truth.sum())
