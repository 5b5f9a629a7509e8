"""A local table as a federated dataset (``data.name = "table"``): your own data without a loader.

``data.root`` is a parquet, arrow or CSV file, a folder of them, or a ``datasets.save_to_disk``
folder; everything is read offline. Each row is one sample: ``data.features`` are its numeric
input columns and ``data.label`` its class column (integers, or strings mapped to classes in
sorted order). Users come from one of:

- ``data.user_column``: natural users, one per distinct value (the user's name is that value,
  so keyed participation keys on it);
- ``data.partitioner``: synthetic users made by a Flower Datasets partitioner over all rows —
  ``iid``, ``dirichlet`` (over the label, concentration ``data.alpha``) or ``pathological``
  (``data.classes_per_partition`` labels each) — into ``data.num_partitions`` users. The run
  header then says that users are partitions, not people: user-level DP protects a partition.

Each user's rows are split into train and test by a seeded permutation (``data.test_fraction``
of them for test, at least one train row). The models of the ``vector`` task fit it
(``logreg``, or a plugin's).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.data.base import TopOneClassification, UserCounts, majority, test_indices
from fedsim.data.registry import DatasetKind, LocalDataOptions, register_dataset, subset
from fedsim.errors import FedsimError

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch


class TableOptions(LocalDataOptions):
    """``[data]`` of ``name = "table"``.

    Parameters
    ----------
    root : the table: a parquet/arrow/CSV file, a folder of them, or a ``save_to_disk`` folder.
    features : the numeric input columns (model input ``x``). Required.
    label : the class column. Required.
    user_column : the column naming each row's user (natural users). Give this or ``partitioner``.
    partitioner : ``iid``, ``dirichlet`` or ``pathological`` (Flower Datasets) for synthetic users.
    num_partitions : how many synthetic users (with ``partitioner``).
    alpha : Dirichlet concentration (``dirichlet``). Default 0.5.
    classes_per_partition : labels per user (``pathological``). Default 2.
    test_fraction : share of each user's rows held out for evaluation. Default 0.2.
    """

    name: Literal["table"] = "table"
    features: list[str] = Field(default_factory=list)
    label: str = ""
    user_column: str | None = None
    partitioner: Literal["iid", "dirichlet", "pathological"] | None = None
    num_partitions: int | None = Field(default=None, ge=2)
    alpha: float = Field(default=0.5, gt=0)
    classes_per_partition: int = Field(default=2, ge=1)
    test_fraction: float = Field(default=0.2, ge=0, lt=1)

    @model_validator(mode="after")
    def _one_way_to_users(self) -> TableOptions:
        if not self.features or not self.label:
            raise ValueError("data.name = 'table' needs data.features = [columns…] and data.label = 'column'")
        if (self.user_column is None) == (self.partitioner is None):
            raise ValueError("give data.user_column (natural users) or data.partitioner (synthetic users), not both")
        if self.partitioner is not None and self.num_partitions is None:
            raise ValueError(f"data.partitioner = '{self.partitioner}' needs data.num_partitions")
        return self

    def _root_meaning(self) -> str:
        return "the table: a parquet/arrow/CSV file, a folder of them, or a save_to_disk folder"

    def __hash__(self) -> int:  # the options are the data cache's key; a list field is not hashable
        return hash(self.model_dump_json())


def _read(root: Path) -> Any:
    """The whole table as one ``datasets.Dataset`` (every split of a folder concatenated)."""
    import datasets

    from fedsim.data.hf_local import load_hf_folder

    datasets.disable_progress_bars()
    if not root.exists():
        raise FedsimError(
            f"data.root = {str(root)!r} does not exist; give the table's path (a relative data.root in a config "
            f"file is taken from that file's folder, one given with --set from the current folder)"
        )
    if root.is_file():
        kind = {".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}.get(root.suffix)
        if kind is None:
            raise FedsimError(f"data.root = {str(root)!r}: a table file is .parquet, .arrow or .csv")
        if kind == "parquet" and _parquet_rows(root) == 0:  # datasets fails on it with a generic error
            raise _no_rows(root)
        quiet = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its parse-error log line repeats ours
        try:
            ds = datasets.load_dataset(kind, data_files=str(root), split="train")
        except Exception as e:  # datasets and pyarrow raise their own types for a file they cannot parse
            raise FedsimError(
                f"data.root = {str(root)!r} is not a readable {kind} table ({_innermost(e)}); "
                f"check the file, or give a .parquet, .arrow or .csv file that its suffix describes"
            ) from None
        finally:
            datasets.logging.set_verbosity(quiet)
    else:
        splits = load_hf_folder(root)
        ds = datasets.concatenate_datasets(list(splits.values())) if len(splits) > 1 else next(iter(splits.values()))
    if len(ds) == 0:
        raise _no_rows(root)
    return ds


def _parquet_rows(root: Path) -> int:
    """The rows parquet file `root` declares in its footer (a file that is not parquet is a
    `FedsimError` naming it)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        return int(pq.read_metadata(root).num_rows)
    except Exception as e:  # pyarrow's ArrowInvalid / OSError for a file that is not parquet
        raise FedsimError(
            f"data.root = {str(root)!r} is not a parquet file ({_innermost(e)}); give a parquet, arrow or CSV table"
        ) from None


def _no_rows(root: Path) -> FedsimError:
    return FedsimError(f"data.root = {str(root)!r}: the table has no rows; give a table with at least one row per user")


def _innermost(e: BaseException) -> str:
    """The first line of the deepest cause of `e` (what the parser actually objected to)."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _first_rows(bad: np.ndarray) -> str:
    rows = np.flatnonzero(bad)
    return f"{len(rows)} row(s), the first row {int(rows[0])}"


def _check_finite(x: np.ndarray, features: list[str]) -> None:
    """A NaN or infinite feature would poison every update its user sends: refused, naming it."""
    for j, c in enumerate(features):
        bad = ~np.isfinite(x[:, j])
        if bad.any():
            raise FedsimError(
                f"data.features: column {c!r} is NaN, infinite or empty in {_first_rows(bad)}; "
                f"fill or drop those rows first"
            )


def _labels(column: list[Any], name: str) -> np.ndarray:
    """The label column as an array of integers or strings; a null, or a number that is not a
    whole number (0.5 is not a class), is refused."""
    nulls = np.array([v is None for v in column])
    if nulls.any():
        raise FedsimError(
            f"data.label: column {name!r} is empty (null) in {_first_rows(nulls)}; label or drop those rows"
        )
    labels = np.asarray(column)
    if labels.dtype.kind == "f":
        bad = ~np.isfinite(labels) | (labels != np.round(labels))
        if bad.any():
            first = labels[np.flatnonzero(bad)[0]]
            raise FedsimError(
                f"data.label: column {name!r} holds {float(first):g}, not a class, in {_first_rows(bad)}; "
                f"labels are whole numbers or strings"
            )
        labels = labels.astype(np.int64)
    return labels


def _partition(ds: Any, spec: TableOptions) -> list[np.ndarray]:
    """Row indices of each synthetic user, from a Flower Datasets partitioner."""
    from flwr_datasets import partitioner as fp

    ds = ds.add_column("__row", list(range(len(ds))))
    n, seed = int(spec.num_partitions or 0), int(spec.subset_seed)
    if spec.partitioner == "iid":
        part: Any = fp.IidPartitioner(num_partitions=n)
    elif spec.partitioner == "dirichlet":
        part = fp.DirichletPartitioner(n, partition_by=spec.label, alpha=spec.alpha, min_partition_size=2, seed=seed)
    else:
        part = fp.PathologicalPartitioner(
            n, partition_by=spec.label, num_classes_per_partition=spec.classes_per_partition, seed=seed
        )
    part.dataset = ds
    try:
        return [np.asarray(part.load_partition(i)["__row"], dtype=np.int64) for i in range(n)]
    except ValueError as e:
        raise FedsimError(f"data.partitioner = '{spec.partitioner}' cannot split this table: {e}") from None


class LocalTable(TopOneClassification, UserCounts):
    """The users of a local table (see the module docstring), held in memory."""

    task = "vector"

    def __init__(self, spec: TableOptions) -> None:
        ds = _read(Path(str(spec.root)))
        missing = [
            c
            for c in [*spec.features, spec.label, *([spec.user_column] if spec.user_column else [])]
            if c not in ds.column_names
        ]
        if missing:
            raise FedsimError(
                f"data: the table has no column {', '.join(missing)}; its columns: {', '.join(ds.column_names)}"
            )
        try:
            self.x = torch.from_numpy(np.stack([np.asarray(ds[c], dtype=np.float32) for c in spec.features], axis=1))
        except (TypeError, ValueError) as e:
            raise FedsimError(f"data.features must be numeric columns ({e})") from None
        _check_finite(self.x.numpy(), spec.features)
        labels = _labels(ds[spec.label], spec.label)
        self.classes, y = np.unique(labels, return_inverse=True)
        self.y = torch.from_numpy(y.astype(np.int64))
        self.vocab_size = len(self.classes)
        if spec.user_column is not None:
            nulls = [i for i, v in enumerate(ds[spec.user_column]) if v is None]
            if nulls:
                raise FedsimError(
                    f"data.user_column = {spec.user_column!r} is empty (null) in {len(nulls)} row(s), the first "
                    f"row {nulls[0]}; give those rows a user, or drop them (they would be one user otherwise)"
                )
            owner = np.asarray([str(v) for v in ds[spec.user_column]])
            distinct, inverse = np.unique(owner, return_inverse=True)
            rows = [np.flatnonzero(inverse == u) for u in range(len(distinct))]
            names = [str(n) for n in distinct]
        else:
            rows = _partition(ds, spec)
            names = [f"partition_{i:05d}" for i in range(len(rows))]
        keep = subset(len(rows), spec.max_users, spec.subset_seed)  # data.max_users: a seeded subset
        rows = [rows[i] for i in keep]
        self.names: list[str] = [names[i] for i in keep]
        rng = np.random.default_rng([int(spec.subset_seed), 7])
        self._train: list[np.ndarray] = []
        self._test: list[np.ndarray] = []
        for r in rows:
            r = rng.permutation(r)
            k = min(int(round(len(r) * spec.test_fraction)), max(len(r) - 1, 0))
            self._test.append(np.sort(r[:k]))
            self._train.append(np.sort(r[k:]))
        self._num_train = np.array([len(t) for t in self._train], dtype=np.int64)
        self._num_test = np.array([len(t) for t in self._test], dtype=np.int64)
        self.partitioned = spec.partitioner is not None

    def model_dims(self) -> dict[str, int]:
        return {"in_features": int(self.x.shape[1]), "num_classes": int(self.vocab_size)}

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.from_numpy(self._train[u][np.asarray(idx, dtype=np.int64)])
        return self.x[i], self.y[i]

    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.from_numpy(self._test[u][test_indices(self.num_test(u), max_examples)])
        return self.x[i], self.y[i]

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float]:
        train = (self.y[torch.from_numpy(self._train[u])].numpy() for u in users)
        test = (self.test_samples(u, max_examples)[1].numpy() for u in users)
        return majority(train, test, self.vocab_size)


_TABLES: dict[str, LocalTable] = {}


def load_table(spec: TableOptions) -> LocalTable:
    """The table of ``spec`` (read once per process)."""
    key = spec.model_dump_json()
    if key not in _TABLES:
        _TABLES[key] = LocalTable(spec)
    return _TABLES[key]


register_dataset(DatasetKind("table", TableOptions, "vector", load_table, "your own local table (parquet/arrow/CSV)"))
