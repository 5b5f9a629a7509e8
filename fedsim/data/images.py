"""FEMNIST and CIFAR-100 from local Hugging Face folders, as federated image populations.

``data.root`` is a folder the user already has, in either form Hugging Face produces:

- a ``datasets.save_to_disk`` folder (a ``Dataset`` or a ``DatasetDict`` with splits), or
- parquet files as downloaded from the Hub (``data/train-00000-of-00001.parquet``,
  ``test-….parquet``, …; the split is the file-name prefix, or ``train`` if there is none).

Published column layouts (checked, with a message naming what is missing):

- ``femnist`` (``flwrlabs/femnist``): ``image`` (28×28 grayscale), ``writer_id`` (text),
  ``hsf_id``, ``character`` (62 classes). One ``train`` split. **Users are writers**
  (flwr-datasets' ``NaturalIdPartitioner`` on ``writer_id``, in its partition order); each
  writer's rows in stored order are split ``⌊0.9·n⌋`` train / rest test, LEAF's default
  fraction. Writers with fewer than 2 rows are dropped.
- ``cifar100`` (``uoft-cs/cifar100``): ``img`` (32×32 RGB), ``fine_label`` (100 classes),
  ``coarse_label``; ``train`` and ``test`` splits. CIFAR-100 has no natural users, so the
  train split is dealt to ``data.num_clients`` users by flwr-datasets'
  ``DirichletPartitioner`` over ``fine_label`` (concentration ``data.partition_alpha``, seed
  ``data.subset_seed``), and the test split to the same number of users by its
  ``IidPartitioner``: evaluating every user evaluates the whole test split.

Decoded pixels are cached once as ``uint8`` arrays under ``$FEDSIM_CACHE/arrays/<name>-<key>/``
(the key hashes the dataset name, the settings and every data file's path, size and mtime),
and memory-mapped afterwards, so every worker shares one copy through the page cache.
Inputs are scaled to ``[0, 1]`` and standardized per channel with constants fixed in this module
before any run (:data:`LAYOUTS`): CIFAR-100's published channel means and standard deviations, and
``(x − 0.5)/0.5`` for FEMNIST; no augmentation. They are never computed from the population's
pixels: statistics over every user's images would let one user's data change every other user's
inputs, hence their updates, which user-level DP does not allow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from fedsim.data.base import CachedArrays, TopOneClassification
from fedsim.data.hf_local import build_once, cache_folder, load_hf_folder, split_source, user_contiguous
from fedsim.data.registry import DatasetKind, LocalDataOptions, register_dataset, subset
from fedsim.errors import FedsimError

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

CACHE_VERSION = 1
FEMNIST_TRAIN_FRACTION = 0.9


@dataclass(frozen=True)
class ImageLayout:
    """A published column layout: image column, label column, user column (None: partitioned),
    classes, channels, side length, splits, and the fixed per-channel ``mean`` and ``std`` that
    standardize pixels scaled to [0, 1]."""

    image: str
    label: str
    user: str | None
    num_classes: int
    channels: int
    size: int
    splits: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]


LAYOUTS = {
    "femnist": ImageLayout("image", "character", "writer_id", 62, 1, 28, ("train",), (0.5,), (0.5,)),
    "cifar100": ImageLayout(
        "img",
        "fine_label",
        None,
        100,
        3,
        32,
        ("train", "test"),
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
    ),
}


def _check_columns(name: str, splits: dict[str, Any], layout: ImageLayout, root: Path) -> None:
    for split in layout.splits:
        if split not in splits:
            raise FedsimError(f"{root}: data.name = '{name}' needs a '{split}' split; found {sorted(splits)}")
        cols = set(splits[split].column_names)
        want = [c for c in (layout.image, layout.label, layout.user) if c is not None]
        missing = [c for c in want if c not in cols]
        if missing:
            raise FedsimError(
                f"{split_source(root, split)}: split '{split}' lacks column(s) {missing} of the "
                f"{name} layout (expected {want}; found {sorted(cols)})"
            )


def _pixels(ds: Any, column: str, layout: ImageLayout, root: Path) -> np.ndarray:
    """``uint8 [n, C, H, W]`` from an image column, decoded in chunks."""
    n = len(ds)
    out = np.empty((n, layout.channels, layout.size, layout.size), dtype=np.uint8)
    mode = "L" if layout.channels == 1 else "RGB"
    for s in range(0, n, 4096):
        for i, img in enumerate(ds[s : s + 4096][column]):
            if hasattr(img, "convert"):
                arr = np.asarray(img.convert(mode), dtype=np.uint8)
            else:
                arr = np.asarray(img, dtype=np.uint8)
            if arr.ndim == 2:
                arr = arr[:, :, None]
            if arr.shape[:2] != (layout.size, layout.size) or arr.shape[2] != layout.channels:
                raise FedsimError(
                    f"{root}: row {s + i} of column '{column}' is {arr.shape}, expected "
                    f"{layout.size}×{layout.size}×{layout.channels}"
                )
            out[s + i] = arr.transpose(2, 0, 1)
    return out


def _labels(ds: Any, column: str, layout: ImageLayout, root: Path) -> np.ndarray:
    y = np.asarray(ds[column], dtype=np.int64)
    if len(y) and (y.min() < 0 or y.max() >= layout.num_classes):
        raise FedsimError(f"{root}: column '{column}' has labels outside 0..{layout.num_classes - 1}")
    return y


def _build(name: str, root: Path, num_clients: int, alpha: float, seed: int, cache: Path) -> dict[str, Any]:
    """Decode and partition; return arrays and per-user index lists."""
    layout = LAYOUTS[name]
    splits = load_hf_folder(root, cache)
    _check_columns(name, splits, layout, root)
    train = splits["train"]
    if name == "femnist":
        from flwr_datasets.partitioner import NaturalIdPartitioner

        part = NaturalIdPartitioner(partition_by=layout.user)
        part.dataset = train.select_columns([layout.user])
        _ = part.num_partitions
        pid_of = {nid: pid for pid, nid in part.partition_id_to_natural_id.items()}
        rows: dict[int, list[int]] = {}
        for i, w in enumerate(train[layout.user]):
            rows.setdefault(pid_of[w], []).append(i)
        names, tr_idx, te_idx = [], [], []
        for pid in sorted(rows):
            r = rows[pid]
            if len(r) < 2:
                continue
            k = max(1, int(np.floor(FEMNIST_TRAIN_FRACTION * len(r))))
            names.append(str(part.partition_id_to_natural_id[pid]))
            tr_idx.append(r[:k])
            te_idx.append(r[k:])
        x = _pixels(train, layout.image, layout, root)
        y = _labels(train, layout.label, layout, root)
        return {
            "names": names,
            "train_x": x,
            "train_y": y,
            "test_x": None,
            "test_y": None,
            "train_idx": tr_idx,
            "test_idx": te_idx,
        }
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    test = splits["test"]
    if num_clients < 2 or num_clients > len(train) or num_clients > len(test):
        raise FedsimError(
            f"data.num_clients = {num_clients}: needs 2 ≤ num_clients ≤ the rows of each split "
            f"({len(train)} train, {len(test)} test)"
        )
    dp = DirichletPartitioner(
        num_partitions=num_clients, partition_by=layout.label, alpha=alpha, min_partition_size=1, seed=seed
    )
    dp.dataset = _with_row(train.select_columns([layout.label]))
    ip = IidPartitioner(num_partitions=num_clients)
    ip.dataset = _with_row(test.select_columns([layout.label]))
    try:
        tr_idx = [sorted(dp.load_partition(u)[ROW]) for u in range(num_clients)]
    except ValueError as e:
        raise FedsimError(
            f"data.partition_alpha = {alpha}: flwr-datasets could not deal the train split to "
            f"{num_clients} users ({e}); raise partition_alpha or lower num_clients"
        ) from None
    te_idx = [list(ip.load_partition(u)[ROW]) for u in range(num_clients)]
    return {
        "names": [f"client_{u:05d}" for u in range(num_clients)],
        "train_x": _pixels(train, layout.image, layout, root),
        "train_y": _labels(train, layout.label, layout, root),
        "test_x": _pixels(test, layout.image, layout, root),
        "test_y": _labels(test, layout.label, layout, root),
        "train_idx": tr_idx,
        "test_idx": te_idx,
    }


ROW = "__fedsim_row"


def _with_row(ds: Any) -> Any:
    """``ds`` with a column of its row numbers (what a partition's rows are, read back)."""
    return ds.add_column(ROW, list(range(len(ds))))


def _save(tmp: Path, built: dict[str, Any]) -> None:
    """Write the arrays user-contiguous (train rows of user 0, user 1, …) and the counts."""
    meta: dict[str, Any] = {"names": built["names"]}
    for split in ("train", "test"):
        x = built[f"{split}_x"] if built[f"{split}_x"] is not None else built["train_x"]
        y = built[f"{split}_y"] if built[f"{split}_y"] is not None else built["train_y"]
        meta[f"{split}_counts"] = user_contiguous(tmp, split, x, y, built[f"{split}_idx"])
    (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")


class FederatedImages(TopOneClassification, CachedArrays):
    """Image classification data of a population of users (see the module docstring).

    Parameters
    ----------
    name : ``femnist`` or ``cifar100``.
    root : the local Hugging Face folder (``data.root``).
    num_clients : CIFAR-100: users to deal the train split to (``data.num_clients``).
    partition_alpha : CIFAR-100: Dirichlet concentration over labels (``data.partition_alpha``).
    seed : CIFAR-100: the partition's seed (``data.subset_seed``).
    cache_dir : the fedsim cache (None: ``$FEDSIM_CACHE`` or ``~/.cache/fedsim``).
    keep : indices of users to keep (None: all).
    """

    def __init__(
        self,
        name: str,
        root: str | Path,
        num_clients: int = 500,
        partition_alpha: float = 0.1,
        seed: int = 0,
        cache_dir: str | Path | None = None,
        keep: list[int] | None = None,
    ) -> None:
        from fedsim.data.shakespeare import default_cache_dir

        if name not in LAYOUTS:
            raise FedsimError(f"image dataset {name!r}: allowed are {', '.join(LAYOUTS)}")
        self.name = name
        self.task = name
        self.layout = LAYOUTS[name]
        root = Path(root)
        if not root.is_dir():
            raise FedsimError(
                f"data.root = {str(root)!r} is not a folder; point it at the {name} dataset saved "
                f"with datasets.save_to_disk or at its downloaded parquet files"
            )
        cache = Path(cache_dir) if cache_dir else default_cache_dir()
        folder = cache_folder(cache, name, root, CACHE_VERSION, [num_clients, partition_alpha, seed])
        build_once(folder, lambda tmp: _save(tmp, _build(name, root, num_clients, partition_alpha, seed, cache)))
        self._open(folder, keep)
        self.mean = torch.tensor(self.layout.mean).view(1, -1, 1, 1)
        self.std = torch.tensor(self.layout.std).view(1, -1, 1, 1)
        self.vocab_size = self.layout.num_classes

    def model_dims(self) -> dict[str, int]:
        """``channels``, ``size`` (side in pixels) and ``num_classes``."""
        return {"channels": self.layout.channels, "size": self.layout.size, "num_classes": self.layout.num_classes}

    def _inputs(self, x: np.ndarray) -> torch.Tensor:
        """Pixels scaled to [0, 1] and standardized per channel with the layout's fixed constants."""
        return (torch.from_numpy(x).float().div_(255.0) - self.mean) / self.std


class FemnistOptions(LocalDataOptions):
    """``data.name = "femnist"``: FEMNIST from a local Hugging Face folder in ``root``; users are
    writers."""

    name: Literal["femnist"] = "femnist"


class Cifar100Options(LocalDataOptions):
    """``data.name = "cifar100"``: CIFAR-100 from a local Hugging Face folder in ``root``, dealt to
    users by a Dirichlet partition.

    Parameters
    ----------
    num_clients : users the train split is dealt to. Default 500 (TFF's count).
    partition_alpha : Dirichlet concentration of each user's label mix (smaller = more
        heterogeneous). Default 0.1.
    """

    name: Literal["cifar100"] = "cifar100"
    num_clients: int = Field(default=500, ge=2)
    partition_alpha: float = Field(default=0.1, gt=0.0, le=1e6)


def load_images(spec: FemnistOptions | Cifar100Options) -> FederatedImages:
    """The image population of ``spec`` (a seeded subset with ``max_users``)."""
    assert spec.root is not None
    clients, alpha = (spec.num_clients, spec.partition_alpha) if isinstance(spec, Cifar100Options) else (500, 0.1)
    full = FederatedImages(spec.name, spec.root, clients, alpha, spec.subset_seed, spec.cache_dir)
    if spec.max_users is None or spec.max_users >= full.population:
        return full
    keep = subset(full.population, spec.max_users, spec.subset_seed)
    return FederatedImages(spec.name, spec.root, clients, alpha, spec.subset_seed, spec.cache_dir, keep)


register_dataset(
    DatasetKind("femnist", FemnistOptions, "femnist", load_images, "FEMNIST (local files), users = writers")
)
register_dataset(
    DatasetKind(
        "cifar100", Cifar100Options, "cifar100", load_images, "CIFAR-100 (local files), users from a Dirichlet split"
    )
)
