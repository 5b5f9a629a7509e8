"""Reading TFF's ``stackoverflow.sqlite`` (docs/stackoverflow_format.md A2) without loading it.

- The database is opened read-only; the tables ``examples`` (columns ``split_name``,
  ``client_id``, ``serialized_example_proto``) and ``client_metadata`` (``client_id``,
  ``split_name``, ``num_examples``) must exist. Columns are selected by name.
- A split's clients: ``SELECT DISTINCT client_id FROM client_metadata WHERE split_name = ?``,
  then Python ``sorted`` (code-point order). Ids stay opaque text.
- A client's examples: ``... WHERE split_name = ? AND client_id = ? ORDER BY rowid``, with an
  optional ``LIMIT`` (the DP-FTRL pipeline's first-``N``-in-stored-order cap). SQLite answers
  it through the ``(split_name, client_id)`` index when the database has it; a database
  without it is read correctly but slowly (``fedsim`` says so once).
Memory: the client list of a split (342,477 short strings for train) and one client's rows
at a time.
"""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

from fedsim.errors import FedsimError

SPLITS = ("train", "heldout", "test")
REQUIRED = {
    "examples": ("split_name", "client_id", "serialized_example_proto"),
    "client_metadata": ("client_id", "split_name", "num_examples"),
}


class StackOverflowDB:
    """Read-only access to one ``stackoverflow.sqlite``.

    Parameters
    ----------
    path : the SQLite file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FedsimError(f"{self.path}: no such database file")
        try:
            self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for table, cols in REQUIRED.items():
                if table not in tables:
                    raise FedsimError(
                        f"{self.path}: table '{table}' is missing; this is not TFF's "
                        f"stackoverflow.sqlite (tables found: {sorted(tables)})"
                    )
                have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
                missing = [c for c in cols if c not in have]
                if missing:
                    raise FedsimError(f"{self.path}: table '{table}' lacks column(s) {missing}")
            indexed = any(
                [r[2] for r in self.conn.execute(f"PRAGMA index_info('{name}')")][:2] == ["split_name", "client_id"]
                for (name,) in self.conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'examples'"
                )
            )
        except sqlite3.DatabaseError as e:
            raise FedsimError(
                f"{self.path}: not a readable SQLite database ({e}); if it was decompressed "
                f"from the .lzma download, delete it and let fedsim decompress it again"
            ) from None
        self.indexed = indexed
        if not indexed:
            warnings.warn(
                f"{self.path} has no (split_name, client_id) index on examples: reading a client scans the whole table",
                stacklevel=2,
            )

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise FedsimError(
                f"{self.path}: database read failed ({e}); the file may be truncated or "
                f"corrupted: download or decompress it again"
            ) from None

    def clients(self, split: str) -> list[str]:
        """The sorted client ids of ``split`` (from ``client_metadata``)."""
        _check_split(split)
        rows = self._query("SELECT DISTINCT client_id FROM client_metadata WHERE split_name = ?", (split,))
        return sorted(r[0] for r in rows)

    def client_counts(self, split: str) -> tuple[list[str], list[int]]:
        """The sorted client ids of ``split`` and each one's ``num_examples`` (summed over
        duplicate metadata rows), from ``client_metadata``."""
        _check_split(split)
        rows = self._query(
            "SELECT client_id, SUM(num_examples) FROM client_metadata WHERE split_name = ? GROUP BY client_id", (split,)
        )
        rows.sort(key=lambda r: r[0])
        return [r[0] for r in rows], [int(r[1] or 0) for r in rows]

    def examples(self, split: str, client_id: str, limit: int | None = None) -> list[bytes]:
        """The serialized examples of (``split``, ``client_id``) in stored (rowid) order; at most
        ``limit`` (the first ones) when given."""
        _check_split(split)
        sql = "SELECT serialized_example_proto FROM examples WHERE split_name = ? AND client_id = ? ORDER BY rowid"
        args: tuple = (split, client_id)
        if limit is not None:
            sql += " LIMIT ?"
            args += (int(limit),)
        return [bytes(r[0]) for r in self._query(sql, args)]

    def stats(self) -> dict[str, dict[str, int]]:
        """``{split: {"num_clients", "num_examples"}}`` from ``client_metadata``."""
        rows = self._query(
            "SELECT split_name, COUNT(DISTINCT client_id), SUM(num_examples) FROM client_metadata GROUP BY split_name"
        )
        return {s: {"num_clients": int(n), "num_examples": int(e or 0)} for s, n, e in rows}

    def close(self) -> None:
        self.conn.close()


def ensure_index(path: str | Path) -> bool:
    """Create the ``(split_name, client_id)`` index on ``examples`` if the database lacks it
    (needs write access; done once). Returns whether it was created."""
    if StackOverflowDB(path).indexed:
        return False
    try:
        conn = sqlite3.connect(path)
        conn.execute("CREATE INDEX IF NOT EXISTS idx_client_id_split ON examples (split_name, client_id)")
        conn.commit()
        conn.close()
    except sqlite3.DatabaseError as e:
        raise FedsimError(
            f"{path}: could not create the (split_name, client_id) index ({e}); the file must be writable once"
        ) from None
    return True


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise FedsimError(f"split {split!r} is not one of {', '.join(SPLITS)} (TFF's names: not 'held_out', not 'val')")
