"""A generated Stack Overflow folder in TFF's file layout, for trials, tests and CI.

It is *generated* text, not real posts: ``stackoverflow.sqlite`` (TFF's two tables and
indexes; client rows interleaved as in the real file; every client in ``train``, about a third
also in ``test``, a few in ``heldout``), ``stackoverflow.word_count`` and
``stackoverflow.tag_count``. Sentences come from a per-user Markov chain over a small
vocabulary, so next-word prediction is learnable and users differ; each post's tags depend on
its words, so tag prediction is learnable too.

Deterministic: the vocabulary, the count files and the chain depend on ``seed`` only, and
client ``k``'s posts on ``(seed, k)`` only. So folders generated with ``first_id`` offsets hold
disjoint users with the same vocabulary, and their union is exactly the folder generated with
all the users at once (what a deployment test with one folder per node needs).
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

import numpy as np

from fedsim.data.stackoverflow.example_proto import encode_example
from fedsim.data.stackoverflow.files import SQLITE, TAG_COUNT, WORD_COUNT
from fedsim.errors import FedsimError

SCHEMA = """
CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, serialized_example_proto BLOB NOT NULL);
CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);
"""
INDEXES = """
CREATE INDEX idx_client_id_split ON examples (split_name, client_id);
CREATE INDEX idx_metadata_client_id ON client_metadata (client_id);
"""


def _words(n: int) -> list[str]:
    syll = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "du"]
    return [syll[i % 10] + syll[(i // 10) % 10] + (str(i // 100) if i >= 100 else "") for i in range(n)]


def _interleave(
    rows: list[tuple[str, str, str, str, str, int]], seed: list[int]
) -> tuple[list[int], dict[tuple[str, str], list[int]]]:
    """A seeded interleaving of the clients' rows (each client's rows keep their order):
    the row order to store, and each (split, client)'s row indices."""
    rng = np.random.default_rng(seed)  # row interleaving only
    order = rng.permutation(len(rows))
    by_client: dict[tuple[str, str], list[int]] = {}
    for r, (split, cid, *_rest) in enumerate(rows):
        by_client.setdefault((split, cid), []).append(r)
    cursor = {k: 0 for k in by_client}
    placed = []
    for key in (rows[r][:2] for r in order):
        placed.append(by_client[key][cursor[key]])
        cursor[key] += 1
    return placed, by_client


def _write_database(
    path: Path,
    rows: list[tuple[str, str, str, str, str, int]],
    placed: list[int],
    by_client: dict[tuple[str, str], list[int]],
) -> None:
    """The SQLite file: ``examples`` in ``placed`` order, ``client_metadata``, the indexes."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    for r in placed:
        split, cid, tokens, title, tg, score = rows[r]
        blob = encode_example(
            {
                "creation_date": "2017-06-01 12:00:00.0 UTC",
                "score": score,
                "tags": tg,
                "title": title,
                "tokens": tokens,
                "type": "question",
            }
        )
        conn.execute("INSERT INTO examples VALUES (?, ?, ?)", (split, cid, blob))
    conn.executemany(
        "INSERT INTO client_metadata VALUES (?, ?, ?)",
        [(cid, split, len(v)) for (split, cid), v in sorted(by_client.items())],
    )
    conn.executescript(INDEXES)
    conn.commit()
    conn.close()


def _write_counts(root: Path, word_counts: Counter[str], tag_counts: Counter[str]) -> None:
    """The word-count text file and the tag-count JSON, most frequent first."""
    with open(root / WORD_COUNT, "w", encoding="utf-8") as f:
        for w, c in sorted(word_counts.items(), key=lambda kv: (-kv[1], kv[0])):
            f.write(f"{w} {c}\n")
    (root / TAG_COUNT).write_text(
        json.dumps(dict(sorted(tag_counts.items(), key=lambda kv: (-kv[1], kv[0])))), encoding="utf-8"
    )


def generate(
    root: str | Path,
    users: int = 60,
    per_user: float = 30.0,
    vocab: int = 200,
    tags: int = 20,
    seed: int = 0,
    first_id: int = 0,
) -> Path:
    """Write a generated Stack Overflow folder into ``root`` (created; must not hold a database).

    Parameters
    ----------
    users : train clients. Default 60.
    per_user : mean train examples per client (Poisson, at least 1). Default 30.
    vocab : distinct words in the text (the word-count file lists them all). Default 200.
    tags : distinct tags. Default 20.
    seed : generator seed. Default 0.
    first_id : the first client's number (clients are ``first_id .. first_id + users − 1``,
        written as 8-digit ids). Default 0.

    Returns ``root``.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if (root / SQLITE).exists():
        raise FedsimError(f"{root / SQLITE} exists; generate into an empty folder")
    if users < 1 or vocab < 10 or tags < 2 or first_id < 0:
        raise FedsimError("synthetic Stack Overflow needs users ≥ 1, vocab ≥ 10, tags ≥ 2, first_id ≥ 0")
    rng = np.random.default_rng(seed)
    words = _words(vocab)
    tag_names = [f"tag-{j}" for j in range(tags)]
    # A shared sparse transition structure, tilted per user.
    succ = rng.integers(0, vocab, size=(vocab, 4))
    ids = [f"{first_id + i:08d}" for i in range(users)]
    rows: list[tuple[str, str, str, str, str, int]] = []  # (split, client, tokens, title, tags, score)
    # Count files from the chain alone (independent of which users are generated): a word's
    # count is its in-degree in the chain plus one; a tag's, the counts of the words that carry it.
    word_counts: Counter[str] = Counter({w: 1 for w in words})
    word_counts.update(words[int(j)] for j in succ.ravel())
    tag_counts: Counter[str] = Counter()
    for i, w in enumerate(words):
        tag_counts[tag_names[i % tags]] += word_counts[w]

    def post(bias: np.ndarray, rng: np.random.Generator) -> tuple[str, str, str]:
        length = int(rng.integers(3, 28))
        w = int(rng.choice(vocab, p=bias))
        seq = [w]
        for _ in range(length - 1):
            w = int(succ[w, rng.integers(0, 4)]) if rng.random() < 0.85 else int(rng.choice(vocab, p=bias))
            seq.append(w)
        tokens = " ".join(words[i] for i in seq)
        title = " ".join(words[i] for i in seq[:3])
        t = sorted({tag_names[i % tags] for i in seq[:2]})
        return tokens, title, "|".join(t)

    for i, cid in enumerate(ids):
        k = first_id + i
        urng = np.random.default_rng([seed, k])
        bias = urng.dirichlet(np.full(vocab, 0.3))
        n_train = max(1, int(urng.poisson(per_user)))
        for split, n in (
            ("train", n_train),
            ("test", max(1, n_train // 4) if k % 3 == 0 else 0),
            ("heldout", 2 if k % 10 == 9 else 0),
        ):
            for _ in range(n):
                tokens, title, tg = post(bias, urng)
                rows.append((split, cid, tokens, title, tg, int(urng.integers(-2, 20))))
    placed, by_client = _interleave(rows, [seed, first_id, users, 1])
    _write_database(root / SQLITE, rows, placed, by_client)
    _write_counts(root, word_counts, tag_counts)
    return root
