"""Vocabularies from TFF's count files (docs/stackoverflow_format.md A4).

- ``stackoverflow.word_count``: one ``word<whitespace>count`` line per word, most frequent
  first. File order is kept (ties included); reading stops once ``vocab_size`` distinct words
  are read (None: all). Read as UTF-8; words are looked up as their UTF-8 bytes.
- ``stackoverflow.tag_count``: one JSON object ``{tag: count}``, sorted by count descending
  with a stable sort, so equal counts keep file order; the first ``tag_vocab_size`` tags.
If a file has fewer entries than asked for, the vocabulary is shorter, and every id derives
from its real length.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedsim.errors import FedsimError


def _check_size(name: str, size: int | None) -> None:
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise FedsimError(f"{name} must be a positive integer or None (all), got {size!r}")


def load_word_vocab(path: str | Path, vocab_size: int | None = 10000) -> list[bytes]:
    """The first ``vocab_size`` distinct words of the word-count file, in file order (UTF-8 bytes)."""
    _check_size("vocab_size", vocab_size)
    counts: dict[str, int] = {}
    p = Path(path)
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if vocab_size is not None and len(counts) >= vocab_size:
                break
            parts = line.split()
            if len(parts) != 2:
                raise FedsimError(f"{p}:{lineno}: expected 'word count', got {line.rstrip()!r}")
            word, count = parts
            try:
                counts[word] = int(count)
            except ValueError:
                raise FedsimError(f"{p}:{lineno}: the count {count!r} is not an integer") from None
    return [w.encode("utf-8") for w in counts]


def load_tag_vocab(path: str | Path, tag_vocab_size: int | None = 500) -> list[bytes]:
    """The ``tag_vocab_size`` most frequent tags (stable: ties keep file order), as UTF-8 bytes."""
    _check_size("tag_vocab_size", tag_vocab_size)
    p = Path(path)
    try:
        counts = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FedsimError(f"{p}: not a JSON object of tag counts ({e})") from None
    if not isinstance(counts, dict):
        raise FedsimError(f"{p}: expected a JSON object {{tag: count}}, got {type(counts).__name__}")
    tags = [t for t, _ in sorted(counts.items(), key=lambda kv: kv[1], reverse=True)]
    return [t.encode("utf-8") for t in (tags if tag_vocab_size is None else tags[:tag_vocab_size])]
