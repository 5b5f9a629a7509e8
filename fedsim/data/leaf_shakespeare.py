"""LEAF's Shakespeare from a local Hugging Face folder (``flwrlabs/shakespeare``), as users.

``data.name = "shakespeare_leaf"``, ``data.root`` = the folder with ``shakespeare.csv`` as
downloaded (or a ``save_to_disk`` / parquet copy). Published columns: ``character_id`` (the
user: a play's speaking role), ``x`` (the preceding characters, 80 in LEAF) and ``y`` (the next
character). Users come from flwr-datasets' ``NaturalIdPartitioner`` on ``character_id`` (in its
partition order); each user's rows in stored order are split ``⌊0.8·n⌋`` train / rest test
(LEAF's Shakespeare fraction). Users with fewer than 2 rows are dropped. Characters are encoded
with the bundled Shakespeare vocabulary (printable ASCII; anything else is the unknown id), so
the models and metrics are those of ``data.name = "shakespeare"``.

Encoded rows are cached once under ``$FEDSIM_CACHE/arrays/`` and memory-mapped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np

from fedsim.data import shakespeare
from fedsim.data.base import CachedArrays, TopOneClassification
from fedsim.data.hf_local import build_once, cache_folder, load_hf_folder, split_source, user_contiguous
from fedsim.data.registry import DatasetKind, LocalDataOptions, register_dataset, subset
from fedsim.errors import FedsimError

CACHE_VERSION = 1
COLUMNS = ("character_id", "x", "y")


def _build(root: Path, cache: Path, tmp: Path) -> None:
    from flwr_datasets.partitioner import NaturalIdPartitioner

    splits = load_hf_folder(root, cache)
    ds = splits.get("train")
    if ds is None:
        raise FedsimError(f"{root}: no 'train' split; found {sorted(splits)}")
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        raise FedsimError(
            f"{split_source(root, 'train')}: lacks column(s) {missing} of the flwrlabs/shakespeare layout "
            f"(expected {list(COLUMNS)}; found {sorted(ds.column_names)})"
        )
    xs, ys = ds["x"], ds["y"]
    if not xs:
        raise FedsimError(f"{root}: the dataset has no rows")
    w = len(xs[0])
    x = np.zeros((len(xs), w), dtype=np.uint8)
    y = np.zeros(len(ys), dtype=np.uint8)
    for i, (a, b) in enumerate(zip(xs, ys)):
        if not isinstance(a, str) or len(a) != w:
            raise FedsimError(
                f"{root}: row {i}: column 'x' must be a string of {w} characters like row 0, got {a!r:.40}"
            )
        if not isinstance(b, str) or len(b) != 1:
            raise FedsimError(f"{root}: row {i}: column 'y' must be one character, got {b!r:.40}")
        x[i] = shakespeare.encode(a)
        y[i] = shakespeare.encode(b)[0]
    part = NaturalIdPartitioner(partition_by="character_id")
    part.dataset = ds.select_columns(["character_id"])
    _ = part.num_partitions
    pid_of = {nid: pid for pid, nid in part.partition_id_to_natural_id.items()}
    rows: dict[int, list[int]] = {}
    for i, c in enumerate(ds["character_id"]):
        rows.setdefault(pid_of[c], []).append(i)
    names, tr, te = [], [], []
    for pid in sorted(rows):
        r = rows[pid]
        if len(r) < 2:
            continue
        k = max(1, int(np.floor(shakespeare.TRAIN_FRACTION * len(r))))
        names.append(str(part.partition_id_to_natural_id[pid]))
        tr.append(r[:k])
        te.append(r[k:])
    meta = {
        "names": names,
        "window": w,
        "train_counts": user_contiguous(tmp, "train", x, y, tr),
        "test_counts": user_contiguous(tmp, "test", x, y, te),
    }
    (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")


class LeafShakespeare(TopOneClassification, CachedArrays):
    """Next-character samples of LEAF's Shakespeare users (see the module docstring).

    Parameters
    ----------
    root : the local folder (``data.root``).
    cache_dir : the fedsim cache (None: ``$FEDSIM_CACHE`` or ``~/.cache/fedsim``).
    keep : indices of users to keep (None: all).
    """

    task = "char"

    def __init__(self, root: str | Path, cache_dir: str | Path | None = None, keep: list[int] | None = None) -> None:
        root = Path(root)
        if not root.is_dir():
            raise FedsimError(
                f"data.root = {str(root)!r} is not a folder; point it at the flwrlabs/shakespeare "
                f"download (shakespeare.csv) or a save_to_disk copy"
            )
        cache = Path(cache_dir) if cache_dir else shakespeare.default_cache_dir()
        folder = build_once(
            cache_folder(cache, "shakespeare_leaf", root, CACHE_VERSION, []), lambda tmp: _build(root, cache, tmp)
        )
        meta = self._open(folder, keep)
        self.window = int(meta["window"])
        self.vocab_size = shakespeare.VOCAB_SIZE

    def model_dims(self) -> dict[str, int]:
        """What the model needs: ``vocab_size``."""
        return {"vocab_size": self.vocab_size}


class LeafShakespeareOptions(LocalDataOptions):
    """``data.name = "shakespeare_leaf"``: LEAF's Shakespeare from the ``flwrlabs/shakespeare``
    download in ``root`` (the folder with ``shakespeare.csv`` or its parquet files)."""

    name: Literal["shakespeare_leaf"] = "shakespeare_leaf"

    def _root_meaning(self) -> str:
        return "the flwrlabs/shakespeare folder"


def load_leaf_shakespeare(spec: LeafShakespeareOptions) -> LeafShakespeare:
    """LEAF's Shakespeare users (a seeded subset with ``max_users``)."""
    assert spec.root is not None
    full = LeafShakespeare(spec.root, spec.cache_dir)
    if spec.max_users is None or spec.max_users >= full.population:
        return full
    return LeafShakespeare(spec.root, spec.cache_dir, subset(full.population, spec.max_users, spec.subset_seed))


register_dataset(
    DatasetKind(
        "shakespeare_leaf",
        LeafShakespeareOptions,
        "char",
        load_leaf_shakespeare,
        "LEAF's Shakespeare (flwrlabs/shakespeare, local files): next-character prediction",
    )
)
