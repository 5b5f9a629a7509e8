"""Stack Overflow data layer at the real scale's shape: memory and time per user read.

Generates (once) a synthetic ``stackoverflow.sqlite`` with TFF's schema and indexes:
342,477 train clients with about 40 examples each (Poisson), generated text (not real posts),
client rows interleaved as in the real file. Then, in a fresh process state, it lists the
train clients and reads and decodes 1,000 random clients, reporting the resident set size
(``VmRSS``/``VmHWM``) after each step and the time per client read.

Usage::

    python benchmarks/stackoverflow_scale.py [--users 342477] [--per-user 40] [--db PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import time
from pathlib import Path

import numpy as np

from fedsim.data.stackoverflow.database import StackOverflowDB
from fedsim.data.stackoverflow.example_proto import decode_example, encode_example

SCHEMA = """
CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, serialized_example_proto BLOB NOT NULL);
CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);
"""
WORDS = [f"w{i}" for i in range(5000)]


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return -1.0


def generate(path: Path, users: int, per_user: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    counts = np.maximum(1, rng.poisson(per_user, size=users))
    ids = [f"{i:08d}" for i in range(users)]
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    conn.executemany(
        "INSERT INTO client_metadata VALUES (?, 'train', ?)", ((ids[i], int(counts[i])) for i in range(users))
    )
    # Interleave clients: write in rounds, each round one example of every client that has one left.
    remaining = counts.copy()
    pyrng = random.Random(seed)
    batch = []
    t = 0
    while remaining.any():
        live = np.nonzero(remaining)[0]
        for i in live:
            n = pyrng.randint(3, 25)
            toks = " ".join(pyrng.choice(WORDS) for _ in range(n))
            batch.append(
                (
                    "train",
                    ids[i],
                    encode_example(
                        {
                            "creation_date": "2016-01-01 00:00:00 UTC",
                            "score": pyrng.randint(-3, 50),
                            "tags": "w1|w2",
                            "title": "a generated title",
                            "tokens": toks,
                            "type": "question",
                        }
                    ),
                )
            )
            if len(batch) >= 200_000:
                conn.executemany("INSERT INTO examples VALUES (?, ?, ?)", batch)
                batch.clear()
        remaining[live] -= 1
        t += 1
    if batch:
        conn.executemany("INSERT INTO examples VALUES (?, ?, ?)", batch)
    conn.execute("CREATE INDEX idx_client_id_split ON examples (split_name, client_id)")
    conn.execute("CREATE INDEX idx_metadata_client_id ON client_metadata (client_id)")
    conn.commit()
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=342_477)
    ap.add_argument("--per-user", type=float, default=40.0)
    ap.add_argument("--reads", type=int, default=1000)
    ap.add_argument("--db", type=Path, default=Path("/tmp/fedsim-so-scale.sqlite"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate_only:
        generate(args.db, args.users, args.per_user)
        return
    out: dict = {"users": args.users, "per_user": args.per_user}
    if not args.db.exists():  # generate in a child process, so its memory does not count below
        import subprocess
        import sys

        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--generate-only",
                "--users",
                str(args.users),
                "--per-user",
                str(args.per_user),
                "--db",
                str(args.db),
            ],
            check=True,
        )
        out["generate_seconds"] = time.perf_counter() - t0
    out["db_bytes"] = args.db.stat().st_size
    out["rss_start_mib"] = _status_mib("VmRSS")
    t0 = time.perf_counter()
    db = StackOverflowDB(args.db)
    clients = db.clients("train")
    out["list_seconds"] = time.perf_counter() - t0
    out["num_clients"] = len(clients)
    out["rss_after_list_mib"] = _status_mib("VmRSS")
    rng = random.Random(1)
    picks = rng.sample(clients, min(args.reads, len(clients)))
    t0 = time.perf_counter()
    n_ex = 0
    for c in picks:
        rows = [decode_example(b) for b in db.examples("train", c)]
        n_ex += len(rows)
    dt = time.perf_counter() - t0
    out.update(
        reads=len(picks),
        examples_read=n_ex,
        ms_per_client=1000 * dt / len(picks),
        us_per_example=1e6 * dt / max(n_ex, 1),
        rss_after_reads_mib=_status_mib("VmRSS"),
        peak_rss_mib=_status_mib("VmHWM"),
    )
    print(json.dumps(out, indent=1) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
