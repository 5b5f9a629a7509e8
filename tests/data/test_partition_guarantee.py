"""What a partitioned table's ε means (issue 44, part 3): nothing for its people or rows.

The neighbouring pair: a table of 600 rows, one person per row, split into 12 partitions; the same
table without one person. A per-row (or per-person) guarantee would need every other person to
stay in the same partition. Flower Datasets' partitioners cut the whole table, so other people
move: on the previous main the header nevertheless said that ε "protects one partition's rows".
"""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.data.table import TableOptions, _partition
from fedsim.runner.build import partition_note


def _table(drop: int | None):
    from datasets import Dataset

    rng = np.random.default_rng(5)
    person = np.arange(600)
    label = rng.integers(0, 4, 600)
    keep = person != drop
    return Dataset.from_dict({"person": person[keep].tolist(), "y": label[keep].tolist()})


def _assignment(ds, partitioner: str) -> dict[int, int]:
    spec = TableOptions(
        name="table",
        root="unused.parquet",
        label="y",
        features=["person"],
        partitioner=partitioner,
        num_partitions=12,
        alpha=0.5,
    )
    people = np.asarray(ds["person"])
    return {int(p): i for i, rows in enumerate(_partition(ds, spec)) for p in people[rows]}


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet"])
def test_removing_one_person_moves_other_people(partitioner):
    before = _assignment(_table(None), partitioner)
    after = _assignment(_table(300), partitioner)
    moved = [p for p in after if after[p] != before[p]]
    changed_partitions = {before[p] for p in moved} | {after[p] for p in moved}
    # another person changes partition (two partitions change besides the removed person's): no
    # per-row statement can hold for these users ...
    assert len(moved) >= 1 and len(changed_partitions) >= 2, (len(moved), changed_partitions)
    # ... and the header and ledger note say exactly that, not that a partition's rows are protected
    note = partition_note(partitioner)
    assert "NO GUARANTEE for the people or rows" in note and "protects" not in note


def test_the_docs_say_what_the_header_says():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for page in ("docs/threat-model.md", "docs/howto/own-data.md"):
        text = " ".join((root / page).read_text(encoding="utf-8").split())
        assert "no guarantee for the people or rows" in text.lower(), page
