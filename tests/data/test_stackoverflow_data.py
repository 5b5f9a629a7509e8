"""Stack Overflow data layer on hand-built fixtures (docs/stackoverflow_format.md A1–A6)."""

from __future__ import annotations

import io
import json
import lzma
import sqlite3
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.data.stackoverflow.database import StackOverflowDB
from fedsim.data.stackoverflow.example_proto import decode_example, encode_example
from fedsim.data.stackoverflow.files import (
    SQLITE,
    TAG_COUNT,
    WORD_COUNT,
    count_file,
    sqlite_path,
    verify_sha256,
)
from fedsim.data.stackoverflow.preprocess import NWPSpec, nwp_accuracy_counts, tag_xy, topk_counts
from fedsim.data.stackoverflow.vocab import load_tag_vocab, load_word_vocab
from fedsim.errors import FedsimError

SCHEMA = """
CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, serialized_example_proto BLOB NOT NULL);
CREATE INDEX idx_client_id_split ON examples (split_name, client_id);
CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);
CREATE INDEX idx_metadata_client_id ON client_metadata (client_id);
"""


def _ex(tokens: str, tags: str = "python", title: str = "a title", score: int = 1, typ: str = "question") -> bytes:
    return encode_example(
        {
            "creation_date": "2014-11-23 22:05:31.08 UTC",
            "score": score,
            "tags": tags,
            "title": title,
            "tokens": tokens,
            "type": typ,
        }
    )


#: (split, client, tokens) in insertion order: client rows are interleaved (not contiguous) and
#: the client "00042" is in train and test with different examples.
ROWS = [
    ("train", "00042", "first post of 42"),
    ("train", "b", "hello world"),
    ("test", "00042", "a test sentence"),
    ("train", "00042", "second post of 42"),
    ("heldout", "h1", "held out text"),
    ("train", "B", "capital b"),
    ("train", "00042", "third post of 42"),
]


def make_db(path: Path, rows=ROWS, index: bool = True) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA if index else SCHEMA.replace("CREATE INDEX idx_client_id_split", "-- "))
    for split, client, tokens in rows:
        conn.execute("INSERT INTO examples VALUES (?, ?, ?)", (split, client, _ex(tokens)))
    counts: dict = {}
    for split, client, _ in rows:
        counts[(split, client)] = counts.get((split, client), 0) + 1
    for (split, client), n in sorted(counts.items(), key=lambda kv: kv[0][1], reverse=True):
        conn.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (client, split, n))
    conn.commit()
    conn.close()
    return path


# ------------------------------------------------------------------------- A1 files


@pytest.mark.parametrize("fmt", [lzma.FORMAT_XZ, lzma.FORMAT_ALONE], ids=["xz", "lzma_alone"])
def test_both_lzma_containers_decompress_once(tmp_path, fmt):
    raw = make_db(tmp_path / "raw.sqlite").read_bytes()
    root = tmp_path / "root"
    root.mkdir()
    (root / (SQLITE + ".lzma")).write_bytes(lzma.compress(raw, format=fmt))
    p = sqlite_path(root)
    assert p.read_bytes() == raw and p.parent == root / ".fedsim-cache"
    mtime = p.stat().st_mtime_ns
    assert sqlite_path(root) == p and p.stat().st_mtime_ns == mtime  # reused, not redone
    assert StackOverflowDB(p).clients("train") == ["00042", "B", "b"]


def test_truncated_lzma_names_the_file_and_leaves_nothing(tmp_path):
    raw = make_db(tmp_path / "raw.sqlite").read_bytes()
    root = tmp_path / "root"
    root.mkdir()
    blob = lzma.compress(raw)
    (root / (SQLITE + ".lzma")).write_bytes(blob[: len(blob) // 2])
    with pytest.raises(FedsimError, match="truncated|not a valid"):
        sqlite_path(root)
    assert not list((root / ".fedsim-cache").glob("*"))  # no partial database left behind
    (root / (SQLITE + ".lzma")).write_bytes(b"not lzma at all")
    with pytest.raises(FedsimError, match="stackoverflow.sqlite.lzma"):
        sqlite_path(root)


def test_plain_files_win_and_missing_files_say_what_to_download(tmp_path):
    with pytest.raises(FedsimError, match="not a folder"):
        sqlite_path(tmp_path / "nope")
    with pytest.raises(FedsimError, match="download"):
        sqlite_path(tmp_path)
    make_db(tmp_path / SQLITE)
    assert sqlite_path(tmp_path) == tmp_path / SQLITE
    with pytest.raises(FedsimError, match="word_count"):
        count_file(tmp_path, WORD_COUNT)


def _tar_bz2(path: Path, member: str, data: bytes) -> None:
    with tarfile.open(path, "w:bz2") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_count_archives_extract_and_verify(tmp_path):
    text = b"the 10\nof 7\n"
    _tar_bz2(tmp_path / (WORD_COUNT + ".tar.bz2"), WORD_COUNT, text)
    p = count_file(tmp_path, WORD_COUNT)
    assert p.read_bytes() == text
    with pytest.raises(FedsimError, match="sha256"):
        verify_sha256(tmp_path / (WORD_COUNT + ".tar.bz2"))  # a fixture is not TFF's file
    import hashlib

    verify_sha256(p, hashlib.sha256(text).hexdigest())
    _tar_bz2(tmp_path / (TAG_COUNT + ".tar.bz2"), "other_name", b"{}")
    with pytest.raises(FedsimError, match="no file named"):
        count_file(tmp_path, TAG_COUNT)


# ------------------------------------------------------------------------- A2 database


def test_clients_sorted_opaque_and_examples_in_rowid_order(tmp_path):
    db = StackOverflowDB(make_db(tmp_path / "so.sqlite"))
    assert db.clients("train") == ["00042", "B", "b"]  # code-point order; ids stay text
    assert db.clients("test") == ["00042"] and db.clients("heldout") == ["h1"]
    toks = [decode_example(b)["tokens"] for b in db.examples("train", "00042")]
    assert toks == ["first post of 42", "second post of 42", "third post of 42"]
    assert [decode_example(b)["tokens"] for b in db.examples("test", "00042")] == ["a test sentence"]
    assert [decode_example(b)["tokens"] for b in db.examples("train", "00042", limit=2)] == toks[:2]
    assert db.stats() == {
        "train": {"num_clients": 3, "num_examples": 5},
        "test": {"num_clients": 1, "num_examples": 1},
        "heldout": {"num_clients": 1, "num_examples": 1},
    }
    with pytest.raises(FedsimError, match="held_out"):
        db.clients("held_out")


def test_database_errors_name_the_file(tmp_path):
    bad = tmp_path / "garbage.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(FedsimError, match="garbage.sqlite"):
        StackOverflowDB(bad)
    conn = sqlite3.connect(tmp_path / "wrong.sqlite")
    conn.executescript(
        "CREATE TABLE examples (split_name TEXT, client_id TEXT, blob BLOB);"
        "CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INT);"
    )
    conn.close()
    with pytest.raises(FedsimError, match="serialized_example_proto"):
        StackOverflowDB(tmp_path / "wrong.sqlite")
    conn = sqlite3.connect(tmp_path / "notables.sqlite")
    conn.executescript("CREATE TABLE t (a INT);")
    conn.close()
    with pytest.raises(FedsimError, match="table 'examples' is missing"):
        StackOverflowDB(tmp_path / "notables.sqlite")
    # a truncated database: the header survives, the pages do not
    good = make_db(tmp_path / "good.sqlite").read_bytes()
    (tmp_path / "trunc.sqlite").write_bytes(good[:1024])
    with pytest.raises(FedsimError, match="trunc.sqlite"):
        db = StackOverflowDB(tmp_path / "trunc.sqlite")
        db.examples("train", "00042")


def test_database_without_the_index_still_reads_in_rowid_order(tmp_path):
    with pytest.warns(UserWarning, match="index"):
        db = StackOverflowDB(make_db(tmp_path / "noidx.sqlite", index=False))
    assert [decode_example(b)["tokens"] for b in db.examples("train", "00042")][-1] == "third post of 42"


# ------------------------------------------------------------------------- A4 vocabularies


def test_word_vocab_keeps_file_order_ties_and_truncates(tmp_path):
    p = tmp_path / "wc"
    p.write_text("the 10\nzeta 5\nalpha 5\ncafé 5\nrare 1\n", encoding="utf-8")
    assert load_word_vocab(p, 3) == [b"the", b"zeta", b"alpha"]  # ties keep file order
    assert load_word_vocab(p, 100) == [b"the", b"zeta", b"alpha", "café".encode(), b"rare"]  # shorter
    assert load_word_vocab(p, None)[-1] == b"rare"
    (tmp_path / "tabbed").write_text("a\t3\nb\t2\n", encoding="utf-8")
    assert load_word_vocab(tmp_path / "tabbed", 10) == [b"a", b"b"]
    (tmp_path / "broken").write_text("a 3\nb two words\n", encoding="utf-8")
    with pytest.raises(FedsimError, match="broken:2"):
        load_word_vocab(tmp_path / "broken", 10)
    with pytest.raises(FedsimError, match="vocab_size"):
        load_word_vocab(p, 0)


def test_tag_vocab_sorted_by_count_stably(tmp_path):
    p = tmp_path / "tc"
    p.write_text(json.dumps({"java": 3, "c++": 9, "node . js": 3, "html": 3, "rust": 1}), encoding="utf-8")
    assert load_tag_vocab(p, None) == [b"c++", b"java", b"node . js", b"html", b"rust"]
    assert load_tag_vocab(p, 2) == [b"c++", b"java"]
    (tmp_path / "bad").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(FedsimError, match="JSON object"):
        load_tag_vocab(tmp_path / "bad", 5)


# ------------------------------------------------------------------------- A5 next-word prediction

VOCAB = [b"the", b"cat", "café".encode(), b"sat"]  # V = 4 → OOV 5, BOS 6, EOS 7, 8 classes


def test_nwp_special_ids_and_lengths():
    s = NWPSpec(VOCAB, seq_len=3)
    assert (s.oov, s.bos, s.eos, s.num_classes) == (5, 6, 7, 8)
    assert s.ids(b"the cat") == [6, 1, 2, 7]  # L−1 words: EOS
    assert s.ids(b"the cat sat") == [6, 1, 2, 4]  # exactly L: no EOS
    assert s.ids(b"the cat sat the") == [6, 1, 2, 4]  # L+1: truncated, no EOS
    assert s.ids("café dog".encode()) == [6, 3, 5, 7]  # UTF-8 word, OOV word
    assert s.ids(b"") == [6, 5, 7]  # [b''] is one OOV word
    assert s.ids(b"the  cat") == [6, 1, 5, 2]  # double space: an empty (OOV) word
    assert s.ids(b" the") == [6, 5, 1, 7]
    x, y = s.xy([b"the cat", b"the cat sat the"])
    assert x.tolist() == [[6, 1, 2], [6, 1, 2]] and y.tolist() == [[1, 2, 7], [1, 2, 4]]
    assert x.dtype == torch.int64 and x.shape == (2, 3)
    short = NWPSpec(VOCAB, seq_len=5)
    x, y = short.xy([b"the"])
    assert x.tolist() == [[6, 1, 7, 0, 0]] and y.tolist() == [[1, 7, 0, 0, 0]]  # padded with 0
    with pytest.raises(FedsimError, match="num_oov_buckets"):
        NWPSpec(VOCAB, num_oov_buckets=0)


def test_nwp_three_masked_accuracies():
    s = NWPSpec(VOCAB, seq_len=4)
    y = torch.tensor([[1, 5, 7, 0]])  # word, OOV, EOS, pad
    pred = torch.tensor([[1, 5, 7, 0]])  # all right
    c = nwp_accuracy_counts(pred, y, s)
    assert c == {"pad": (3, 3), "pad_oov": (2, 2), "pad_oov_eos": (1, 1)}
    pred = torch.tensor([[2, 5, 7, 3]])  # the word wrong
    c = nwp_accuracy_counts(pred, y, s)
    assert c == {"pad": (2, 3), "pad_oov": (1, 2), "pad_oov_eos": (0, 1)}


# ------------------------------------------------------------------------- A6 tag prediction


def test_tag_features_follow_tff():
    words = {b"how": 0, b"to": 1, b"sort": 2}
    tags = {b"python": 0, b"node . js": 1}
    x, y = tag_xy(b"how to  sort\tit", b"how sort", b"python|node . js|unknown", words, tags)
    # in-vocabulary words: how ×2, to ×1, sort ×2 (OOV "it" dropped from the denominator)
    np.testing.assert_allclose(x, [2 / 5, 1 / 5, 2 / 5])
    np.testing.assert_array_equal(y, [1.0, 1.0])
    x, y = tag_xy(b"nothing here", b"", b"", words, tags)
    assert not x.any() and not y.any()  # no in-vocab words: zeros; empty tags: nothing
    x, _ = tag_xy("how\u00a0to".encode(), b"", b"python", words, tags)  # U+00A0 does not split
    assert not x.any()


def test_topk_counts_micro_average():
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.0], [0.1, 0.2, 0.3, 0.4]])
    y = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    hits, predicted, true = topk_counts(scores, y, k=2)
    assert (hits, predicted, true) == (2, 4, 3)  # row 1: tag 0 in top 2; row 2: tag 3 in top 2


# ------------------------------------------------------------------------- CLI


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "so"
    root.mkdir()
    raw = make_db(tmp_path / "raw.sqlite").read_bytes()
    (root / (SQLITE + ".lzma")).write_bytes(lzma.compress(raw, format=lzma.FORMAT_ALONE))
    _tar_bz2(root / (WORD_COUNT + ".tar.bz2"), WORD_COUNT, b"of 9\npost 8\nfirst 7\n42 6\n")
    (root / TAG_COUNT).write_text(json.dumps({"java": 2, "python": 5}), encoding="utf-8")
    return root


def test_cli_show_and_stats(tmp_path, capsys):
    from helpers import run_cli

    root = _root(tmp_path)
    code, out, err = run_cli(
        capsys,
        "data",
        "show",
        "stackoverflow_nwp",
        "--root",
        str(root),
        "--split",
        "train",
        "--client",
        "00042",
        "--seq-len",
        "5",
        "--json",
    )
    assert code == 0, err
    r = json.loads(out)
    assert r["dataset"] == "stackoverflow_nwp" and r["client_id"] == "00042" and r["split"] == "train"
    first = r["examples"][0]
    assert set(first) >= {"creation_date", "score", "tags", "title", "tokens", "type", "ids", "x", "y"}
    assert first["tokens"] == "first post of 42" and first["score"] == 1
    # V = 4: of 1, post 2, first 3, 42 4; OOV 5, BOS 6, EOS 7; 4 words < L = 5 → EOS
    assert first["ids"] == [6, 3, 2, 1, 4, 7]
    assert first["x"] == [6, 3, 2, 1, 4] and first["y"] == [3, 2, 1, 4, 7]
    assert [e["tokens"] for e in r["examples"]] == ["first post of 42", "second post of 42", "third post of 42"]
    code, out, _ = run_cli(
        capsys,
        "data",
        "show",
        "stackoverflow_tag",
        "--root",
        str(root),
        "--client",
        "b",
        "--word-vocab-size",
        "3",
        "--json",
    )
    t = json.loads(out)["examples"][0]
    assert len(t["x"]) == 3 and t["y"] == [1.0, 0.0]  # tags sorted by count: python, java
    code, out, _ = run_cli(capsys, "data", "stats", "stackoverflow_nwp", "--root", str(root), "--json")
    assert json.loads(out)["splits"]["train"] == {"num_clients": 3, "num_examples": 5}
    code, _, err = run_cli(capsys, "data", "show", "stackoverflow_nwp", "--root", str(root), "--client", "zz")
    assert code == 2 and "not in split" in err
